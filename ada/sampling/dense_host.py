"""The Driver's host side over the dense Engine (the contract: contract.SlotBackend): a
prefix LRU of prefilled prompts, refills by insert_many, chunks on the smallest slot bucket
holding every running request, multi-turn appends into a parked slot's rows (`extend`), and
tail compaction (parked slots move like running ones). `Engine.driver_backend` builds it; its
paged counterpart is paged_host.PagedSlots."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import numpy as np

from ada.sampling.contract import ChunkStats, LazyState, host_chunk
from ada.sampling.slots import Prefix, bucket_for

if TYPE_CHECKING:
    from ada.sampling.driver import Driver


class DenseSlots(LazyState):
    """The Driver's device side over the dense Engine: a prefix LRU of prefilled prompts,
    refills by insert_many, chunks on the smallest slot bucket, tail compaction."""

    def __init__(self, driver: Driver):
        self.d, self.engine = driver, driver.engine
        self._prefixes: collections.OrderedDict = collections.OrderedDict()

    def stats(self) -> dict:
        return {}

    def release(self, slot: int) -> None:
        pass

    def forget_prefixes(self) -> None:
        """New weights (Driver.set_params): no later request starts from an old prefill."""
        self._prefixes.clear()

    def _prefix_for(self, key: tuple):
        hit = self._prefixes.get(key)
        if hit is not None:
            self._prefixes.move_to_end(key)
        return hit

    def _remember(self, key, prefix: Prefix, row: int) -> None:
        """Keep `key`'s prefill. The LRU is bounded in prefill rows held on the chips, not
        in prompts: a prefill call's rows share one buffer, so its least recent buffer is
        dropped whole (every prompt in it) while the buffers hold more than
        `prefix_cache_size` rows; the newest is always kept. ada.plan's memory ledger
        counts this bound (ada/memory.py: prefix_bound)."""
        self._prefixes[key] = (prefix, row)
        self._prefixes.move_to_end(key)
        while True:
            buffers = {id(p): p for p, _ in self._prefixes.values()}
            victim = self._prefixes[next(iter(self._prefixes))][0]
            if (victim is prefix or sum(p.logits.shape[0] for p in buffers.values())
                    <= self.d.prefix_cache_size):
                return
            for k in [k for k, (p, _) in self._prefixes.items() if p is victim]:
                del self._prefixes[k]

    def fill(self) -> ChunkStats:
        """Admit the queued requests: those whose prompt the LRU holds first, then each new
        prefill call's right after it, so a fill keeps no prefill buffer alive beyond the
        LRU's (ada/memory.py: prefix_bound). One prefill per distinct new prompt, batched by
        prompt-length bucket."""
        d, counts = self.d, ChunkStats()
        waiting: dict[tuple, list] = collections.defaultdict(list)  # prompt -> its requests
        while d.head() is not None:
            slot, seq, r = d.admit()
            waiting[(r.prompt_id, tuple(r.prompt_tokens))].append((slot, seq, r))
        hits = {key: hit for key in waiting if (hit := self._prefix_for(key)) is not None}
        self._insert({key: waiting.pop(key) for key in hits}, hits)
        by_bucket: dict[int, list[tuple]] = collections.defaultdict(list)
        for key in waiting:
            by_bucket[bucket_for(len(key[1]), self.engine.prompt_buckets)].append(key)
        rows = self.engine.row_buckets[-1]
        for keys in by_bucket.values():
            for i in range(0, len(keys), rows):
                part = keys[i:i + rows]
                prompts = [list(k[1]) for k in part]
                prefix = self.engine.prefill(d.params, prompts)
                counts += ChunkStats.prefill(prompts)
                for row, key in enumerate(part):
                    self._remember(key, prefix, row)
                self._insert({key: waiting[key] for key in part},
                             {key: (prefix, row) for row, key in enumerate(part)})
        return counts

    def _insert(self, taken: dict, where: dict) -> None:
        """Start each taken request (prompt -> [(slot, seq, request)]) from its prompt's
        prefill row (`where`: prompt -> (Prefix, row)): one insert call per prefill buffer
        and step key."""
        d = self.d
        by_prefix: dict[tuple, tuple[Prefix, object, list]] = {}
        for key, requests in taken.items():
            prefix, row = where[key]
            for slot, seq, r in requests:
                step_key = d.key_of(r)
                group = (id(prefix), np.asarray(step_key).tobytes())
                by_prefix.setdefault(group, (prefix, step_key, []))[2].append(
                    (slot, row, r.prompt_id, r.sample_idx, d.max_new(r)))
                d.start(slot, seq, r, prefix.cache.max_len)
        for prefix, step_key, entries in by_prefix.values():
            slots, rows, pids, sidxs, mnts = zip(*entries, strict=True)
            self.state = self.engine.insert_many(prefix, self.state, slots, rows,
                                                 step_key, pids, sidxs, mnts)

    def run_chunk(self) -> tuple[tuple, ChunkStats]:
        """One chunk over the first b slots: host (tokens, logprobs, valid, active), and
        its counts."""
        d = self.d
        b = bucket_for(max(d.running) + 1, self.engine.slot_buckets)
        filled = max(s.filled for s in d.running.values() if not s.parked)
        self.state, chunk = self.engine.generate(d.params, self.state, num_slots=b,
                                                 filled=filled)
        return host_chunk(chunk, b)

    def extend(self, appends: dict[int, list[int]]) -> ChunkStats:
        """Append each slot's tokens into its cache rows at its write position (one extend
        call, engine.Engine.extend) and resume it; the rows never run out (Driver.extend
        checked the room)."""
        d = self.d
        self.state = self.engine.extend(d.params, self.state, appends,
                                        [d.running[slot].stop_counts for slot in appends])
        return ChunkStats.append(list(appends.values()))

    def compact(self) -> None:
        """Move the highest busy slots into the lowest free ones when that lets the next
        chunk run on a smaller slot bucket."""
        d = self.d
        if not d.running:
            return
        need = bucket_for(len(d.running), self.engine.slot_buckets)
        while max(d.running) >= need and (dst := d.lowest_free_slot()) is not None and dst < need:
            src = max(d.running)
            self.state = self.engine.move(self.state, src, dst)
            d.move(src, dst)
