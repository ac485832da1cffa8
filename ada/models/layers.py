"""The transformer's building blocks: norms, RoPE, attention, cache writes, dense products.

Pure functions, shared by the dense-cache forward (ada/models/transformer.py) and the paged
one (ada/models/paged_attention.py). Shape suffixes as in transformer.py.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ada.models.model_config import LinearRopeScaling, ModelConfig


def rms_norm(x, weight, eps, plus_one: bool = False):
    """RMSNorm computed in float32 and cast back, as transformers does. `plus_one`: Gemma's
    (1 + w) scale, applied in float32 before the cast (transformers' Gemma RMSNorm)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if plus_one:
        return (x32 * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)
    return weight.astype(x.dtype) * x32.astype(x.dtype)


def rope_inv_freq(config: ModelConfig, local: bool = False) -> jax.Array:
    """RoPE inverse frequencies of the global layers, or with `local` of the sliding-window
    layers (their own base, `rope_local_theta`, and no scaling: Gemma 3)."""
    hd = config.head_dim
    theta = (config.rope_local_theta or config.rope_theta) if local else config.rope_theta
    inv_freq = 1.0 / (theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    s = None if local else config.rope_scaling
    if s is None:
        return inv_freq
    if isinstance(s, LinearRopeScaling):
        return inv_freq / s.factor
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, smoothed, scaled)


def apply_rope(x_BxTxNxHd, positions_BxT, inv_freq):
    """Rotate-half RoPE (the transformers convention), angles in float32."""
    angles = positions_BxT.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Hd/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos = jnp.cos(angles).astype(x_BxTxNxHd.dtype)
    sin = jnp.sin(angles).astype(x_BxTxNxHd.dtype)
    half = x_BxTxNxHd.shape[-1] // 2
    rotated = jnp.concatenate([-x_BxTxNxHd[..., half:], x_BxTxNxHd[..., :half]], axis=-1)
    return x_BxTxNxHd * cos + rotated * sin


def softcap(x, cap: float | None):
    """cap * tanh(x / cap) (Gemma 2's attention and final logits); identity for None."""
    return x if cap is None else cap * jnp.tanh(x / cap)


def score_scale(config: ModelConfig) -> float:
    """The factor q.k scores are scaled by: query_pre_attn_scalar**-0.5 for Gemma, else
    head_dim**-0.5 (`scale_scores`; the paged TPU kernel's sm_scale)."""
    return (config.query_pre_attn_scalar or config.head_dim) ** -0.5


def scale_scores(scores, config: ModelConfig):
    """q.k scores (float32) scaled, then soft-capped: Gemma scales by
    query_pre_attn_scalar**-0.5, the other families divide by sqrt(head_dim)."""
    if config.query_pre_attn_scalar is None:
        scores = scores / math.sqrt(config.head_dim)
    else:
        scores = scores * config.query_pre_attn_scalar ** -0.5
    return softcap(scores, config.attn_logit_softcap)


def attention(q_BxTxHxHd, k_BxKxSxHd, v_BxKxSxHd, allowed_BxTxS, config: ModelConfig):
    B, T, H, Hd = q_BxTxHxHd.shape
    K = config.num_kv_heads
    q = q_BxTxHxHd.reshape(B, T, K, H // K, Hd)
    scores = jnp.einsum("btkgh,bksh->bkgts", q, k_BxKxSxHd).astype(jnp.float32)
    scores = scale_scores(scores, config)
    scores = jnp.where(allowed_BxTxS[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxKxSxHd.dtype)
    # The dot's own output order ([B, K, G, T, Hd]: batch, then each side's free dims), the
    # small result transposed after: asked for [B, T, K, G, Hd] directly, XLA:CPU computes
    # the transposed product and transposes the value cache to feed it (cache-sized, per
    # layer and step, where a device holds one KV head: tests/test_decode_hlo.py).
    out = jnp.einsum("bkgts,bksh->bkgth", probs, v_BxKxSxHd).transpose(0, 3, 1, 2, 4)
    return out.reshape(B, T, H * Hd)


def decode_attention(q_Bx1xHxHd, k_BxKxWxHd, v_BxKxWxHd, k_Bx1xKxHd, v_Bx1xKxHd, allowed_Bx1xW,
                     start_B, config: ModelConfig):
    """One query per row against the cache before this step's write ([0, W)) and the row's
    new key and value, which belong at cache position start_B[b]: attention's numbers over
    the written cache, reading only the unwritten one. The new key's score takes its
    position's place among the scores (a [B, K, G, W] select; the softmax is the same sum in
    the same order); its value joins the weighted sum after the cache's."""
    B, _, H, Hd = q_Bx1xHxHd.shape
    K = config.num_kv_heads
    W = k_BxKxWxHd.shape[2]
    q = q_Bx1xHxHd.reshape(B, 1, K, H // K, Hd)
    scores = jnp.einsum("btkgh,bksh->bkgts", q, k_BxKxWxHd).astype(jnp.float32)
    own = jnp.einsum("btkgh,btkh->bkgt", q, k_Bx1xKxHd.astype(q.dtype)).astype(jnp.float32)
    at_new = (jnp.arange(W)[None, :] == start_B[:, None])[:, None, None, None]  # [B,1,1,1,W]
    scores = scale_scores(jnp.where(at_new, own[..., None], scores), config)
    scores = jnp.where(allowed_Bx1xW[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxKxWxHd.dtype)  # [B, K, G, 1, W]
    out = jnp.einsum("bkgts,bksh->bkgth", jnp.where(at_new, 0, probs), v_BxKxWxHd)
    p_new = jnp.sum(jnp.where(at_new, probs, 0), axis=-1)  # [B, K, G, 1]
    out = out + p_new[..., None] * v_Bx1xKxHd.astype(out.dtype).transpose(0, 2, 1, 3)[:, :, None]
    return out.transpose(0, 3, 1, 2, 4).reshape(B, 1, H * Hd)


def write_rows(cache_BxSx, new_BxTx, start_B):
    """Write each row's T new entries at that row's own start index."""
    def one(c, n, s):
        return jax.lax.dynamic_update_slice_in_dim(c, n, s, axis=0)

    return jax.vmap(one)(cache_BxSx, new_BxTx.astype(cache_BxSx.dtype), start_B)


def write_kv(cache_BxKxSxHd, new_BxTxKxHd, start_B):
    """Write one layer's new keys or values in place: row b, head k at positions
    start_B[b] + t. A scatter touches only the B*T*K new [Hd] rows, so a decode step does
    not copy the cache. Each head is its own scatter index, not part of the update window:
    with a [K, Hd] window and two or more heads per chip, the TPU compiler laid the cache
    out heads-minor inside the decode loop and relaid every layer's cache in and out of
    each chunk (tests/test_decode_hlo.py)."""
    B, T, K = new_BxTxKxHd.shape[:3]
    rows = jnp.arange(B)[:, None, None]
    heads = jnp.arange(K)[None, None, :]
    cols = (start_B[:, None] + jnp.arange(T)[None, :])[:, :, None]
    new = new_BxTxKxHd.astype(cache_BxKxSxHd.dtype)  # indexed region: [B, T, K, Hd]
    return cache_BxKxSxHd.at[rows, heads, cols].set(new, mode="drop")


def dense(x_BxTxI, w_IxO):
    """x @ w as one 2-D matmul over the flattened rows. Same numbers; its backward is then a
    plain [I, rows] x [rows, O] product for the weight gradient, which XLA:CPU runs ~17%
    faster in the train step than the 3-D contraction's transposes (docs/results.md)."""
    rows = x_BxTxI.reshape(-1, x_BxTxI.shape[-1]) @ w_IxO
    return rows.reshape(*x_BxTxI.shape[:-1], w_IxO.shape[-1])


def linear(x_BxTxI, w, name: str):
    """x @ w[name], plus its low-rank adapter ((x @ A) * scale) @ B where `w` holds one
    (ada/models/lora.py): the product on the r-wide side, so no merged weight exists."""
    y = dense(x_BxTxI, w[name])
    if name + "_lora_a" not in w:
        return y
    low = dense(x_BxTxI, w[name + "_lora_a"]) * w["lora_scale"]
    return y + dense(low, w[name + "_lora_b"])
