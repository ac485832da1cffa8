"""Cache moves between chips, over every program a sampler compiles (issue 34, item 3).

A decode engine compiles one program per bucket: generate at each slot and window bucket,
prefill at each row bucket, insert (dense) or attach (paged) at each count. On a mesh whose
data axis splits the slots, any of them that moves a KV cache, a page pool or a prompt's new
keys and values between chips pays for it every call. `cache_sized_moves` compiles them all
for the engine's mesh and counts such ops in the optimized HLO (`kv_moves`); `ada.plan
--buckets` reports the count (`buckets.cache_sized_moves` in its JSON), and
`tests/test_decode_hlo.py` requires zero on a v5e (data 2, tensor 2) slice.

Prefill at the smallest and the largest row bucket stands for the rows between; the prompt
length is the longest bucket (the most bytes).
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp

from ada.hlo_bytes import DTYPE_BYTES

_ARRAY = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\]")
_MOVE = re.compile(r"= (.+?) (all-gather|all-to-all|collective-permute|all-reduce|"
                   r"reduce-scatter|copy)(-start)?\(")


def kv_moves(hlo: str, limit: int, head_dim: int, copies: bool) -> list[str]:
    """Collectives (and, with `copies`, plain copies: not the copy-starts that stage a buffer
    into on-chip memory) of a key / value buffer of `limit` bytes or more in optimized HLO
    text: arrays of 4 or more dims whose minor dim is head_dim (caches, pools, a prompt's new
    keys and values). The tensor-parallel all-reduces of the activations ([.., hidden]) are
    not moves."""
    out = []
    for line in hlo.splitlines():
        m = _MOVE.search(line)
        if not m or (m.group(2) == "copy" and (m.group(3) or not copies)):
            continue
        kv = [DTYPE_BYTES[a.group(1)] * math.prod(int(d) for d in a.group(2).split(",") if d)
              for a in _ARRAY.finditer(m.group(1))
              if a.group(2).count(",") >= 3 and a.group(2).endswith(f",{head_dim}")]
        if any(size >= limit for size in kv):
            out.append(f"{m.group(2)} {m.group(1)[:120]}")
    return out


def _abstract(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def bucket_programs(engine, params) -> list[tuple[str, bool, int, object]]:
    """Every bucket's program of a dense `Engine` or a `PagedEngine`, lowered from abstract
    `params` (the sampling form, with their shardings): (name, whether a plain copy counts,
    the size that makes a buffer cache-sized on a chip, lowered). Generate, insert and attach
    must not copy a cache; prefill lays its prompt's new keys and values out as the cache
    holds them (a copy on the chip) and must only not move them between chips."""
    from ada.sampling.paged import PagedEngine

    S, c, mesh = jax.ShapeDtypeStruct, engine.config, engine.mesh.shape
    i32 = lambda *shape: S(shape, jnp.int32)
    u32 = lambda *shape: S(shape, jnp.uint32)
    data = mesh["data"]
    heads = c.num_kv_heads // mesh["tensor"] if c.num_kv_heads % mesh["tensor"] == 0 else (
        c.num_kv_heads)
    item = jnp.dtype(c.compute_dtype).itemsize
    layer = engine.num_slots // data * heads * engine.cache_len * c.head_dim * item
    P = engine.prompt_buckets[-1]
    prompt = lambda n: n * P * heads * c.head_dim * item  # n prompts' keys on a chip
    if isinstance(engine, PagedEngine):
        state, D = engine.abstract_state(), engine.pool_shards
        with engine._kernel_mesh():
            out = [(f"paged generate, window {w} pages", True, layer, engine._generate.lower(
                params, state, i32(engine.num_slots, w), num_steps=engine.chunk_size))
                for w in engine.window_buckets]
        out += [(f"paged prefill, {n} rows a shard", False, prompt(n), engine._prefill.lower(
            params, state.pages, i32(D * n, P), i32(D * n), i32(D * n, -(-P // engine.page_size)),
            i32(D * n))) for n in sorted({engine.row_buckets[0], engine.row_buckets[-1]})]
        logits = S((D * engine.row_buckets[-1], c.vocab_size), jnp.float32)
        return out + [(f"attach {n}", True, layer, engine._attach.lower(
            state, logits, i32(D * n), i32(D * n), i32(n), i32(n), i32(n), u32(2), u32(n),
            u32(n), i32(n))) for n in engine.insert_buckets]
    state = _abstract(jax.eval_shape(engine.init_decode_state), engine.state_shardings())
    out = [(f"generate, {b} slots, window {w}", True, layer, engine._generate.lower(
        params, state, num_steps=engine.chunk_size, num_slots=b, window=w))
        for b in engine.slot_buckets for w in engine.window_buckets]
    prefix = None
    for n in sorted({engine.row_buckets[0], engine.row_buckets[-1]}):
        args = (params, S((n, P), jnp.int32), S((n, P), bool))
        out.append((f"prefill, {n} rows", False, prompt(n), engine._prefill.lower(*args)))
        prefix = jax.eval_shape(engine._prefill, *args)
    return out + [(f"insert {n}", True, layer, engine._insert_many.lower(
        prefix, state, i32(n), i32(n), u32(2), u32(n), u32(n), i32(n)))
        for n in engine.insert_buckets]


def cache_sized_moves(engines, params, log=lambda name: None) -> dict:
    """Compile every bucket of each engine (`bucket_programs`) and count the cache-sized
    moves in them: {"cache_sized_moves": collectives + copies, "collectives": between chips,
    "copies": on a chip, "programs": compiled, "found": the first few}. `log(name)` is called
    as each program starts compiling. (XLA:CPU's gather path copies the window it gathers:
    a copy on the chip, never a collective.)"""
    found, programs = [], 0
    for engine in engines:
        for name, copies, limit, lowered in bucket_programs(engine, params):
            log(name)
            programs += 1
            hlo = lowered.compile().as_text()
            found += [f"{name}: {m}" for m in kv_moves(hlo, limit, engine.config.head_dim, copies)]
    plain = sum(": copy " in f for f in found)
    return dict(cache_sized_moves=len(found), collectives=len(found) - plain, copies=plain,
                programs=programs, found=found[:8])
