"""One decoder-only transformer for the Qwen2/2.5, Qwen3 and Llama 3 families.

Pure functions over a parameter pytree; the config is a frozen (hashable) dataclass so it
can be a static argument of `jax.jit`. The families differ only in a few switches:

  family   q/k/v bias   per-head q/k RMSNorm   head_dim          RoPE scaling
  qwen2    yes          no                     hidden / heads    none
  qwen3    no           yes                    free (config)     none
  llama    no           no                     hidden / heads    llama3 (optional)

Parameter layout (weights stored [in, out]; every per-layer tensor is stacked on a leading
layer axis L so the training forward runs the blocks under `lax.scan`, which keeps compile
time flat in depth):

  embed [V, D]; final_norm [D]; lm_head [D, V] (absent when embeddings are tied)
  layers/attn_norm [L, D]  layers/q [L, D, H*Hd]  layers/k, layers/v [L, D, K*Hd]
  layers/o [L, H*Hd, D]    layers/q_bias [L, H*Hd], k_bias/v_bias [L, K*Hd]  (qkv_bias)
  layers/q_norm, layers/k_norm [L, Hd]  (qk_norm)
  layers/mlp_norm [L, D]   layers/gate, layers/up [L, D, F]  layers/down [L, F, D]

Shape suffixes: B batch, T new tokens, S cache length, D hidden, H query heads,
K key/value heads, G = H // K, Hd head dim, F MLP width, V vocabulary, L layers.

With a KV cache (prefill and decode) the blocks run in a Python loop instead, one layer's
weights and cache at a time: the cache is a tuple of per-layer arrays, and `decode_params`
turns the stacked weights into a list of per-layer dicts. Each layer then reads its own
buffers. Under `lax.scan`, XLA:CPU copies every layer's weight slice and cache slice out of
the stacked arrays on every decode step, and decode is memory-bound (benchmarks/decode.py).
The cost is a compile time that grows with depth for the cached path.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

Params = dict[str, Any]

FAMILIES = ("qwen2", "qwen3", "llama")


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    max_position_embeddings: int = 32768
    dtype: str = "float32"  # compute dtype: "float32" or "bfloat16"
    param_dtype: str = "float32"

    def __post_init__(self):
        problems = []
        if self.family not in FAMILIES:
            problems.append(f"family={self.family!r} is not one of {FAMILIES}")
        if self.num_heads % max(self.num_kv_heads, 1):
            problems.append(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} must be even for RoPE")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16"):
                problems.append(f"{name}={getattr(self, name)!r} must be 'float32' or 'bfloat16'")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be positive")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


@struct.dataclass
class KVCache:
    """Keys and values of every layer for B rows of up to S tokens.

    `valid[b, s]` marks the cache entries that hold real (non-padding) tokens and `end[b]` is
    the next write index of row b. Causality is by cache index, RoPE by explicit position, so
    a left-padded prompt and its decode steps need no special casing.

    Keys and values share one layout, head dim minor: the TPU's q.k and p.v dots and the
    scatter that writes a step's entries in place all read it where it lies. (Keys stored
    [B, K, Hd, S], as XLA:CPU's broadcast-multiply-reduce once preferred, cost the TPU three
    cache-sized relayout copies per layer per step; XLA:CPU is as fast with this one:
    docs/results.md, "Decode on TPU".)
    """

    k: tuple[jax.Array, ...]  # L x [B, K, S, Hd]
    v: tuple[jax.Array, ...]  # L x [B, K, S, Hd]
    valid: jax.Array  # [B, S] bool
    end: jax.Array  # [B] int32

    @property
    def max_len(self) -> int:
        return self.v[0].shape[2]


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    dtype = dtype or config.compute_dtype
    K, Hd, L = config.num_kv_heads, config.head_dim, config.num_layers
    return KVCache(
        k=tuple(jnp.zeros((batch, K, max_len, Hd), dtype) for _ in range(L)),
        v=tuple(jnp.zeros((batch, K, max_len, Hd), dtype) for _ in range(L)),
        valid=jnp.zeros((batch, max_len), bool),
        end=jnp.zeros((batch,), jnp.int32),
    )


# ----------------------------------------------------------------------------- parameters


def param_shapes(config: ModelConfig) -> dict[str, Any]:
    """The parameter pytree's shapes (nested dicts of tuples); the one source of the layout."""
    c = config
    L, D, F, V = c.num_layers, c.hidden_size, c.intermediate_size, c.vocab_size
    qd, kvd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layers = {
        "attn_norm": (L, D),
        "q": (L, D, qd),
        "k": (L, D, kvd),
        "v": (L, D, kvd),
        "o": (L, qd, D),
        "mlp_norm": (L, D),
        "gate": (L, D, F),
        "up": (L, D, F),
        "down": (L, F, D),
    }
    if c.qkv_bias:
        layers.update(q_bias=(L, qd), k_bias=(L, kvd), v_bias=(L, kvd))
    if c.qk_norm:
        layers.update(q_norm=(L, c.head_dim), k_norm=(L, c.head_dim))
    shapes = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
    if not c.tie_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def init_params(config: ModelConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random parameters (normal(0, std) weights, zero biases, unit norms)."""
    shapes = param_shapes(config)
    flat, treedef = jax.tree_util.tree_flatten_with_path(
        shapes, is_leaf=lambda x: isinstance(x, tuple)
    )
    keys = jax.random.split(key, len(flat))
    dtype = jnp.dtype(config.param_dtype)
    leaves = []
    for (path, shape), k in zip(flat, keys, strict=True):
        name = path[-1].key
        if name.endswith("norm"):
            leaves.append(jnp.ones(shape, dtype))
        elif name.endswith("bias"):
            leaves.append(jnp.zeros(shape, dtype))
        else:
            leaves.append((std * jax.random.normal(k, shape, jnp.float32)).astype(dtype))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _per_layer(layers, num_layers: int) -> list:
    """Stacked layer weights as a list of per-layer dicts (a list passes through)."""
    if isinstance(layers, list | tuple):
        return list(layers)
    return [jax.tree.map(lambda x, i=i: x[i], layers) for i in range(num_layers)]


def in_decode_form(params: Params, config: ModelConfig, unembed_copy: bool = True) -> bool:
    return isinstance(params["layers"], list | tuple) and (
        "lm_head" in params or not (config.tie_embeddings and unembed_copy))


def decode_params(params: Params, config: ModelConfig, *, unembed_copy: bool = True) -> Params:
    """The params in the form the cached forward reads fastest (module docstring): `layers`
    as a list of per-layer dicts, one buffer per layer and weight, and for tied embeddings
    with `unembed_copy` the unembedding materialised as `lm_head` [D, V] (XLA:CPU's dot reads
    [D, V] ~1.7x faster than it contracts against [V, D]). Without it the tied embedding is
    held once and serves both the gather and the unembedding (the TPU's matmul reads [V, D]
    where it lies; the engine picks per backend, `ada.sampling.engine.backend_choices`). A copy
    of the weights; idempotent."""
    if in_decode_form(params, config, unembed_copy):
        return params
    out = dict(params, layers=_per_layer(params["layers"], config.num_layers))
    if config.tie_embeddings and unembed_copy:
        out["lm_head"] = params["embed"].T
    return out


# ----------------------------------------------------------------------------- building blocks


def rms_norm(x, weight, eps):
    """RMSNorm computed in float32 and cast back, as transformers does."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * x32.astype(x.dtype)


def rope_inv_freq(config: ModelConfig) -> jax.Array:
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    s = config.rope_scaling
    if s is None:
        return inv_freq
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


def _attention(q_BxTxHxHd, k_BxKxSxHd, v_BxKxSxHd, allowed_BxTxS, config: ModelConfig):
    B, T, H, Hd = q_BxTxHxHd.shape
    K = config.num_kv_heads
    q = q_BxTxHxHd.reshape(B, T, K, H // K, Hd)
    scores = jnp.einsum("btkgh,bksh->bkgts", q, k_BxKxSxHd).astype(jnp.float32)
    scores = scores / math.sqrt(Hd)
    scores = jnp.where(allowed_BxTxS[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxKxSxHd.dtype)
    # The dot's own output order ([B, K, G, T, Hd]: batch, then each side's free dims), the
    # small result transposed after: asked for [B, T, K, G, Hd] directly, XLA:CPU computes
    # the transposed product and transposes the value cache to feed it (cache-sized, per
    # layer and step, where a device holds one KV head: tests/test_decode_hlo.py).
    out = jnp.einsum("bkgts,bksh->bkgth", probs, v_BxKxSxHd).transpose(0, 3, 1, 2, 4)
    return out.reshape(B, T, H * Hd)


def _decode_attention(q_Bx1xHxHd, k_BxKxWxHd, v_BxKxWxHd, k_Bx1xKxHd, v_Bx1xKxHd, allowed_Bx1xW,
                      start_B, config: ModelConfig):
    """One query per row against the cache before this step's write ([0, W)) and the row's
    new key and value, which belong at cache position start_B[b]: _attention's numbers over
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
    scores = jnp.where(at_new, own[..., None], scores) / math.sqrt(Hd)
    scores = jnp.where(allowed_Bx1xW[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxKxWxHd.dtype)  # [B, K, G, 1, W]
    out = jnp.einsum("bkgts,bksh->bkgth", jnp.where(at_new, 0, probs), v_BxKxWxHd)
    p_new = jnp.sum(jnp.where(at_new, probs, 0), axis=-1)  # [B, K, G, 1]
    out = out + p_new[..., None] * v_Bx1xKxHd.astype(out.dtype).transpose(0, 2, 1, 3)[:, :, None]
    return out.transpose(0, 3, 1, 2, 4).reshape(B, 1, H * Hd)


def _write_rows(cache_BxSx, new_BxTx, start_B):
    """Write each row's T new entries at that row's own start index."""
    def one(c, n, s):
        return jax.lax.dynamic_update_slice_in_dim(c, n, s, axis=0)

    return jax.vmap(one)(cache_BxSx, new_BxTx.astype(cache_BxSx.dtype), start_B)


def _write_kv(cache_BxKxSxHd, new_BxTxKxHd, start_B):
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


def _dense(x_BxTxI, w_IxO):
    """x @ w as one 2-D matmul over the flattened rows. Same numbers; its backward is then a
    plain [I, rows] x [rows, O] product for the weight gradient, which XLA:CPU runs ~17%
    faster in the train step than the 3-D contraction's transposes (docs/results.md)."""
    rows = x_BxTxI.reshape(-1, x_BxTxI.shape[-1]) @ w_IxO
    return rows.reshape(*x_BxTxI.shape[:-1], w_IxO.shape[-1])


def _block(x_BxTxD, layer, kv, ctx, config: ModelConfig):
    """One pre-norm transformer block.

    `kv` is None (no cache) or this layer's (k, v) cache, each [B, K, S, Hd];
    returns the new activations and the updated (k, v).
    """
    c = config
    dt = c.compute_dtype
    B, T, _ = x_BxTxD.shape
    H, K, Hd = c.num_heads, c.num_kv_heads, c.head_dim
    w = {name: value.astype(dt) for name, value in layer.items()}

    h = rms_norm(x_BxTxD, w["attn_norm"], c.rms_norm_eps)
    q, k, v = _dense(h, w["q"]), _dense(h, w["k"]), _dense(h, w["v"])
    if c.qkv_bias:
        q, k, v = q + w["q_bias"], k + w["k_bias"], v + w["v_bias"]
    q = q.reshape(B, T, H, Hd)
    k = k.reshape(B, T, K, Hd)
    v = v.reshape(B, T, K, Hd)
    if c.qk_norm:
        q = rms_norm(q, w["q_norm"], c.rms_norm_eps)
        k = rms_norm(k, w["k_norm"], c.rms_norm_eps)
    q = apply_rope(q, ctx["positions"], ctx["inv_freq"])
    k = apply_rope(k, ctx["positions"], ctx["inv_freq"])

    if kv is None:
        attn = _attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), ctx["allowed"], c)
    elif T == 1 and ctx["read_then_write"]:
        # Decode: attend to the cache as it was plus the new key and value, then write them
        # (forward's read_then_write).
        W = ctx["attend_len"]  # attend to cache positions [0, W) only
        attn = _decode_attention(q, *(cache[:, :, :W].astype(dt) for cache in kv), k, v,
                                 ctx["allowed"], ctx["start"], c)
        kv = (_write_kv(kv[0], k, ctx["start"]), _write_kv(kv[1], v, ctx["start"]))
    else:
        kv = (_write_kv(kv[0], k, ctx["start"]), _write_kv(kv[1], v, ctx["start"]))
        W = ctx["attend_len"]  # attend to cache positions [0, W) only
        keys, values = (cache[:, :, :W].astype(dt) for cache in kv)
        attn = _attention(q, keys, values, ctx["allowed"], c)
    x_BxTxD = x_BxTxD + _dense(attn, w["o"])

    h = rms_norm(x_BxTxD, w["mlp_norm"], c.rms_norm_eps)
    mlp = _dense(jax.nn.silu(_dense(h, w["gate"])) * _dense(h, w["up"]), w["down"])
    return x_BxTxD + mlp, kv


def forward(
    params: Params,
    config: ModelConfig,
    tokens_BxT: jax.Array,
    positions_BxT: jax.Array,
    mask_BxT: jax.Array | None = None,
    cache: KVCache | None = None,
    *,
    remat: bool = False,
    return_hidden: bool = False,
    attend_len: int | None = None,
    unroll: bool = False,
    read_then_write: bool = False,
):
    """Run the model on T new tokens per row.

    Args:
      tokens_BxT, positions_BxT: token ids and their RoPE positions (left padding: padded
        slots can hold any id and position; they are excluded through `mask_BxT`).
      mask_BxT: True for real tokens. Default: all real.
      cache: when given, the new keys/values are written at `cache.end` of each row and the
        queries attend to every valid earlier cache entry; the updated cache is returned.
      remat: rematerialise each block in the backward pass (saves activation memory).
      return_hidden: return the final normed hidden states [B, T, D] instead of logits (the
        training loss projects them in chunks so [B, T, V] never has to exist at once).
      unroll: without a cache, run the blocks in a Python loop over per-layer slices, not
        under `lax.scan`: no stacked per-layer residuals to fill and slice in the backward
        pass (faster at small depth), at a compile time that grows with depth.
      attend_len: with a cache, attend to cache positions [0, attend_len) only (static; the
        decode engine's window buckets). Every row whose output matters must have its new
        tokens inside the window (cache.end + T <= attend_len); the cache is written in
        full either way. Decode attention is memory-bound in the cache length, so short
        responses in a long cache then read only what they filled.
      read_then_write: with a cache and one new token per row (decode), attend to the cache
        as it was plus the new key and value, then write them, instead of writing first and
        attending to the written cache (the same numbers up to rounding). The reads then
        need not wait for the write: the TPU compiler streams the cache from HBM and
        scatters the new entries in place, where after a write it staged whole caches in
        on-chip memory and wrote them back (1.4-1.6x the step's floor for the Llama 3.2 3B
        and Qwen3 4B presets). XLA:CPU instead copies the loop-carried cache to keep its old
        value, so the engine chooses per backend (ada.sampling.engine.backend_choices).

    Returns:
      (logits [B, T, V] float32 — or hidden states —, updated cache or None)
    """
    c = config
    B, T = tokens_BxT.shape
    if mask_BxT is None:
        mask_BxT = jnp.ones((B, T), bool)
    mask_BxT = mask_BxT.astype(bool)
    inv_freq = rope_inv_freq(c)

    if cache is None:
        idx = jnp.arange(T)
        allowed = mask_BxT[:, None, :] & (idx[None, :, None] >= idx[None, None, :])
        start = None
    else:
        start = cache.end
        S = cache.max_len
        new_valid = _write_rows(cache.valid, mask_BxT, start)
        q_idx_BxT = start[:, None] + jnp.arange(T)[None, :]
        W = S if attend_len is None else attend_len
        if not 0 < W <= S:
            raise ValueError(f"attend_len={attend_len} must be in [1, cache length {S}]")
        allowed = new_valid[:, None, :W] & (jnp.arange(W)[None, None, :] <= q_idx_BxT[:, :, None])

    ctx = {"positions": positions_BxT, "inv_freq": inv_freq, "allowed": allowed, "start": start,
           "attend_len": None if cache is None else W, "read_then_write": read_then_write}
    x = params["embed"].astype(c.compute_dtype)[tokens_BxT]
    layers = params["layers"]

    if cache is None and not unroll and not isinstance(layers, list | tuple):
        def body(x, layer):
            return _block(x, layer, None, ctx, c)[0], None

        if remat:
            body = jax.checkpoint(body, prevent_cse=False)
        x, _ = jax.lax.scan(body, x, layers)
        new_cache = None
    else:
        # One layer at a time, each with its own weight and cache buffers (module docstring).
        block = jax.checkpoint(_block, static_argnums=(4,)) if remat else _block
        ks, vs = [], []
        # (stacked weights work too, as static slices: XLA:CPU copies them each call)
        for i, layer in enumerate(_per_layer(layers, c.num_layers)):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            x, kv = block(x, layer, kv, ctx, c)
            if kv is not None:
                ks.append(kv[0])
                vs.append(kv[1])
        new_cache = (None if cache is None
                     else KVCache(k=tuple(ks), v=tuple(vs), valid=new_valid, end=cache.end + T))

    x = rms_norm(x, params["final_norm"].astype(c.compute_dtype), c.rms_norm_eps)
    if return_hidden:
        return x, new_cache
    return project_logits(params, config, x), new_cache


def project_logits(params: Params, config: ModelConfig, hidden_BxTxD) -> jax.Array:
    """Logits [B, T, V] float32, from `lm_head` [D, V] when the params have one (untied, or
    tied in decode form), else against the tied embedding [V, D] directly (no transposed
    copy per call)."""
    dt = config.compute_dtype
    if "lm_head" in params:
        logits = hidden_BxTxD @ params["lm_head"].astype(dt)
    else:
        logits = jnp.einsum("btd,vd->btv", hidden_BxTxD, params["embed"].astype(dt))
    return logits.astype(jnp.float32)


def positions_from_mask(mask_BxT: jax.Array) -> jax.Array:
    """RoPE positions for a left-padded batch: 0 at each row's first real token."""
    mask = mask_BxT.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)
