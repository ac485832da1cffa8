"""The sampler as a stream: several steps' prompts sample at once over one driver, each
step's batch trained in order, the policy at most `rl.max_staleness` versions behind.

A *cohort* is the prompt batch of one train step (the data iterator's batch `t` trains at
step t). Each cohort runs its own adaptive collection (its exit rule, N rounds of M
responses, selection: `Collector.collect_steps`) as its results arrive; the cohorts share
the driver's slots, the oldest first, so when an old cohort's last rounds leave slots
empty (the drain of a synchronous step) the next cohorts fill them. The trainer takes a
cohort once every one of its prompts is done; the new weights reach the driver between two
chunks (`Driver.set_params`).

Versions. The policy version is the number of train steps applied (`TrainState.step`).
Step t trains with version t - 1 as the proximal policy. Every sampled token records the
version that produced it; its lag is (version at training) - (its version).

Staleness bound, by admission: cohort t starts sampling only once version >= t - 1 - k.
Its tokens are then all at least version t - 1 - k when step t trains them, so no trained
token lags more than k (checked per token, `staleness_max`). Nothing is dropped or masked:
the bound is kept by not starting work that would break it, so no prompt is lost and none
is trained twice. With k = 0 cohort t starts only after step t - 1 has trained: the stream
is the synchronous loop, call for call (tests/test_stream.py: bit for bit).

A sequence that spans a weight update continues under the new weights with the cache its
earlier tokens wrote (PipelineRL's choice, `Driver.set_params`): nothing is recomputed or
redrawn, its tokens record both versions, and the cost is that its later tokens were
sampled from a mix of the two policies (their behaviour log-probs are the true ones of
what was sampled: each token's own version's, the policy's untruncated by top-k / top-p,
as the trainer computes the proximal one). Cached prompt prefills are dropped at each
update.

Resume: the in-flight cohorts are not checkpointed; they are drawn again. A checkpoint
after step t holds the data iterator's position after cohort t, so a resumed run draws
cohort t + 1 onwards again and samples it with version t (fresher than the killed run
would have: the bound holds, no prompt is lost, no sample trained twice). With k = 0
nothing is in flight at a checkpoint, and a resumed run equals an uninterrupted one.

A budget split (adaptive.allocation; ada/run/allocator.py) draws a cohort's prompts and caps
at its admission from the success memory as of step t - 1 - k, the version admission waits
for, so its caps do not depend on the threads' timing; the collection then runs inside them.

Where it runs (rl.sampler_devices):
  colocated (0)     sampler and trainer take turns on the same devices: `next_batch` samples
                    in the caller's thread until the batch is complete; the gain is the
                    drain. Deterministic for every k.
  disaggregated (N) this process's last N devices sample on a thread of their own, the
                    others train (ada/meshes.py). The sampler never waits for the trainer
                    but by the bound: it admits the next cohorts, and new weights (handed
                    across by `Engine.prepare_params`, device to device) take effect
                    between two chunks. Which version samples which token then depends on
                    timing; at k = 0 it cannot (one cohort at a time). Under LoRA only the
                    adapters cross: the frozen base is placed on the sampler's devices once,
                    at start, and each update's adapters (a few MB) are merged into it
                    there, W + scale * A @ B in the engine's jitted hand-off.
The bound is checked against the version the driver holds, never the trainer's newer one.
`handoff_bytes`: what the latest hand-off took from the trainer (the adapters under LoRA,
disaggregated; else the train params, which a colocated hand-off reads in place).

Memory (colocated; ada/memory.py is the ledger ada.plan reports and tests/test_memory.py holds
to the live arrays): when a batch is handed out with no cohort left sampling (always at
k = 0) the driver frees its decode state, prefix caches and weights (`Driver.release`), so
the update has the chips to itself; the hand-off brings the new weights and the next fill a
fresh decode state. With cohorts in flight the sampler keeps all three through the update.
Evaluation samples beside the stream (`sample`): through this driver when it is the same
engine, else on its own decode state sharing this driver's weights.
Per step: sampler_idle_share (colocated: the share of the step the trainer held the
devices; disaggregated: the sampler's waits for the bound), trainer_idle_share (the share
spent waiting for the batch), queue_depth (groups of later steps already complete).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time
from collections.abc import Generator, Iterator

import jax
import numpy as np

from ada import sharding as shd
from ada.adaptive.collect import Collected
from ada.models import lora
from ada.rollout import Rollout
from ada.sampling.driver import Driver, Request
from ada.trajectory import COUNTERS as ENV_COUNTERS


@dataclasses.dataclass
class _Cohort:
    step: int  # the train step it is for
    prompts: list
    data_state: dict  # the iterator's state before it was drawn
    steps: Generator  # its collection (the STEP protocol, ada/adaptive/collect.py)
    allocation: dict | None = None  # its budget split's record (ada/run/allocator.py)
    keep: frozenset = frozenset()  # its prompts whose prefill the driver should keep
    got: list = dataclasses.field(default_factory=list)  # its completions of this chunk
    result: Collected | None = None


class _View:
    """A cohort's view of the shared driver: what it submits is routed back to it."""

    shared = True  # collect.py: no free slot and nothing of ours in flight is not an error

    def __init__(self, stream: Stream, cohort_step: int):
        self._stream, self._step = stream, cohort_step

    def submit(self, request) -> int:
        seq = self._stream.driver.submit(request)
        self._stream.owner[seq] = self._step
        return seq

    def free_slots(self) -> int:
        return self._stream.driver.free_slots()

    def keep_prompts(self, prompt_ids) -> None:
        self._stream.keep(self._step, prompt_ids)


class _Sampler:
    """A rollout whose `sample` runs beside the stream (`Stream.sample`)."""

    def __init__(self, stream: Stream, rollout: Rollout):
        self._stream, self._rollout, self.reward = stream, rollout, rollout.reward

    def sample(self, params, records, k: int, key, prompt_ids) -> list:
        return self._stream.sample(self._rollout, params, records, k, key, prompt_ids)


class Stream:
    """Cohorts of prompts sampled over one driver (module doc). `version`: the policy
    version of `params` (train steps applied); the next batch handed out is for step
    version + 1. `max_staleness`: k. `last_step`: no cohort past it is drawn.
    `threaded`: the sampler runs on its own thread (disaggregated) until `close`.
    `allocator`: each cohort's prompts and per-prompt caps (ada/run/allocator.py; None: the
    iterator's next batch, every prompt M x N).
    `driver`: the one to sample on (default: a Driver over `rollout.engine` and `params`;
    experiments/stream_sim.py passes the simulator's)."""

    def __init__(self, rollout: Rollout, params, iterator: Iterator, base_key, *,
                 max_staleness: int, version: int, last_step: int, threaded: bool = False,
                 driver=None, allocator=None):
        self.rollout, self.iterator, self.base_key = rollout, iterator, base_key
        self.allocator = allocator
        self.k, self.version, self.last_step = int(max_staleness), int(version), int(last_step)
        mesh = rollout.engine.mesh if driver is None else None
        self.device = jax.local_devices()[0] if mesh is None else mesh.devices.flat[0]
        self._mesh = mesh
        # disaggregated LoRA: the frozen base on the sampler's devices, placed once
        self._frozen = (place(lora.split(params)[1], mesh, self.device)
                        if threaded and driver is None and lora.has_adapters(params) else None)
        self.handoff_bytes = 0
        if driver is None:  # `driver`: another with the Driver's calls (the simulator's)
            params = self._handoff(params)
            with jax.default_device(self.device):
                driver = rollout.wrap(Driver(rollout.engine, params, tokenizer=rollout.tokenizer,
                                             version=self.version))
        self.driver = driver
        self.cohorts: collections.deque[_Cohort] = collections.deque()
        self.owner: dict[int, int] = {}  # driver submission number -> cohort step
        self.next_step = self.version + 1
        self._since = time.perf_counter()  # the previous hand-out
        self._idle = 0.0  # seconds the sampler could not sample since then
        self._counters = self._driver_counters()
        self._cv = threading.Condition()
        self._new_params = None  # (params in decode form, version) for the sampler thread
        self._error: BaseException | None = None
        self._closed = False
        self._thread = None
        if threaded:
            self._thread = threading.Thread(target=self._sample, name="ada-sampler", daemon=True)
            self._thread.start()

    # -- the trainer's side ------------------------------------------------------------

    def next_batch(self) -> tuple[Collected, dict]:
        """Sample until the batch of step version + 1 is complete; returns it and the
        stream's metrics of this step (`stream_metrics`)."""
        t0 = time.perf_counter()
        want = self.version + 1
        if self._thread is None:
            self._idle += t0 - self._since  # the trainer held the devices
            with jax.default_device(self.device):
                while not self._ready(want):
                    self._chunk()
        with self._cv:
            while not self._ready(want):
                self._cv.wait()
            head = self.cohorts.popleft()
            now = time.perf_counter()
            wall = max(now - self._since, 1e-9)
            counters = self._driver_counters()
            done = {k: counters[k] - self._counters[k] for k in counters}
            metrics = dict(
                self.staleness(head.result),
                sampler_idle_share=min(self._idle / wall, 1.0),
                trainer_idle_share=min((now - t0) / wall, 1.0),
                queue_depth=sum(len(c.prompts) for c in self.cohorts if c.result is not None),
                cohorts_in_flight=sum(c.result is None for c in self.cohorts),
                slot_occupancy=done["useful_token_steps"] / max(done["computed_token_steps"], 1),
                carried_tokens=done["carried_tokens"])
            self._since, self._idle, self._counters = now, 0.0, counters
            if head.allocation is not None:
                metrics["allocation"] = head.allocation
        head.result.metrics.update(prefilled_prompts=done["prefilled_prompts"],
                                   prefilled_tokens=done["prefilled_tokens"],
                                   page_copies=done["page_copies"])
        if getattr(self.rollout, "env", None) is not None:  # tool use: step.step_metrics
            head.result.metrics["env"] = {k: done[k] for k in ENV_COUNTERS}
        if self._thread is None and not self.in_flight():
            self.driver.release()  # the update has the chips to itself (module doc: memory)
        return head.result, metrics

    def in_flight(self) -> bool:
        """Whether a cohort is still sampling."""
        return any(c.result is None for c in self.cohorts)

    def sampler(self, rollout: Rollout) -> _Sampler:
        """`rollout` as `evaluate_policy` uses it, sampling on the stream's chips (`sample`)."""
        return _Sampler(self, rollout)

    def sample(self, rollout: Rollout, params, records, k: int, key, prompt_ids) -> list:
        """`rollout.sample` (held-out evaluation) beside the stream: through the stream's
        own driver when it is the same engine and colocated (cohorts in flight go on
        sampling meanwhile; a request's tokens depend only on it and its key), else on a
        driver of `rollout`'s engine that shares the stream's weights (colocated; `params`
        are the trainer's, the version the driver holds): no second copy of the weights,
        a second decode state only for another engine (ada.plan: eval's sampler). At k >= 1
        the cohorts in flight advance during an eval (under the same weights), so eval.every
        changes which of their tokens an update catches midway; k = 0 has none in flight.
        Disaggregated, eval samples the trainer's `params` on a driver of its own."""
        if self._thread is not None or rollout.engine is not self.driver.engine:
            if self._thread is None and self.driver.params is not None:
                params = self.driver.params
            return rollout.sample(params, records, k, key, prompt_ids)
        reqs = [Request(prompt_tokens=r["prompt_tokens"], prompt_id=pid, sample_idx=j,
                        step_key=jax.random.key_data(key))
                for r, pid in zip(records, prompt_ids, strict=True) for j in range(k)]
        before = self._driver_counters()
        where = {self.driver.submit(r): i for i, r in enumerate(reqs)}
        outs: list = [None] * len(reqs)
        with jax.default_device(self.device):
            while any(o is None for o in outs):
                got = self.driver.step()
                for c in got:
                    if c.seq in where:
                        outs[where.pop(c.seq)] = c
                self._deliver([c for c in got if c.seq in self.owner])
        after = self._driver_counters()  # the eval's work is not the next batch's
        self._counters = {n: v + after[n] - before[n] for n, v in self._counters.items()}
        if not self.in_flight():
            self.driver.release(weights=False)
        return [outs[i * k:(i + 1) * k] for i in range(len(records))]

    def _ready(self, step: int) -> bool:
        """Whether the batch of `step` is complete (colocated: admits what the bound allows;
        the sampler thread's error is raised here)."""
        if self._error is not None:
            raise RuntimeError(f"the sampler thread failed: {self._error!r}") from self._error
        if self._thread is None:
            self._admit()
        head = self.cohorts[0] if self.cohorts else None
        if head is None or head.step != step:
            if self._thread is None or step > self.last_step:
                raise RuntimeError(f"the stream holds no batch for step {step}")
            return False
        return head.result is not None

    def set_params(self, params, version: int) -> None:
        """The trained weights, `version` = train steps applied. Colocated: now; threaded:
        copied to the sampler's devices here, taken up by the sampler between two chunks."""
        self.version = int(version)
        with jax.default_device(self.device):
            if self._thread is None:
                self.driver.set_params(self._handoff(params), self.version)
                return
            prepared = self.rollout.engine.prepare_params(self._handoff(params))
        with self._cv:
            self._new_params = (prepared, self.version)
            self._cv.notify_all()

    def _handoff(self, params):
        tree, self.handoff_bytes = handoff(params, self._frozen, self._mesh, self.device)
        return tree

    def close(self) -> None:
        """Stop the sampler thread (threaded) and free the driver's chips: cohorts still in
        flight are dropped (a resume draws them again)."""
        if self._thread is not None:
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            self._thread.join()
        self.cohorts.clear()
        self.driver.close()

    def data_state(self) -> dict:
        """The data iterator's position after the batches trained so far: the state before
        the oldest cohort still in flight was drawn (a checkpoint's; the module doc)."""
        with self._cv:
            return self.cohorts[0].data_state if self.cohorts else self.iterator.get_state()

    def staleness(self, collected: Collected) -> dict:
        """The trained tokens' lag behind the version that trains them (the kept responses):
        max, mean and a histogram over lags 0..k; and the share of responses that an update
        caught midway (two versions in one)."""
        kept = [c for row, valid in zip(collected.completions, collected.group_valid, strict=True)
                for c, ok in zip(row, valid, strict=True) if ok and c is not None]
        lags = np.array([self.version - v for c in kept for v in c.versions], np.int64)
        hist = np.bincount(lags, minlength=self.k + 1) if lags.size else np.zeros(self.k + 1)
        return {"staleness_max": int(lags.max()) if lags.size else 0,
                "staleness_mean": float(lags.mean()) if lags.size else 0.0,
                "staleness_hist": [int(x) for x in hist],
                "spanning_share": float(np.mean([len(set(c.versions)) > 1 for c in kept]))
                if kept else 0.0}

    # -- the sampler's side ------------------------------------------------------------

    def _sample(self) -> None:
        """The sampler thread: take new weights, admit, run a chunk; wait when the bound
        allows no work."""
        try:
            with jax.default_device(self.device):
                while True:
                    with self._cv:
                        if self._closed:
                            return
                        if self._new_params is not None:
                            (params, version), self._new_params = self._new_params, None
                            self.driver.set_params(params, version)
                        self._admit()
                        if not any(c.result is None for c in self.cohorts):
                            t = time.perf_counter()
                            self._cv.wait()
                            self._idle += time.perf_counter() - t
                            continue
                    got = self.driver.step()
                    with self._cv:
                        self._deliver(got)
                        self._cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - raised in the trainer's next_batch
            with self._cv:
                self._error = e
                self._cv.notify_all()

    def _admit(self) -> None:
        """Draw the next cohorts the bound allows: step t once the driver's weights are of
        version >= t - 1 - k."""
        while (self.next_step <= self.last_step
               and self.next_step - 1 - self.k <= self.driver.version):
            step = self.next_step
            state = self.iterator.get_state()
            caps = record = None
            if self.allocator is None:
                prompts = next(self.iterator)
            else:
                prompts, caps, record = self.allocator.draw(step)
            key = jax.random.fold_in(self.base_key, step)
            rollout = self.rollout
            collector = rollout.collector(_View(self, step),
                                          step_key=jax.random.key_data(jax.random.fold_in(key, 0)))
            more = (itertools.chain.from_iterable(self.iterator)
                    if rollout.collect_cfg.dynamic_sampling else None)
            cohort = _Cohort(step, prompts, state, collector.collect_steps(
                prompts, jax.random.fold_in(key, 1), more, caps), allocation=record)
            self.cohorts.append(cohort)
            self.next_step += 1
            self._resume(cohort, None)

    def keep(self, step: int, prompt_ids) -> None:
        """A cohort's prompts whose prefill is worth keeping; the driver keeps every live
        cohort's."""
        for c in self.cohorts:
            if c.step == step:
                c.keep = frozenset(int(p) for p in prompt_ids)
        self.driver.keep_prompts(frozenset().union(*(c.keep for c in self.cohorts)))

    def _chunk(self) -> None:
        """One driver step, delivered (colocated)."""
        self._deliver(self.driver.step())

    def _deliver(self, got: list) -> None:
        """Each live cohort gets its completions of a driver step and goes on, oldest
        first (it takes the free slots first)."""
        by_step = {c.step: c for c in self.cohorts}
        for c in got:
            by_step[self.owner.pop(c.seq)].got.append(c)
        for cohort in list(self.cohorts):
            if cohort.result is None:
                mine, cohort.got = cohort.got, []
                self._resume(cohort, mine)

    def _resume(self, cohort: _Cohort, got) -> None:
        try:
            cohort.steps.send(got)
        except StopIteration as stop:
            cohort.result = stop.value
            self.keep(cohort.step, ())

    def _driver_counters(self) -> dict:
        s = self.driver.stats()
        return {k: s.get(k, 0) for k in ("prefilled_prompts", "prefilled_tokens", "page_copies",
                                          "useful_token_steps", "computed_token_steps",
                                          "carried_tokens", *ENV_COUNTERS)}


def place(tree, mesh, device):
    """`tree` on the sampler's devices (`mesh`, else `device`) by ada/sharding.py's rules."""
    if mesh is None:
        return jax.device_put(tree, device)
    return jax.device_put(tree, shd.param_shardings(tree, mesh))


def handoff(params, frozen, mesh, device) -> tuple:
    """(what the sampler's hand-off reads, the bytes it took from the trainer): with `frozen`
    (disaggregated LoRA: the base already on the sampler's devices) only the adapters cross,
    joined there with it (module doc: where it runs); else `params` as they are."""
    if frozen is None:
        return params, nbytes(params)
    adapters = lora.split(params)[0]
    return lora.join(place(adapters, mesh, device), frozen), nbytes(adapters)


def nbytes(tree) -> int:
    """Bytes of the arrays (or shapes) of `tree`, whole (not per chip)."""
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))
