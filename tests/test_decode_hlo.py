"""The compiled decode step moves the KV cache and the logits only where the math needs it:
no copy or transpose of a cache-sized or logits-sized buffer, no gather of the logits onto
every chip, and the cache written in place (issue 24, items 1 and 4).

The engine's generate chunk is compiled, never run, on small shapes laid out like the 1.5B
preset's sampler (16 slots split over data 2, two KV heads and the vocabulary over tensor 2,
head dim 128, bfloat16, a vocabulary whose halves are not whole 128-blocks, as 151,936's
are not): on XLA:CPU always, and for v5e through libtpu (abstract chips) when it loads.
The decode chunk is a loop (2 steps), as the engine runs it: a layout the compiler prefers
inside the loop but not at its boundary shows as relayouts of every cache per chunk.

Before this test, with keys stored [B, K, Hd, S] and the sampler's blocks straddling the
vocabulary shards, the v5e program held three relayout copies of every layer's key cache
per step (the write's scatter and the q.k dot want the head dim minor) and gathered and
relaid out the whole [slots, V] logits on every chip: this test failed there with 8 such
ops. With two KV heads per chip and the step's [K, Hd] rows written as one scatter window,
the compiler laid the cache out heads-minor inside the loop and relaid all of it in and
out of each chunk (16 relayouts here).
"""

import math
import re

import jax
import jax.numpy as jnp
import pytest

from ada import sharding as shd
from ada import tpu
from ada.hlo_bytes import DTYPE_BYTES, HEAD, INSTR
from ada.models.known import known
from ada.models.transformer import param_shapes
from ada.sampling.engine import Engine

CONFIG = known("qwen2.5-math-1.5b").replace(
    hidden_size=256, intermediate_size=512, num_heads=12, num_kv_heads=2, vocab_size=4160,
    num_layers=2, dtype="bfloat16", param_dtype="bfloat16")
SLOTS, PROMPT, NEW, STEPS = 16, 128, 128, 2

_ARRAY = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\](\{[^}]*\})?")


def _arrays(text: str) -> list[tuple[int, str, str]]:
    """(bytes, dims, layout without memory space) of every array type in `text`."""
    return [(DTYPE_BYTES[a.group(1)] * math.prod(int(d) for d in a.group(2).split(",") if d),
             a.group(2), re.sub(r"S\(\d+\)", "", a.group(3) or ""))
            for a in _ARRAY.finditer(text)]


def moves(hlo: str, limit: int) -> list[tuple[str, bool, str]]:
    """The copies and transposes of an optimized HLO module whose result is `limit` bytes or
    more: copy, transpose and copy-start instructions, and fusions whose root is one (a
    materialised copy), as (kind, relayout, line): a relayout changes the dims or the layout;
    a copy that does not is a plain copy, and a copy-start that does not only moves the buffer
    between memory spaces (the TPU compiler's prefetch into on-chip memory)."""
    types, roots, found, cur = {}, {}, [], None
    for line in hlo.splitlines():
        if head := HEAD.match(line):
            cur = head.group(1)
        elif line.startswith("}"):
            cur = None
        elif cur is not None and (m := INSTR.match(line)):
            name, rtype, op, rest = m.groups()
            types[name] = rtype
            found.append((rtype, op, rest, line.strip()))
            if line.lstrip().startswith("ROOT "):
                roots[cur] = (op, rest)
    out = []
    for rtype, op, rest, line in found:
        callee = re.search(r"calls=%?([\w.\-]+)", rest)
        kind, args = roots.get(callee.group(1), (op, rest)) if op == "fusion" and callee else (
            op, rest)
        if kind not in ("copy", "transpose", "copy-start"):
            continue
        results = [a for a in _arrays(rtype) if a[0] >= limit]
        if not results:
            continue
        operand = re.match(r"\s*(?:\w+\[[\d,]*\]\{[^}]*\} )?%?([\w.\-]+)", args)
        sources = _arrays(types.get(operand.group(1), "")) if operand else []
        if kind == "copy-start":  # (source, destination, context)
            sources, results = results[:1], results[1:] or results
        relayout = kind == "transpose" or {a[1:] for a in results} != {a[1:] for a in sources}
        out.append((kind, relayout, line[:240]))
    return out


def compile_generate(devices, mesh_shape, dtype="bfloat16", kv_heads=2):
    """The engine's generate chunk compiled for `devices` on a `mesh_shape` mesh (None: one
    device, no mesh); returns (engine, compiled)."""
    mesh = None if mesh_shape is None else shd.make_mesh(
        mesh_shape, devices[:math.prod(mesh_shape)])
    config = CONFIG.replace(dtype=dtype, param_dtype=dtype, num_kv_heads=kv_heads)
    engine = Engine(config, num_slots=SLOTS, max_prompt_len=PROMPT, max_new_tokens=NEW,
                    chunk_size=STEPS, slot_bucketing=False, mesh=mesh)
    stacked = jax.eval_shape(lambda: jax.tree.map(
        lambda s: jnp.zeros(s, dtype), param_shapes(config),
        is_leaf=lambda x: isinstance(x, tuple)))
    params = jax.eval_shape(engine._sampling_fn, stacked)
    state = jax.eval_shape(engine.init_decode_state)
    if mesh is not None:
        put = lambda tree, shardings: jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
        params = put(params, engine.param_shardings(stacked))
        state = put(state, engine.state_shardings())
    lowered = engine._generate.lower(params, state, num_steps=STEPS, num_slots=SLOTS,
                                     window=engine.cache_len)
    return engine, lowered.compile()


def limits(engine, mesh_shape) -> tuple[int, int]:
    """One layer's key cache and the logits, on one device (bytes)."""
    data, _, tensor = mesh_shape or (1, 1, 1)
    c = engine.config
    heads = c.num_kv_heads // tensor if c.num_kv_heads % tensor == 0 else c.num_kv_heads
    vocab = c.vocab_size // tensor if c.vocab_size % tensor == 0 else c.vocab_size
    item = jnp.dtype(c.compute_dtype).itemsize
    return SLOTS // data * heads * engine.cache_len * c.head_dim * item, SLOTS // data * vocab * 4


def check(engine, compiled, mesh_shape):
    """No relayout of a buffer the size of one layer's keys (any dtype) or of the float32
    logits, no plain copy of a cache-sized buffer, and no gather of the logits."""
    cache, logits = limits(engine, mesh_shape)
    hlo = compiled.as_text()
    result = lambda line: line.split(" = ", 1)[1].split("(")[0]
    found = [line for kind, relayout, line in moves(hlo, min(cache, logits))
             if any(a[0] >= cache for a in _arrays(result(line))) and (
                 relayout or kind != "copy-start")
             or relayout and "f32[" in result(line)]
    found += [line.strip()[:240] for line in hlo.splitlines()
              if re.search(r"= .* all-gather(-start)?\(", line)
              and max(a[0] for a in _arrays(line.split(" all-gather")[0])) >= logits]
    assert not found, (f"{len(found)} relayouts, cache copies or gathers (one layer's keys: "
                       f"{cache} bytes, the logits: {logits}, on one device) in the decode "
                       "step:\n" + "\n".join(found[:8]))
    # The donated cache comes back in place: its buffers alias the outputs.
    assert compiled.memory_analysis().alias_size_in_bytes >= 2 * engine.config.num_layers * cache


KV_HEADS = pytest.mark.parametrize("kv_heads", [2, 4], ids=["1-kv-head-per-chip",
                                                         "2-kv-heads-per-chip"])


@KV_HEADS
@pytest.mark.parametrize("mesh_shape", [None, (2, 1, 2)], ids=["one-device", "data2-tensor2"])
def test_cpu_decode_step_has_no_cache_relayout(mesh_shape, kv_heads):
    """In float32, as CPU runs compute (XLA:CPU's bfloat16 dots convert their operands)."""
    engine, compiled = compile_generate(jax.devices("cpu"), mesh_shape, "float32", kv_heads)
    check(engine, compiled, mesh_shape)


@KV_HEADS
def test_v5e_decode_step_has_no_cache_relayout(kv_heads):
    """The real TPU compiler (libtpu), ahead of time on an abstract v5e:2x2 slice, with one
    KV head per chip (the Qwen2.5-Math presets) and two (Llama 3.2 3B and Qwen3 4B)."""
    try:
        devices, _ = tpu.tpu_devices("v5e:2x2")
    except tpu.SliceError as e:
        pytest.skip(f"libtpu is not usable here: {e}")
    engine, compiled = compile_generate(devices, (2, 1, 2), kv_heads=kv_heads)
    check(engine, compiled, (2, 1, 2))
    # The tied embedding is held once: the unembedding reads [V, D] as it lies (XLA:CPU
    # keeps a [D, V] copy beside it, engine.unembed_copy).
    params = jax.eval_shape(engine._sampling_fn, jax.eval_shape(lambda: jax.tree.map(
        lambda s: jnp.zeros(s, jnp.bfloat16), param_shapes(CONFIG),
        is_leaf=lambda x: isinstance(x, tuple))))
    assert "lm_head" not in params


def test_moves_are_told_apart():
    """The check is not vacuous: a program that transposes the keys to [B, K, Hd, S] (the
    layout this file guards against) is caught on XLA:CPU; in TPU text, a relayout copy is
    told from a plain copy and from a move into on-chip memory."""
    shape = (SLOTS, 2, PROMPT + NEW, 128)
    k = jax.ShapeDtypeStruct(shape, jnp.float32)
    hlo = jax.jit(lambda x: jnp.swapaxes(x, 2, 3) + 1).lower(k).compile().as_text()
    assert any(relayout for _, relayout, _ in moves(hlo, math.prod(shape) * 4))
    tpu_text = """ENTRY %main (p: bf16[8,256,128]) -> bf16[8,128,256] {
  %p = bf16[8,256,128]{2,1,0:T(8,128)(2,1)} parameter(0)
  %copy-start.1 = (bf16[8,256,128]{2,1,0:T(8,128)(2,1)}, bf16[8,256,128]{2,1,0:T(8,128)(2,1)S(1)}, u32[]{:S(2)}) copy-start(%p)
  %copy.2 = bf16[8,256,128]{1,2,0:T(8,128)(2,1)} copy(%p)
  %copy.3 = bf16[8,256,128]{2,1,0:T(8,128)(2,1)} copy(%p)
  ROOT %t = bf16[8,128,256]{2,1,0:T(8,128)(2,1)} transpose(%p), dimensions={0,2,1}
}"""
    assert [(kind, relayout) for kind, relayout, _ in moves(tpu_text, 8 * 256 * 128 * 2)] == [
        ("copy-start", False), ("copy", True), ("copy", False), ("transpose", True)]


@pytest.mark.slow
def test_v5e_no_cache_moves_between_chips_in_any_bucket():
    """Every program a sampler compiles on a data 2 x tensor 2 v5e slice, dense and paged,
    for every bucket (ada.sampling.bucket_moves): generate at each window (slot bucketing
    asked for, and dropped: the first b slots of a batch-split cache lie on the first shards,
    and a chunk on them moved every layer's cache between chips), prefill at the smallest and
    largest row bucket, insert / attach at every count. None holds a collective of a cache,
    a pool or a prompt's keys and values; generate, insert and attach hold no plain copy of
    one either (prefill lays its prompt's new keys and values out as the cache holds them: a
    copy on the chip). The paged pool is split over data with its slots; without its
    shard_map (paged.on_shards) the same generate all-reduces every layer's gathered pages."""
    from ada.sampling.bucket_moves import cache_sized_moves
    from ada.sampling.paged import PagedEngine

    try:
        devices, _ = tpu.tpu_devices("v5e:2x2")
    except tpu.SliceError as e:
        pytest.skip(f"libtpu is not usable here: {e}")
    mesh = shd.make_mesh((2, 1, 2), devices)
    stacked = jax.eval_shape(lambda: jax.tree.map(
        lambda s: jnp.zeros(s, jnp.bfloat16), param_shapes(CONFIG),
        is_leaf=lambda x: isinstance(x, tuple)))
    dense = Engine(CONFIG, num_slots=SLOTS, max_prompt_len=PROMPT, max_new_tokens=NEW,
                   chunk_size=STEPS, mesh=mesh, slot_bucketing=True)
    assert dense.slot_buckets == (SLOTS,)
    paged = PagedEngine(CONFIG, num_slots=SLOTS, max_prompt_len=PROMPT, max_new_tokens=NEW,
                        chunk_size=STEPS, mesh=mesh, page_size=16, attention="auto")
    assert paged.attention == "kernel" and paged.pool_shards == 2
    sp = jax.eval_shape(dense._sampling_fn, stacked)
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          sp, shd.param_shardings(sp, mesh))
    got = cache_sized_moves([dense, paged], params)
    windows, inserts = len(dense.window_buckets), len(dense.insert_buckets)
    assert got["programs"] == 2 * (windows + 2 + inserts), got
    assert got["cache_sized_moves"] == 0, "\n".join(got["found"])


def test_kv_moves_sees_a_cache_moved_between_chips():
    """The count is not vacuous: a cache split over data and gathered onto every chip shows
    as an all-gather of a cache-sized buffer; its tensor-parallel activations' all-reduce
    ([.., hidden]) and a smaller buffer do not count."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from ada.sampling.bucket_moves import kv_moves

    mesh = shd.make_mesh((2, 1, 2), jax.devices("cpu")[:4])
    cache = jax.ShapeDtypeStruct((SLOTS, 2, PROMPT, 128), jnp.float32,
                                 sharding=NamedSharding(mesh, P("data")))
    gather = jax.jit(lambda x: x * 2, out_shardings=NamedSharding(mesh, P()))
    hlo = gather.lower(cache).compile().as_text()
    size = SLOTS // 2 * 2 * PROMPT * 128 * 4  # one chip's share
    assert len(kv_moves(hlo, size, 128, copies=False)) == 1
    assert kv_moves(hlo, 4 * size, 128, copies=False) == []  # below the size asked
    assert kv_moves(hlo, size, 64, copies=False) == []  # not a key / value buffer
