"""Adaptive collection: rounds or a continuous scheduler over an engine, then selection.

One code path serves every method; a method is a `CollectConfig` (`ada.methods` holds the
table of named methods and builds theirs): an exit rule, M responses per round, at most N
rounds, and for DAPO dynamic sampling (drop groups whose rewards are all equal and draw
further prompt batches until P mixed groups, or dapo_max_batches).

Rounds (the reference loop): in round r every active prompt (not done, budget left) gets M
requests; after the round every response is scored and the rule is re-evaluated on the
counts. Continuous: a fixed number of engine slots stays busy; `DispatchPolicy` decides which
active prompt gets each free slot, each finished response is scored at once, and a prompt
retires the moment its rule holds. Responses still in flight for a retired prompt are
scored into its pool when they arrive (they count in its statistics and may be selected).
A collection may take per-prompt caps (`ada.adaptive.allocation`): a prompt then draws at
most its cap (<= M x N; a round gives it only what is left); without caps each may draw
M x N, and caps of M x N for all are that same collection bit for bit.

The engine is a slot driver (duck-typed; rounds drain it one round at a time):
  driver.submit(engine_request); driver.free_slots() -> int; driver.step() -> [completion]
  driver.keep_prompts(prompt_ids): the prompts still active, whose prefill is worth keeping
  make_request(SampleRequest) -> engine_request           (default: the request itself)
A completion needs `.prompt_id`, `.sample_idx` (echoed from the request) and `.text`.
reward_fn(prompt_record, text) -> float (or reward_fn(prompt_record, completion) with
reward_input="completion", for rewards that need token ids or finish_reason), scored by
`ada.rewards.score.score`: a raise, None, NaN or inf scores 0 and is counted in
metrics["reward_failures"]; the batch always completes. A response is positive iff
`ada.rewards.score.correct(reward, positive_threshold)`. The engine driver of
ada/sampling/driver.py fits as is (ada/rollout.py):
make_request = lambda r: driver.Request(tokens(r.prompt), r.prompt_id, r.sample_idx, ...);
ada/adaptive/simulate.py has a simulated one.

Prompt ids: the engine-facing id of row i of the b-th prompt batch (DAPO draws several) on
process p of k is (b * k + p) * P + i, unique across processes and batches, so every
prompt draws its own random stream and selection key.

Multi-host: a Collector sees only its own process's prompts (generation is process-local),
and its exit decisions are `rules.RULES[rule].done(pos, neg, seen, n)` of the pool counts in
`Pool.stats`. Those are plain sums, so they could be summed across hosts before deciding if
one prompt's draws were ever spread over several; nothing does that today.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from ada.adaptive import rules
from ada.adaptive.pool import Pool, PoolStats
from ada.adaptive.select import select
from ada.rewards.score import FAILURE_SCORE, score

SCHEDULERS = ("rounds", "continuous")


@dataclasses.dataclass(frozen=True)
class SampleRequest:
    """One response to draw: row `prompt_id` of the collection, response `sample_idx`."""

    prompt_id: int
    sample_idx: int
    prompt: Any = None


def threshold_problem(threshold: float, reward_range) -> str | None:
    """Why (threshold, reward_range) cannot split rewards into positive (> threshold) and
    negative, or None. The one check behind CollectConfig and the run config."""
    lo, hi = reward_range
    if not lo < hi:
        return f"reward_range={tuple(reward_range)} must be (low, high) with low < high"
    if not lo <= threshold < hi:
        return (f"threshold={threshold} is outside the reward range [{lo}, {hi}): no reward "
                f"could be {'positive' if threshold >= hi else 'negative'}; set it in [{lo}, {hi})")
    return None


@dataclasses.dataclass(frozen=True)
class CollectConfig:
    rule: str = "balance"
    n: int = 4  # group size kept per prompt
    samples_per_round: int = 8  # M
    max_rounds: int = 4  # N; the budget per prompt is M x N
    positive_threshold: float = 0.5  # positive iff ada.rewards.score.correct: reward > it
    reward_range: tuple[float, float] = (0.0, 1.0)
    scheduler: str = "rounds"  # "rounds" | "continuous"
    dynamic_sampling: bool = False  # DAPO: keep only mixed groups, draw more prompts
    dapo_max_batches: int = 4  # DAPO: prompt batches drawn per collection at most
    overlap_scoring: bool = True  # rounds: score each driver step's responses while it decodes

    def __post_init__(self):
        p = []
        if self.n < 2:
            p.append(f"n={self.n}: a group needs n >= 2 responses for a baseline; raise n")
        if self.samples_per_round < 1 or self.max_rounds < 1:
            p.append(f"samples_per_round={self.samples_per_round} and max_rounds="
                     f"{self.max_rounds} must both be >= 1")
        elif self.budget < self.n:
            p.append(f"samples_per_round * max_rounds = {self.samples_per_round} x "
                     f"{self.max_rounds} = {self.budget} < n={self.n}: a prompt could never "
                     f"fill its group; raise samples_per_round or max_rounds, or lower n")
        if self.rule not in rules.RULES:
            p.append(f"rule={self.rule!r} is not one of {sorted(rules.RULES)}")
        if self.scheduler not in SCHEDULERS:
            p.append(f"scheduler={self.scheduler!r} is not one of {SCHEDULERS}")
        lo, hi = self.reward_range
        problem = threshold_problem(self.positive_threshold, self.reward_range)
        if problem:
            p.append(problem)
        if lo < hi and not lo <= FAILURE_SCORE <= hi:
            p.append(f"reward_range={self.reward_range} must hold {FAILURE_SCORE}, the score of "
                     "a failed reward")
        if self.dapo_max_batches < 1:
            p.append(f"dapo_max_batches={self.dapo_max_batches} must be >= 1")
        if p:
            raise ValueError("invalid CollectConfig: " + "; ".join(p))

    @property
    def budget(self) -> int:
        return self.samples_per_round * self.max_rounds


class DispatchPolicy:
    """Which active prompts get the next free slots. Pure and engine-independent: the real
    continuous driver and the simulator both call `pick` with the same counts.

    A prompt is eligible while it is not done and has budget left. Among eligible prompts,
    each free slot goes to the first by (in-flight requests already cover its minimum need,
    in-flight, dispatched, prompt id): prompts whose need is not yet covered come first,
    then the least loaded.
    It is work-conserving: slots are only left idle when no prompt is eligible.
    """

    def __init__(self, rule: str, n: int, budget: int):
        self.rule, self.n, self.budget = rules.get_rule(rule), n, budget

    def pick(self, free: int, done, dispatched, inflight, pos, neg, caps=None) -> list[int]:
        """`caps`: per prompt, the samples it may draw (default: the budget for all)."""
        budget = self.budget if caps is None else np.asarray(caps, np.int64)
        dispatched = np.array(dispatched, np.int64)
        inflight = np.array(inflight, np.int64)
        need = self.rule.min_needed(pos, neg, np.asarray(pos) + np.asarray(neg), self.n,
                                    budget)
        ids = np.arange(dispatched.shape[0], dtype=np.int64)
        base = int(np.max(budget, initial=0)) + 1
        out: list[int] = []
        for _ in range(free):
            eligible = ~np.asarray(done) & (dispatched < budget)
            if not eligible.any():
                break
            covered = (inflight >= need).astype(np.int64)
            key = ((covered * base + inflight) * base + dispatched) * ids.size + ids
            p = int(np.argmin(np.where(eligible, key, np.iinfo(np.int64).max)))
            out.append(p)
            dispatched[p] += 1
            inflight[p] += 1
        return out


# A collection is a generator (`Collector.collect_steps`): it submits requests to its
# driver, and where it needs the driver to run it yields STEP; whoever runs it does one
# driver.step() and sends back the completions of that step that are the collection's.
# `run_steps` runs one collection alone (the synchronous step); ada/stream.py runs several
# steps' collections over one driver at once.
STEP = None


def run_steps(steps: Generator, driver):
    """Run a collection generator alone over `driver` (every completion is its own);
    returns what it returns."""
    got = None
    try:
        while True:
            steps.send(got)
            got = driver.step()
    except StopIteration as stop:
        return stop.value


def drain_steps(driver, requests: Sequence[SampleRequest], make_request=None,
                on_step: Callable[[list], Any] | None = None) -> Generator:
    """Run a list of requests through a slot driver to completion (a round's `generate`;
    the STEP protocol above): `on_step` sees what each driver step finished; returns every
    completion."""
    make_request = make_request or (lambda r: r)
    pending, inflight, out = deque(requests), 0, []
    while pending or inflight:
        for _ in range(min(driver.free_slots(), len(pending))):
            driver.submit(make_request(pending.popleft()))
            inflight += 1
        if inflight == 0 and not getattr(driver, "shared", False):  # shared: others' slots
            raise RuntimeError("the driver reports no free slots but holds none of our requests")
        got = yield STEP
        inflight -= len(got)
        out.extend(got)
        if on_step is not None:
            on_step(got)
    return out


@dataclasses.dataclass
class Collected:
    """A collected batch: exactly n responses for each of P prompts, plus pool statistics."""

    prompts: list  # [P] prompt records of the groups
    sample_idx: np.ndarray  # [P, n] int32; -1 where group_valid is False
    rewards: np.ndarray  # [P, n] float32
    group_valid: np.ndarray  # [P, n] bool
    completions: list  # [P][n] completion objects (None where invalid)
    pool: PoolStats  # [P] counts and shifted sums of every response drawn per prompt
    done: np.ndarray  # [P] bool, the exit rule held
    mixed: np.ndarray  # [P] bool, kept rewards not all equal
    samples: np.ndarray  # [P] responses drawn per prompt (dispatched, incl. late ones)
    metrics: dict = dataclasses.field(default_factory=dict)
    rounds: list = dataclasses.field(default_factory=list)


class Collector:
    """Collects [P, n] groups for a batch of prompts with one CollectConfig, over a slot
    driver (the module doc)."""

    def __init__(self, config: CollectConfig, reward_fn: Callable[[Any, str], float], *,
                 driver, make_request: Callable[[SampleRequest], Any] | None = None,
                 reward_input: str = "text", process_index: int = 0, process_count: int = 1):
        if reward_input not in ("text", "completion"):
            raise ValueError(f"reward_input={reward_input!r}; use 'text' or 'completion'")
        self.config = config
        self.reward_fn = reward_fn
        self.reward_input = reward_input
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index={process_index} is not in [0, {process_count})")
        self.process_index, self.process_count = int(process_index), int(process_count)
        if driver is None:
            raise ValueError("Collector needs a slot driver (driver=...; module doc)")
        self.driver = driver
        self.make_request = make_request or (lambda r: r)
        self.policy = DispatchPolicy(config.rule, config.n, config.budget)
        self._rule = rules.get_rule(config.rule)

    # ------------------------------------------------------------------ public

    def collect(self, prompts: Sequence, key: jax.Array,
                more_prompts: Iterable | None = None, caps=None) -> Collected:
        """Collect groups for `prompts` (DAPO also draws from `more_prompts`). `caps`: per
        prompt, the samples it may draw (`ada.adaptive.allocation`); None: M x N each."""
        return run_steps(self.collect_steps(prompts, key, more_prompts, caps), self.driver)

    def collect_steps(self, prompts: Sequence, key: jax.Array,
                      more_prompts: Iterable | None = None, caps=None) -> Generator:
        """`collect` as a generator of the STEP protocol (module code above `run_steps`):
        returns the Collected."""
        prompts = list(prompts)
        if not prompts:
            raise ValueError("collect() needs at least one prompt")
        t0 = time.perf_counter()
        if caps is not None and self.config.dynamic_sampling:
            raise ValueError("per-prompt caps and dynamic_sampling (DAPO) do not combine: "
                             "DAPO's further batches have no caps; use allocation=none")
        if not self.config.dynamic_sampling:
            out = yield from self._collect_batch(prompts, key, batch=0, width=len(prompts),
                                                 caps=caps)
        else:
            if more_prompts is None:
                raise ValueError("dynamic_sampling (DAPO) needs more_prompts=an iterator of "
                                 "further prompt records to draw when groups are dropped")
            out = yield from self._collect_dynamic(prompts, key, iter(more_prompts))
        out.metrics["seconds"] = time.perf_counter() - t0
        return out

    # ------------------------------------------------------------------ internals

    def _score(self, prompts, offset, completions) -> tuple[list[int], np.ndarray, np.ndarray]:
        """(row, reward, failed) of each completion."""
        rows = []
        for c in completions:
            p = int(c.prompt_id) - offset
            if not 0 <= p < len(prompts):
                raise ValueError(f"completion has prompt_id={c.prompt_id}, not a request of this "
                                 f"collection (rows {offset}..{offset + len(prompts) - 1})")
            rows.append(p)
        responses = [c.text if self.reward_input == "text" else c for c in completions]
        rewards, failed = score(self.reward_fn, [prompts[p] for p in rows], responses)
        return rows, rewards, failed

    def _ingest(self, pool: Pool, prompts, offset, completions, counters,
                scored=None) -> list[tuple[int, float]]:
        """Score completions (unless `scored` already holds their `_score`) and add them to
        the pool; returns (row, reward) per completion."""
        rows, rewards, failed = scored or self._score(prompts, offset, completions)
        counters["reward_failures"] += int(failed.sum())
        for p, c, r in zip(rows, completions, rewards, strict=True):
            pool.add(p, int(c.sample_idx), float(r), c)
        return [(p, float(r)) for p, r in zip(rows, rewards, strict=True)]

    def _done(self, pool: Pool):
        s = pool.stats
        return np.asarray(self._rule.done(s.pos, s.neg, s.seen, self.config.n), bool)

    def _collect_batch(self, prompts: list, key, batch: int, width: int, caps=None) -> Generator:
        """One prompt batch; `batch` numbers DAPO's draws and, with the collection's prompt
        count `width`, sets the global prompt ids (module doc)."""
        cfg = self.config
        pool = Pool(len(prompts), cfg.budget, cfg.positive_threshold, shift=cfg.positive_threshold,
                    caps=caps)
        offset = (batch * self.process_count + self.process_index) * width
        counters = {"reward_failures": 0, "late_samples": 0}
        if cfg.scheduler == "rounds":
            rounds = yield from self._run_rounds(prompts, pool, offset, counters)
        else:
            rounds = yield from self._run_continuous(prompts, pool, offset, counters)
        return self._finish(prompts, pool, key, counters, rounds, offset)

    def _run_rounds(self, prompts, pool: Pool, offset, counters) -> Generator:
        cfg, out = self.config, []
        done = np.zeros(pool.num_prompts, bool)
        for r in range(cfg.max_rounds):
            active = np.flatnonzero(~done & (pool.dispatched < pool.caps))
            if active.size == 0:
                break
            t0 = time.perf_counter()
            self.driver.keep_prompts(active + offset)
            reqs = [SampleRequest(int(p) + offset, pool.next_sample_idx(int(p)), prompts[p])
                    for p in active
                    for _ in range(min(cfg.samples_per_round, pool.caps[p] - pool.dispatched[p]))]
            completions, scored = yield from self._generate_scored(reqs, prompts, offset)
            if len(completions) != len(reqs):
                raise RuntimeError(f"generate returned {len(completions)} completions for "
                                   f"{len(reqs)} requests; it must answer every request")
            rewards = [r for _, r in self._ingest(pool, prompts, offset, completions, counters,
                                                  scored)]
            newly = self._done(pool) & ~done
            done |= newly
            out.append(dict(round=r, active_prompts=int(active.size), completed=int(newly.sum()),
                            finished=int(done.sum()), samples=len(reqs),
                            **self._lacking(pool, active),
                            reward_mean=float(np.mean(rewards)),
                            seconds=time.perf_counter() - t0))
        self.driver.keep_prompts(())
        return out

    def _lacking(self, pool: Pool, prompts) -> dict:
        """Of `prompts`, how many still lack the positives / negatives of a balanced group
        (n // 2 and n - n // 2) after their draws so far: the paper's sampling dynamics
        (early in training positives are missing, late negatives)."""
        n = self.config.n
        pos, neg = np.asarray(pool.stats.pos)[prompts], np.asarray(pool.stats.neg)[prompts]
        return dict(lacking_pos=int(np.sum(pos < n // 2)), lacking_neg=int(np.sum(neg < n - n // 2)))

    def _generate_scored(self, reqs, prompts, offset) -> Generator:
        """A round's completions, and with `overlap_scoring` their `_score`: each driver
        step's completions are scored on a thread while the driver decodes on.
        The pool takes the round whole either way, in completion order, so the exit
        decisions and the collected batch do not change (tests/test_overlap.py)."""
        if not self.config.overlap_scoring:
            return (yield from drain_steps(self.driver, reqs, self.make_request)), None
        parts = []
        with ThreadPoolExecutor(max_workers=1) as scorer:
            completions = yield from drain_steps(
                self.driver, reqs, self.make_request,
                lambda got: parts.append(scorer.submit(self._score, prompts, offset, got)))
            parts = [f.result() for f in parts]
        return completions, ([p for rows, _, _ in parts for p in rows],
                             np.concatenate([r for _, r, _ in parts]),
                             np.concatenate([f for _, _, f in parts]))

    def _run_continuous(self, prompts, pool: Pool, offset, counters) -> Generator:
        cfg, drv, s = self.config, self.driver, pool.stats
        done = np.zeros(pool.num_prompts, bool)
        t0, rewards, steps = time.perf_counter(), [], 0
        while True:
            drv.keep_prompts(np.flatnonzero(~done & (pool.dispatched < pool.caps)) + offset)
            free = drv.free_slots()
            picks = self.policy.pick(free, done, pool.dispatched, pool.inflight, s.pos, s.neg,
                                     pool.caps)
            for p in picks:
                drv.submit(self.make_request(
                    SampleRequest(p + offset, pool.next_sample_idx(p), prompts[p])))
            if int(pool.inflight.sum()) == 0:
                if not (free == 0 and np.any(~done & (pool.dispatched < pool.caps))):
                    break  # nothing in flight and no prompt eligible: every prompt done or spent
                if not getattr(drv, "shared", False):  # shared: the slots are others' (stream)
                    raise RuntimeError("the driver reports no free slots but holds none of our "
                                       "requests; is another client using it?")
            steps += 1
            got = yield STEP
            for p, r in self._ingest(pool, prompts, offset, got, counters):
                rewards.append(r)
                if done[p]:
                    counters["late_samples"] += 1
                elif self._rule.done(s.pos[p], s.neg[p], s.seen[p], cfg.n):
                    done[p] = True
        drv.keep_prompts(())
        return [dict(round=0, active_prompts=pool.num_prompts, completed=int(done.sum()),
                     finished=int(done.sum()), samples=int(pool.dispatched.sum()),
                     **self._lacking(pool, np.arange(pool.num_prompts)),
                     reward_mean=float(np.mean(rewards)) if rewards else 0.0,
                     seconds=time.perf_counter() - t0, driver_steps=steps)]

    def _finish(self, prompts, pool: Pool, key, counters, rounds, offset: int) -> Collected:
        cfg = self.config
        if int(pool.inflight.sum()):
            raise RuntimeError("collection ended with requests still in flight")
        prompt_ids = offset + np.arange(pool.num_prompts)
        idx, st = jax.device_get(select(pool.rewards.astype(np.float32), pool.valid, cfg.n,
                                        cfg.rule, key, cfg.positive_threshold, prompt_ids))
        gv = st["group_valid"]
        P = pool.num_prompts
        comps = [[pool.completions[p][int(i)] if v else None for i, v in zip(idx[p], gv[p], strict=False)]
                 for p in range(P)]
        samples = pool.dispatched.copy()
        mixed = st["mixed"]
        out = Collected(
            prompts=list(prompts), sample_idx=idx, rewards=st["rewards"],
            group_valid=gv, completions=comps, pool=pool.stats,
            done=st["done"], mixed=mixed, samples=samples, rounds=rounds,
        )
        # The first round's draws (sample_idx < M) estimate the policy's own accuracy on the
        # batch; the kept rewards cannot (under balance they sit near 1/2 by construction).
        first = pool.valid[:, :cfg.samples_per_round]
        out.metrics = dict(counters, **_summary(samples.sum(), mixed, P, out.done),
                           round0_reward_sum=float(np.sum(pool.rewards[:, :cfg.samples_per_round],
                                                          where=first)),
                           round0_samples=int(first.sum()))
        return out

    def _collect_dynamic(self, prompts, key, more: Iterator) -> Generator:
        P = len(prompts)
        kept, uniform, batches, drawn = [], [], [], 0
        batch = prompts
        for b in range(self.config.dapo_max_batches):
            res = yield from self._collect_batch(batch, jax.random.fold_in(key, b), batch=b,
                                                 width=P)
            batches.append(res)
            drawn += len(batch)
            for i in range(len(batch)):
                (kept if res.mixed[i] else uniform).append((res, i))
            if len(kept) >= P:
                break
            batch = list(itertools.islice(more, P))
            if not batch:
                break
        rows = kept[:P] + uniform[: P - min(P, len(kept))]
        out = _stack_rows(rows)
        total = int(sum(r.samples.sum() for r in batches))
        out.metrics = {
            **{k: sum(r.metrics[k] for r in batches)
               for k in ("reward_failures", "late_samples", "round0_reward_sum", "round0_samples")},
            **_summary(total, out.mixed, P, out.done),
            "prompt_batches": len(batches), "prompts_drawn": drawn,
            "unfilled": int(P - min(P, len(kept))),
        }
        out.rounds = [dict(rd, batch=b) for b, r in enumerate(batches) for rd in r.rounds]
        return out


def _summary(total_samples, mixed, P, done) -> dict:
    n_mixed = int(np.sum(mixed))
    return dict(
        samples=int(total_samples), samples_per_prompt=float(total_samples) / P,
        mixed_share=n_mixed / P,
        samples_per_mixed_prompt=(float(total_samples) / n_mixed if n_mixed else float("inf")),
        exited_share=float(np.mean(done)),
    )


def _stack_rows(rows: list[tuple[Collected, int]]) -> Collected:
    """Stack chosen rows of several Collected into one (DAPO's batch assembly)."""
    def cat(get):
        return np.stack([get(r)[i] for r, i in rows])

    pools = [r.pool.take(np.array([i])) for r, i in rows]
    pool = pools[0]
    pool = PoolStats(pos=np.concatenate([q.pos for q in pools]),
                     neg=np.concatenate([q.neg for q in pools]),
                     s1=np.concatenate([q.s1 for q in pools]),
                     s2=np.concatenate([q.s2 for q in pools]), shift=pool.shift)
    return Collected(
        prompts=[r.prompts[i] for r, i in rows],
        sample_idx=cat(lambda r: r.sample_idx), rewards=cat(lambda r: r.rewards),
        group_valid=cat(lambda r: r.group_valid),
        completions=[r.completions[i] for r, i in rows], pool=pool,
        done=cat(lambda r: r.done), mixed=cat(lambda r: r.mixed),
        samples=cat(lambda r: r.samples),
    )
