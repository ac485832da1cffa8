"""Paged decoding: the decode state over a page pool and its jitted prefill / attach /
generate, the counterparts of engine.py's prefill / insert / generate (docs/paged.md).
`PagedEngine` is what ada.sampling.backends.make_engine builds for sampling.kv_cache=paged; the Driver
runs it through paged_host.PagedSlots (`driver_backend`), which owns the page allocator.

  prefill   N prompts, right-padded to a power-of-two bucket, written into pages the host
            allocator gave each prompt (ada/sampling/pages.py: `alloc_prompt`); returns
            each prompt's next-token logits. A prompt sampled M times is prefilled once.
  attach    starts requests in free slots from prefilled prompts: copies the partial
            prompt page of each sample into its own page (the allocator's (src, dst)
            pairs), sets the slot's length, logits, key and max new tokens. The slots'
            page-table rows are the allocator's; shared full prompt pages are not copied.
  generate  K decode steps under lax.scan for every slot, reading the page table the host
            passes each chunk (its width bucketed: a chunk gathers only the pages its slots
            can reach), sampling as engine.decode_step does (same keys, same stop rules).
  extend    a parked multi-turn request's observation (or a restarted one's context):
            its tokens written into the slot's own pages after its last token (the host
            grows them first; the prompt's shared pages are not touched), the slot resumed
            from the logits after the last one (docs/paged.md, "Multi-turn requests").

Sequences are unpadded: slot b's token i sits at position i, its RoPE position too, so the
logits equal the dense cache's (left-padded, positions from the mask) up to float rounding
(tests/test_paged.py). Attention is "gather" (pure JAX, any backend) or "kernel" (the Pallas
TPU kernel; blocks from `paged_attention.tuned_blocks`).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding

from ada import sharding as shd
from ada.models.paged_attention import (
    PagedKV,
    copy_pages,
    gather_window,
    init_pages,
    kernel_fits,
    paged_forward,
    tuned_blocks,
)
from ada.models.transformer import ModelConfig, project_logits
from ada.sampling.engine import (
    Chunk,
    bucket_for,
    check_stop_ids,
    pow2_buckets,
    sampler_layout,
)
from ada.sampling.engine_base import EngineBase
from ada.sampling.paged_host import PagedSlots
from ada.sampling.pages import full_reservation_pages, min_pool_pages
from ada.sampling.samplers import SamplingConfig, sample_and_stop
from ada.sampling.slots import request_key, resume_slots


@struct.dataclass
class PagedState:
    """Everything a paged decode step reads and writes, for B slots (the page table is
    the host allocator's, passed per call)."""

    pages: tuple  # L x [num_pages, page_size, 2K, Hd]
    lengths: jax.Array  # [B] int32: tokens in the slot's pages = RoPE position of the next
    logits: jax.Array  # [B, V] float32: logits of the slot's next token
    generated: jax.Array  # [B] int32
    max_new: jax.Array  # [B] int32
    active: jax.Array  # [B] bool
    keys: jax.Array  # [B, 2] uint32: request_key(step_key, prompt_id, sample_idx)


def prefill_fn(params, pages, tokens_NxT, counts_N, page_table_NxW, order_N, *,
               config: ModelConfig, on_shards=None):
    """Write N right-padded prompts (counts_N real tokens each) into their pages (each row
    on the data shard that holds its pages: PagedEngine.prefill lays them out); return
    (pages, next-token logits [N, V] of rows order_N, i.e. in the caller's order)."""
    N = tokens_NxT.shape[0]
    kv = PagedKV(pages=pages, page_table=page_table_NxW, lengths=jnp.zeros((N,), jnp.int32))
    hidden, kv = paged_forward(params, config, tokens_NxT, kv, counts_N, return_hidden=True,
                               on_shards=on_shards)
    last = jnp.take_along_axis(hidden, jnp.maximum(counts_N - 1, 0)[:, None, None], axis=1)
    return kv.pages, project_logits(params, config, last[order_N])[:, 0]


def attach_fn(state: PagedState, logits_NxV, src_C, dst_C, slots_I, rows_I, lengths_I,
              step_key, prompt_ids_I, sample_idxs_I, max_new_I, *, copy=copy_pages) -> PagedState:
    """Start I requests: page copies src_C -> dst_C first (dst a null page: padding; `copy`
    runs them on each data shard where the pool is split), then slot slots_I[i] continues
    prefilled row rows_I[i] of `logits_NxV` from lengths_I[i] tokens. Padding repeats the
    last request (the same values written twice)."""
    keys = jax.vmap(request_key, (None, 0, 0))(step_key, prompt_ids_I, sample_idxs_I)
    return state.replace(
        pages=copy(state.pages, src_C, dst_C),
        lengths=state.lengths.at[slots_I].set(lengths_I),
        logits=state.logits.at[slots_I].set(logits_NxV[rows_I]),
        generated=state.generated.at[slots_I].set(0),
        max_new=state.max_new.at[slots_I].set(max_new_I),
        active=state.active.at[slots_I].set(True),
        keys=state.keys.at[slots_I].set(keys))


def extend_fn(params, state: PagedState, tokens_NxT, counts_N, table_NxW, slots_N, generated_N,
              max_new_N, *, config: ModelConfig, on_shards=None, constrain=None) -> PagedState:
    """Append counts_N[i] tokens (row i, right-padded) to slot slots_N[i] after its
    lengths (table_NxW: its page-table row, the pages already grown) and resume it: its
    logits after its last appended token, `generated` / `max_new` the request's tokens so
    far and its turn's end, active. Rows with slot >= B (and no tokens, a null row) are
    padding: nothing written."""
    B = state.active.shape[0]
    rows = jnp.minimum(slots_N, B - 1)
    kv = PagedKV(pages=state.pages, page_table=table_NxW, lengths=state.lengths[rows])
    hidden, kv = paged_forward(params, config, tokens_NxT, kv, counts_N, return_hidden=True,
                               on_shards=on_shards)
    last = jnp.take_along_axis(hidden, jnp.maximum(counts_N - 1, 0)[:, None, None], axis=1)
    logits = project_logits(params, config, last)[:, 0]

    return resume_slots(state.replace(pages=kv.pages), slots_N, constrain, logits=logits,
                        lengths=kv.lengths, generated=generated_N, max_new=max_new_N)


def stop_fn(state: PagedState, stop_B) -> PagedState:
    """Deactivate the slots where stop_B is True (preempted: their pages go back to the
    allocator, their rows of the page table become null)."""
    return state.replace(active=state.active & ~stop_B)


def decode_step(params, state: PagedState, page_table_BxW, windows=None, *,
                config: ModelConfig, sampling: SamplingConfig, eos_ids: tuple[int, ...],
                attention: str = "gather", blocks=None, vocab_shards: int = 1, on_shards=None,
                turn_end_ids: tuple[int, ...] = ()):
    """engine.decode_step over pages: sample each active slot's token, run the model on it
    (the gather path over the chunk's `windows`, paged_attention.gather_window). Returns
    (state, windows, (tokens, logprobs, valid))."""
    tokens_B, logprobs_B, valid_B, generated, active = sample_and_stop(
        state, sampling, eos_ids, vocab_shards, turn_end_ids)
    kv = PagedKV(pages=state.pages, page_table=page_table_BxW, lengths=state.lengths)
    logits, kv, *written = paged_forward(
        params, config, tokens_B[:, None], kv, valid_B.astype(jnp.int32), attention=attention,
        blocks=blocks, on_shards=on_shards, windows=windows)
    new_state = state.replace(pages=kv.pages, lengths=kv.lengths, logits=logits[:, 0],
                              generated=generated, active=active)
    return new_state, written[0] if written else None, (tokens_B, logprobs_B, valid_B)


def generate_fn(params, state: PagedState, page_table_BxW, *, config: ModelConfig,
                sampling: SamplingConfig, eos_ids: tuple[int, ...], num_steps: int,
                attention: str = "gather", blocks=None, vocab_shards: int = 1,
                constrain=None, on_shards=None, gather=gather_window,
                turn_end_ids: tuple[int, ...] = ()) -> tuple[PagedState, Chunk]:
    """num_steps decode steps under lax.scan; every live slot's pages must already hold
    its tokens after the chunk (the host grows them first). The gather path reads each
    slot's window, `gather`ed once for the chunk (on each shard where the pool is split)."""
    windows = (tuple(gather(p, page_table_BxW) for p in state.pages)
               if attention == "gather" else None)

    def body(carry, _):
        s, w = carry
        s, w, out = decode_step(params, s, page_table_BxW, w, config=config, sampling=sampling,
                                eos_ids=eos_ids, attention=attention, blocks=blocks,
                                vocab_shards=vocab_shards, on_shards=on_shards,
                                turn_end_ids=turn_end_ids)
        return (s, w), out

    (state, _), (tok, lp, valid) = jax.lax.scan(body, (state, windows), None, length=num_steps)
    if constrain is not None:
        state = constrain(state)
    W = page_table_BxW.shape[1] * state.pages[0].shape[1]
    return state, Chunk(tokens=tok.T, logprobs=lp.T, valid=valid.T, active=state.active,
                        window=W)


def on_shards(mesh: Mesh, batch_axis, heads_axis):
    """Run a cache function on each shard of `mesh` (shard_map): each data shard its own
    slots' rows, queries and pages (the pool split over `batch_axis` with the slots: the
    page ids are global, the function takes them modulo its slice, `local_pages`), the
    combined heads over `heads_axis` (None: every shard reads all heads). So a decode step,
    a prefill and a page copy read and write only pages their chip holds, the Pallas kernel
    included: no cache moves between chips.

    Returns wrappers for `paged_attention.attend_pages` (q, k, v, pages, table, start,
    count) -> (attention, pages), or with `windowed` for `attend_window` (q, k, v, pages,
    window, table, start, count) -> (attention, (pages, window)); for `copy_pages` (pages,
    src, dst) -> pages; and for `gather_window` (pages, table) -> window."""
    from jax.sharding import PartitionSpec as P

    b, h = batch_axis, heads_axis
    heads = P(b, None, h, None)  # q [B, T, H, Hd], k / v [B, T, K, Hd], a pool [P, S, 2K, Hd]
    window = (P(b, h, None, None),) * 2  # keys, values [B, K, S, Hd]

    def attend(step, windowed=False):
        pool = (heads, window) if windowed else (heads,)
        return jax.shard_map(step, mesh=mesh, check_vma=False,
                             in_specs=(heads, heads, heads, *pool, P(b, None), P(b), P(b)),
                             out_specs=(P(b, None, h), pool if windowed else heads))

    def copy(fn):
        return jax.shard_map(fn, mesh=mesh, check_vma=False, in_specs=(heads, P(b), P(b)),
                             out_specs=heads)

    gather = jax.shard_map(gather_window, mesh=mesh, check_vma=False,
                           in_specs=(heads, P(b, None)), out_specs=window)
    return attend, copy, gather


class PagedEngine(EngineBase):
    """Jitted, bucketed prefill / attach / stop / generate over one page pool (state
    donated): the engine `sampling.kv_cache = "paged"` builds (ada.sampling.backends.make_engine).

    The same contract as engine.Engine where the Driver reads it (prepare_params,
    check_prompt, check_max_new, max_new_tokens, num_slots, eos_ids, compiles ...); the host
    side is the Driver's paged slots (paged_host.PagedSlots, from `driver_backend`) over a
    `pages.PageAllocator` of the same num_slots, num_pages, page_size, pages_per_slot and
    shards.

    On a mesh whose data axis splits the slots, the pool is split with them
    (`pool_shards` equal ranges of `shard_pages` pages, each with its null page): a data
    shard's slots hold pages of its own range only, and prefill, attach and generate run
    their cache work on each shard (`on_shards`), so per chip the pool is the slots it
    serves, as the dense cache is.

    Args (beyond Engine's):
      page_size: tokens per page.
      num_pages: the pool over every data shard, null pages included (rounded up to a
        multiple of the shards); 0: `pages.full_reservation_pages` per shard, where every
        request is admitted with its worst case reserved and never preempted. Otherwise
        requests are admitted by expected fill (a chunk of lookahead, `watermark` pages kept
        free) and the youngest are preempted when the running ones cannot grow.
      attention: "gather" (pure JAX, any backend), "kernel" (the Pallas kernel, TPU; run on
        each shard of the mesh by `on_shards`, blocks from `tuned_blocks` for the mesh's chip
        unless given) or "auto" (the backend's, engine.backend_choices, where head_dim is a
        multiple of 128; else gather).
    Windows: generate reads the first W columns of the page table, W the smallest of
    `num_windows` equal steps of pages_per_slot that holds every live slot's pages.
    """

    def __init__(self, config: ModelConfig, *, num_slots: int, max_prompt_len: int,
                 max_new_tokens: int, page_size: int = 16, num_pages: int = 0,
                 sampling: SamplingConfig | None = None, eos_ids=(), chunk_size: int = 8,
                 min_prompt_bucket: int = 16, max_prefill_rows: int = 8, num_windows: int = 4,
                 mesh: Mesh | None = None, attention: str = "gather", blocks=None,
                 turn_end_ids=()):
        if attention not in ("auto", "gather", "kernel"):
            raise ValueError(f"attention={attention!r} is not one of auto, gather, kernel")
        problems = []
        self.eos_ids, self.turn_end_ids = check_stop_ids(eos_ids, turn_end_ids, config, problems)
        if problems:
            raise ValueError("invalid PagedEngine settings: " + "; ".join(problems))
        self.config, self.num_slots, self.page_size = config, int(num_slots), int(page_size)
        self.max_new_tokens, self.chunk_size, self.mesh = int(max_new_tokens), int(chunk_size), mesh
        self.sampling = sampling or SamplingConfig()
        self.prompt_buckets = pow2_buckets(min(min_prompt_bucket, max_prompt_len), max_prompt_len)
        self.max_prompt_len = self.prompt_buckets[-1]
        self.pages_per_slot = -(-(self.max_prompt_len + self.max_new_tokens) // self.page_size)
        self.cache_len = self.pages_per_slot * self.page_size
        # the pool is split over the data shards the slots are split over, in equal ranges
        self.batch_axis = (None if mesh is None else
                           shd.spec_for(("batch",), (self.num_slots,), mesh)[0])
        axes = (self.batch_axis,) if isinstance(self.batch_axis, str) else self.batch_axis or ()
        self.pool_shards = int(np.prod([mesh.shape[a] for a in axes]))
        slots_per_shard = self.num_slots // self.pool_shards
        self.full_reservation = not num_pages
        self.shard_pages = (-(-int(num_pages) // self.pool_shards) if num_pages else
                            full_reservation_pages(slots_per_shard, self.pages_per_slot,
                                                   self.max_prompt_len, self.page_size))
        self.num_pages = self.pool_shards * self.shard_pages
        # admission: the worst case (never preempted), or a chunk ahead with 10% kept free
        self.lookahead = None if self.full_reservation else self.chunk_size
        need = min_pool_pages(self.max_prompt_len, self.max_new_tokens, self.page_size,
                              lookahead=self.lookahead)
        if self.shard_pages - 1 < need:
            split = (f" in each of {self.pool_shards} data shards: pass "
                     f"{self.pool_shards * (need + 1)} or more" if self.pool_shards > 1 else "")
            raise ValueError(f"num_pages={num_pages} is too small: one request of "
                             f"{self.max_prompt_len} prompt + {self.max_new_tokens} new tokens "
                             f"needs {need + 1} pages of {self.page_size} (null page included)"
                             f"{split}")
        self.watermark = 0 if self.full_reservation else min((self.shard_pages - 1) // 10,
                                                             self.shard_pages - 1 - need)
        self.row_buckets = pow2_buckets(1, max(1, min(int(max_prefill_rows), slots_per_shard)))
        self.insert_buckets = pow2_buckets(1, self.num_slots)
        self.append_buckets = pow2_buckets(self.prompt_buckets[0], self.cache_len)
        step = -(-self.pages_per_slot // int(num_windows))
        self.window_buckets = tuple(sorted({min(step * i, self.pages_per_slot)
                                            for i in range(1, int(num_windows) + 1)}))
        self.choices, self.vocab_shards = sampler_layout(config, self.num_slots, mesh)
        self.attention = ((self.choices.paged_attention if kernel_fits(config) else "gather")
                          if attention == "auto" else attention)
        heads = None if mesh is None else self.state_shardings().pages[0].spec[2]
        if self.attention == "kernel":
            device = (jax.local_devices()[0] if mesh is None else mesh.devices.flat[0])
            blocks = blocks or tuned_blocks(
                config, self.page_size, slots_per_shard, self.pages_per_slot,
                device_kind=device.device_kind,
                kv_head_shards=mesh.shape["tensor"] if heads else 1)
        self.blocks = blocks
        attend, copy, gather = None, copy_pages, gather_window
        if mesh is not None and mesh.size > 1:
            attend, on_each, gather = on_shards(mesh, self.batch_axis, heads)
            copy = on_each(copy_pages)
        self._prefill = jax.jit(functools.partial(prefill_fn, config=config, on_shards=attend),
                                donate_argnums=(1,))
        self._attach = jax.jit(functools.partial(attach_fn, copy=copy), donate_argnums=(0,))
        self._stop = jax.jit(functools.partial(stop_fn), donate_argnums=(0,))
        self._extend = jax.jit(functools.partial(
            extend_fn, config=config, on_shards=attend,
            constrain=self._constrain if mesh is not None else None), donate_argnums=(1,))
        self._generate = jax.jit(
            functools.partial(generate_fn, config=config, sampling=self.sampling,
                              eos_ids=self.eos_ids, turn_end_ids=self.turn_end_ids,
                              attention=self.attention, blocks=blocks,
                              vocab_shards=self.vocab_shards, on_shards=attend, gather=gather,
                              constrain=self._constrain if mesh is not None else None),
            static_argnames=("num_steps",), donate_argnums=(1,))
        self._jit_shared()

    def driver_backend(self, driver):
        """The Driver's host side over this engine: admission, prefix pages, growth and
        preemption (paged_host.PagedSlots)."""
        return PagedSlots(driver)

    # -- sharding and params ---------------------------------------------------

    def state_shardings(self) -> PagedState:
        """NamedShardings of the state on the engine's mesh: per-slot vectors split like a
        batch, each pool's pages split the same ways (a data shard holds its slots' pages)
        and over tensor on its combined-head axis 2 when the KV heads divide (a head's key
        and value stay together)."""
        assert self.mesh is not None
        c, B = self.config, self.num_slots
        ns = lambda logical, shape: NamedSharding(self.mesh, shd.spec_for(logical, shape, self.mesh))
        pages = ns(("batch", None, "kv_heads", None),
                   (self.num_pages, self.page_size, c.num_kv_heads, c.head_dim))
        vec = ns(("batch",), (B,))
        return PagedState(pages=(pages,) * c.num_layers, lengths=vec,
                          logits=ns(("batch", "vocab"), (B, c.vocab_size)), generated=vec,
                          max_new=vec, active=vec, keys=ns(("batch", None), (B, 2)))

    def lower_generate(self, params, filled: int | None = None, num_steps: int | None = None):
        """generate's jitted chunk lowered for abstract (ShapeDtypeStruct) or real params at
        a fill of `filled` tokens per slot (default: the whole window)."""
        K = self.chunk_size if num_steps is None else int(num_steps)
        W = self.window_pages(self.cache_len if filled is None else filled, K)
        table = jax.ShapeDtypeStruct((self.num_slots, W), jnp.int32)
        with self._kernel_mesh():
            return self._generate.lower(params, self.abstract_state(), table, num_steps=K)

    def _kernel_mesh(self):
        """The Pallas kernel lowers for the devices of the ambient mesh: the engine's."""
        if self.attention == "kernel" and self.mesh is not None:
            return jax.set_mesh(self.mesh)
        return contextlib.nullcontext()

    # -- the contract ------------------------------------------------------------

    def _empty_state(self) -> PagedState:
        B, V = self.num_slots, self.config.vocab_size
        return PagedState(pages=init_pages(self.config, self.num_pages, self.page_size),
                          lengths=jnp.zeros((B,), jnp.int32), logits=jnp.zeros((B, V), jnp.float32),
                          generated=jnp.zeros((B,), jnp.int32), max_new=jnp.zeros((B,), jnp.int32),
                          active=jnp.zeros((B,), bool), keys=jnp.zeros((B, 2), jnp.uint32))

    def prefill(self, params, state: PagedState, prompts: list, prompt_pages: list):
        """Prefill prompts[i] into prompt_pages[i] (PromptPages; at most row_buckets[-1] of
        them in any one shard). Returns (state, logits), logits[i] prompts[i]'s. Each
        prompt's row lies on the data shard that holds its pages: shard s has rows
        [s * n, (s + 1) * n), n the row bucket of the fullest shard."""
        T = bucket_for(max(len(p) for p in prompts), self.prompt_buckets)
        n, rows = self._shard_blocks([pp.shard for pp in prompt_pages], self.row_buckets)
        N, W = self.pool_shards * n, -(-T // self.page_size)
        tokens = np.zeros((N, T), np.int32)
        counts = np.zeros((N,), np.int32)  # filler rows: no tokens, nothing written
        table = np.zeros((N, W), np.int32)
        order = np.zeros((N,), np.int32)
        order[:len(rows)] = rows
        for row, p, pp in zip(rows, prompts, prompt_pages, strict=True):
            tokens[row, :len(p)], counts[row] = p, len(p)
            table[row, :len(pp.pages)] = pp.pages
        pages, logits = self._prefill(params, state.pages, tokens, counts, table, order)
        return state.replace(pages=pages), logits

    def attach(self, state: PagedState, logits, copies, slots, rows, lengths, step_key,
               prompt_ids, sample_idxs, max_new) -> PagedState:
        """attach_fn, padded to power-of-two counts (copies: the allocator's pairs)."""
        n = len(slots)
        pad = bucket_for(n, self.insert_buckets) - n

        def arr(xs, dtype):
            xs = np.asarray(xs, dtype)
            return np.concatenate([xs, np.repeat(xs[-1:], pad)]) if pad else xs

        # each data shard copies its own pages
        C, at = self._shard_blocks([d // self.shard_pages for _, d in copies],
                                   self.insert_buckets)
        src = np.zeros(self.pool_shards * C, np.int32)
        dst = np.zeros_like(src)  # a null page: no copy
        for i, (s, d) in zip(at, copies, strict=True):
            src[i], dst[i] = s, d
        return self._attach(state, logits, src, dst, arr(slots, np.int32), arr(rows, np.int32),
                            arr(lengths, np.int32), step_key, arr(prompt_ids, np.uint32),
                            arr(sample_idxs, np.uint32), arr(max_new, np.int32))

    def _shard_blocks(self, shards: list[int], buckets) -> tuple[int, list[int]]:
        """Lay items out in one block per data shard, shard s's at [s * n, (s + 1) * n) in
        their order, n the bucket of the fullest shard (at least 1): (n, each item's index)."""
        n = bucket_for(max(np.bincount(shards, minlength=1).max(), 1), buckets)
        taken = np.zeros(self.pool_shards, np.int64)
        at = []
        for sh in shards:
            at.append(int(sh * n + taken[sh]))
            taken[sh] += 1
        return n, at

    def extend(self, params, state: PagedState, page_table, appends: dict,
               counts: list) -> PagedState:
        """Append appends[slot] (token ids) after each slot's tokens, in pages the host has
        grown for them, and resume it (extend_fn); counts[i]: (generated, max_new) of the
        i-th slot's request. Rows laid out per data shard as `prefill`'s, lengths padded to
        a power-of-two bucket, the page table cut to the window bucket that holds them."""
        slots = list(appends)
        n, rows = self._shard_blocks([s * self.pool_shards // self.num_slots for s in slots],
                                     self.insert_buckets)
        N = self.pool_shards * n
        T = bucket_for(max(map(len, appends.values())), self.append_buckets)
        ends = [int(page_table[s].astype(bool).sum()) * self.page_size for s in slots]
        W = self.window_pages(max(ends), 0)
        tokens, lens = np.zeros((N, T), np.int32), np.zeros((N,), np.int32)
        table = np.zeros((N, W), np.int32)
        slot_ids = np.full((N,), self.num_slots, np.int32)  # padding rows: no slot
        gen, max_new = np.zeros((2, N), np.int32)
        for row, slot, (g, m) in zip(rows, slots, counts, strict=True):
            tokens[row, :len(appends[slot])], lens[row] = appends[slot], len(appends[slot])
            table[row], slot_ids[row], gen[row], max_new[row] = page_table[slot, :W], slot, g, m
        return self._extend(params, state, tokens, lens, table, slot_ids, gen, max_new)

    def stop(self, state: PagedState, slots) -> PagedState:
        """Deactivate these slots (one compile for any number of them)."""
        mask = np.zeros((self.num_slots,), bool)
        mask[list(slots)] = True
        return self._stop(state, mask)

    def window_pages(self, filled: int, num_steps: int) -> int:
        """Page-table columns a chunk reads: the window bucket holding filled + num_steps."""
        return bucket_for(min(-(-(filled + num_steps) // self.page_size), self.pages_per_slot),
                          self.window_buckets)

    def generate(self, params, state: PagedState, page_table, filled: int,
                 num_steps: int | None = None) -> tuple[PagedState, Chunk]:
        """A chunk over the first W page-table columns, W the window bucket holding
        `filled` (the most tokens a live slot holds) + num_steps."""
        K = self.chunk_size if num_steps is None else int(num_steps)
        W = self.window_pages(filled, K)
        with self._kernel_mesh():
            return self._generate(params, state, np.asarray(page_table[:, :W], np.int32),
                                  num_steps=K)

    def compiles(self) -> dict[str, int]:
        """Compilations made so far, per function (jit's own cache sizes)."""
        return {name: int(getattr(self, f"_{name}")._cache_size())
                for name in ("init", "prefill", "attach", "stop", "extend", "generate")}
