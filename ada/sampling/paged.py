"""Paged decoding: the decode state over a page pool and its jitted prefill / attach /
generate, the counterparts of engine.py's prefill / insert / generate (docs/paged.md).

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

Sequences are unpadded: slot b's token i sits at position i, its RoPE position too, so the
logits equal the dense cache's (left-padded, positions from the mask) up to float rounding
(tests/test_paged.py). Attention is "gather" (pure JAX, any backend) or "kernel" (the Pallas
TPU kernel; blocks from `paged_attention.tuned_blocks`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ada.models.paged_attention import (
    PagedKV,
    copy_pages,
    init_pages,
    paged_forward,
)
from ada.models.transformer import ModelConfig, project_logits
from ada.sampling.engine import Chunk, bucket_for, pow2_buckets
from ada.sampling.samplers import SamplingConfig, sample
from ada.sampling.slots import request_key


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


def prefill_fn(params, pages, tokens_NxT, counts_N, page_table_NxW, *, config: ModelConfig):
    """Write N right-padded prompts (counts_N real tokens each) into their pages; return
    (pages, next-token logits [N, V])."""
    N = tokens_NxT.shape[0]
    kv = PagedKV(pages=pages, page_table=page_table_NxW, lengths=jnp.zeros((N,), jnp.int32))
    hidden, kv = paged_forward(params, config, tokens_NxT, kv, counts_N, return_hidden=True)
    last = jnp.take_along_axis(hidden, jnp.maximum(counts_N - 1, 0)[:, None, None], axis=1)
    return kv.pages, project_logits(params, config, last)[:, 0]


def attach_fn(state: PagedState, logits_NxV, src_C, dst_C, slots_I, rows_I, lengths_I,
              step_key, prompt_ids_I, sample_idxs_I, max_new_I) -> PagedState:
    """Start I requests: page copies src_C -> dst_C first (dst NULL: padding), then slot
    slots_I[i] continues prefilled row rows_I[i] of `logits_NxV` from lengths_I[i] tokens.
    Padding repeats the last request (the same values written twice)."""
    keys = jax.vmap(request_key, (None, 0, 0))(step_key, prompt_ids_I, sample_idxs_I)
    return state.replace(
        pages=copy_pages(state.pages, src_C, dst_C),
        lengths=state.lengths.at[slots_I].set(lengths_I),
        logits=state.logits.at[slots_I].set(logits_NxV[rows_I]),
        generated=state.generated.at[slots_I].set(0),
        max_new=state.max_new.at[slots_I].set(max_new_I),
        active=state.active.at[slots_I].set(True),
        keys=state.keys.at[slots_I].set(keys))


def stop_fn(state: PagedState, stop_B) -> PagedState:
    """Deactivate the slots where stop_B is True (preempted: their pages go back to the
    allocator, their rows of the page table become null)."""
    return state.replace(active=state.active & ~stop_B)


def decode_step(params, state: PagedState, page_table_BxW, *, config: ModelConfig,
                sampling: SamplingConfig, eos_ids: tuple[int, ...], attention: str = "gather",
                blocks=None):
    """engine.decode_step over pages: sample each active slot's token, run the model on it."""
    keys = jax.vmap(jax.random.fold_in)(state.keys, state.generated)
    tokens_B, logprobs_B = sample(state.logits, keys, sampling)
    valid_B = state.active
    generated = state.generated + valid_B.astype(jnp.int32)
    is_eos = (jnp.isin(tokens_B, jnp.asarray(eos_ids, jnp.int32)) if eos_ids
              else jnp.zeros_like(valid_B))
    active = valid_B & ~is_eos & (generated < state.max_new)
    kv = PagedKV(pages=state.pages, page_table=page_table_BxW, lengths=state.lengths)
    logits, kv = paged_forward(params, config, tokens_B[:, None], kv, valid_B.astype(jnp.int32),
                               attention=attention, blocks=blocks)
    new_state = state.replace(pages=kv.pages, lengths=kv.lengths, logits=logits[:, 0],
                              generated=generated, active=active)
    return new_state, (tokens_B, logprobs_B, valid_B)


def generate_fn(params, state: PagedState, page_table_BxW, *, config: ModelConfig,
                sampling: SamplingConfig, eos_ids: tuple[int, ...], num_steps: int,
                attention: str = "gather", blocks=None) -> tuple[PagedState, Chunk]:
    """num_steps decode steps under lax.scan; every live slot's pages must already hold
    its tokens after the chunk (the host grows them first)."""
    def body(s, _):
        return decode_step(params, s, page_table_BxW, config=config, sampling=sampling,
                           eos_ids=eos_ids, attention=attention, blocks=blocks)

    state, (tok, lp, valid) = jax.lax.scan(body, state, None, length=num_steps)
    W = page_table_BxW.shape[1] * state.pages[0].shape[1]
    return state, Chunk(tokens=tok.T, logprobs=lp.T, valid=valid.T, active=state.active,
                        window=W)


class PagedEngine:
    """Jitted, bucketed prefill / attach / generate over one page pool (state donated).

    The host side is the caller's: a `pages.PageAllocator` with the same num_slots,
    num_pages, page_size and pages_per_slot gives the page tables (docs/paged.md shows the
    loop). Windows: generate reads the first W columns of the page table, W the smallest
    of `num_windows` equal steps of pages_per_slot that holds every live slot's pages.
    """

    def __init__(self, config: ModelConfig, *, num_slots: int, num_pages: int, page_size: int,
                 pages_per_slot: int, sampling: SamplingConfig | None = None, eos_ids=(),
                 chunk_size: int = 8, min_prompt_bucket: int = 16, max_prefill_rows: int = 8,
                 num_windows: int = 4, attention: str = "gather", blocks=None):
        self.config, self.num_slots, self.num_pages = config, num_slots, num_pages
        self.page_size, self.pages_per_slot, self.chunk_size = page_size, pages_per_slot, chunk_size
        self.sampling = sampling or SamplingConfig()
        self.eos_ids = tuple(int(e) for e in eos_ids)
        self.max_prompt_len = pages_per_slot * page_size
        self.prompt_buckets = pow2_buckets(min_prompt_bucket, self.max_prompt_len)
        self.row_buckets = pow2_buckets(1, max_prefill_rows)
        self.insert_buckets = pow2_buckets(1, num_slots)
        step = -(-pages_per_slot // num_windows)
        self.window_buckets = tuple(sorted({min(step * i, pages_per_slot)
                                            for i in range(1, num_windows + 1)}))
        self._prefill = jax.jit(functools.partial(prefill_fn, config=config), donate_argnums=(1,))
        self._attach = jax.jit(attach_fn, donate_argnums=(0,))
        self._stop = jax.jit(stop_fn, donate_argnums=(0,))
        self._generate = jax.jit(
            functools.partial(generate_fn, config=config, sampling=self.sampling,
                              eos_ids=self.eos_ids, attention=attention, blocks=blocks),
            static_argnames=("num_steps",), donate_argnums=(1,))

    def init_state(self) -> PagedState:
        B, V = self.num_slots, self.config.vocab_size
        return PagedState(pages=init_pages(self.config, self.num_pages, self.page_size),
                          lengths=jnp.zeros((B,), jnp.int32), logits=jnp.zeros((B, V), jnp.float32),
                          generated=jnp.zeros((B,), jnp.int32), max_new=jnp.zeros((B,), jnp.int32),
                          active=jnp.zeros((B,), bool), keys=jnp.zeros((B, 2), jnp.uint32))

    def prefill(self, params, state: PagedState, prompts: list, prompt_pages: list):
        """Prefill prompts[i] into prompt_pages[i] (PromptPages). Returns (state, logits)."""
        T = bucket_for(max(len(p) for p in prompts), self.prompt_buckets)
        N = bucket_for(len(prompts), self.row_buckets)
        W = -(-T // self.page_size)
        tokens = np.zeros((N, T), np.int32)
        counts = np.zeros((N,), np.int32)  # filler rows: no tokens, nothing written
        table = np.zeros((N, W), np.int32)
        for i, (p, pp) in enumerate(zip(prompts, prompt_pages, strict=True)):
            tokens[i, :len(p)], counts[i] = p, len(p)
            table[i, :len(pp.pages)] = pp.pages
        pages, logits = self._prefill(params, state.pages, tokens, counts, table)
        return state.replace(pages=pages), logits

    def attach(self, state: PagedState, logits, copies, slots, rows, lengths, step_key,
               prompt_ids, sample_idxs, max_new) -> PagedState:
        """attach_fn, padded to power-of-two counts (copies: the allocator's pairs)."""
        n = len(slots)
        pad = bucket_for(n, self.insert_buckets) - n

        def arr(xs, dtype):
            xs = np.asarray(xs, dtype)
            return np.concatenate([xs, np.repeat(xs[-1:], pad)]) if pad else xs

        src = np.zeros(bucket_for(max(len(copies), 1), self.insert_buckets), np.int32)
        dst = np.zeros_like(src)  # NULL: no copy
        for i, (s, d) in enumerate(copies):
            src[i], dst[i] = s, d
        return self._attach(state, logits, src, dst, arr(slots, np.int32), arr(rows, np.int32),
                            arr(lengths, np.int32), step_key, arr(prompt_ids, np.uint32),
                            arr(sample_idxs, np.uint32), arr(max_new, np.int32))

    def stop(self, state: PagedState, slots) -> PagedState:
        """Deactivate these slots (one compile for any number of them)."""
        mask = np.zeros((self.num_slots,), bool)
        mask[list(slots)] = True
        return self._stop(state, mask)

    def generate(self, params, state: PagedState, page_table, filled: int,
                 num_steps: int | None = None) -> tuple[PagedState, Chunk]:
        """A chunk over the first W page-table columns, W the window bucket holding
        `filled` (the most tokens a live slot holds) + num_steps."""
        K = self.chunk_size if num_steps is None else int(num_steps)
        W = bucket_for(min(-(-(filled + K) // self.page_size), self.pages_per_slot),
                       self.window_buckets)
        return self._generate(params, state, np.asarray(page_table[:, :W], np.int32),
                              num_steps=K)
