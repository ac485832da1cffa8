"""The training prompt stream: seeded, resumable, each process taking its own slice.

`PromptIterator` turns a record list into an endless, deterministic stream of global
batches of P prompts; process i of k takes the i-th contiguous P/k slice of every global
batch. Its state is two integers (epoch, position); a run restored with `set_state` from
a checkpointed `get_state()` continues with exactly the batch it would have drawn next.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from ada.data.sources import DataError, Record


@dataclasses.dataclass(frozen=True)
class IteratorState:
    """Where the stream is: `position` global batches already taken from epoch `epoch`."""

    epoch: int = 0
    position: int = 0


class PromptIterator:
    """Endless, deterministic, resumable batches of prompts, sharded over processes.

    Epoch e visits the records in the order `permutation(seed, e)`; global batch b of that
    epoch is `order[b*P:(b+1)*P]` and process i takes the i-th of `process_count` equal,
    contiguous slices of it, so processes are disjoint and together cover the global batch.
    The `N mod P` records left over at an epoch's end are dropped for that epoch only (the
    next epoch reshuffles), which keeps every batch the same static shape. The order
    depends only on (seed, epoch, N), never on how often the iterator was restarted, so
    `get_state()` / `set_state()` resume exactly.
    """

    def __init__(self, records: Sequence[Record], batch_size: int, seed: int = 0,
                 process_index: int = 0, process_count: int = 1, shuffle: bool = True):
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be positive")
        if process_count <= 0 or not 0 <= process_index < process_count:
            raise ValueError(
                f"process_index={process_index} must be in [0, process_count={process_count})")
        if batch_size % process_count:
            raise ValueError(
                f"global batch_size={batch_size} is not divisible by process_count="
                f"{process_count}; each process needs an equal slice")
        if len(records) < batch_size:
            raise DataError(
                f"only {len(records)} prompts for a global batch of {batch_size}; "
                "lower the batch size or add data")
        self.records = list(records)
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.process_index, self.process_count = process_index, process_count
        self.batches_per_epoch = len(self.records) // batch_size
        self._state = IteratorState()
        self._order_epoch, self._order = -1, np.arange(0)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Indices of epoch `epoch`'s visiting order (same on every process)."""
        if not self.shuffle:
            return np.arange(len(self.records))
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
        return rng.permutation(len(self.records))

    def global_batch_indices(self, state: IteratorState) -> np.ndarray:
        """Record indices of the global batch at `state`, [P]."""
        if state.epoch != self._order_epoch:
            self._order_epoch, self._order = state.epoch, self.epoch_order(state.epoch)
        start = state.position * self.batch_size
        return self._order[start:start + self.batch_size]

    def local_batch_indices(self, state: IteratorState) -> np.ndarray:
        """This process's slice of the global batch, [P / process_count]."""
        per = self.batch_size // self.process_count
        g = self.global_batch_indices(state)
        return g[self.process_index * per:(self.process_index + 1) * per]

    def __iter__(self) -> Iterator[list[Record]]:
        return self

    def __next__(self) -> list[Record]:
        idx = self.local_batch_indices(self._state)
        pos = self._state.position + 1
        if pos == self.batches_per_epoch:
            self._state = IteratorState(self._state.epoch + 1, 0)
        else:
            self._state = IteratorState(self._state.epoch, pos)
        return [self.records[i] for i in idx]

    @property
    def state(self) -> IteratorState:
        return self._state

    def get_state(self) -> dict[str, int]:
        """JSON-able state for checkpoints; includes what must match on restore."""
        return {"epoch": self._state.epoch, "position": self._state.position,
                "seed": self.seed, "num_records": len(self.records),
                "batch_size": self.batch_size}

    def set_state(self, state: Mapping[str, int]) -> None:
        """Resume from `get_state()`; refuses a state made for different data or batching."""
        for key, mine in (("seed", self.seed), ("num_records", len(self.records)),
                          ("batch_size", self.batch_size)):
            if key in state and int(state[key]) != mine:
                raise ValueError(
                    f"iterator state has {key}={state[key]} but this iterator has {mine}; "
                    "the checkpoint was made with different data or settings")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.batches_per_epoch:
            raise ValueError(
                f"iterator state epoch={epoch} position={position} is out of range "
                f"(batches per epoch: {self.batches_per_epoch})")
        self._state = IteratorState(epoch, position)
