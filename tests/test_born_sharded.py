"""The decode state is born sharded (issue 42, item 1): the dense cache and the page pool,
with the logits, positions or lengths, counters, keys and the active flags, are made by one
jitted init whose outputs are the state's shardings, so no chip ever holds more than its
shard. Before, the state was made eagerly with jnp.zeros on one device and then placed:
at the 1.5B preset's "most that fit" slots on v5e:2x2, chip 0 would first have held the
whole ~40 GiB cache.

On a (data 2, tensor 2) CPU mesh, the dense and the paged engine run the Driver through
init, prefill and insert (attach), a chunk and the release of finished slots with every
device-to-device transfer refused (explicit ones too: `device_put` from one device onto the
shards is one), and after each phase every state leaf holds exactly its shard on each
device and no live array of a state leaf's full shape lies on one device. Remove the jitted
init (jnp.zeros then device_put, as it was) and the init phase fails at the guard: the cache
made on device 0 is moved onto its shards.

For v5e the init compiled for an abstract 2x2 slice (libtpu; skipped where it cannot load)
outputs one shard of the state per chip: its bytes up to the TPU's tile padding of the
small vectors, a quarter of the whole."""

from __future__ import annotations

import gc
import math

import jax
import numpy as np
import pytest

from ada import roofline, tpu
from ada.checkpoint import Checkpointer
from ada import sharding as shd
from ada.models import preset
from ada.models.known import known
from ada.models.transformer import init_params
from ada.sampling.driver import Driver, Request
from ada.sampling.engine import Engine
from ada.sampling.paged import PagedEngine

ENGINE = dict(num_slots=4, max_prompt_len=8, max_new_tokens=8, chunk_size=4, num_windows=1)
KINDS = pytest.mark.parametrize("kind", ["dense", "paged"])


def _engine(kind, config, mesh, page_size=4, **kw):
    kw = dict(ENGINE, mesh=mesh, **kw)
    return Engine(config, **kw) if kind == "dense" else PagedEngine(config, page_size=page_size,
                                                                    **kw)


def _check_phase(engine, state, phase, before):
    """Each state leaf holds exactly its shard on every device (the cache or pool a quarter
    of it), and no live array of a sharded leaf's full shape lies on one device (of those
    made since `before`, the ids of the arrays live when the test began: an earlier test in
    the same worker may leave arrays of these shapes behind)."""
    shardings = engine.state_shardings()
    whole = set()
    for (path, x), sh in zip(jax.tree_util.tree_leaves_with_path(state),
                             jax.tree.leaves(shardings), strict=True):
        name = f"{phase}: {jax.tree_util.keystr(path)}"
        assert x.sharding.is_equivalent_to(sh, x.ndim), (name, x.sharding, sh)
        shard = math.prod(sh.shard_shape(x.shape)) * x.dtype.itemsize
        assert {s.data.nbytes for s in x.addressable_shards} == {shard}, name
        if x.ndim == 4:  # a layer's cache or pool: over data and tensor
            assert shard * 4 == x.nbytes, name
        if shard < x.nbytes:
            whole.add((x.shape, x.dtype))
    single = [(a.shape, a.dtype, a.sharding) for a in jax.live_arrays()
              if id(a) not in before and (a.shape, a.dtype) in whole
              and len(a.sharding.device_set) == 1]
    assert not single, (phase, single[:3])


@KINDS
def test_decode_state_is_born_sharded(kind):
    earlier = jax.live_arrays()  # held, so no array made here reuses one of their ids
    before = {id(a) for a in earlier}
    config = preset("tiny", family="qwen2")
    engine = _engine(kind, config, shd.local_mesh(2, 2))
    params = engine.prepare_params(init_params(config, jax.random.key(0)))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, config.vocab_size, n).tolist() for n in (5, 8, 3, 7)]
    # four slots' worth, then prompt 0 again into the first slot released
    requests = [Request(prompts[i % 4], prompt_id=i % 4, sample_idx=i // 4, max_new_tokens=m)
                for i, m in enumerate([3, 8, 8, 6, 5])]
    with jax.transfer_guard_device_to_device("disallow_explicit"):
        driver = Driver(engine, params, step_key=np.asarray(jax.random.PRNGKey(3)))
        _check_phase(engine, driver.state, "init", before)
        for r in requests:
            driver.submit(r)
        driver.backend.fill()  # prefill and insert / attach
        _check_phase(engine, driver.state, "insert", before)
        done, steps = [], 0
        while driver.busy():  # chunks, and the release of finished slots
            done += driver.step()
            _check_phase(engine, driver.state, f"step {steps}", before)
            steps += 1
    assert sorted(len(c.token_ids) for c in done) == [3, 5, 6, 8, 8]
    assert engine.compiles()["init"] == 1


def test_init_on_a_v5e_slice_outputs_one_shard_per_chip():
    """The init compiled for an abstract v5e:2x2 slice (mesh data 2, tensor 2; shapes like
    the 1.5B preset's per chip: head dim 128, bfloat16): per chip its outputs are one shard
    of the state (exact up to the TPU's tile padding of the [slots] vectors), a quarter of
    the whole state; what `lower_init` gives the planner."""
    try:
        devices, _ = tpu.tpu_devices("v5e:2x2")
    except tpu.LibtpuUnavailable as e:
        pytest.skip(str(e))
    config = known("qwen2.5-math-1.5b").replace(
        hidden_size=256, intermediate_size=512, num_heads=12, num_kv_heads=2, vocab_size=4160,
        num_layers=2, dtype="bfloat16", param_dtype="bfloat16")
    mesh = shd.make_mesh((2, 1, 2), devices)
    for kind in ("dense", "paged"):
        engine = _engine(kind, config, mesh, page_size=16, num_slots=16, max_prompt_len=128,
                         max_new_tokens=128)
        state = engine.abstract_state()
        leaves = jax.tree.leaves(state)
        shard = roofline.device_bytes(state)
        whole = sum(x.size * x.dtype.itemsize for x in leaves)
        out = engine.lower_init().compile().memory_analysis().output_size_in_bytes
        # the output tuple's 8-byte pointers, and at most a 4 KiB tile per padded leaf
        assert shard + 8 * len(leaves) <= out <= shard + (8 + 4096) * len(leaves), (kind, out)
        assert 3.9 * out < whole, (kind, out, whole)


@KINDS
def test_host_and_one_device_masters_are_placed_before_the_cast(kind, tmp_path):
    """A float32 master on the host (a checkpoint restored as ada.run.saved.load_run restores it
    for ada.evaluate, ada-serve and the difficulty filter) or on one device is placed onto
    its shards first and cast there to bfloat16: with every device-to-device transfer
    refused, each decode-form leaf has the engine's sharding, no live array holds a whole
    master or decode-form leaf on one device (beyond the caller's own one-device master),
    and the values are the one-device cast's, bit for bit. The old path (cast where they
    lie, on device 0, then `device_put`) fails at the guard: the whole decode-form copy on
    device 0 is moved onto its shards."""
    config = preset("tiny", family="qwen2").replace(dtype="bfloat16", param_dtype="float32")
    engine = _engine(kind, config, shd.local_mesh(2, 2))
    master = init_params(config, jax.random.key(0))
    want = jax.device_get(jax.jit(engine._sampling_fn)(master))
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, {"params": master}, {})
    host = ckpt.restore_params(1, host=True)[0]["params"]
    ckpt.close()
    assert all(type(x) is np.ndarray for x in jax.tree.leaves(host))
    one = jax.device_put(host, jax.devices()[0])
    del master
    shardings = engine.param_shardings(host)
    # the caller's own buffers (on CPU a device_get is a view of them, held by live arrays)
    callers = {x.unsafe_buffer_pointer() for x in jax.tree.leaves(one)}
    gc.collect()
    earlier = jax.live_arrays()  # held: what other tests in this process left, and ours
    known = {id(a) for a in earlier}
    for name, params in (("host", host), ("one device", one)):
        with jax.transfer_guard_device_to_device("disallow_explicit"):
            prepared = engine.prepare_params(params)
        whole = {(x.shape, x.dtype) for x in jax.tree.leaves(params) + jax.tree.leaves(prepared)}
        for (path, x), sh in zip(jax.tree_util.tree_leaves_with_path(prepared),
                                 jax.tree.leaves(shardings), strict=True):
            assert x.sharding.is_equivalent_to(sh, x.ndim), (name, jax.tree_util.keystr(path))
        single = [(a.shape, a.dtype) for a in jax.live_arrays() if id(a) not in known
                  and (a.shape, a.dtype) in whole and len(a.sharding.device_set) == 1
                  and a.unsafe_buffer_pointer() not in callers and a.size > 1]
        assert not single, (name, single[:3])
        for a, b in zip(jax.tree.leaves(prepared), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a), b)
    assert {x.dtype for x in jax.tree.leaves(host)} == {np.dtype(np.float32)}
    assert {x.dtype for x in jax.tree.leaves(prepared)} == {jax.numpy.dtype("bfloat16")}


def test_a_hugging_face_checkpoint_is_loaded_onto_its_shards(tmp_path):
    """The run's initial params from `model.path` are placed leaf by leaf on the train mesh's
    parameter shardings as they are read: no live array of a sharded leaf's full shape lies
    on one device. Before, the checkpoint was loaded whole onto device 0 (the 7B preset's
    float32 master, 28 GiB, on a 16 GiB v5e chip) and sharded by the trainer afterwards;
    drop the `mesh` argument and this fails."""
    from ada import config as C
    from ada.run.policy import initial_params, model_config_for
    from tiny_hf import make_tiny_hf

    make_tiny_hf("qwen2", tmp_path / "m")
    c = C.build_config("configs/default.py", [("model.path", str(tmp_path / "m")),
                                              ("model.param_dtype", "float32")])
    mesh = shd.make_mesh((2, 4, 1))
    before = {id(a) for a in jax.live_arrays()}

    model_cfg = model_config_for(c, tokenizer=None)
    params, _ = initial_params(c, model_cfg, None, None, None, mesh)
    want = shd.param_shardings(params, mesh)
    whole = set()
    for (path, x), sh in zip(jax.tree_util.tree_leaves_with_path(params),
                             jax.tree.leaves(want), strict=True):
        assert x.sharding.is_equivalent_to(sh, x.ndim), (jax.tree_util.keystr(path), x.sharding)
        if len(sh.device_set) > 1 and math.prod(sh.shard_shape(x.shape)) < x.size:
            whole.add((x.shape, x.dtype))
    assert whole  # the tiny model's matrices are split over fsdp
    single = [(a.shape, a.dtype) for a in jax.live_arrays()
              if id(a) not in before and (a.shape, a.dtype) in whole
              and len(a.sharding.device_set) == 1]
    assert not single, single[:3]
