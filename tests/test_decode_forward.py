"""The decode-only fast path (`decode_forward`, `unstack_layers`, `Engine.decode_params`)
against the reference `forward` with a KV cache: same logits and cache, every family."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ada.models import forward, init_cache, init_params, positions_from_mask, preset
from ada.models.transformer import decode_forward, unstack_layers
from ada.sampling.engine import Engine
from ada.sampling.samplers import SamplingConfig

TOL = 1e-5


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_decode_forward_equals_forward(family):
    config = preset("tiny", family=family)
    params = init_params(config, jax.random.PRNGKey(1), std=0.2)
    rng = np.random.default_rng(0)
    B, P, S = 3, 6, 10
    mask = np.ones((B, P), bool)
    mask[1, :2] = mask[2, :5] = False  # left padding
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (B, P)))
    positions = positions_from_mask(jnp.asarray(mask))
    _, cache = jax.jit(forward, static_argnums=1)(
        params, config, tokens, positions, jnp.asarray(mask), init_cache(config, B, S))
    ref_fn = jax.jit(lambda p, *a: forward(p, config, *a))
    fast_fn = jax.jit(lambda p, *a: decode_forward(p, config, *a))
    pos = jnp.asarray(mask.sum(-1))[:, None]
    for step, alive in enumerate(([True, True, True], [True, False, True])):
        tok = jnp.asarray(rng.integers(0, config.vocab_size, (B, 1)))
        m = jnp.asarray(alive)[:, None]  # a masked row: written as invalid, like an idle slot
        ref_logits, ref_cache = ref_fn(params, tok, pos + step, m, cache)
        for p in (params, unstack_layers(params)):  # stacked and per-layer params
            logits, new_cache = fast_fn(p, tok, pos + step, m, cache)
            np.testing.assert_allclose(logits, ref_logits, atol=TOL, rtol=0)
            for name in ("k", "v"):
                np.testing.assert_allclose(getattr(new_cache, name), getattr(ref_cache, name),
                                           atol=TOL, rtol=0)
            np.testing.assert_array_equal(new_cache.valid, ref_cache.valid)
            np.testing.assert_array_equal(new_cache.end, ref_cache.end)
        assert np.abs(np.asarray(ref_logits)).max() > 0.1  # the check is not on zeros
        cache = ref_cache


def test_unstack_layers_layout():
    config = preset("tiny", family="qwen2")
    params = init_params(config, jax.random.PRNGKey(2))
    out = unstack_layers(params)
    assert len(out["layers"]) == config.num_layers
    for i, layer in enumerate(out["layers"]):
        assert layer.keys() == params["layers"].keys()
        for name, w in layer.items():
            np.testing.assert_array_equal(w, params["layers"][name][i])
    assert out["embed"] is params["embed"]
    assert unstack_layers(out) is out  # already unstacked: unchanged


def test_engine_decode_params_cached_by_identity():
    config = preset("tiny", family="qwen2")
    engine = Engine(config, num_slots=2, max_prompt_len=8, max_new_tokens=4,
                    sampling=SamplingConfig(temperature=0.0))
    params = init_params(config, jax.random.PRNGKey(3))
    first = engine.decode_params(params)
    assert engine.decode_params(params) is first  # no second copy for the same params
    new = jax.tree.map(lambda x: x + 1, params)  # e.g. after a training step
    second = engine.decode_params(new)
    assert second is not first
    np.testing.assert_array_equal(second["layers"][1]["q"], new["layers"]["q"][1])
    assert engine.decode_params(second) is second  # per-layer params pass through
    assert engine.compiles()["unstack"] == 1
    assert jnp.asarray(first["layers"][0]["q"]).shape == params["layers"]["q"].shape[1:]
