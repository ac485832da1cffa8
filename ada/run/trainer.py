"""The Trainer: a run's state and its step, behind the five calls a loop (and a tool) needs:
`restore`, `step`, `evaluate`, `save`, `close`. Tools time or wrap these methods; nothing
patches the loop.

Finiteness is read one step late, as nanodo reads a step's metrics after dispatching the
next: `step` t reads whether step t - 1 left finite parameters, so no step waits on its own
check; `evaluate` and `save` read the current step's first, so a non-finite state is never
evaluated or checkpointed, and a run that ends reads its last step's (`close`). A
non-finite update (a NaN loss or gradient) is skipped by the train step itself and counted
by the guard; `optim.max_skipped_in_row` of them in a row stop the run (`check_guard`).

Batches come from the stream (ada/stream.py): at rl.max_staleness = 0 each step's batch is
sampled by the weights of the step before, exactly as `ada.step.rl_step` would; above 0 the
next steps' prompts sample while a step drains, at most k versions behind. Under a budget
split (adaptive.allocation != none) each step's draws update the state's success memory,
gathered from every process, before the new weights reach the sampler, and the allocator
(ada/run/allocator.py) reads it for the cohorts those weights admit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from ada import distributed
from ada.adaptive import success
from ada.config import alloc_config
from ada.errors import ConfigError
from ada.evaluation import evaluate_policy
from ada.rl.optimizer import all_finite
from ada.run import folder
from ada.run.allocator import Allocator, allocation_metrics, remember
from ada.run.build import Setup, prompts_and_layout
from ada.run.state import RunState
from ada.step import update_step
from ada.stream import Stream

_all_finite = jax.jit(all_finite)


class RunError(RuntimeError):
    """A run that cannot go on (non-finite updates or parameters); one line for the user."""


class Trainer:
    """`setup` (ada.run.build) trained in `workdir`. `observe(phase, step, stream)`, if
    given, is called at each phase boundary (init, collect, update, handoff, eval, save)."""

    def __init__(self, config, workdir: str, setup: Setup, observe=None):
        c = self.config = config
        self.setup, self.observe = setup, observe or (lambda phase, step, stream: None)
        self.iterator, self.layout = prompts_and_layout(c, setup)
        train = setup.fns.init_state(setup.params)
        # the train state holds the weights now: the Setup's initial copy would stay on a chip
        # through the run, a copy the memory ledger (ada/memory.py) rightly does not count
        setup.params = None
        # a copy: the train step donates the state's buffers under a mesh (LoRA's reference
        # is the frozen base inside the state: no copy)
        self.ref_params = (jax.tree.map(jnp.copy, train.params)
                           if setup.fns.config.reference_copy else None)
        self.ckpt = folder.checkpoints(workdir, c.checkpoint.keep)
        self.alloc = alloc_config(c)
        memory = (success.init(len(self.iterator.records))
                  if self.alloc.allocation != "none" else None)
        self.state = RunState(train, jax.random.key(c.seed), base=setup.base, memory=memory)
        self.allocator: Allocator | None = None
        self.saved: int | None = None  # the latest step saved (its write may be in flight)
        self.stream: Stream | None = None
        self._finite = None  # (step, its all-finite flag on the device), not yet read
        self._clock = None  # (this segment's first step's start, the earlier segments' seconds)

    def restore(self) -> bool:
        """Resume from the latest checkpoint if there is one (True), then start the stream
        from the state. A checkpoint that does not fit the config is a ConfigError."""
        ckpt, resumed = self.ckpt, self.ckpt.latest_step() is not None
        if resumed:
            try:
                self.state = self.state.restore(ckpt)
            except ConfigError:  # a LoRA checkpoint's other base: its own line
                raise
            except Exception as e:  # noqa: BLE001 - e.g. a forced model change: shapes differ
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                raise ConfigError(f"checkpoint {ckpt.latest_step()} in {ckpt.directory} does not "
                                  f"fit this config ({first}); resume with the run's own "
                                  "settings, or start a new run with another --workdir") from None
            self.iterator.set_state(self.state.data)
            self.saved = self.state.step
        c, st = self.config, self.state
        if st.memory is not None:
            self.allocator = Allocator(self.alloc, self.iterator, st.memory, st.step,
                                       c.rl.max_staleness, c.adaptive.half_life)
        self.stream = Stream(self.setup.rollout, st.train.params, self.iterator, st.key,
                             max_staleness=c.rl.max_staleness, version=st.step,
                             last_step=c.train.steps, threaded=c.rl.sampler_devices > 0,
                             allocator=self.allocator)
        self.observe("init", st.step, self.stream)
        return resumed

    def step(self) -> dict:
        """One RL step: the stream's next batch, the update, the new weights to the sampler.
        Returns its metrics (host values). Raises RunError if the step before it left
        non-finite parameters."""
        c, stream = self.config, self.stream
        step = self.state.step + 1
        t0 = time.perf_counter()
        if self._clock is None:
            self._clock = (t0, self.state.seconds)
        collected, streamed = stream.next_batch()
        self.observe("collect", step, stream)
        record = streamed.pop("allocation", None)
        if record is not None:  # before the new weights admit the cohorts that read it
            self.state = dataclasses.replace(self.state, memory=remember(
                self.state.memory, record["ids"], collected.pool, step, c.adaptive.half_life))
            self.allocator.publish(step, self.state.memory)
        t1 = time.perf_counter()
        train, m = update_step(self.state.train, collected, fns=self.setup.fns, method=c.method,
                               layout=self.layout, normalize_std=c.adaptive.normalize_std,
                               ref_params=self.ref_params,
                               update_diagnostics=c.log.update_diagnostics, version=step - 1)
        # at once: the step donated the old train state's buffers, which nothing may keep
        st = self.state = dataclasses.replace(self.state, train=train, step=step)
        self.observe("update", step, stream)
        stream.set_params(train.params, step)
        self.observe("handoff", step, stream)
        m.update(time_collect_s=t1 - t0, time_update_s=time.perf_counter() - t1,
                 **stream_metrics(streamed))
        if c.model.lora.rank:  # LoRA rows only: a full run's keys stay as they were
            m.update(lora_rank=c.model.lora.rank, handoff_bytes=stream.handoff_bytes)
        counters = {"samples_total": int(st.counters["samples_total"] + m["samples"]),
                    "prompts_total": int(st.counters["prompts_total"] + c.data.prompts_per_step)}
        m["samples_total"] = counters["samples_total"]
        if record is not None:
            m.update(allocation_metrics(record, m["zero_variance_share"]))
        skipped = bool(m.get("skipped", 0) > 0)
        guard = {"skipped_steps": st.guard["skipped_steps"] + skipped,
                 "skipped_in_row": st.guard["skipped_in_row"] + 1 if skipped else 0}
        m["skipped_steps"] = guard["skipped_steps"]
        self.state = dataclasses.replace(st, counters=counters, guard=guard)
        self._tick()
        previous, self._finite = self._finite, (step, _all_finite(train.params))
        self._check_finite(previous)
        return m

    def check_finite(self) -> None:
        """RunError if the latest step left non-finite parameters (reads its flag now)."""
        self._check_finite(self._finite)
        self._finite = None  # read, and finite

    def _check_finite(self, flag) -> None:
        if flag is None or bool(jax.device_get(flag[1])):
            return
        raise RunError(f"step {flag[0]} left non-finite parameters (inf or NaN: an update "
                       f"overflowed; is optim.lr={self.config.optim.lr:g} too high?); nothing of "
                       f"it was checkpointed (latest checkpoint: {self._last()}). Lower "
                       "--config.optim.lr and resume with --force_config, or start again with "
                       "another --workdir")

    def check_guard(self) -> None:
        """RunError after optim.max_skipped_in_row steps in a row whose update was skipped (a
        non-finite loss or gradient)."""
        n, step = self.config.optim.max_skipped_in_row, self.state.step
        if self.state.guard["skipped_in_row"] >= n:
            raise RunError(f"steps {step - n + 1}-{step}: {n} RL steps in a row had a non-finite "
                           f"loss or gradient and were skipped (optim.max_skipped_in_row={n}); "
                           f"the run stops (latest checkpoint: {self._last()}). Lower "
                           "--config.optim.lr or check the data and the reward, then resume "
                           "with --force_config")

    def _last(self) -> str:
        return f"step {self.saved}" if self.saved else "none"

    def _tick(self) -> None:
        """The state's training seconds (every segment's, saved with it) to now: the end of a
        step or of its eval. The first eval of a new run is not training."""
        if self._clock is not None:
            start, earlier = self._clock
            self.state = dataclasses.replace(self.state,
                                             seconds=earlier + time.perf_counter() - start)

    def evaluate(self) -> dict:
        """The run's held-out avg@k / pass@k (eval section) of the current params, the same
        draws at every eval, on the stream's sampler (no second copy of the weights)."""
        self.check_finite()
        c, s = self.config, self.setup
        out = evaluate_policy(self.stream.sampler(s.eval_rollout), self.state.train.params,
                              s.eval_records, samples=c.eval.samples, pass_k=c.eval.pass_k,
                              threshold=c.adaptive.positive_threshold, seed=c.seed)
        self._tick()
        self.observe("eval", self.state.step, self.stream)
        return out

    def save(self) -> int:
        """Start checkpointing the current state (the write runs while the next steps do);
        with the data position after its batch: the batches in flight are drawn again."""
        self.check_finite()
        self.state = dataclasses.replace(self.state, data=self.stream.data_state())
        self.state.save(self.ckpt, self.config.method)
        self.saved = self.state.step
        self.observe("save", self.saved, self.stream)
        return self.saved

    def close(self, failed: bool = False) -> int | None:
        """Finish the save in flight and stop the stream; returns the latest complete
        checkpoint. After a failure the save in flight (of a good step) is finished quietly."""
        try:
            if not failed:
                self.check_finite()
                return self.ckpt.close()  # StorageError if the last write failed
        except BaseException:
            failed = True
            raise
        finally:
            if failed:
                with contextlib.suppress(Exception):
                    self.ckpt.close()
            if self.stream is not None:
                self.stream.close()
        return None


def stream_metrics(local: dict) -> dict:
    """The stream's per-step metrics over every process: the staleness of the trained
    tokens, the idle shares and queue of the slowest process. (The importance weights' come
    from the loss, at k = 0 too: 1 for the tokens the proximal policy drew.)"""
    hist = distributed.global_sum(np.asarray(local["staleness_hist"], np.int64))
    worst = distributed.allgather(np.array([
        local["staleness_max"], local["sampler_idle_share"], local["trainer_idle_share"],
        local["queue_depth"], local["cohorts_in_flight"]], np.float64)).max(axis=0)
    return {"staleness_max": int(worst[0]),
            "staleness_mean": float(np.arange(hist.size) @ hist / max(hist.sum(), 1)),
            "staleness_hist": [int(x) for x in hist],
            "sampler_idle_share": float(worst[1]), "trainer_idle_share": float(worst[2]),
            "queue_depth": int(worst[3]), "cohorts_in_flight": int(worst[4]),
            # this process's: the sampler's work, and what an update caught mid-response
            "slot_occupancy": float(local["slot_occupancy"]),
            "spanning_share": float(local["spanning_share"]),
            "carried_tokens": int(local["carried_tokens"])}
