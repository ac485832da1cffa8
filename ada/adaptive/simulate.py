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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np


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


class SimulatedDriver:
    """A slot engine: `num_slots` requests decode in parallel, one token per step each."""

    def __init__(self, policy: SimulatedPolicy, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be >= 1")
        self.policy, self.num_slots = policy, num_slots
        self.clock = 0  # decode steps so far
        self.busy_slot_steps = 0  # sum over steps of busy slots (utilisation numerator)
        self._slots: list[list] = []  # [remaining, completion]

    def free_slots(self) -> int:
        return self.num_slots - len(self._slots)

    def keep_prompts(self, prompt_ids) -> None:
        """Nothing to keep: a simulated draw has no prefill."""

    def submit(self, request) -> None:
        if not self.free_slots():
            raise RuntimeError("submit() with no free slot; check free_slots() first")
        correct, length = self.policy.outcome(request.prompt, request.sample_idx)
        c = SimCompletion(prompt_id=request.prompt_id, sample_idx=request.sample_idx,
                          text="1" if correct else "0", num_tokens=length)
        self._slots.append([length, c])

    def step(self) -> list[SimCompletion]:
        if not self._slots:
            return []
        dt = min(s[0] for s in self._slots)
        self.clock += dt
        self.busy_slot_steps += dt * len(self._slots)
        for s in self._slots:
            s[0] -= dt
        done = [s[1] for s in self._slots if s[0] == 0]
        self._slots = [s for s in self._slots if s[0] > 0]
        return done


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
