"""Memory planner: XLA's per-device figures against bytes actually live on the fake devices."""

import json
import math

import jax
import numpy as np

from ada import memory_plan
from ada import sharding as shd
from ada.models import init_params, param_shapes, positions_from_mask, preset
from ada.models.known import QWEN25_MATH_7B
from ada.rl.train import TrainConfig

CFG = preset("tiny", family="qwen3")
TC = TrainConfig(mini_batches=2, micro_batches=2, logit_chunk=8)
B, T = 16, 12


def device_bytes(tree, device) -> int:
    """Bytes of the shards of every array of `tree` that live on `device`."""
    return sum(s.data.nbytes for x in jax.tree.leaves(tree)
               for s in x.addressable_shards if s.device == device)


def test_planned_bytes_equal_live_bytes_on_cpu():
    """Tolerance: exact. Arguments and outputs are whole buffers whose sizes XLA knows from
    the shardings, so the figures must equal the live shard bytes to the byte (outputs plus
    the output tuple's pointer table). (`temp` cannot
    be measured on CPU — it has no allocator statistics — so it is only checked to be
    positive and below the unsharded activations of the whole batch.)"""
    compiled, fns, _, abstract_batch = memory_plan.compile_train_step(CFG, TC, (2, 2, 2), B, T)
    rng = np.random.default_rng(0)
    mask = np.ones((B, T), bool)
    batch = dict(tokens=rng.integers(0, CFG.vocab_size, (B, T)), mask=mask,
                 positions=np.asarray(positions_from_mask(mask)),
                 response_mask=(np.arange(T) >= 6)[None].repeat(B, 0),
                 advantages=rng.normal(size=B), old_logp=np.full((B, T), -6.2))
    state = fns.init_state(init_params(CFG, jax.random.key(0)))
    batch = fns.shard_batch(batch)
    dev = jax.devices()[0]
    ma = compiled.memory_analysis()
    live_in = device_bytes((state, batch), dev)
    assert ma.argument_size_in_bytes == live_in

    p = memory_plan.plan(CFG, TC, (2, 2, 2), B, T)
    d = p["per_device"]
    assert d["arguments"] == live_in
    assert d["params"] + d["opt_state"] + d["batch"] + 3 * 4 == live_in  # + 3 int32 counters
    assert d["params"] == device_bytes(state.params, dev)

    new_state, metrics = compiled(state, batch)
    n_out = len(jax.tree.leaves((new_state, metrics)))
    # XLA also counts the output tuple's table of 8-byte buffer pointers
    assert ma.output_size_in_bytes == device_bytes((new_state, metrics), dev) + 8 * n_out
    assert ma.alias_size_in_bytes >= device_bytes(new_state.params, dev)  # donated state
    full_activations = 4 * B * T * (CFG.num_layers * 10 * CFG.hidden_size + CFG.vocab_size)
    assert 0 < d["temp"] < full_activations
    assert d["peak"] == d["arguments"] + d["outputs"] + d["temp"] - d["aliased"]


def test_seven_b_state_splits_over_the_mesh():
    """Per-device params and Adam moments of Qwen2.5-Math-7B: total / (fsdp x tensor)."""
    n_params = sum(math.prod(s) for s in jax.tree.leaves(
        param_shapes(QWEN25_MATH_7B), is_leaf=lambda x: isinstance(x, tuple)))
    assert abs(n_params - 7.6156e9) < 1e6
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, np.float32),
                            param_shapes(QWEN25_MATH_7B), is_leaf=lambda x: isinstance(x, tuple))
    for shape in [(1, 4, 2), (2, 4, 1)]:
        sh = shd.param_shardings(abstract, shd.make_mesh(shape))
        per_dev = memory_plan._device_bytes(abstract, sh)
        ways = shape[1] * shape[2]
        # every matrix splits evenly; only the norms (and, without tensor, nothing else)
        # stay replicated: < 0.05% above total / ways
        assert 4 * n_params // ways <= per_dev < 1.0005 * 4 * n_params / ways


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    memory_plan.main(["--model", "tiny", "--mesh", "2,2,2", "--batch", "8", "--seq", "8",
                      "--micro-batches", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "data=2xfsdp=2xtensor=2" in printed and "GiB/device" in printed
    rows = json.loads(out.read_text())
    assert rows[0]["per_device"]["peak"] > rows[0]["per_device"]["params"] > 0
