"""The page allocator of the paged KV cache: host side, pure Python and NumPy, deterministic
(docs/paged.md; the device side is ada/models/paged_attention.py).

The pool has `num_pages` pages of `page_size` tokens, optionally split into `shards` equal
ranges (one per data shard of the sampler mesh: a slot takes pages from its own shard only).
The first page of every shard is a null page, never given out. Each slot has a row of the
page table (`table`, [num_slots, pages_per_slot] int32, NULL past its pages) that the decode
step reads. Every page has a reference count: a page is free at 0.

Prefix sharing is page sharing. A prompt is prefilled once into pages of its own
(`alloc_prompt`, held by the returned `PromptPages`); each of its M samples `attach`es to it:
the prompt's full pages enter the slot's table by reference (count + 1, no copy), and its
partial last page, which the sample will write into, is copied to a fresh page of the
slot's own (the returned (src, dst) pairs, copied on the device by `paged.attach_fn`). So
a slot writes only to pages whose count is 1 and that it alone holds: a sample never
writes into a shared page (`check()` asserts it).

Growth and running out. A slot takes pages as its sequence grows (`grow`, before each decode
chunk, for the chunk's tokens). Admission (`can_admit`) asks for the prompt's pages plus a
lookahead of new tokens (by default all of max_new: the worst case, nothing ever preempted;
a chunk's worth admits by expected fill instead) while keeping `watermark` pages free for
the running slots' growth. Every call that takes pages is all-or-nothing: it raises
`OutOfPages` (or returns False) and changes nothing. When running slots cannot all grow,
`grow_or_preempt` serves them oldest first and preempts the youngest (freeing their pages,
never a running request's pages that it keeps); the caller deactivates the victims on the
device in the same update that publishes the new page table and requeues them (a greedy or
keyed request drawn again from scratch gives the same tokens: token i's key depends only on
the request and i). The Driver runs this loop (ada/sampling/paged_host.py); `min_pool_pages`
and `full_reservation_pages` size its pool (sampling.num_pages).
"""

from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np

from ada.models.paged_attention import NULL_PAGE, page_bytes


class OutOfPages(RuntimeError):
    """The pool (or the slot's shard of it) has too few free pages for the request."""


@dataclasses.dataclass
class PromptPages:
    """A prompt's prefilled pages: full ones shared by reference, the partial last one
    copied per sample. Held until `release_prompt` (e.g. when a prefix cache evicts it)."""

    pages: list[int]
    length: int
    shard: int = 0
    live: bool = True


class PageAllocator:
    """Pages for `num_slots` slots of up to `pages_per_slot` pages each (module docstring)."""

    def __init__(self, num_pages: int, page_size: int, num_slots: int, pages_per_slot: int,
                 *, shards: int = 1, watermark: int = 0):
        if num_pages % shards or num_slots % shards or num_pages // shards < 2:
            raise ValueError(f"num_pages={num_pages} and num_slots={num_slots} must split into "
                             f"{shards} shards of at least 2 pages")
        self.num_pages, self.page_size = int(num_pages), int(page_size)
        self.num_slots, self.pages_per_slot = int(num_slots), int(pages_per_slot)
        self.shards, self.watermark = int(shards), int(watermark)
        self.shard_pages = self.num_pages // self.shards
        self.refcount = np.zeros(self.num_pages, np.int32)
        self._free = [list(range(s * self.shard_pages + 1, (s + 1) * self.shard_pages))
                      for s in range(self.shards)]  # sorted lists are heaps: lowest first
        self.table = np.full((self.num_slots, self.pages_per_slot), NULL_PAGE, np.int32)
        self.num_held = np.zeros(self.num_slots, np.int64)  # pages in the slot's row
        self.num_shared = np.zeros(self.num_slots, np.int64)  # leading read-only pages
        self._prompts: list[PromptPages] = []

    # -- counting --------------------------------------------------------------

    def pages_for(self, tokens: int) -> int:
        return -(-max(int(tokens), 0) // self.page_size)

    def shard_of(self, slot: int) -> int:
        return slot * self.shards // self.num_slots

    def free_pages(self, shard: int = 0) -> int:
        return len(self._free[shard])

    def attach_cost(self, prompt_len: int, lookahead: int) -> int:
        """New pages a sample of an already prefilled prompt takes: its copy of the
        partial prompt page and its pages for `lookahead` more tokens."""
        return self.pages_for(prompt_len + lookahead) - prompt_len // self.page_size

    def can_admit(self, prompt_len: int, max_new: int, *, prefilled: bool = False,
                  lookahead: int | None = None, shard: int = 0) -> bool:
        """Whether a request fits now: its prompt's pages (unless `prefilled`, i.e. shared)
        and pages for `lookahead` new tokens (default max_new: the worst case), leaving
        `watermark` pages for the running slots to grow into."""
        ahead = max_new if lookahead is None else min(lookahead, max_new)
        if self.pages_for(prompt_len + ahead) > self.pages_per_slot:
            return False
        need = self.attach_cost(prompt_len, ahead)
        if not prefilled:
            need += self.pages_for(prompt_len)
        return need + self.watermark <= self.free_pages(shard)

    # -- taking and giving back ------------------------------------------------

    def _take(self, n: int, shard: int) -> list[int]:
        if n > len(self._free[shard]):
            raise OutOfPages(f"need {n} pages, {len(self._free[shard])} free in shard {shard}")
        pages = [heapq.heappop(self._free[shard]) for _ in range(n)]
        self.refcount[pages] = 1
        return pages

    def _drop(self, pages) -> None:
        for p in pages:
            self.refcount[p] -= 1
            assert self.refcount[p] >= 0, f"page {p} released twice"
            if self.refcount[p] == 0:
                heapq.heappush(self._free[p // self.shard_pages], int(p))

    def alloc_prompt(self, length: int, shard: int = 0) -> PromptPages:
        """Pages for a prompt's prefill (refcount 1, held by the returned handle)."""
        if self.pages_for(length) > self.pages_per_slot:
            raise OutOfPages(f"a {length}-token prompt needs more than {self.pages_per_slot} pages")
        pp = PromptPages(self._take(self.pages_for(length), shard), int(length), shard)
        self._prompts.append(pp)
        return pp

    def release_prompt(self, prompt: PromptPages) -> None:
        if prompt.live:
            prompt.live = False
            self._prompts.remove(prompt)
            self._drop(prompt.pages)

    def attach(self, slot: int, prompt: PromptPages, lookahead: int = 0) -> list[tuple[int, int]]:
        """Give a free slot the prompt's pages: full ones shared, the partial one copied, and
        pages for `lookahead` new tokens. Returns the (src, dst) page copies to make on the
        device before the slot's first step (at most one)."""
        assert self.num_held[slot] == 0, f"slot {slot} is busy"
        assert prompt.live, "the prompt's pages were released"
        shard = self.shard_of(slot)
        if prompt.shard != shard:
            raise ValueError(f"prompt pages are in shard {prompt.shard}, slot {slot} in {shard}")
        full = prompt.length // self.page_size
        total = self.pages_for(prompt.length + lookahead)
        if total > self.pages_per_slot:
            raise OutOfPages(f"{prompt.length} + {lookahead} tokens exceed a slot's "
                             f"{self.pages_per_slot} pages")
        own = self._take(total - full, shard)  # all-or-nothing: raises before any change
        shared = prompt.pages[:full]
        self.refcount[shared] += 1
        self.table[slot, :total] = shared + own
        self.num_held[slot], self.num_shared[slot] = total, full
        partial = prompt.length % self.page_size
        return [(prompt.pages[full], own[0])] if partial else []

    def grow(self, slot: int, tokens: int) -> bool:
        """Make the slot's pages hold `tokens` tokens. False (and nothing taken) when its
        shard has too few free pages; more tokens than a slot's row holds is an error."""
        if self.pages_for(tokens) > self.pages_per_slot:
            raise ValueError(f"{tokens} tokens exceed a slot's {self.pages_per_slot} pages")
        need = self.pages_for(tokens) - int(self.num_held[slot])
        if need <= 0:
            return True
        if need > self.free_pages(self.shard_of(slot)):
            return False
        n = int(self.num_held[slot])
        self.table[slot, n:n + need] = self._take(need, self.shard_of(slot))
        self.num_held[slot] += need
        return True

    def free(self, slot: int) -> None:
        """Give back a finished (or preempted) slot's pages; its row becomes all null."""
        n = int(self.num_held[slot])
        self._drop(self.table[slot, :n].tolist())
        self.table[slot] = NULL_PAGE
        self.num_held[slot] = self.num_shared[slot] = 0

    # -- invariants ------------------------------------------------------------

    def check(self) -> None:
        """Assert the bookkeeping is consistent (tests call it after every operation)."""
        count = np.zeros(self.num_pages, np.int64)
        for s in range(self.num_slots):
            row = self.table[s]
            n = int(self.num_held[s])
            assert (row[n:] == NULL_PAGE).all() and (row[:n] != NULL_PAGE).all(), s
            assert all(p // self.shard_pages == self.shard_of(s) for p in row[:n]), s
            np.add.at(count, row[:n], 1)
        for pp in self._prompts:
            np.add.at(count, pp.pages, 1)
        assert (count == self.refcount).all(), "refcounts differ from the references"
        nulls = np.arange(self.shards) * self.shard_pages
        free = np.concatenate([np.asarray(f, np.int64) for f in self._free])
        assert (self.refcount[nulls] == 0).all() and not np.isin(nulls, free).any()
        assert len(set(free.tolist())) == len(free) and (self.refcount[free] == 0).all()
        assert len(free) + (self.refcount > 0).sum() + self.shards == self.num_pages
        for s in range(self.num_slots):  # a slot writes only pages it alone holds
            writable = self.table[s, self.num_shared[s]:self.num_held[s]]
            assert (self.refcount[writable] == 1).all(), f"slot {s} can write a shared page"


# ----------------------------------------------------------------------------- policies


def grow_or_preempt(alloc: PageAllocator, demands: dict[int, int],
                    admitted: dict[int, int]) -> list[int]:
    """Grow every running slot to its demanded token count, oldest admission first; when
    a slot cannot grow, preempt the youngest running slot (possibly itself), free its pages
    and retry. Returns the victims, youngest first. Slots that are not victims get all their
    pages and keep every page they had: a running request is never corrupted.

    demands: slot -> tokens its pages must hold after the next chunk.
    admitted: slot -> admission order (larger = younger), for every slot in demands."""
    order = sorted(demands, key=lambda s: admitted[s])
    victims: list[int] = []
    for slot in order:
        while slot not in victims and not alloc.grow(slot, demands[slot]):
            same = [s for s in order if s not in victims
                    and alloc.shard_of(s) == alloc.shard_of(slot)]
            victim = max(same, key=lambda s: admitted[s])
            alloc.free(victim)
            victims.append(victim)
    return victims


# ----------------------------------------------------------------------------- sizing


def min_pool_pages(max_prompt_len: int, max_new: int, page_size: int, *,
                   lookahead: int | None = None, watermark: int = 0) -> int:
    """Usable pages (the null page aside) one request of the longest prompt and max_new
    tokens needs alone in the pool: its prompt's pages (prefilled once), its own copy of
    the partial one and pages for every new token; and its admission (the prompt plus
    `lookahead` tokens, default all, plus `watermark`) must fit too."""
    def pages(n):
        return -(-int(n) // page_size)

    own = pages(max_prompt_len) - max_prompt_len // page_size  # the prompt's pages, its copy
    ahead = max_new if lookahead is None else min(lookahead, max_new)
    return max(own + pages(max_prompt_len + max_new),
               own + pages(max_prompt_len + ahead) + watermark)


def full_reservation_pages(num_slots: int, pages_per_slot: int, max_prompt_len: int,
                           page_size: int) -> int:
    """num_pages (null page included) for which a request admitted with its worst case
    reserved is never preempted, and a free slot can always take the queue's head once
    the prefix cache gives back the pages of the prompts the head does not need: every
    slot's full row plus one longest prompt's pages."""
    return 1 + num_slots * pages_per_slot + -(-max_prompt_len // page_size)


# ----------------------------------------------------------------------------- planning


def slots_that_fit(model_cfg, hbm_bytes_for_kv: float, page_size: int, mean_response_len: float,
                   prompt_len: float, *, max_response_len: int, max_prompt_len: int | None = None,
                   samples_per_prompt: int = 1, kv_head_shards: int = 1, slot_shards: int = 1,
                   pool_shards: int = 1, chunk_size: int = 8, headroom: float = 0.1,
                   per_slot_bytes: float | None = None, dtype=None) -> dict:
    """Slots that fit `hbm_bytes_for_kv` bytes per chip, dense worst case vs paged at a
    planned mean fill. Per chip: KV heads split `kv_head_shards` ways (tensor), the dense
    cache's slots `slot_shards` ways (data), the page pool `pool_shards` ways (data too: the
    paged engine splits its pool with its slots, docs/paged.md; 1 where every data shard
    would hold the whole pool). Slot counts are per mesh.

    worst case: every slot reserves max_prompt_len + max_response_len positions (the dense
      cache; or paging with full reservation).
    mean fill: a slot holds its share of the prompt's full pages (shared by
      samples_per_prompt samples), its own partial prompt page, and pages for
      mean_response_len + chunk_size more tokens (rounded up to whole pages); `headroom` of
      the pool stays free for growth past the mean (preemption beyond it).
    per_slot_bytes: other per-slot bytes (default: three float32 [V / tensor] vectors, the
      logits and sampling temporaries), charged to both."""
    token_bytes = page_bytes(model_cfg, 1, dtype, kv_head_shards)
    pbytes = token_bytes * page_size
    if per_slot_bytes is None:
        per_slot_bytes = 3 * 4 * model_cfg.vocab_size / kv_head_shards
    worst_tokens = (max_prompt_len or math.ceil(prompt_len)) + max_response_len
    worst = int(hbm_bytes_for_kv // (worst_tokens * token_bytes + per_slot_bytes))
    shared = (prompt_len // page_size) / samples_per_prompt
    own = math.ceil((prompt_len % page_size + mean_response_len + chunk_size) / page_size)
    per_slot = (shared + own) * pbytes + per_slot_bytes
    mean = int(hbm_bytes_for_kv * (1 - headroom) // per_slot)
    return dict(worst_case_slots=worst * slot_shards, mean_fill_slots=mean * pool_shards,
                ratio=mean * pool_shards / max(worst * slot_shards, 1),
                worst_case_tokens_per_slot=worst_tokens,
                mean_fill_tokens_per_slot=(shared + own) * page_size, page_bytes=pbytes,
                headroom=headroom,
                num_pages=int(hbm_bytes_for_kv // pbytes), token_bytes=token_bytes)
