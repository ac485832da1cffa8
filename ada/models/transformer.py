"""One decoder-only transformer for the Qwen2/2.5, Qwen3, Llama 3, Gemma 2 and Gemma 3 families.

Pure functions over a parameter pytree; the config (ada/models/model_config.py) is a frozen
(hashable) dataclass so it can be a static argument of `jax.jit`. The families differ only
in a few switches (each family's are its row of ada/models/families.py):

  family   q/k/v bias  q/k RMSNorm  head_dim        RoPE scaling        attention
  qwen2    yes         no           hidden / heads  none                global
  qwen3    no          yes          free (config)   none                global
  llama    no          no           hidden / heads  llama3 (optional)   global
  gemma2   no          no           free (config)   none                local 1:1 global,
                                                                        soft-capped scores
  gemma3   no          yes          free (config)   linear (global      local 5:1 global,
                                                    layers; optional)   own local RoPE base

Gemma's block besides: RMSNorm scales by (1 + w), norms after attention and after the MLP
as well as before, a GeGLU MLP (tanh GELU), embeddings scaled by sqrt(hidden), scores
scaled by query_pre_attn_scalar**-0.5, and Gemma 2's final logits soft-capped. A local
layer's query at position p sees keys at positions > p - window (`sliding_windows`).

Parameter layout (weights stored [in, out]; every per-layer tensor is stacked on a leading
layer axis L so the training forward runs the blocks under `lax.scan`, which keeps compile
time flat in depth):

  embed [V, D]; final_norm [D]; lm_head [D, V] (absent when embeddings are tied)
  layers/attn_norm [L, D]  layers/q [L, D, H*Hd]  layers/k, layers/v [L, D, K*Hd]
  layers/o [L, H*Hd, D]    layers/q_bias [L, H*Hd], k_bias/v_bias [L, K*Hd]  (qkv_bias)
  layers/q_norm, layers/k_norm [L, Hd]  (qk_norm)
  layers/mlp_norm [L, D]   layers/gate, layers/up [L, D, F]  layers/down [L, F, D]
  layers/post_attn_norm, layers/post_mlp_norm [L, D]  (Gemma)

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

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from ada.models.layers import (
    apply_rope,
    attention,
    decode_attention,
    linear,
    rms_norm,
    rope_inv_freq,
    softcap,
    write_kv,
    write_rows,
)
from ada.models.lora import merge
from ada.models.model_config import (
    FAMILIES,
    LinearRopeScaling,
    Llama3RopeScaling,
    ModelConfig,
)

Params = dict[str, Any]

# A global layer's window under `lax.scan` when local and global layers mix: a query sees
# every earlier key (positions stay far below it).
_NO_WINDOW = 1 << 30


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
    if c.gemma:
        layers.update(post_attn_norm=(L, D), post_mlp_norm=(L, D))
    shapes = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
    if not c.tie_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def init_params(config: ModelConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random parameters (normal(0, std) weights, zero biases, unit norms: weights of one,
    or of zero under Gemma's (1 + w) scale)."""
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
            leaves.append((jnp.zeros if config.gemma else jnp.ones)(shape, dtype))
        elif name.endswith("bias"):
            leaves.append(jnp.zeros(shape, dtype))
        else:
            leaves.append((std * jax.random.normal(k, shape, jnp.float32)).astype(dtype))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def per_layer(layers, num_layers: int) -> list:
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
    of the weights; idempotent. LoRA adapters are merged in (`lora.merge`), so the decode
    kernels read plain weights."""
    if in_decode_form(params, config, unembed_copy):
        return params
    params = merge(params)
    out = dict(params, layers=per_layer(params["layers"], config.num_layers))
    if config.tie_embeddings and unembed_copy:
        out["lm_head"] = params["embed"].T
    return out


# ----------------------------------------------------------------------------- the block


def block(x_BxTxD, layer, config: ModelConfig, positions_BxT, inv_freq, attend):
    """One transformer block (pre-norm; Gemma also post-norm), whatever holds the keys and
    values: `attend(q [B, T, H, Hd], k, v [B, T, K, Hd])`, called with the new queries, keys
    and values after RoPE, returns (attention output [B, T, H * Hd], the cache state it
    wrote). The dense cache's is `_block`'s, the paged cache's ada.models.paged_attention's.
    Returns the new activations and that state."""
    c = config
    dt = c.compute_dtype
    B, T, _ = x_BxTxD.shape
    H, K, Hd = c.num_heads, c.num_kv_heads, c.head_dim
    w = {name: value.astype(dt) for name, value in layer.items()}

    def norm(x, weight):
        return rms_norm(x, weight, c.rms_norm_eps, plus_one=c.gemma)

    h = norm(x_BxTxD, w["attn_norm"])
    q, k, v = linear(h, w, "q"), linear(h, w, "k"), linear(h, w, "v")
    if c.qkv_bias:
        q, k, v = q + w["q_bias"], k + w["k_bias"], v + w["v_bias"]
    q = q.reshape(B, T, H, Hd)
    k = k.reshape(B, T, K, Hd)
    v = v.reshape(B, T, K, Hd)
    if c.qk_norm:
        q = norm(q, w["q_norm"])
        k = norm(k, w["k_norm"])
    q = apply_rope(q, positions_BxT, inv_freq)
    k = apply_rope(k, positions_BxT, inv_freq)
    attn, state = attend(q, k, v)
    out = linear(attn.astype(dt), w, "o")
    if c.gemma:
        out = norm(out, w["post_attn_norm"])
    x_BxTxD = x_BxTxD + out

    h = norm(x_BxTxD, w["mlp_norm"])
    gate = linear(h, w, "gate")
    act = jax.nn.gelu(gate, approximate=True) if c.gemma else jax.nn.silu(gate)
    mlp = linear(act * linear(h, w, "up"), w, "down")
    if c.gemma:
        mlp = norm(mlp, w["post_mlp_norm"])
    return x_BxTxD + mlp, state


def _block(x_BxTxD, layer, kv, ctx, config: ModelConfig, window=None, inv_freq=None):
    """`block` over the dense cache: `kv` is None (no cache) or this layer's (k, v) cache,
    each [B, K, S, Hd]; `window` is the layer's sliding window (None: global), `inv_freq`
    its RoPE frequencies. Returns the new activations and the updated (k, v)."""
    c = config
    dt = c.compute_dtype
    T = x_BxTxD.shape[1]
    allowed = ctx["allowed"]
    if window is not None:  # keys at positions > the query's position - window
        allowed = allowed & (ctx["key_pos"][:, None, :] > ctx["positions"][:, :, None] - window)

    def attend(q, k, v):
        if kv is None:
            return attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), allowed, c), None
        new = (write_kv(kv[0], k, ctx["start"]), write_kv(kv[1], v, ctx["start"]))
        if T == 1 and ctx["read_then_write"]:
            # Decode: attend to the cache as it was plus the new key and value; the write
            # does not feed the reads (forward's read_then_write).
            keys, values, mask, at = _attended(kv, allowed, ctx, window, dt)
            return decode_attention(q, keys, values, k, v, mask, at, c), new
        keys, values, mask, _ = _attended(new, allowed, ctx, window if T == 1 else None, dt)
        return attention(q, keys, values, mask, c), new

    return block(x_BxTxD, layer, c, ctx["positions"], inv_freq, attend)


def _attended(kv, allowed_BxTxW, ctx, window, dt):
    """The cache entries a layer's queries read: positions [0, W) (the engine's attend_len),
    or for a decode step (T = 1) of a sliding-window layer with window < W only each row's
    last `window` entries up to its new one, [lo, lo + window), so a local layer reads its
    window and not the whole cache. The entries in a row are its real tokens in order after
    any left padding, so the window's keys (positions > p - window) are the `window` cache
    indices ending at the row's write index `start` (one per position). Returns keys,
    values, the mask cut the same way, and `start` relative to the cut."""
    W = ctx["attend_len"]
    if window is None or window >= W:
        return (*(cache[:, :, :W].astype(dt) for cache in kv), allowed_BxTxW, ctx["start"])
    lo = jnp.clip(ctx["start"] - (window - 1), 0, W - window)

    def cut(x, axis):  # each row's [lo, lo + window) along `axis` (after the row axis)
        return jax.vmap(lambda r, s: jax.lax.dynamic_slice_in_dim(r, s, window, axis))(x, lo)

    return (cut(kv[0], 1).astype(dt), cut(kv[1], 1).astype(dt), cut(allowed_BxTxW, 1),
            ctx["start"] - lo)


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
        responses in a long cache then read only what they filled. A sliding-window layer's
        decode step reads only its last `window` entries (`_attended`).
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
    windows = c.layer_windows
    local = any(w is not None for w in windows)
    inv_freqs = layer_inv_freqs(c)

    if cache is None:
        idx = jnp.arange(T)
        allowed = mask_BxT[:, None, :] & (idx[None, :, None] >= idx[None, None, :])
        start = None
        key_pos = positions_BxT if local else None
    else:
        start = cache.end
        S = cache.max_len
        new_valid = write_rows(cache.valid, mask_BxT, start)
        q_idx_BxT = start[:, None] + jnp.arange(T)[None, :]
        W = S if attend_len is None else attend_len
        if not 0 < W <= S:
            raise ValueError(f"attend_len={attend_len} must be in [1, cache length {S}]")
        allowed = new_valid[:, None, :W] & (jnp.arange(W)[None, None, :] <= q_idx_BxT[:, :, None])
        # A cache entry's position: the real tokens before it in its row (positions_from_mask
        # and the engine's decode positions count the same way).
        key_pos = jnp.cumsum(new_valid[:, :W], axis=-1, dtype=jnp.int32) - 1 if local else None

    ctx = {"positions": positions_BxT, "allowed": allowed, "start": start, "key_pos": key_pos,
           "attend_len": None if cache is None else W, "read_then_write": read_then_write}
    x = embed(params, c, tokens_BxT)
    layers = params["layers"]

    if cache is None and not unroll and not isinstance(layers, list | tuple):
        if local:  # each layer's window and RoPE frequencies ride along the scan
            xs = (layers, jnp.asarray([w or _NO_WINDOW for w in windows], jnp.int32),
                  jnp.stack(inv_freqs))

            def body(x, xs):
                layer, window, inv_freq = xs
                return _block(x, layer, None, ctx, c, window, inv_freq)[0], None
        else:
            xs = layers

            def body(x, layer):
                return _block(x, layer, None, ctx, c, None, inv_freqs[0])[0], None

        if remat:
            body = jax.checkpoint(body, prevent_cse=False)
        x, _ = jax.lax.scan(body, x, xs)
        new_cache = None
    else:
        # One layer at a time, each with its own weight and cache buffers (module docstring).
        run_block = jax.checkpoint(_block, static_argnums=(4,)) if remat else _block
        ks, vs = [], []
        # (stacked weights work too, as static slices: XLA:CPU copies them each call)
        for i, layer in enumerate(per_layer(layers, c.num_layers)):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            x, kv = run_block(x, layer, kv, ctx, c, windows[i], inv_freqs[i])
            if kv is not None:
                ks.append(kv[0])
                vs.append(kv[1])
        new_cache = (None if cache is None
                     else KVCache(k=tuple(ks), v=tuple(vs), valid=new_valid, end=cache.end + T))

    x = final_norm(params, c, x)
    if return_hidden:
        return x, new_cache
    return project_logits(params, config, x), new_cache


def layer_inv_freqs(config: ModelConfig) -> list:
    """Each layer's RoPE frequencies: a sliding-window layer's own (Gemma 3's local base),
    every other layer the global ones."""
    inv_global = rope_inv_freq(config)
    windows = config.layer_windows
    if all(w is None for w in windows):
        return [inv_global] * config.num_layers
    inv_local = rope_inv_freq(config, local=True)
    return [inv_global if w is None else inv_local for w in windows]


def embed(params: Params, config: ModelConfig, tokens_BxT) -> jax.Array:
    """The tokens' embeddings in the compute dtype (Gemma's scaled by sqrt(hidden))."""
    x = params["embed"].astype(config.compute_dtype)[tokens_BxT]
    if config.gemma:
        x = x * jnp.asarray(math.sqrt(config.hidden_size), config.compute_dtype)
    return x


def final_norm(params: Params, config: ModelConfig, x_BxTxD) -> jax.Array:
    return rms_norm(x_BxTxD, params["final_norm"].astype(config.compute_dtype),
                    config.rms_norm_eps, plus_one=config.gemma)


def project_logits(params: Params, config: ModelConfig, hidden_BxTxD) -> jax.Array:
    """Logits [B, T, V] float32, from `lm_head` [D, V] when the params have one (untied, or
    tied in decode form), else against the tied embedding [V, D] directly (no transposed
    copy per call); soft-capped in float32 where the config says (Gemma 2)."""
    dt = config.compute_dtype
    if "lm_head" in params:
        logits = hidden_BxTxD @ params["lm_head"].astype(dt)
    else:
        logits = jnp.einsum("btd,vd->btv", hidden_BxTxD, params["embed"].astype(dt))
    return softcap(logits.astype(jnp.float32), config.final_logit_softcap)


def positions_from_mask(mask_BxT: jax.Array) -> jax.Array:
    """RoPE positions for a left-padded batch: 0 at each row's first real token."""
    mask = mask_BxT.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)


# The config and the blocks are importable from here too (their home before the split).
__all__ = [
    "FAMILIES", "KVCache", "LinearRopeScaling", "Llama3RopeScaling", "ModelConfig", "Params",
    "apply_rope", "block", "decode_params", "embed", "final_norm", "forward", "in_decode_form",
    "init_cache", "init_params", "layer_inv_freqs", "param_shapes", "per_layer",
    "positions_from_mask", "project_logits", "rms_norm", "rope_inv_freq",
]
