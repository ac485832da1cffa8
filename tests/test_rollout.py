"""The sampler on every local device: the trained params reach a multi-device engine device
to device (no host round trip) in the sampler's dtype and decode form, an engine over
several devices samples what one device does, and a bad `sampling.mesh` is one line.

The 8 fake CPU devices come from tests/conftest.py.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.array import ArrayImpl

from ada import sharding as shd
from ada.config import ConfigError, validate
from ada.models import init_params, preset
from ada.models.transformer import decode_params
from ada.rl.train import TrainConfig, make_train_fns
from ada.rollout import Rollout
from ada.sampling.backends import make_engine
from ada.sampling.engine import Engine
from configs import default


class Tokenizer:
    eos_ids = (1,)

    def decode(self, ids):
        return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def bf16_model():
    cfg = preset("tiny", family="qwen2", vocab_size=64, dtype="bfloat16")
    return cfg, init_params(cfg, jax.random.key(0))


@pytest.fixture(scope="module")
def train_state(bf16_model):
    cfg, params = bf16_model
    return make_train_fns(cfg, TrainConfig(), shd.make_mesh((2, 2, 2))).init_state(params)


@contextlib.contextmanager
def no_host_round_trip(monkeypatch, guard=jax.transfer_guard):
    """`guard("disallow")`, and no array read on the host: jax.transfer_guard does not see
    the fake CPU devices' transfers (host memory either way), so reading a value, which
    device_get, np.asarray and process_allgather all do, fails too."""

    def host_read(*_, **__):
        raise AssertionError("the params made a host round trip")

    with monkeypatch.context() as m, guard("disallow"):
        m.setattr(ArrayImpl, "_value", property(host_read))
        m.setattr(ArrayImpl, "__array__", host_read)
        yield


def expected_sampling_params(cfg, params):
    return decode_params(jax.tree.map(lambda x: np.asarray(x).astype(cfg.compute_dtype), params),
                         cfg)


def check_prepared(engine, cfg, params, got):
    want = expected_sampling_params(cfg, params)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    shardings = jax.tree.leaves(engine.param_shardings(params))
    for g, w, sh in zip(jax.tree.leaves(got), jax.tree.leaves(want), shardings, strict=True):
        assert g.sharding == sh and g.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("engine_mesh", [(4, 1), (2, 2), (8, 1)])
def test_trained_params_reach_the_engine_on_device(bf16_model, train_state, engine_mesh,
                                                   monkeypatch):
    """From the train mesh over 8 devices to an engine over 4 or 8 (2 or 1 copies): no
    transfer, no host round trip (process_allgather, device_get), the exact cast and split,
    laid out by the engine's shardings."""
    cfg, params = bf16_model
    engine = Engine(cfg, num_slots=8, max_prompt_len=16, max_new_tokens=8,
                    mesh=shd.local_mesh(*engine_mesh))
    with no_host_round_trip(monkeypatch):  # no transfer of any kind
        got = engine.prepare_params(train_state.params)
    check_prepared(engine, cfg, params, got)
    assert tuple(got["layers"][1]["q"].sharding.spec) == ((None, "tensor") if engine_mesh[1] > 1
                                                          else (None, None))
    # the Rollout hands the params over the same way, once, when it makes its Driver
    rollout, key = Rollout(engine, Tokenizer(), None, None), jax.random.key(0)
    with no_host_round_trip(monkeypatch, jax.transfer_guard_device_to_host):
        driver = rollout.driver(train_state.params, key)
    check_prepared(engine, cfg, params, driver.params)
    assert engine.prepare_params(driver.params) is driver.params  # decode form: taken as is


@pytest.mark.parametrize("where", ["device", "host"])
def test_params_on_one_device_or_the_host_reach_the_engine(bf16_model, where):
    cfg, params = bf16_model
    engine = Engine(cfg, num_slots=8, max_prompt_len=16, max_new_tokens=8,
                    mesh=shd.local_mesh(2, 2))
    src = (jax.device_put(params, jax.devices()[5]) if where == "device"
           else jax.tree.map(np.asarray, params))
    check_prepared(engine, cfg, params, engine.prepare_params(src))


def engine_for(mesh, temperature, model_cfg):
    c = default.get_config()
    c.sampling.mesh = mesh
    c.sampling.num_slots = 8
    c.sampling.slot_bucketing = False  # the same shapes on every mesh (engine.py docstring)
    c.sampling.num_windows = 1
    c.sampling.max_prefill_rows = 4
    return make_engine(c, model_cfg, Tokenizer(), temperature=temperature, max_new_tokens=10)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_over_four_devices_samples_as_one(temperature):
    cfg = preset("tiny", family="qwen2", vocab_size=64)
    params = init_params(cfg, jax.random.key(1))
    # sharper logits than a fresh init's, so greedy decoding has no near-ties
    params = dict(params, embed=params["embed"] * 20)
    rng = np.random.default_rng(0)
    records = [{"prompt_tokens": rng.integers(2, 64, rng.integers(3, 12)).tolist()}
               for _ in range(6)]
    key = jax.random.key(3)
    outs = {}
    for mesh in ((1, 1), (4, 1), (2, 2)):
        engine = engine_for(mesh, temperature, cfg)
        assert engine.mesh.devices.shape == (mesh[0], 1, mesh[1])
        rollout = Rollout(engine, Tokenizer(), None, None)
        outs[mesh] = rollout.sample(params, records, 3, key, range(5, 5 + len(records)))
    one = outs[(1, 1)]
    assert len({tuple(c.token_ids) for row in one for c in row}) > 1
    for mesh in ((4, 1), (2, 2)):
        for row_a, row_b in zip(outs[mesh], one, strict=True):
            assert [c.token_ids for c in row_a] == [c.token_ids for c in row_b], mesh
            for a, b in zip(row_a, row_b, strict=True):
                np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_a_bad_sampling_mesh_is_one_line():
    cfg = preset("tiny", family="qwen2", vocab_size=64)
    with pytest.raises(ConfigError, match=r"sampling\.mesh=\(3, 1\) does not divide .* 8 devices"):
        engine_for((3, 1), 1.0, cfg)
    with pytest.raises(ConfigError, match=r"sampling\.mesh=\(-1, 16\)"):
        engine_for((-1, 16), 1.0, cfg)
    c = default.get_config()
    c.sampling.mesh = (4, 1)
    c.sampling.num_slots = 6
    with pytest.raises(ConfigError, match=r"sampling\.num_slots=6 does not split over "
                                          r"sampling\.mesh data=4"):
        make_engine(c, cfg, Tokenizer(), temperature=1.0, max_new_tokens=4)
    c = default.get_config()
    c.sampling.mesh = (2, 0)
    with pytest.raises(ConfigError, match=r"sampling\.mesh=\(2, 0\) must be \(data, tensor\)"):
        validate(c)
    assert engine_for((-1, 2), 1.0, cfg).mesh.devices.shape == (4, 1, 2)
