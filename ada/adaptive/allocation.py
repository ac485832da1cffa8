"""How a step's sample budget is split across its prompts: one cap per prompt.

Reinforce-Ada decides how long to sample one prompt; this decides how many samples each
prompt of a step may draw at most. The collector (`Collector.collect(..., caps=)`) then runs
the method's rounds, exit rule, balanced selection and pool baseline unchanged inside each
cap. The budget is counted in samples, not tokens: samples are what the exit rules and the
group shape are made of, and a prompt's response length is not known before it is drawn.

  none      every prompt gets the method's M x N (today's behaviour; `caps=None` in the
            collector is the same collection bit for bit)
  knapsack  Knapsack RL's value (arXiv 2509.25849): value(N, p) = [1 - p^N - (1 - p)^N] p (1 - p)^2,
            the chance that N draws give a group with signal times the information of a prompt
            at pass rate p (largest for hard-but-solvable prompts, p = 1/3)
  variance  the same with p (1 - p), the expected gradient weight the simulator measures
            (largest at p = 1/2; easy and hard prompts weigh alike)

value is taken in expectation over each prompt's Beta posterior (`ada.adaptive.success`),
exactly: every term is a moment E[p^a (1 - p)^b] = B(alpha + a, beta + b) / B(alpha, beta),
so an unseen prompt (the prior) is valued by what it might be, not by a point guess.
For N >= 1 the value is concave in N (its increments p^N (1 - p) + (1 - p)^N p, times the
weight, fall with N), so filling the budget by the largest increments first is the optimal
integer allocation; tests/test_allocation.py holds it to brute force.

The split, in order: prompts whose own record predicts no signal even at `max_cap`
(P(all draws equal) > `skip_above` under Beta(1 + pos, 1 + neg) of their decayed draws, so
an unseen prompt is never skipped on the population's word; e.g. at 0.5, 32 correct of 32)
get cap 0 and are reported as skipped, as GRESO skips on a prompt's streak; every other
prompt gets `floor`; a share `explore` of what is left is spread evenly (round robin), so
no prompt is starved by an over-confident posterior; the rest goes to the largest expected
increments, never above `max_cap`. Ties go to the lower cap, then the earlier prompt, so the
result is a pure function of (posteriors, config). The defaults (floor 2, explore 0.1,
skip_above 0.5) are chosen by the simulator's sweep in docs/results.md.
"""

from __future__ import annotations

import dataclasses

import numpy as np

ALLOCATIONS = ("none", "knapsack", "variance")
_WEIGHT = {"knapsack": (1, 2), "variance": (1, 1)}  # value weight p^a (1 - p)^b


@dataclasses.dataclass(frozen=True)
class AllocConfig:
    allocation: str = "none"
    budget: int = 0  # samples per step over all prompts (GRPO's n x P for "equal samples")
    floor: int = 2  # fewest samples a kept prompt draws (a baseline needs two)
    max_cap: int = 32  # most samples one prompt may draw (the method's M x N by default)
    explore: float = 0.1  # share of the budget above the floors spread evenly
    skip_above: float = 0.5  # skip a prompt whose own P(no signal at max_cap) exceeds it (1: never)

    def __post_init__(self):
        p = []
        if self.allocation not in ALLOCATIONS:
            p.append(f"allocation={self.allocation!r} is not one of {ALLOCATIONS}")
        if not 1 <= self.floor <= self.max_cap:
            p.append(f"floor={self.floor} and max_cap={self.max_cap} need 1 <= floor <= max_cap")
        if not 0.0 <= self.explore <= 1.0:
            p.append(f"explore={self.explore} must be a share in [0, 1]")
        if not 0.0 < self.skip_above <= 1.0:
            p.append(f"skip_above={self.skip_above} must be in (0, 1]; 1 never skips")
        if p:
            raise ValueError("invalid AllocConfig: " + "; ".join(p))


@dataclasses.dataclass(frozen=True)
class Allocation:
    caps: np.ndarray  # [P] int64, samples each prompt may draw (0: skipped)
    skipped: np.ndarray  # [P] bool
    predicted_signal: np.ndarray  # [P] float64, P(the draws up to the cap hold both kinds)

    def metrics(self) -> dict:
        kept = self.caps[~self.skipped]
        return dict(budget_used=int(self.caps.sum()), skipped_prompts=int(self.skipped.sum()),
                    cap_min=int(kept.min()) if kept.size else 0, cap_max=int(kept.max(initial=0)),
                    cap_std=float(kept.std()) if kept.size else 0.0,
                    predicted_signal_share=float(self.predicted_signal.mean()))


def _log_rising(x, k: int) -> np.ndarray:
    """log of x (x + 1) ... (x + j - 1) for j = 0..k, [P, k + 1] float64."""
    steps = np.log(x[:, None] + np.arange(k, dtype=np.float64)[None, :])
    return np.concatenate([np.zeros((x.size, 1)), np.cumsum(steps, axis=1)], axis=1)


def moments(alpha, beta, k: int):
    """E[p^a (1 - p)^b] under Beta(alpha, beta) as a function m(a, b), a + b <= k."""
    alpha, beta = np.asarray(alpha, np.float64), np.asarray(beta, np.float64)
    la, lb, lab = _log_rising(alpha, k), _log_rising(beta, k), _log_rising(alpha + beta, k)
    return lambda a, b: np.exp(la[:, a] + lb[:, b] - lab[:, a + b])


def no_signal(alpha, beta, n: int) -> np.ndarray:
    """[P, n + 1]: expected P(j draws are all correct or all wrong), j = 0..n."""
    m = moments(alpha, beta, n)
    return np.stack([m(j, 0) + m(0, j) if j else np.ones(len(alpha)) for j in range(n + 1)], 1)


def expected_value(alpha, beta, max_cap: int, weight=(1, 2)) -> np.ndarray:
    """[P, max_cap + 1]: E[(1 - p^N - (1 - p)^N) p^a (1 - p)^b] for N = 0..max_cap (0 at N = 0)."""
    a, b = weight
    m = moments(alpha, beta, max_cap + a + b)
    out = np.stack([m(a, b) - m(a + N, b) - m(a, b + N) for N in range(max_cap + 1)], 1)
    out[:, 0] = 0.0
    return out


def _round_robin(caps, units: int, limit: int) -> np.ndarray:
    """Add `units` one at a time to the lowest cap below `limit` (earliest prompt first)."""
    caps = caps.copy()
    for _ in range(units):
        room = caps < limit
        if not room.any():
            break
        caps[np.argmin(np.where(room, caps, np.iinfo(np.int64).max))] += 1
    return caps


def greedy(values, caps, units: int, max_cap: int) -> np.ndarray:
    """Raise `caps` (>= 1) by `units` in all, by the largest increments of `values`
    [P, max_cap + 1] (non-increasing in N from N = 1; ties: lower N, then earlier prompt)."""
    P = values.shape[0]
    if caps.min(initial=1) < 1:
        raise ValueError("greedy needs every cap >= 1: value is concave in N from N = 1 only")
    gain = np.diff(values, axis=1)  # gain[i, N]: value(N + 1) - value(N)
    gain[:, 1:] = np.minimum.accumulate(gain[:, 1:], axis=1)  # rounding keeps prefixes
    N = np.broadcast_to(np.arange(max_cap), (P, max_cap))
    i = np.broadcast_to(np.arange(P)[:, None], (P, max_cap))
    open_ = N >= caps[:, None]
    order = np.lexsort((i[open_], N[open_], -gain[open_]))[:units]
    return caps + np.bincount(i[open_][order], minlength=P)


def skips(cfg: AllocConfig, evidence) -> np.ndarray:
    """[P] bool: the prompts whose own record (decayed pos, neg) predicts no signal at
    max_cap with probability above skip_above (the module doc)."""
    pos, neg = (np.asarray(x, np.float64) for x in evidence)
    return no_signal(1.0 + pos, 1.0 + neg, cfg.max_cap)[:, -1] > cfg.skip_above


def allocate(cfg: AllocConfig, alpha, beta, evidence=None) -> Allocation:
    """Caps for one step's prompts from their posteriors (alpha, beta: [P]); `evidence`, the
    prompts' own decayed (pos, neg) (`success.evidence`), decides the skips (None: no
    prompt has a record, none is skipped)."""
    alpha, beta = np.asarray(alpha, np.float64), np.asarray(beta, np.float64)
    P = alpha.size
    quiet = no_signal(alpha, beta, cfg.max_cap)
    if cfg.allocation == "none":
        caps = np.full(P, cfg.max_cap, np.int64)
        return Allocation(caps, np.zeros(P, bool), 1.0 - quiet[:, -1])
    skipped = np.zeros(P, bool) if evidence is None else skips(cfg, evidence)
    kept = int((~skipped).sum())
    if cfg.budget < kept * cfg.floor:
        raise ValueError(f"budget={cfg.budget} < {kept} prompts x floor={cfg.floor}; raise the "
                         "budget or lower the floor")
    caps = np.where(skipped, 0, cfg.floor).astype(np.int64)
    spare = min(cfg.budget, kept * cfg.max_cap) - int(caps.sum())
    explore = int(round(cfg.explore * spare))
    caps = _round_robin(caps, explore, np.where(skipped, 0, cfg.max_cap))
    values = expected_value(alpha, beta, cfg.max_cap, _WEIGHT[cfg.allocation])
    values[skipped] = 0.0
    caps = np.where(skipped, cfg.max_cap, caps)  # no room: a skipped prompt takes nothing
    caps = greedy(values, caps, spare - explore, cfg.max_cap)
    caps = np.where(skipped, 0, caps)
    return Allocation(caps, skipped, 1.0 - quiet[np.arange(P), caps])
