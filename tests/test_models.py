"""The transformer core: a float64 NumPy reference, KV-cache decoding, left padding, bf16,
parameter counts against transformers. (HF checkpoint parity lives in test_hf_interop.py.)"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import DENSE_FAMILIES, jit_forward, left_padded, random_params
from tiny_hf import HF_CLASSES, hf_config_for
from tolerances import model_tol

from ada.models import (
    ModelConfig,
    decode_params,
    forward,
    init_cache,
    param_shapes,
    positions_from_mask,
    preset,
)
from ada.models.transformer import rope_inv_freq

pytestmark = pytest.mark.numerics  # CI runs it again under another CPU's kernels

# bfloat16 compute (float32 params cast per block) against float32 compute: bf16 keeps 8
# mantissa bits, so logits of the tiny models move by ~1% of their largest value; 5% asserted.
BF16_REL_TOL = 0.05

# ----------------------------------------------------------------------------- NumPy reference


def numpy_forward(params, c: ModelConfig, tokens, positions, mask):
    """Float64 reference written from the paper-level definitions, one row at a time."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    inv_freq = np.asarray(rope_inv_freq(c), np.float64)  # llama3 scaling: checked vs HF below

    def rms(x, w):
        return w * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + c.rms_norm_eps)

    def rope(x, pos):  # x [T, N, Hd]
        ang = pos[:, None] * inv_freq[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos[:, None] + rot * sin[:, None]

    out = np.zeros(tokens.shape + (c.vocab_size,))
    for b in range(tokens.shape[0]):
        keep = np.flatnonzero(mask[b])
        x = p["embed"][tokens[b, keep]]
        pos = positions[b, keep].astype(np.float64)
        T = len(keep)
        for i in range(c.num_layers):
            w = {k: v[i] for k, v in p["layers"].items()}
            h = rms(x, w["attn_norm"])
            q, k, v = h @ w["q"], h @ w["k"], h @ w["v"]
            if c.qkv_bias:
                q, k, v = q + w["q_bias"], k + w["k_bias"], v + w["v_bias"]
            q = q.reshape(T, c.num_heads, c.head_dim)
            k = k.reshape(T, c.num_kv_heads, c.head_dim)
            v = v.reshape(T, c.num_kv_heads, c.head_dim)
            if c.qk_norm:
                q, k = rms(q, w["q_norm"]), rms(k, w["k_norm"])
            q, k = rope(q, pos), rope(k, pos)
            heads = []
            for hq in range(c.num_heads):
                hk = hq // (c.num_heads // c.num_kv_heads)
                s = q[:, hq] @ k[:, hk].T / math.sqrt(c.head_dim)
                s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
                s = np.exp(s - s.max(-1, keepdims=True))
                heads.append((s / s.sum(-1, keepdims=True)) @ v[:, hk])
            x = x + np.concatenate(heads, -1) @ w["o"]
            h = rms(x, w["mlp_norm"])
            g = h @ w["gate"]
            x = x + (g / (1 + np.exp(-g)) * (h @ w["up"])) @ w["down"]
        x = rms(x, p["final_norm"])
        out[b, keep] = x @ (p["embed"].T if c.tie_embeddings else p["lm_head"])
    return out


@pytest.fixture(scope="module", params=DENSE_FAMILIES)
def model(request):
    config = preset("tiny", family=request.param)
    return config, random_params(config, seed=DENSE_FAMILIES.index(request.param))


def test_forward_matches_numpy_float64(model):
    config, params = model
    tokens, mask, positions = left_padded(config.vocab_size)
    ref = numpy_forward(params, config, tokens, positions, mask)
    out, cache = jit_forward(params, config, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
    assert cache is None and out.dtype == jnp.float32 and out.shape == ref.shape
    diff = np.abs(np.asarray(out) - ref)[mask].max()
    assert diff <= model_tol(ref, config), diff


def test_llama3_rope_frequencies_match_transformers():
    """The one piece the NumPy reference borrows from ada, checked against transformers."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = preset("tiny", family="llama")
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config_for(config), "cpu")
    np.testing.assert_allclose(np.asarray(rope_inv_freq(config)), inv_freq.numpy(), rtol=1e-6)
    # all three bands (kept, scaled by 1/factor, smoothly interpolated) are exercised
    base = 1.0 / config.rope_theta ** (np.arange(0, config.head_dim, 2) / config.head_dim)
    ratio = inv_freq.numpy() / base
    assert np.isclose(ratio, 1).any() and np.isclose(ratio, 1 / 8).any()
    assert ((ratio > 1 / 8 + 1e-3) & (ratio < 1 - 1e-3)).any()


# ----------------------------------------------------------------------------- KV cache


def _decode(params, config, tokens, mask, positions, chunks, max_len):
    """Prefill the first chunk, then feed the rest in the given chunk sizes through the cache."""
    cache = init_cache(config, tokens.shape[0], max_len)
    outs, start = [], 0
    for n in chunks:
        sl = slice(start, start + n)
        out, cache = jit_forward(params, config, jnp.asarray(tokens[:, sl]),
                                 jnp.asarray(positions[:, sl]), jnp.asarray(mask[:, sl]), cache)
        outs.append(np.asarray(out))
        start += n
    assert start == tokens.shape[1]
    return np.concatenate(outs, axis=1), cache


@pytest.mark.slow
def test_incremental_decode_equals_full_forward(model):
    config, params = model
    tokens, mask, positions = left_padded(config.vocab_size)
    full, _ = jit_forward(params, config, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
    T = tokens.shape[1]
    chunks = [14] + [1] * (T - 14)  # prefill (covers every row's padding), then 1-token steps
    inc, cache = _decode(params, config, tokens, mask, positions, chunks, max_len=T + 4)
    diff = np.abs(inc - np.asarray(full))[mask].max()
    assert diff <= model_tol(full, config), diff
    np.testing.assert_array_equal(np.asarray(cache.end), [T] * 3)
    np.testing.assert_array_equal(np.asarray(cache.valid)[:, :T], mask)
    assert not np.asarray(cache.valid)[:, T:].any()
    # multi-token chunks after the prefill go through the same path
    inc2, _ = _decode(params, config, tokens, mask, positions, [14, 3, 3], max_len=T + 4)
    diff2 = np.abs(inc2 - np.asarray(full))[mask].max()
    assert diff2 <= model_tol(full, config), diff2


@pytest.mark.slow
def test_decode_params_equal_stacked(model):
    """The decode form of the params (decode_params: one buffer per layer, a materialised
    [D, V] unembedding when tied) gives what the stacked params give: the cache bit for bit,
    logits up to rounding (the tied unembedding is a different dot)."""
    config, params = model
    split = decode_params(params, config)
    assert len(split["layers"]) == config.num_layers and decode_params(split, config) is split
    np.testing.assert_array_equal(split["layers"][1]["q"], params["layers"]["q"][1])
    if config.tie_embeddings:
        np.testing.assert_array_equal(split["lm_head"], params["embed"].T)
    tokens, mask, positions = left_padded(config.vocab_size)
    T = tokens.shape[1]
    stacked, stacked_cache = _decode(params, config, tokens, mask, positions, [14, 1, 5], T + 2)
    per_layer, per_layer_cache = _decode(split, config, tokens, mask, positions, [14, 1, 5], T + 2)
    np.testing.assert_allclose(per_layer, stacked, atol=model_tol(stacked, config))
    for a, b in zip(jax.tree_util.tree_leaves(per_layer_cache),
                    jax.tree_util.tree_leaves(stacked_cache), strict=True):
        np.testing.assert_array_equal(a, b)
    args = [jnp.asarray(a) for a in (tokens, positions, mask)]
    np.testing.assert_allclose(np.asarray(jit_forward(split, config, *args)[0]),
                               np.asarray(jit_forward(params, config, *args)[0]),
                               atol=model_tol(stacked, config))
    # Without the unembedding copy (the TPU's form): a tied embedding is held once and serves
    # the gather and the unembedding; the same logits up to rounding.
    once = decode_params(params, config, unembed_copy=False)
    assert ("lm_head" in once) == (not config.tie_embeddings)
    assert decode_params(once, config, unembed_copy=False) is once
    once_logits, once_cache = _decode(once, config, tokens, mask, positions, [14, 1, 5], T + 2)
    np.testing.assert_allclose(once_logits, stacked, atol=model_tol(stacked, config))
    for a, b in zip(jax.tree_util.tree_leaves(once_cache),
                    jax.tree_util.tree_leaves(stacked_cache), strict=True):
        np.testing.assert_array_equal(a, b)


def test_attention_window_equals_whole_cache(model):
    """attend_len = the filled prefix (+ the new token) gives the whole-cache result (up to
    summation order: a shorter reduction rounds differently in the last bits): the unread
    tail holds nothing a query may see. A window past the cache is refused."""
    config, params = model
    tokens, mask, positions = left_padded(config.vocab_size)
    T = tokens.shape[1]
    _, cache = _decode(params, config, tokens[:, :-1], mask[:, :-1], positions[:, :-1],
                       [T - 1], max_len=T + 20)
    step = lambda **kw: forward(params, config, jnp.asarray(tokens[:, -1:]),  # noqa: E731
                                jnp.asarray(positions[:, -1:]), jnp.asarray(mask[:, -1:]),
                                cache, **kw)
    whole, whole_cache = step()
    windowed, windowed_cache = step(attend_len=T)
    np.testing.assert_allclose(np.asarray(windowed), np.asarray(whole),
                               atol=model_tol(whole, config))
    for a, b in zip(jax.tree_util.tree_leaves(windowed_cache),
                    jax.tree_util.tree_leaves(whole_cache), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=model_tol(b, config))
    with pytest.raises(ValueError, match="attend_len"):
        step(attend_len=T + 21)


def test_read_then_write_equals_write_then_read(model):
    """Decode reading the cache before the step's write (the TPU's form, forward's
    read_then_write) gives the logits and the cache of writing first, windowed or not, and
    a row whose new token is padding (an idle slot) gives the same cache too."""
    config, params = model
    tokens, mask, positions = left_padded(config.vocab_size)
    T = tokens.shape[1]
    _, cache = _decode(params, config, tokens[:, :-1], mask[:, :-1], positions[:, :-1],
                       [T - 1], max_len=T + 20)
    step_mask = mask[:, -1:].copy()
    step_mask[1] = False  # an idle slot
    for attend_len in (None, T):
        outs = [forward(params, config, jnp.asarray(tokens[:, -1:]),
                        jnp.asarray(positions[:, -1:]), jnp.asarray(step_mask), cache,
                        attend_len=attend_len, read_then_write=rtw) for rtw in (False, True)]
        (first, first_cache), (second, second_cache) = outs
        live = step_mask[:, 0]
        np.testing.assert_allclose(np.asarray(second)[live], np.asarray(first)[live],
                                   atol=model_tol(first, config))
        # the same entries written (later layers' from inputs equal up to rounding)
        for a, b in zip(jax.tree_util.tree_leaves(second_cache),
                        jax.tree_util.tree_leaves(first_cache), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=model_tol(b, config))
        np.testing.assert_array_equal(np.asarray(second_cache.k[0]), np.asarray(first_cache.k[0]))


def test_left_padding_is_invisible(model):
    config, params = model
    tokens, mask, positions = left_padded(config.vocab_size)
    out = np.asarray(jit_forward(params, config, jnp.asarray(tokens), jnp.asarray(positions),
                                 jnp.asarray(mask))[0])
    # other ids in the padding slots change nothing
    junk = np.where(mask, tokens, (tokens + 17) % config.vocab_size)
    out_junk = np.asarray(jit_forward(params, config, jnp.asarray(junk), jnp.asarray(positions),
                                      jnp.asarray(mask))[0])
    np.testing.assert_array_equal(out[mask], out_junk[mask])
    # the padded row equals the same tokens run alone without padding
    row = tokens[2:3, 11:]
    alone, _ = jit_forward(params, config, jnp.asarray(row), jnp.arange(row.shape[1])[None], None)
    diff = np.abs(np.asarray(alone)[0] - out[2, 11:]).max()
    assert diff <= model_tol(out, config), diff


def test_positions_from_mask_brute_force():
    rng = np.random.default_rng(0)
    mask = np.arange(12)[None, :] >= rng.integers(0, 13, (6, 1))  # left padding of 0..12
    got = np.asarray(positions_from_mask(jnp.asarray(mask)))
    for b in range(6):
        expect, n = [], 0
        for real in mask[b]:
            expect.append(n if real else 0)
            n += bool(real)
        assert got[b].tolist() == expect


# ----------------------------------------------------------------------------- bfloat16


@pytest.mark.slow
def test_bfloat16_compute_close_to_float32(model):
    config, params = model
    tokens, mask, positions = left_padded(config.vocab_size)
    args = (jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
    ref = np.asarray(jit_forward(params, config, *args)[0])
    bf16 = config.replace(dtype="bfloat16")
    out = np.asarray(jit_forward(params, bf16, *args)[0])
    assert out.dtype == np.float32 and np.isfinite(out).all()
    scale = np.abs(ref[mask]).max()
    rel = np.abs(out - ref)[mask].max() / scale
    assert 0 < rel <= BF16_REL_TOL, rel  # > 0: the bf16 path really ran in bf16
    if config.family != "qwen3":  # the decode path below is family-independent; save compiles
        return
    # bf16 params too, and bf16 decoding through a bf16 cache
    bf16_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    bf16 = bf16.replace(param_dtype="bfloat16")
    inc, cache = _decode(bf16_params, bf16, tokens, mask, positions, [14] + [1] * 6, max_len=24)
    assert {k.dtype for k in cache.k + cache.v} == {jnp.dtype(jnp.bfloat16)}
    rel_inc = np.abs(inc - ref)[mask].max() / scale
    assert rel_inc <= BF16_REL_TOL, rel_inc


# ----------------------------------------------------------------------------- config, counts


@pytest.mark.parametrize("family", DENSE_FAMILIES)
@pytest.mark.parametrize("name, lo, hi", [("tiny", 1e5, 1e6), ("small", 1e7, 3e7)])
def test_param_count_matches_transformers(family, name, lo, hi):
    config = preset(name, family=family)
    with torch.device("meta"):  # shapes only, no memory
        hf = HF_CLASSES[family][1](hf_config_for(config))
    n_hf = sum(p.numel() for p in hf.parameters())
    n_ada = sum(math.prod(s) for s in jax.tree.leaves(param_shapes(config),
                                                      is_leaf=lambda x: isinstance(x, tuple)))
    assert n_ada == n_hf
    assert lo <= n_ada <= hi


@pytest.mark.parametrize("changes, match", [
    (dict(family="gpt2"), "family='gpt2' is not one of"),
    (dict(num_kv_heads=3), "num_heads=4 is not a multiple of num_kv_heads=3"),
    (dict(head_dim=15), "head_dim=15 must be even"),
    (dict(dtype="float16"), "dtype='float16' must be 'float32' or 'bfloat16'"),
    (dict(vocab_size=0), "vocab_size=0 must be positive"),
])
def test_model_config_rejects(changes, match):
    with pytest.raises(ValueError, match=match):
        preset("tiny", family="qwen2").replace(**changes)
