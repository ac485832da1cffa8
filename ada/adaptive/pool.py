"""Per-prompt pool state: the counts the exit rules read and the reward moments the baseline
reads, for every response drawn for a prompt (the "global statistics" of Reinforce-Ada).

Everything is a plain sum over responses. Generation is process-local (ada/rollout.py):
each process keeps the pools of its own prompts and decides their exits alone. A sampler
that spread one prompt's draws over hosts could sum these arrays across them first and
every host would reach the same exit decisions; nothing does that today.

  pos, neg   responses that are correct / not (`ada.rewards.score.correct`: reward > threshold)
  s1, s2     sum of (r - shift) and of (r - shift)^2

Moments are shifted by a constant `shift` (the threshold by default, a value inside the
reward range): mean = shift + s1 / c, var = (s2 - s1^2 / c) / (c - 1) (Bessel), clamped at 0.
Raw sums of r and r^2 cancel catastrophically when |mean| >> std; shifting by a value near
the data keeps the error at the level of Welford's update while the state stays a sum, which
Welford's (mean, M2) pair is not. Pools of one sample (or none) get mean 0, std 1, as in the
reference (verl fork, `_compute_with_global_stats`). Host-side accumulation is float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ada.rewards.score import correct


def _xp(x):
    return jnp if isinstance(x, jax.Array) else np


@struct.dataclass
class PoolStats:
    """Counts and shifted reward sums per prompt, all [P]."""

    pos: jax.Array  # [P] int
    neg: jax.Array  # [P] int
    s1: jax.Array  # [P] float, sum of (r - shift)
    s2: jax.Array  # [P] float, sum of (r - shift)^2
    shift: float = struct.field(pytree_node=False, default=0.0)

    @property
    def seen(self):
        return self.pos + self.neg

    @classmethod
    def empty(cls, num_prompts: int, shift: float = 0.0) -> PoolStats:
        z = np.zeros((num_prompts,), np.int64)
        f = np.zeros((num_prompts,), np.float64)
        return cls(pos=z, neg=z.copy(), s1=f, s2=f.copy(), shift=float(shift))

    def take(self, idx) -> PoolStats:
        return self.replace(pos=self.pos[idx], neg=self.neg[idx], s1=self.s1[idx], s2=self.s2[idx])

    def mean_std(self):
        return moments(self.seen, self.s1, self.s2, self.shift)


def add_one(stats: PoolStats, prompt: int, reward: float, threshold: float) -> None:
    """In-place host update for one scored response (NumPy arrays only)."""
    if correct(reward, threshold):
        stats.pos[prompt] += 1
    else:
        stats.neg[prompt] += 1
    d = float(reward) - stats.shift
    stats.s1[prompt] += d
    stats.s2[prompt] += d * d


def moments(count, s1, s2, shift):
    """(mean, std) from shifted sums; Bessel-corrected; count <= 1 -> (0, 1)."""
    xp = _xp(s1)
    c = xp.maximum(count, 1).astype(s1.dtype)
    mean_d = s1 / c
    var = (s2 - s1 * mean_d) / xp.maximum(c - 1, 1)
    # A uniform pool (all 0 or all 1: the common case) has var exactly 0, but s2 - s1^2/c
    # leaves rounding noise of order eps * s2 / c; below that resolution call it 0, so the
    # std clamp (and not noise) decides the advantage scale.
    noise = 16 * float(np.finfo(s1.dtype).eps) * s2 / c
    std = xp.sqrt(xp.where(var > noise, var, 0.0))
    many = count > 1
    return xp.where(many, shift + mean_d, 0.0), xp.where(many, std, 1.0)


class Pool:
    """Host-side pool of a batch: every scored response, stored at its sample index.

    Arrays are [P, budget]; the column is the request's `sample_idx`, so the pool (and the
    selection made from it) does not depend on the order in which responses arrive.
    """

    def __init__(self, num_prompts: int, budget: int, threshold: float, shift: float,
                 caps=None):
        self.threshold = float(threshold)
        # per prompt, the samples it may draw (`ada.adaptive.allocation`); all of `budget` if None
        self.caps = np.full(num_prompts, budget, np.int64) if caps is None else np.asarray(caps,
                                                                                        np.int64)
        if (self.caps.shape != (num_prompts,) or self.caps.min(initial=0) < 0
                or self.caps.max(initial=0) > budget):
            raise ValueError(f"caps must be {num_prompts} integers in [0, {budget}]: a prompt "
                             "draws at most M x N; raise samples_per_round or max_rounds")
        self.rewards = np.zeros((num_prompts, budget), np.float64)
        self.valid = np.zeros((num_prompts, budget), bool)
        self.completions: list[dict[int, object]] = [{} for _ in range(num_prompts)]
        self.dispatched = np.zeros((num_prompts,), np.int64)
        self.stats = PoolStats.empty(num_prompts, shift)

    @property
    def num_prompts(self) -> int:
        return self.rewards.shape[0]

    @property
    def budget(self) -> int:
        return self.rewards.shape[1]

    @property
    def inflight(self):
        return self.dispatched - self.stats.seen

    def next_sample_idx(self, prompt: int) -> int:
        """Reserve the next sample index of `prompt` (one request)."""
        idx = int(self.dispatched[prompt])
        if idx >= self.caps[prompt]:
            raise RuntimeError(f"prompt {prompt} is past its cap of {self.caps[prompt]} samples")
        self.dispatched[prompt] += 1
        return idx

    def add(self, prompt: int, sample_idx: int, reward: float, completion) -> None:
        if not 0 <= sample_idx < self.dispatched[prompt]:
            raise ValueError(
                f"completion for prompt {prompt} has sample_idx={sample_idx}, which was never "
                f"requested (dispatched {self.dispatched[prompt]})"
            )
        if self.valid[prompt, sample_idx]:
            raise ValueError(f"duplicate completion for prompt {prompt}, sample_idx {sample_idx}")
        self.rewards[prompt, sample_idx] = reward
        self.valid[prompt, sample_idx] = True
        self.completions[prompt][sample_idx] = completion
        add_one(self.stats, prompt, reward, self.threshold)
