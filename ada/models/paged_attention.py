"""Paged KV cache and ragged paged attention: the device side (docs/paged.md).

The cache of every layer is one pool of fixed-size pages, laid out as JAX's Pallas TPU kernel
(`jax.experimental.pallas.ops.tpu.ragged_paged_attention`) reads it:

  pages [num_pages, page_size, 2K, Hd]   keys and values interleaved on axis 2: combined
                                          head 2h is key head h, 2h + 1 its value head

A slot (one sequence) owns the pages its row of the page table names, in order: position p
of the slot lies in page `page_table[slot, p // page_size]` at offset `p % page_size`. Its
`lengths[slot]` tokens sit at positions [0, length): no padding, so a token's RoPE position
is its cache position. Page 0 is the null page: a page-table entry never given out points
there, nothing is ever written to it, and what is read from it is masked. Which pages a
slot holds, and who shares them, is the host allocator's business (ada/sampling/pages.py).
On a mesh the pool is split over the data shards with the slots: each shard holds its own
range of pages (its null page first) and runs the cache step on them alone (`local_pages`).

Writes scatter each new token's [2K, Hd] row into its page (in place when the pool is
donated); a write whose position has no page, or whose token is padding, is dropped.
Attention reads only the pages a slot's table names, in one of two ways:

  "gather"  pure JAX: gather the slot's first W pages ([B, W * page_size] positions, W the
            page table's width, a static window the caller buckets) and mask by position.
            Any T; the CPU path and the reference.
  "kernel"  the Pallas TPU kernel, decode only (T = 1): it reads ceil(length / page_size)
            pages per slot, rounded up to its `num_kv_pages_per_block`. Needs a TPU (or
            libtpu to compile for one) and head_dim a multiple of 128.

A chunk of gather-path decode steps (the engine's generate) gathers each slot's window once,
before its first step, into the dense cache's layout (`gather_window`), writes each new
token into both the pool and that window, and attends over the window as the dense cache
does (`attend_window`): the page table is fixed for the chunk, so the per-step gather and
its relayout (4x the dense attention's time on XLA:CPU) are paid once per chunk.

`paged_forward` is the model's cached forward over pages: the same weights and math as
ada.models.transformer.forward with a KVCache, for the families that module serves.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from ada.models import layers
from ada.models.layers import scale_scores, score_scale
from ada.models.transformer import (
    ModelConfig,
    block,
    embed,
    final_norm,
    layer_inv_freqs,
    per_layer,
    project_logits,
)

NULL_PAGE = 0


@struct.dataclass
class PagedKV:
    """The paged cache as one forward call sees it, for B slots."""

    pages: tuple[jax.Array, ...]  # L x [num_pages, page_size, 2K, Hd]
    page_table: jax.Array  # [B, W] int32: the slot's pages in order (NULL_PAGE past its end)
    lengths: jax.Array  # [B] int32: tokens in the cache (the next write position)

    @property
    def page_size(self) -> int:
        return self.pages[0].shape[1]


def init_pages(config: ModelConfig, num_pages: int, page_size: int, dtype=None):
    """An empty pool: one zeroed [num_pages, page_size, 2K, Hd] array per layer."""
    dtype = dtype or config.compute_dtype
    shape = (num_pages, page_size, 2 * config.num_kv_heads, config.head_dim)
    return tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))


def page_bytes(config: ModelConfig, page_size: int, dtype=None, kv_head_shards: int = 1) -> int:
    """Bytes of one page of every layer (keys and values), per KV-head shard."""
    itemsize = jnp.dtype(dtype or config.compute_dtype).itemsize
    heads = -(-config.num_kv_heads // kv_head_shards)
    return config.num_layers * page_size * 2 * heads * config.head_dim * itemsize


# ----------------------------------------------------------------------------- write


def write_positions(page_table_BxW, start_B, count_B, T: int, page_size: int, num_pages: int):
    """Where each of T new tokens per slot goes: (page [B, T], offset [B, T]). Token t of
    slot b sits at position start_B[b] + t. Padding (t >= count_B[b]), positions past the
    table and unassigned (null) pages get page `num_pages`: out of bounds, so dropped."""
    W = page_table_BxW.shape[1]
    pos = start_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    col = pos // page_size
    page = jnp.take_along_axis(page_table_BxW, jnp.clip(col, 0, W - 1), axis=1)
    keep = (jnp.arange(T)[None, :] < count_B[:, None]) & (col < W) & (page != NULL_PAGE)
    return jnp.where(keep, page, num_pages), pos % page_size


def write_kv(pages_PxSxCxHd, k_BxTxKxHd, v_BxTxKxHd, page_BxT, offset_BxT):
    """Scatter new keys and values into their pages (interleaved, as the kernel reads them);
    only the B*T rows are touched, in place under donation."""
    B, T, K, Hd = k_BxTxKxHd.shape
    kv = jnp.stack([k_BxTxKxHd, v_BxTxKxHd], axis=3).reshape(B, T, 2 * K, Hd)
    return pages_PxSxCxHd.at[page_BxT, offset_BxT].set(kv.astype(pages_PxSxCxHd.dtype),
                                                       mode="drop")


def write_tokens(pages_PxSxCxHd, k_BxTxKxHd, v_BxTxKxHd, page_table_BxW, start_B, count_B):
    """A layer's step write: each slot's count_B[b] new keys and values at positions
    start_B[b] + t of its pages (`write_positions`, `write_kv`). Returns (pool, the page
    table in this pool's local ids, `local_pages`)."""
    P, page_size = pages_PxSxCxHd.shape[:2]
    table = local_pages(page_table_BxW, P)
    page_BxT, off_BxT = write_positions(table, start_B, count_B, k_BxTxKxHd.shape[1],
                                        page_size, P)
    return write_kv(pages_PxSxCxHd, k_BxTxKxHd, v_BxTxKxHd, page_BxT, off_BxT), table


def copy_pages(pages: tuple, src_N, dst_N) -> tuple:
    """Copy whole pages src -> dst in every layer (the copy-on-write of a shared prompt's
    partial last page). Page ids are taken modulo the pool's length (`local_pages`); pairs
    whose dst is a null page are no-ops (padding)."""
    def one(p):
        src, dst = local_pages(src_N, p.shape[0]), local_pages(dst_N, p.shape[0])
        return p.at[jnp.where(dst == NULL_PAGE, p.shape[0], dst)].set(p[src], mode="drop")

    return tuple(one(p) for p in pages)


def local_pages(page_ids, pool_len: int):
    """Page ids as a pool of `pool_len` pages indexes them. The host numbers the pages of a
    pool split over the data shards globally (shard s owns [s * pool_len, (s + 1) *
    pool_len), its null page first); each shard holds its own range, so the id modulo its
    length is the local index, and every null page (the unassigned entries' 0 included)
    maps to the local null page. An unsplit pool is unchanged."""
    return page_ids % pool_len


# ----------------------------------------------------------------------------- attention


def attention_gather(q_BxTxHxHd, pages_PxSxCxHd, page_table_BxW, start_B, config: ModelConfig,
                     window: int | None = None):
    """Ragged paged attention in pure JAX: query t of slot b (position start_B[b] + t)
    attends to the slot's positions <= its own (and > its own - `window` for a
    sliding-window layer), read through its first W pages (a sliding-window layer's decode
    step: only the pages its window touches). Returns [B, T, H * Hd]. The
    math of the dense cached attention (float32 softmax, the config's score scale and cap)."""
    B, T, H, Hd = q_BxTxHxHd.shape
    _, page_size, C, _ = pages_PxSxCxHd.shape
    K, W = C // 2, page_table_BxW.shape[1]
    first = jnp.zeros((B,), jnp.int32)  # the position of the first page read
    if window is not None and T == 1 and (n := -(-window // page_size) + 1) < W:
        # a local layer's decode step reads only the n pages its window can touch
        lo = jnp.clip((start_B - window + 1) // page_size, 0, W - n)
        page_table_BxW = jax.vmap(lambda r, c: jax.lax.dynamic_slice_in_dim(r, c, n))(
            page_table_BxW, lo)
        first, W = lo * page_size, n
    S = W * page_size
    # keys and values gathered apart (not the window whole, then sliced: one copy less;
    # 1.2x faster on XLA:CPU, docs/results.md "Pages with their slots")
    pool = pages_PxSxCxHd.reshape(-1, page_size, K, 2, Hd)
    k, v = (pool[page_table_BxW, :, :, i].reshape(B, S, K, Hd).astype(q_BxTxHxHd.dtype)
            for i in (0, 1))
    q = q_BxTxHxHd.reshape(B, T, K, H // K, Hd)
    scores = scale_scores(jnp.einsum("btkgh,bskh->bkgts", q, k).astype(jnp.float32), config)
    q_pos = (start_B[:, None] + jnp.arange(T)[None, :])[:, :, None]
    k_pos = (first[:, None] + jnp.arange(S)[None, :])[:, None, :]
    allowed = k_pos <= q_pos  # [B, T, S]
    if window is not None:
        allowed &= k_pos > q_pos - window
    scores = jnp.where(allowed[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskh->btkgh", probs, v).reshape(B, T, H * Hd)


def gather_window(pages_PxSxCxHd, page_table_BxW):
    """Each slot's first W pages as a dense cache: (keys, values), each [B, K, W * page, Hd]
    (the dense cache's layout, `layers.attention`'s operands), position p at index p. One
    gather each, of [page, Hd] slices straight into that layout (2x faster on XLA:CPU than
    gathering whole page rows and relaying them out)."""
    P, page_size, C, Hd = pages_PxSxCxHd.shape
    B, W = page_table_BxW.shape
    pool = pages_PxSxCxHd.reshape(P, page_size, C // 2, 2, Hd)
    rows = local_pages(page_table_BxW, P)[:, None, :]  # [B, 1, W]
    heads = jnp.arange(C // 2)[None, :, None]  # [1, K, 1]

    def part(i):  # advanced indices first: [B, K, W, page, Hd]
        got = pool.at[rows, :, heads, i].get(mode="promise_in_bounds")
        return got.reshape(B, C // 2, W * page_size, Hd)

    return part(0), part(1)


def attend_window(q_Bx1xHxHd, k_Bx1xKxHd, v_Bx1xKxHd, pages_PxSxCxHd, window_kv, page_table_BxW,
                  start_B, count_B, config: ModelConfig, window: int | None = None):
    """One layer's decode step (T = 1) of a gather-path chunk: write the new key and value
    into their page and into the chunk's window (`gather_window`), then attend over the
    written window as the dense cache does (`layers.attention`; reading the window before
    the write, as the dense TPU step does, makes XLA:CPU copy it twice a step). An idle
    slot's pool write is dropped and its output unused. Returns (attention [B, 1, H * Hd],
    (pool, window))."""
    pages, _ = write_tokens(pages_PxSxCxHd, k_Bx1xKxHd, v_Bx1xKxHd, page_table_BxW, start_B,
                            count_B)
    keys, values = (layers.write_kv(w, new, start_B)
                    for w, new in zip(window_kv, (k_Bx1xKxHd, v_Bx1xKxHd), strict=True))
    pos = jnp.arange(keys.shape[2])[None, :]
    allowed = pos <= start_B[:, None]
    if window is not None:
        allowed &= pos > start_B[:, None] - window
    attn = layers.attention(q_Bx1xHxHd, keys, values, allowed[:, None], config)
    return attn, (pages, (keys, values))


def kernel_fits(config: ModelConfig) -> bool:
    """Whether the Pallas kernel serves this model: its blocks want head_dim a multiple of
    128 (the TPU's lanes)."""
    return config.head_dim % 128 == 0


def ragged_decode(q_BxHxHd, pages_PxSxCxHd, kv_lens_B, page_table_BxW, *, impl=None,
                  **options):
    """One query per slot through `impl` (default the Pallas kernel
    `ragged_paged_attention`) in its ragged layout: slot b is sequence b, with query b.
    The engine runs it on each shard of its mesh (`attend_pages`); CPU tests pass
    `reference_decode`. Returns [B, H, Hd]."""
    if impl is None:
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import (
            ragged_paged_attention as impl,
        )
    B = q_BxHxHd.shape[0]
    return impl(q_BxHxHd, pages_PxSxCxHd, kv_lens_B, page_table_BxW,
                jnp.arange(B + 1, dtype=jnp.int32), jnp.full((1,), B, jnp.int32), **options)


def reference_decode(q_BxHxHd, pages_PxSxCxHd, kv_lens_B, page_table_BxW, **options):
    """ragged_decode through the kernel's own pure-JAX reference (`ref_ragged_paged_attention`,
    which drops the kernel's block options and needs concrete lengths: call it eagerly)."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import (
        ref_ragged_paged_attention,
    )

    kernel_only = ("num_kv_pages_per_block", "num_queries_per_block", "vmem_limit_bytes")
    return ragged_decode(q_BxHxHd, pages_PxSxCxHd, kv_lens_B, page_table_BxW,
                         impl=ref_ragged_paged_attention,
                         **{k: v for k, v in options.items() if k not in kernel_only})


def attention_kernel(q_BxHxHd, pages_PxSxCxHd, page_table_BxW, kv_lens_B, config: ModelConfig,
                     window: int | None = None, *, num_kv_pages_per_block: int,
                     num_queries_per_block: int, vmem_limit_bytes: int | None = None,
                     kernel=ragged_decode):
    """Decode attention (one query per slot) through the Pallas TPU kernel. kv_lens_B
    counts the new token (written first); every slot's must be >= 1, its one query (an idle
    slot: 1, one token of the null page its table row holds). The config's score scale and
    soft-cap and the layer's sliding window are the kernel's own options. Returns [B, H * Hd].

    The block sizes are explicit: the kernel's tuned-size lookup asks the default backend,
    which is the CPU when compiling ahead of time (`tuned_blocks` reads its table for a
    named chip). Call it under `jax.set_mesh(mesh)` of TPU devices (libtpu AOT or real).
    `kernel`: ragged_decode's signature (the engine's is shard-mapped over its mesh)."""
    B, H, Hd = q_BxHxHd.shape
    # The kernel's dots take the ambient matmul precision, and Mosaic rejects "highest"
    # (fp32 passes) on bfloat16 operands: trace it at the default whatever the caller set.
    with jax.default_matmul_precision("default"):
        out = kernel(
            q_BxHxHd, pages_PxSxCxHd, kv_lens_B.astype(jnp.int32),
            page_table_BxW.astype(jnp.int32), sm_scale=score_scale(config),
            sliding_window=window, soft_cap=config.attn_logit_softcap,
            num_kv_pages_per_block=num_kv_pages_per_block,
            num_queries_per_block=num_queries_per_block, vmem_limit_bytes=vmem_limit_bytes)
    return out.reshape(B, H * Hd)


def tuned_blocks(config: ModelConfig, page_size: int, num_slots: int, pages_per_slot: int,
                 device_kind: str = "TPU v5 lite", kv_head_shards: int = 1,
                 max_kv_pages_per_block: int | None = 16) -> tuple[int, int]:
    """(num_kv_pages_per_block, num_queries_per_block) from the kernel's tuned table for a
    named chip, without asking the default backend. Decode reads whole blocks of pages (the
    kernel DMAs a full block even past a slot's end), so the page block is capped at
    `max_kv_pages_per_block` (None: the table's value): bytes then track live pages."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes as t

    dt = config.compute_dtype
    heads = -(-config.num_kv_heads // kv_head_shards)
    q_heads = heads * (config.num_heads // config.num_kv_heads)
    qh, ch = kernel.get_min_heads_per_blk(q_heads, 2 * heads, dt, dt)
    key = t.simplify_key((dt, dt, qh, ch // 2, config.head_dim, page_size, num_slots,
                          pages_per_slot))
    name = " ".join(device_kind.split()[:2])
    bkv, bq = t.TUNED_BLOCK_SIZES.get(name, {}).get(key, (128, 32))
    if max_kv_pages_per_block:
        bkv = min(bkv, max_kv_pages_per_block)
    return min(pages_per_slot, bkv), min(num_slots, bq)


def kernel_read_bytes(kv_lens, page_size: int, num_kv_pages_per_block: int,
                      page_bytes_one_layer: int) -> int:
    """HBM bytes one layer's kernel call reads for these kv lengths (host numbers): whole
    blocks of pages per slot. The compiler's cost analysis cannot see into the kernel."""
    total = 0
    for n in kv_lens:
        pages = -(-max(int(n), 1) // page_size)
        total += -(-pages // num_kv_pages_per_block) * num_kv_pages_per_block
    return total * page_bytes_one_layer


# ----------------------------------------------------------------------------- the model


def attend_pages(q_BxTxHxHd, k_BxTxKxHd, v_BxTxKxHd, pages_PxSxCxHd, page_table_BxW, start_B,
                 count_B, config: ModelConfig, window: int | None = None, *,
                 attention: str = "gather", blocks: tuple[int, int] | None = None,
                 kernel=ragged_decode):
    """One layer's step over the pool it is given: write the new keys and values into their
    pages, then attend (module docstring). The page table holds global ids (`local_pages`),
    so the engine runs this on each data shard's slice of a split pool (its slots' rows,
    queries and pages: paged.PagedEngine's `on_shards`), and as it is on a whole one.
    Returns (attention [B, T, H * Hd], the pool)."""
    B = q_BxTxHxHd.shape[0]
    pages, table = write_tokens(pages_PxSxCxHd, k_BxTxKxHd, v_BxTxKxHd, page_table_BxW, start_B,
                                count_B)
    if attention != "kernel":
        return attention_gather(q_BxTxHxHd, pages, table, start_B, config, window), pages
    # the kernel's kv lengths: a slot's tokens with the new one; an idle slot (no new token,
    # its table row null) reads one token of the null page, not up to its stale length
    kv_lens = jnp.where(count_B > 0, start_B + count_B, 1)
    attn = attention_kernel(q_BxTxHxHd[:, 0], pages, table, kv_lens, config, window,
                            num_kv_pages_per_block=min(blocks[0], table.shape[1]),
                            num_queries_per_block=min(blocks[1], B), kernel=kernel)
    return attn[:, None], pages


def paged_forward(params, config: ModelConfig, tokens_BxT, kv: PagedKV, counts_B=None, *,
                  attention: str = "gather", blocks: tuple[int, int] | None = None,
                  return_hidden: bool = False, kernel=ragged_decode, on_shards=None,
                  windows=None):
    """Run the model on T new tokens per slot over the paged cache: the dense forward's
    blocks (ada.models.transformer.block), attending through pages.

    Token t of slot b is at position kv.lengths[b] + t; tokens t >= counts_B[b] (default:
    all T) are padding: not written, their outputs unused. Each layer writes its new keys
    and values into their pages, then attends over the slot's pages (`attend_pages`);
    `blocks` = (num_kv_pages_per_block, num_queries_per_block) for attention="kernel"
    (`kernel`: ragged_decode or its reference form). `on_shards(step, windowed)` wraps
    attend_pages (or attend_window) to run on each shard of a mesh (None: as it is).
    `windows`: a gather-path decode step (T = 1) inside a chunk, each layer's
    `gather_window` (module docstring); then returns (..., the updated windows) too.
    Returns (logits [B, T, V] float32 or the final hidden states, the updated PagedKV
    with lengths advanced by counts_B)."""
    c = config
    B, T = tokens_BxT.shape
    counts = jnp.full((B,), T, jnp.int32) if counts_B is None else counts_B.astype(jnp.int32)
    start = kv.lengths
    positions = start[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    if attention == "kernel" and (T != 1 or blocks is None):
        raise ValueError("attention='kernel' is decode only (T = 1) and needs blocks=(kv pages,"
                         " queries) per block")
    if windows is not None and (T != 1 or attention != "gather"):
        raise ValueError("windows are the gather path's decode step (T = 1)")
    x = embed(params, c, tokens_BxT)
    new_pages, new_windows = [], []
    for i, (layer, pages, window, inv_freq) in enumerate(zip(
            per_layer(params["layers"], c.num_layers), kv.pages, c.layer_windows,
            layer_inv_freqs(c), strict=True)):
        if windows is None:
            step = functools.partial(attend_pages, config=c, window=window, attention=attention,
                                     blocks=blocks, kernel=kernel)
            args = (pages,)
        else:
            step = functools.partial(attend_window, config=c, window=window)
            args = (pages, windows[i])
        step = step if on_shards is None else on_shards(step, windows is not None)

        def attend(q, k, v, args=args, step=step):
            return step(q, k, v, *args, kv.page_table, start, counts)

        x, state = block(x, layer, c, positions, inv_freq, attend)
        pages, window_kv = state if windows is not None else (state, None)
        new_pages.append(pages)
        new_windows.append(window_kv)

    x = final_norm(params, c, x)
    new_kv = kv.replace(pages=tuple(new_pages), lengths=start + counts)
    out = x if return_hidden else project_logits(params, config, x)
    return (out, new_kv) if windows is None else (out, new_kv, tuple(new_windows))
