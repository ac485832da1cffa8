"""A run's budget split: each cohort's prompts and caps from the success memory, before
its first round (`adaptive.allocation` != none; ada/adaptive/allocation.py has the rule,
ada/adaptive/success.py the memory).

Every process computes the same allocation from data they all hold: the memory (updated
by the trainer from every process's draws, gathered: `remember`) and the data iterator's
global batches (the same order everywhere). Each process then takes its own contiguous
slice of the chosen prompts, as the iterator would have given it.

Which memory a cohort reads. Cohort t of a stream with rl.max_staleness = k is admitted
once the sampler holds version t - 1 - k (ada/stream.py), so it reads the memory as it was
after step t - 1 - k trained (`publish`ed by the trainer before it hands those weights on),
whatever the threads' timing: on every process, and on a resumed run at k = 0, the same
memory, the same caps. A resumed run at k > 0 reads the restored step's for the cohorts
it draws again (as it samples them with fresher weights: the stream's own resume rule).

Skips. Prompts whose own record predicts no signal are dropped before their first round
(`allocation.skips`) and the next global batches are drawn until the cohort has
prompts_per_step prompts, at most `MAX_BATCHES` batches; short after that, skipped prompts
fill the rest, so the update keeps its shape. The unused prompts of the last batch drawn
are passed over for this epoch (as DAPO's are).
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from ada import distributed
from ada.adaptive import allocation, success
from ada.adaptive.allocation import AllocConfig

MAX_BATCHES = 4  # global batches a cohort may draw to replace skipped prompts


class Allocator:
    """The caps of each cohort (`draw`) from the memory the trainer `publish`es. `start`:
    the step of `memory` (0, or the restored checkpoint's)."""

    def __init__(self, cfg: AllocConfig, iterator, memory: success.SuccessMemory, start: int,
                 max_staleness: int, half_life: float):
        self.cfg, self.iterator, self.k, self.half_life = cfg, iterator, max_staleness, half_life
        self.start = start
        self.memories = {start: memory}  # the memory after each step, as long as a cohort needs it
        self._lock = threading.Lock()  # the trainer publishes, a sampler thread may draw

    def publish(self, step: int, memory: success.SuccessMemory) -> None:
        """The memory after step `step` trained; before its weights reach the sampler."""
        with self._lock:
            self.memories[step] = memory

    def draw(self, step: int) -> tuple[list, np.ndarray, dict]:
        """Cohort `step`'s records (this process's slice), their caps, and the allocation's
        record: dataset ids of the slice (`ids`) and the step's metrics (the same on every
        process)."""
        read = max(step - 1 - self.k, self.start)
        with self._lock:
            mem = self.memories[read]
            for s in [s for s in self.memories if s < read]:
                del self.memories[s]
        it, cfg, hl = self.iterator, self.cfg, self.half_life
        P = it.batch_size
        kept, skipped = [], []
        for _ in range(MAX_BATCHES):
            idx = it.global_batch_indices(it.state)
            next(it)
            skip = allocation.skips(cfg, success.evidence(mem, idx, step, hl))
            kept += idx[~skip].tolist()
            skipped += idx[skip].tolist()
            if len(kept) >= P:
                break
        ids = np.asarray((kept + skipped)[:P], np.int64)  # short: skipped prompts fill in
        alpha, beta = success.posterior(mem, ids, step, hl)
        got = allocation.allocate(cfg, alpha, beta)  # the skips were made above
        per = P // it.process_count
        mine = slice(it.process_index * per, (it.process_index + 1) * per)
        m = dict(got.metrics(), skipped_prompts=len(skipped) - max(P - len(kept), 0))
        m["digest"] = int.from_bytes(  # int32: what a gather keeps without x64
            hashlib.sha256(ids.tobytes() + got.caps.tobytes()).digest()[:3], "big")
        return ([it.records[i] for i in ids[mine]], got.caps[mine],
                {"ids": ids[mine], "metrics": m})


def remember(memory: success.SuccessMemory, ids, pool, step: int,
             half_life: float) -> success.SuccessMemory:
    """The memory after step `step`'s draws: every response each prompt drew (the pool's
    counts, not only the kept group's), gathered from every process in process order."""
    local = np.stack([np.asarray(x, np.int32) for x in (ids, pool.pos, pool.neg)])  # counts
    ids_, pos, neg = np.concatenate(list(distributed.allgather(local)), axis=1)
    return success.update(memory, ids_, pos, neg, step, half_life)


def allocation_metrics(record: dict, zero_variance_share: float) -> dict:
    """The step's allocation metrics; every process must have drawn the same allocation
    (RuntimeError otherwise: the processes' memories or data orders differ)."""
    m = dict(record["metrics"])
    digest = m.pop("digest")
    if len({int(d) for d in distributed.allgather(np.int32(digest))}) > 1:
        raise RuntimeError("the processes computed different allocations (their success "
                           "memories or data orders differ)")
    return dict(m, realised_signal_share=1.0 - zero_variance_share)
