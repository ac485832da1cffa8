"""The decode state's slots: what prefill hands over (`Prefix`), what each decode step
reads and writes (`DecodeState`, every field slot-major), and the pure functions that fill
(`insert_fn`, `insert_many_fn`), extend (`extend_fn`: a multi-turn request's appended
observation), move and cut its slots. Jitted by `Engine` (engine.py).
Also the power-of-two buckets every compiled shape is rounded to (both caches)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from ada.models.transformer import KVCache, forward, project_logits


@struct.dataclass
class Prefix:
    """N prefilled prompts: a [N, P] cache and each row's next-token logits."""

    cache: KVCache  # per layer: k, v [N, K, P, Hd]
    logits: jax.Array  # [N, V] float32
    lengths: jax.Array  # [N] int32: real prompt tokens (the first generated position)


@struct.dataclass
class DecodeState:
    """Everything one decode step reads and writes, for B slots."""

    cache: KVCache  # per layer: k, v [B, K, S, Hd]
    logits: jax.Array  # [B, V] float32: logits of the slot's next token
    positions: jax.Array  # [B] int32: RoPE position of the next token
    generated: jax.Array  # [B] int32: tokens generated so far
    max_new: jax.Array  # [B] int32
    active: jax.Array  # [B] bool: still generating
    keys: jax.Array  # [B, 2] uint32: fold_in(fold_in(step_key, prompt_id), sample_idx)


def request_key(step_key: jax.Array, prompt_id, sample_idx) -> jax.Array:
    """The per-request base key; token i then uses fold_in(request_key, i)."""
    return jax.random.fold_in(jax.random.fold_in(step_key, prompt_id), sample_idx)


def _copy_row(dst, dst_row, src, src_row):
    """dst with row dst_row (leading axis) replaced by src's row src_row (traced indices)."""
    r = jax.lax.dynamic_index_in_dim(src, src_row, axis=0, keepdims=True)
    return jax.lax.dynamic_update_slice(dst, r.astype(dst.dtype), (dst_row,) + (0,) * (dst.ndim - 1))


def insert_fn(prefix: Prefix, state: DecodeState, slot, row, key, max_new) -> DecodeState:
    """Copy prefix row `row` into decode slot `slot` (traced ints: one compile per bucket)."""
    pc, sc = prefix.cache, state.cache
    Pl, S = pc.max_len, sc.max_len

    def put_row(dst, src):  # one layer's k or v
        return _copy_row(dst, slot, src, row)

    valid_row = jnp.zeros((S,), bool).at[:Pl].set(pc.valid[row])
    cache = KVCache(
        k=tuple(map(put_row, sc.k, pc.k)), v=tuple(map(put_row, sc.v, pc.v)),
        valid=sc.valid.at[slot].set(valid_row), end=sc.end.at[slot].set(Pl),
    )
    return DecodeState(
        cache=cache,
        logits=state.logits.at[slot].set(prefix.logits[row]),
        positions=state.positions.at[slot].set(prefix.lengths[row]),
        generated=state.generated.at[slot].set(0),
        max_new=state.max_new.at[slot].set(max_new),
        active=state.active.at[slot].set(True),
        keys=state.keys.at[slot].set(key),
    )


def insert_many_fn(prefix: Prefix, state: DecodeState, slots_I, rows_I, step_key, prompt_ids_I,
                   sample_idxs_I, max_new_I) -> DecodeState:
    """insert_fn for I requests in one call, their keys made on the device: one dispatch
    per refill instead of two per request (host dispatch was most of a small model's
    collection). A loop of in-place row copies, not a gather: no [I, prompt cache] copy."""
    keys_I = jax.vmap(request_key, (None, 0, 0))(step_key, prompt_ids_I, sample_idxs_I)

    def body(i, st):
        return insert_fn(prefix, st, slots_I[i], rows_I[i], keys_I[i], max_new_I[i])

    return jax.lax.fori_loop(0, slots_I.shape[0], body, state)


def extend_fn(params, state: DecodeState, tokens_NxT, counts_N, slots_N, generated_N, max_new_N,
              *, config, constrain=None) -> DecodeState:
    """Append counts_N[i] tokens (tokens_NxT's row i, right-padded) to slot slots_N[i]'s
    cache at its write index and RoPE position, and resume it: its logits become those after
    its last appended token, `generated` / `max_new` the request's tokens so far and its
    turn's end, active. Nothing already cached is computed again. The slots' rows are taken
    into a cache T positions longer (the padding's writes land past S, never clamped back
    onto cached entries) and put back cut to S; rows with slot >= B are padding (computed on
    the last slot's row, written nowhere)."""
    B, T = state.active.shape[0], tokens_NxT.shape[1]
    rows = jnp.minimum(slots_N, B - 1)
    sc, S = state.cache, state.cache.max_len

    def grown(x):  # [N, K, S + T, Hd]
        return jnp.pad(x[rows], ((0, 0), (0, 0), (0, T), (0, 0)))

    cache = KVCache(k=tuple(map(grown, sc.k)), v=tuple(map(grown, sc.v)),
                    valid=jnp.pad(sc.valid[rows], ((0, 0), (0, T))), end=sc.end[rows])
    mask = jnp.arange(T)[None, :] < counts_N[:, None]
    start = state.positions[rows]
    hidden, cache = forward(params, config, tokens_NxT, start[:, None] + jnp.arange(T)[None, :],
                            mask, cache, return_hidden=True)
    last = jnp.take_along_axis(hidden, jnp.maximum(counts_N - 1, 0)[:, None, None], axis=1)
    logits = project_logits(params, config, last)[:, 0]

    put = functools.partial(put_slots, slots_N=slots_N)
    new_cache = KVCache(k=tuple(put(f, n[:, :, :S]) for f, n in zip(sc.k, cache.k, strict=True)),
                        v=tuple(put(f, n[:, :, :S]) for f, n in zip(sc.v, cache.v, strict=True)),
                        valid=put(sc.valid, cache.valid[:, :S]),
                        end=put(sc.end, sc.end[rows] + counts_N))
    return resume_slots(state.replace(cache=new_cache), slots_N, constrain, logits=logits,
                        positions=start + counts_N, generated=generated_N, max_new=max_new_N)


def put_slots(full, new, slots_N):
    """`full` with rows slots_N set to `new`'s (slots >= B dropped: padding rows)."""
    return full.at[slots_N].set(new.astype(full.dtype), mode="drop")


def resume_slots(state, slots_N, constrain=None, **fields):
    """`state` (dense or paged) with the rows slots_N of each named field set and those slots
    active (slots >= B dropped), then `constrain`ed: the end of an extend."""
    new = state.replace(active=put_slots(state.active, jnp.ones_like(slots_N, bool), slots_N),
                        **{k: put_slots(getattr(state, k), v, slots_N) for k, v in fields.items()})
    return new if constrain is None else constrain(new)


def move_fn(state: DecodeState, src, dst) -> DecodeState:
    """Copy slot `src` to slot `dst` and deactivate `src` (tail compaction)."""
    moved = jax.tree.map(lambda x: _copy_row(x, dst, x, src), state)  # all fields slot-major
    return moved.replace(active=moved.active.at[src].set(False))


def take_rows(state: DecodeState, b: int) -> DecodeState:
    return jax.tree.map(lambda x: x[:b], state)  # every field is slot-major


def put_rows(state: DecodeState, part: DecodeState) -> DecodeState:
    def put(full, x):
        if x.shape == full.shape:
            return x
        return jax.lax.dynamic_update_slice(full, x, (0,) * full.ndim)

    return jax.tree.map(put, state, part)


def pow2_buckets(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two from lo up to the first one >= hi."""
    out, b = [], max(1, lo)
    while True:
        out.append(b)
        if b >= hi:
            return tuple(out)
        b *= 2


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")
