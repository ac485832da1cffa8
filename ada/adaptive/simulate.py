"""Simulated policies and a simulated slot engine, for measuring collection methods without a
model. The collector, its dispatch policy and its selection are the real ones; only the
engine is replaced by `SimulatedDriver`, which implements the same driver interface
(`submit` / `free_slots` / `step`) as the real continuous-batching driver.

A simulated prompt has a known pass rate. The outcome of response (prompt uid, sample_idx) —
correct or not, and its length in tokens — is a fixed function of (seed, uid, sample_idx),
so a response does not depend on which slot or round produced it, and two methods drawing
the same sample index see the same response. Lengths are log-normal around `mean_len`
(wrong answers `wrong_len_factor` times longer, as rambling failures are), clipped to
[1, max_len]: a workload whose lengths vary, where a round barrier leaves slots idle.

Time is counted in decode steps: every busy slot emits one token per step. `step()` jumps
to the next step at which some request finishes (nothing else can change in between, so
this is exact) and `clock` is the number of decode steps so far.

For the stream (ada/stream.py; experiments/stream_sim.py) the driver also has a policy
version: `set_params` changes it between two steps, every token records the version it
was sampled under (`versions`), `step(limit)` stops early (at a trainer's update), and
`wait(dt)` lets time pass with nothing decoding (a colocated update). `SharedSimDriver`
holds the requests that wait for a slot, so the head cohort's wait for slots that younger
cohorts hold can be measured, and can pause younger requests for it (`head_first`).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import sys
from collections.abc import Callable, Iterator

import numpy as np

from ada.adaptive import allocation, rules, success


@dataclasses.dataclass(frozen=True)
class SimPrompt:
    uid: int
    pass_rate: float


@dataclasses.dataclass(frozen=True)
class SimCompletion:
    prompt_id: int
    sample_idx: int
    token_ids: tuple = ()
    text: str = ""
    logprobs: tuple = ()
    finish_reason: str = "eos"
    num_tokens: int = 0
    seq: int = -1  # the driver's submission number
    versions: tuple = ()  # per token: the policy version it was sampled under


def sim_reward(prompt: SimPrompt, text: str) -> float:
    """The simulated verifier: a completion's text is its 0/1 correctness."""
    del prompt
    return float(text)


@dataclasses.dataclass(frozen=True)
class SimulatedPolicy:
    seed: int = 0
    mean_len: float = 256.0
    len_sigma: float = 0.6
    wrong_len_factor: float = 1.5
    max_len: int = 1024

    def outcome(self, prompt: SimPrompt, sample_idx: int) -> tuple[bool, int]:
        rng = np.random.default_rng([self.seed, prompt.uid, sample_idx])
        u, z = rng.random(), rng.standard_normal()
        correct = bool(u < prompt.pass_rate)
        scale = self.mean_len * (1.0 if correct else self.wrong_len_factor)
        length = int(np.clip(round(scale * np.exp(self.len_sigma * z)), 1, self.max_len))
        return correct, length


@dataclasses.dataclass
class _Request:
    seq: int
    left: int  # tokens still to emit
    completion: SimCompletion  # what it returns, less its versions
    versions: list = dataclasses.field(default_factory=list)  # [[version, tokens], ...]
    rank: int = 0  # SharedSimDriver: its cohort


class SimulatedDriver:
    """A slot engine: `num_slots` requests decode in parallel, one token per step each."""

    def __init__(self, policy: SimulatedPolicy, num_slots: int, version: int = 0):
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be >= 1")
        self.policy, self.num_slots, self.version = policy, num_slots, int(version)
        self.clock = 0  # decode steps so far (with `wait`'s idle ones)
        self.idle_steps = 0  # of which nothing decoded (`wait`)
        self.busy_slot_steps = 0  # sum over steps of busy slots (utilisation numerator)
        self.carried_tokens = 0  # tokens of running requests at a weight change
        self._seq = itertools.count()
        self._slots: list[_Request] = []

    def free_slots(self) -> int:
        return self.num_slots - len(self._slots)

    def keep_prompts(self, prompt_ids) -> None:
        """Nothing to keep: a simulated draw has no prefill."""

    def submit(self, request) -> int:
        if not self.free_slots():
            raise RuntimeError("submit() with no free slot; check free_slots() first")
        r = self._request(request)
        self._slots.append(r)
        return r.seq

    def _request(self, request) -> _Request:
        correct, length = self.policy.outcome(request.prompt, request.sample_idx)
        seq = next(self._seq)
        return _Request(seq, length, SimCompletion(
            prompt_id=request.prompt_id, sample_idx=request.sample_idx,
            text="1" if correct else "0", num_tokens=length, seq=seq))

    def set_params(self, params, version: int) -> None:
        """New weights between two steps: running requests go on, their next tokens under
        `version` (ada.sampling.driver.Driver.set_params)."""
        del params
        self.carried_tokens += sum(r.completion.num_tokens - r.left for r in self._slots)
        self.version = int(version)

    def release(self, weights: bool = True) -> None:
        """Nothing to free: a simulated driver holds nothing on a chip (Driver.release)."""

    def close(self) -> None:
        """Abandon what runs (Driver.close)."""
        self._slots.clear()

    def wait(self, dt: int) -> None:
        """`dt` steps pass with nothing decoding (the trainer holds the devices)."""
        self.clock += int(dt)
        self.idle_steps += int(dt)

    def stats(self) -> dict:
        return {"useful_token_steps": self.busy_slot_steps, "carried_tokens": self.carried_tokens,
                "computed_token_steps": (self.clock - self.idle_steps) * self.num_slots}

    def step(self, limit: int | None = None) -> list[SimCompletion]:
        """Decode until a request finishes, or `limit` steps; returns what finished."""
        if not self._slots:
            return []
        dt = min(r.left for r in self._slots)
        dt = dt if limit is None else min(dt, int(limit))
        self._advance(dt)
        done = [r for r in self._slots if r.left == 0]
        self._slots = [r for r in self._slots if r.left > 0]
        return [dataclasses.replace(r.completion, versions=tuple(itertools.chain.from_iterable(
            itertools.repeat(v, n) for v, n in r.versions))) for r in done]

    def _advance(self, dt: int) -> None:
        self.clock += dt
        self.busy_slot_steps += dt * len(self._slots)
        for r in self._slots:
            r.left -= dt
            if r.versions and r.versions[-1][0] == self.version:
                r.versions[-1][1] += dt
            else:
                r.versions.append([self.version, dt])


class SharedSimDriver(SimulatedDriver):
    """The stream's shared slots with the waiting made visible: every request a cohort
    submits waits here until a slot frees (`free_slots` never runs out), and free slots go
    to the lowest `rank` first (the stream's cohort step: the oldest), in submission order
    within one. With the rounds scheduler that is where ada/stream.py's slots go (it resumes
    the cohorts oldest first after each step, each taking the free slots it needs:
    tests/test_stream_sim.py holds the two to the same runs), so what this adds is the
    measure of the head-of-line wait: steps during which the oldest cohort in the driver
    has requests waiting while younger cohorts hold slots (`hol_steps`, and `hol_slot_steps`
    counting the slots it waits for).

    `head_first`: younger cohorts yield to the head: while its requests wait, the youngest
    cohorts' running requests pause (keeping their tokens, at no cost: as if a paged cache
    kept their pages) and resume when slots free. Not what ada/stream.py does."""

    def __init__(self, policy: SimulatedPolicy, num_slots: int, version: int = 0, *,
                 rank: Callable[[int], int] = lambda seq: 0, head_first: bool = False):
        super().__init__(policy, num_slots, version)
        self.rank, self.head_first = rank, head_first
        self._new: list[_Request] = []  # submitted, not yet ranked (the stream ranks after)
        self._waiting: list[tuple] = []  # heap of (rank, seq, request)
        self._waits: collections.Counter = collections.Counter()  # rank -> requests waiting
        self.hol_steps = self.hol_slot_steps = self.paused = 0

    def free_slots(self) -> int:
        return sys.maxsize

    def live(self) -> int:
        """Requests submitted and not finished (running or waiting)."""
        return len(self._slots) + len(self._waiting) + len(self._new)

    def submit(self, request) -> int:
        r = self._request(request)
        self._new.append(r)
        return r.seq

    def step(self, limit: int | None = None) -> list[SimCompletion]:
        self._fill()
        return super().step(limit)

    def _wait(self, r: _Request) -> None:
        heapq.heappush(self._waiting, (r.rank, r.seq, r))
        self._waits[r.rank] += 1

    def _fill(self) -> None:
        for r in self._new:
            r.rank = self.rank(r.seq)
            self._wait(r)
        self._new = []
        free = self.num_slots - len(self._slots)
        if self.head_first and self._waiting:
            head = self._waiting[0][0]
            short = self._waits[head] - free
            younger = sorted((r for r in self._slots if r.rank > head),
                             key=lambda r: (-r.rank, -r.left))[:max(short, 0)]
            if younger:
                self.paused += len(younger)
                out = {r.seq for r in younger}
                self._slots = [r for r in self._slots if r.seq not in out]
                for r in younger:
                    self._wait(r)
                free += len(younger)
        for _ in range(min(free, len(self._waiting))):
            r = heapq.heappop(self._waiting)[2]
            self._waits[r.rank] -= 1
            self._slots.append(r)

    def _advance(self, dt: int) -> None:
        if self._waiting:
            head = min(self._waiting[0][0], min((r.rank for r in self._slots), default=sys.maxsize))
            held = sum(r.rank > head for r in self._slots)
            if self._waits[head] and held:
                self.hol_steps += dt
                self.hol_slot_steps += dt * min(self._waits[head], held)
        super()._advance(dt)


def pass_rate_mix(name: str, rng: np.random.Generator, size: int) -> np.ndarray:
    """Pass rates of a prompt mix.

    skewed:  35% hard (p ~ U[0, 0.1]), 35% easy (p ~ U[0.9, 1]), 30% medium (U[0.1, 0.9]);
             at n = 4 about 60% of prompts draw an all-correct or all-wrong group.
    uniform: p ~ U[0, 1].
    """
    if name == "uniform":
        return rng.random(size)
    if name == "skewed":
        kind = rng.choice(3, size=size, p=[0.35, 0.35, 0.30])
        lo = np.array([0.0, 0.9, 0.1])[kind]
        hi = np.array([0.1, 1.0, 0.9])[kind]
        return lo + (hi - lo) * rng.random(size)
    raise ValueError(f"unknown pass-rate mix {name!r}; use 'skewed' or 'uniform'")


def uniform_group_share(pass_rates: np.ndarray, n: int) -> float:
    """Expected share of prompts whose n-sample group is all-correct or all-wrong."""
    p = np.asarray(pass_rates, np.float64)
    return float(np.mean(p**n + (1 - p) ** n))


def prompt_stream(mix: str, seed: int, start_uid: int = 0) -> Iterator[SimPrompt]:
    """An endless stream of simulated prompts from a mix (DAPO draws from it)."""
    rng = np.random.default_rng([seed, 7])
    uid = start_uid
    while True:
        for p in pass_rate_mix(mix, rng, 256):
            yield SimPrompt(uid, float(p))
            uid += 1


# ---------------------------------------------------------------- the budget study
# (ada/adaptive/allocation.py; experiments/allocation_sim.py). Many steps of many prompts need
# no engine: `rounds_counts` is the collector's rounds scheduler over a fixed outcome table
# (tests/test_allocation.py holds it to `Collector` over `SimulatedDriver`, cap for cap).


def rounds_counts(correct_PxS: np.ndarray, caps, rule: str, n: int, M: int):
    """Rounds of M per active prompt, each prompt up to its cap, `rule` re-checked after each
    round, over outcomes `correct_PxS` (response j of prompt i is correct_PxS[i, j]).
    Returns (drawn, pos, neg, mixed) per prompt; mixed: the kept group holds both kinds,
    which for every rule and selection fill is pos >= 1 and neg >= 1 (ada/adaptive/select.py)."""
    rule_done = rules.get_rule(rule).done
    caps = np.asarray(caps, np.int64)
    P = caps.size
    ones = np.concatenate([np.zeros((P, 1), np.int64),
                           np.cumsum(correct_PxS[:, :max(int(caps.max(initial=0)), 1)], 1)], 1)
    drawn, done = np.zeros(P, np.int64), np.zeros(P, bool)
    pos = np.zeros(P, np.int64)
    while True:
        active = ~done & (drawn < caps)
        if not active.any():
            break
        drawn = np.where(active, np.minimum(drawn + M, caps), drawn)
        pos = ones[np.arange(P), drawn]
        done |= active & np.asarray(rule_done(pos, drawn - pos, drawn, n), bool)
    neg = drawn - pos
    return drawn, pos, neg, (pos >= 1) & (neg >= 1)


def beta_quantile(u, a: float, b: float) -> np.ndarray:
    """Quantiles u of Beta(a, b), by inverting its CDF on a logit grid (both tails resolved)."""
    z = np.linspace(-14.0, 14.0, 8193)
    x = 1.0 / (1.0 + np.exp(-z))
    logw = a * np.log(x) + b * np.log1p(-x)  # density in z: x^a (1 - x)^b
    cdf = np.cumsum(np.exp(logw - logw.max()))
    return np.interp(u, cdf / cdf[-1], x)


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """Pass rates of a prompt set over RL steps: Beta(a, b) fits at `steps` (log-linear in
    between, constant outside); each prompt keeps its quantile u, so it stays as hard
    relative to the others while the whole set moves as the fits do."""

    steps: tuple  # anchor steps, increasing
    ab: tuple  # (a, b) per anchor

    def rates(self, u: np.ndarray, step: int) -> np.ndarray:
        la, lb = (np.interp(step, self.steps, np.log([ab[k] for ab in self.ab])) for k in (0, 1))
        return beta_quantile(u, float(np.exp(la)), float(np.exp(lb)))


@dataclasses.dataclass(frozen=True)
class Arm:
    """One collection method in the study: an exit rule and rounds of M within caps that
    `allocation` sets from the success memory (`none`: M x N for every prompt)."""

    name: str
    rule: str
    M: int
    N: int
    n: int = 4
    alloc: object = None  # ada.adaptive.allocation.AllocConfig; None: no allocation
    half_life: float = success.HALF_LIFE
    prior_strength: float = success.PRIOR_STRENGTH


def run_arm(arm: Arm, traj: Trajectory, num_prompts: int, batch: int, steps: int, seed: int,
            start: int = 0, measure_from: int = 0) -> dict:
    """`steps` RL steps of `batch` prompts (epochs of a shuffled set of `num_prompts`) under
    `arm`, pass rates from `traj` at step start + t. A prompt the allocation skips is replaced
    by the next prompt of the data (at most 4 x batch drawn per step), as a run would keep the
    update's shape. Returns totals over steps >= measure_from: samples, mixed groups,
    signal (sum over mixed groups of p (1 - p)), skipped, and per step draws per prompt."""
    rng = np.random.default_rng([seed, 11])
    u = rng.random(num_prompts)
    mem = success.init(num_prompts)
    order, pos_in = rng.permutation(num_prompts), 0
    tot = dict(samples=0, mixed=0, signal=0.0, skipped=0, prompts=0, predicted=0.0)
    for t in range(steps):
        p_all = traj.rates(u, start + t)
        ids, caps, skipped = [], [], 0
        while len(ids) < batch and skipped < 3 * batch:
            want = batch - len(ids)
            if pos_in + want > num_prompts:
                order, pos_in = rng.permutation(num_prompts), 0
            cand = order[pos_in:pos_in + want]
            pos_in += want
            if arm.alloc is None:
                ids, caps = list(cand), [arm.M * arm.N] * want
                break
            keep = ~allocation.skips(arm.alloc, success.evidence(mem, cand, start + t,
                                                                 arm.half_life))
            skipped += int((~keep).sum())
            ids += list(cand[keep])
        ids = np.asarray(ids[:batch], np.int64)
        if ids.size == 0:  # every prompt drawn was skipped: a step with nothing to train
            tot["skipped"] += skipped if t >= measure_from else 0
            continue
        pred = np.zeros(ids.size)
        if arm.alloc is not None:
            a, b = success.posterior(mem, ids, start + t, arm.half_life, arm.prior_strength)
            got = allocation.allocate(arm.alloc, a, b)  # skips were made above
            caps, pred = got.caps, got.predicted_signal
        caps = np.asarray(caps, np.int64)
        p = p_all[ids]
        correct = rng.random((ids.size, max(int(caps.max()), 1))) < p[:, None]
        drawn, pos, neg, mixed = rounds_counts(correct, caps, arm.rule, arm.n, arm.M)
        if arm.alloc is not None:
            mem = success.update(mem, ids, pos, neg, start + t, arm.half_life)
        if t >= measure_from:
            tot["samples"] += int(drawn.sum())
            tot["mixed"] += int(mixed.sum())
            tot["signal"] += float(np.sum(mixed * p * (1 - p)))
            tot["skipped"] += skipped
            tot["prompts"] += ids.size
            tot["predicted"] += float(pred.sum())
    return tot
