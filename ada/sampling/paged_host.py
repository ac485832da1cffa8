"""The Driver's host side over a paged engine (docs/paged.md, "The paged engine in the
driver"): what `PagedEngine.driver_backend` gives the Driver (driver.py) in place of its
dense_host.DenseSlots. The queue, the slots' requests and tokens, completions and counters
stay the Driver's; this owns the device state and a `pages.PageAllocator`, and decides
which queued requests enter and which running ones leave.

  fill       admits the queue's head while `can_admit` says its pages fit (FIFO: a request
             that does not fit is deferred, and so is everything behind it). Each distinct
             new prompt gets pages (`alloc_prompt`) and one prefill (batched by prompt-length
             bucket); the prompt stays in a prefix LRU (its PromptPages and next-token
             logits), so the M samples of a prompt, in this round or a later one, share its
             full pages with no copy (`attach`). When the head does not fit, cached prompts
             no queued request needs are released first; then, when nothing is running (or
             every running slot already holds its worst case), the others the head does not
             need. Prompts admitted in this fill are never released before their attach.
  run_chunk  grows every running slot's pages for the chunk's tokens, oldest admission
             first (`grow_or_preempt`; when the pool is short, cached prompts are released
             first, those no queued request needs before the others); the victims are
             deactivated on the device and requeued at the front, oldest first, and restart
             from scratch with the same tokens (token i's key depends only on the request
             and i). Then one jitted chunk over every slot, reading the first W columns of
             the page table.
  extend     a multi-turn request's appended tokens (its observation, or a restart's
             context): its own pages grown for them (cached prompts released first where
             short; a slot that still cannot grow is requeued), then one PagedEngine.extend.
             Parked slots do not grow, and are preempted before any running slot (docs/paged.md,
             "Multi-turn requests").
  release    a finished slot's pages go back to the pool (`free`).

Data shards. Where the engine splits its pool over the data shards of its mesh
(`pool_shards` > 1), each shard's slots take pages of its own range only, and all of the
above happens per shard: a request enters a shard with a free slot where its prompt is
already cached (its samples share the prompt's pages there), else the shard with the most
free pages (a prefill of its own there); eviction and preemption free pages in the shard
that needs them.

Admission reserves a request's worst case when the engine's pool is sized for it
(`num_pages` = 0: never preempted) and a chunk's worth plus a watermark otherwise.
"""

from __future__ import annotations

import collections

import numpy as np

from ada.sampling.contract import ChunkStats, LazyState, host_chunk
from ada.sampling.pages import PageAllocator, grow_or_preempt
from ada.sampling.slots import bucket_for


class PagedSlots(LazyState):
    """Admission, prompt pages, growth and preemption for one Driver (module docstring)."""

    def __init__(self, driver):
        self.d = driver
        self.engine = e = driver.engine
        self.alloc = PageAllocator(e.num_pages, e.page_size, e.num_slots, e.pages_per_slot,
                                   shards=e.pool_shards, watermark=e.watermark)
        # (prompt_id, tokens, shard) -> (PromptPages, prefill logits [N, V], row), least
        # recent first
        self._prompts: collections.OrderedDict = collections.OrderedDict()
        self._order: dict[int, int] = {}  # slot -> admission number (larger: younger)
        self._admitted = 0
        self.preemptions = 0
        self.deferrals = 0
        self.evictions = 0
        self.page_copies = 0

    def stats(self) -> dict:
        a = self.alloc
        return {"preemptions": self.preemptions, "deferrals": self.deferrals,
                "prompt_evictions": self.evictions, "page_copies": self.page_copies,
                "pages_in_use": a.num_pages - a.shards - sum(map(len, a._free))}

    # -- the prefix cache --------------------------------------------------------

    def _release(self, key) -> None:
        self.alloc.release_prompt(self._prompts.pop(key)[0])
        self.evictions += 1

    def _evict(self, shard: int, keep: set, needed: set, others: bool) -> bool:
        """Release the least recent cached prompt of `shard` not in `keep` (and, unless
        `others`, not in `needed`), one the Driver is not asked to keep (`keep_prompts`)
        first. False when there is none."""
        allowed = [key for key in self._prompts if key[2] == shard and key not in keep
                   and (others or key[:2] not in needed)]
        kept = self.d.kept_prompts
        for key in sorted(allowed, key=lambda k: k[0] in kept):  # stable: LRU order within
            self._release(key)
            return True
        return False

    def _queued_keys(self) -> set:
        return {(r.prompt_id, tuple(r.prompt_tokens)) for r in self.d.queued()}

    def _place(self, prompt, n: int, max_new: int, new: dict,
               extra: int = 0) -> tuple[int, bool, bool]:
        """The data shard the queue's head enters, as (shard, prefilled there, fits now):
        a shard with a free slot where its prompt is cached and it fits; else the one with
        the most free pages where it fits with a new prefill; else where to make room (its
        prompt's shard, or the one with the most free pages). extra: tokens it appends
        after its prompt on starting (a restarted multi-turn request's context)."""
        a, e = self.alloc, self.engine
        lookahead = None if e.lookahead is None else e.lookahead + extra
        max_new += extra
        free = sorted({a.shard_of(s) for s in self.d.idle_slots()})
        cached = [s for s in free if prompt + (s,) in self._prompts or prompt + (s,) in new]
        for s in cached:
            if a.can_admit(n, max_new, prefilled=True, lookahead=lookahead, shard=s):
                return s, True, True
        roomy = sorted(free, key=lambda s: (-a.free_pages(s), s))
        for s in roomy:
            if s not in cached and a.can_admit(n, max_new, lookahead=lookahead, shard=s):
                return s, False, True
        s = cached[0] if cached else roomy[0]
        return s, s in cached, False

    # -- the Driver's backend ----------------------------------------------------

    def fill(self) -> ChunkStats:
        d, e, a, counts = self.d, self.engine, self.alloc, ChunkStats()
        starts, new, pinned = [], {}, set()  # new: key -> PromptPages to prefill
        needed = None
        while (head := d.head()) is not None:
            seq, r = head
            prompt = (r.prompt_id, tuple(r.prompt_tokens))
            n, (h, mnt) = len(r.prompt_tokens), d.context_of(seq, r)
            shard, cached, fits = self._place(prompt, n, mnt, new, h)
            key = prompt + (shard,)
            if not fits:
                needed = self._queued_keys() if needed is None else needed
                idle = e.full_reservation or not any(
                    a.shard_of(s) == shard for s in [*d.running, *(x[0] for x in starts)])
                if self._evict(shard, pinned | {key}, needed, others=idle):
                    continue
                self.deferrals += 1
                break
            slot, seq, r = d.admit(next(s for s in d.idle_slots() if a.shard_of(s) == shard))
            if not cached:
                new[key] = a.alloc_prompt(n, shard)
            pp = new[key] if key in new else self._prompts[key][0]
            ahead = h + (mnt if e.lookahead is None else min(e.lookahead, mnt))
            starts.append((slot, seq, r, key, mnt, a.attach(slot, pp, ahead)))
            pinned.add(key)
            self._order[slot], self._admitted = self._admitted, self._admitted + 1
        if not starts:
            return counts
        # One prefill per distinct new prompt, batched by prompt-length bucket, at most a
        # row bucket's worth per data shard in a call.
        by_bucket: dict[int, dict] = collections.defaultdict(lambda: collections.defaultdict(list))
        for key in new:
            by_bucket[bucket_for(len(key[1]), e.prompt_buckets)][key[2]].append(key)
        rows = e.row_buckets[-1]
        for shards in by_bucket.values():
            for i in range(0, max(map(len, shards.values())), rows):
                part = [k for keys in shards.values() for k in keys[i:i + rows]]
                prompts = [list(k[1]) for k in part]
                self.state, logits = e.prefill(d.params, self.state, prompts,
                                               [new[k] for k in part])
                counts += ChunkStats.prefill(prompts)
                for row, key in enumerate(part):
                    self._prompts[key] = (new[key], logits, row)
        # One attach call per prefill call (its logits) and step key for all its requests.
        groups: dict[tuple, tuple] = {}
        for slot, seq, r, key, mnt, copies in starts:
            _, logits, row = self._prompts[key]
            self._prompts.move_to_end(key)
            step_key = d.key_of(r)
            g = groups.setdefault((id(logits), np.asarray(step_key).tobytes()),
                                  (logits, step_key, [], []))
            g[2].extend(copies)
            g[3].append((slot, row, len(r.prompt_tokens), r.prompt_id, r.sample_idx, mnt))
            d.start(slot, seq, r, len(r.prompt_tokens))
        for logits, step_key, copies, entries in groups.values():
            slots, rows, lengths, pids, sidxs, mnts = zip(*entries, strict=True)
            self.state = e.attach(self.state, logits, copies, slots, rows, lengths, step_key,
                                  pids, sidxs, mnts)
            self.page_copies += len(copies)
        over = len(self._prompts) - d.prefix_cache_size  # after the attaches' copies
        for key in [k for k in self._prompts if k[0] not in d.kept_prompts][:max(over, 0)]:
            self._release(key)
        return counts

    def run_chunk(self) -> tuple[tuple | None, ChunkStats]:
        """Grow or preempt, then one chunk over every slot: host (tokens, logprobs, valid,
        active) and its counts, or None when no request is left running."""
        d, e, a = self.d, self.engine, self.alloc
        K = e.chunk_size
        # a parked slot does not grow, and is preempted before any running one (its pages
        # are idle): it looks younger than every running slot
        demands = {slot: s.filled if s.parked else min(s.filled + K, s.end)
                   for slot, s in d.running.items()}
        short = collections.Counter()
        for s, t in demands.items():
            short[a.shard_of(s)] += max(0, a.pages_for(t) - int(a.num_held[s]))
        for shard, pages in short.items():
            self._free_up(shard, pages)
        late = self._admitted + 1
        order = {s: self._order[s] + late * x.parked for s, x in d.running.items()}
        self._preempt(grow_or_preempt(a, demands, order), freed=True)
        live = [s for s in d.running.values() if not s.parked]
        if not live:
            return None, ChunkStats()
        filled = max(s.filled for s in live)
        self.state, chunk = e.generate(d.params, self.state, a.table, filled)
        return host_chunk(chunk, e.num_slots)

    def extend(self, appends: dict[int, list[int]]) -> ChunkStats:
        """Grow each slot's own pages for its appended tokens, oldest admission first (cached
        prompts released first where its shard is short), then append them all in one call
        (PagedEngine.extend; the prompt's shared pages are never written). A slot that still
        cannot grow is preempted: requeued with its context, restarted when it fits."""
        d, a = self.d, self.alloc
        fits, victims = {}, []
        for slot in sorted(appends, key=self._order.__getitem__):
            tokens = d.running[slot].filled + len(appends[slot])
            self._free_up(a.shard_of(slot), a.pages_for(tokens) - int(a.num_held[slot]))
            if a.grow(slot, tokens):
                fits[slot] = appends[slot]
            else:
                victims.append(slot)
        self._preempt(victims, freed=False)
        if not fits:
            return ChunkStats()
        self.state = self.engine.extend(d.params, self.state, a.table, fits,
                                        [d.running[slot].stop_counts for slot in fits])
        return ChunkStats.append(list(fits.values()))

    def _free_up(self, shard: int, pages: int) -> None:
        """Release cached prompts of `shard` until it has `pages` free pages or none is left:
        cached prompts go before a running request does, those no queued request needs
        first."""
        needed, others = None, False
        while pages > self.alloc.free_pages(shard):
            needed = self._queued_keys() if needed is None else needed
            if not self._evict(shard, set(), needed, others=others):
                if others:
                    return
                others = True

    def _preempt(self, victims: list[int], freed: bool) -> None:
        """Stop the victims on the device and requeue them in this order (youngest first:
        the oldest ends at the queue's front); `freed`: their pages are back already."""
        if not victims:
            return
        self.state = self.engine.stop(self.state, victims)
        for slot in victims:
            if not freed:
                self.alloc.free(slot)
            del self._order[slot]
            self.d.requeue(slot)
        self.preemptions += len(victims)

    def release(self, slot: int) -> None:
        self.alloc.free(slot)
        del self._order[slot]

    def forget_prefixes(self) -> None:
        """New weights (Driver.set_params): every cached prompt is released (a running
        request keeps the pages it shares), so no later request attaches an old prefill."""
        for key in list(self._prompts):
            self._release(key)

    def compact(self) -> None:
        """Nothing to compact: a chunk runs every slot, and pages are not slot-major."""
