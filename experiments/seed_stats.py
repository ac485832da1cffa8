"""Statistics over seeds for experiments/compare_methods.py: sample standard deviations,
Welch's t-test, a bootstrap interval of a difference of means, Holm's correction. Each is
checked against a hand computation in tests/test_compare.py."""

import numpy as np
from scipy import special

BOOTSTRAP_REPS = 10_000


def mean_std(xs) -> tuple[float, float]:
    """Mean and sample std (ddof = 1: seeds are a sample) of the non-NaN values."""
    xs = [x for x in xs if x == x]
    if not xs:
        return float("nan"), float("nan")
    return float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else float("nan")


def welch(a, b) -> tuple[float, float, float]:
    """Welch's t-test of mean(a) - mean(b): (t, Welch-Satterthwaite df, two-sided p); NaN
    where a group has one seed or neither varies."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if min(len(a), len(b)) < 2:
        return float("nan"), float("nan"), float("nan")
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:
        return float("nan"), float("nan"), float("nan")
    t = (a.mean() - b.mean()) / np.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return float(t), float(df), float(2 * special.stdtr(df, -abs(t)))


def bootstrap_ci(a, b, reps: int = BOOTSTRAP_REPS, seed: int = 0) -> list[float]:
    """95% percentile bootstrap interval of mean(a) - mean(b): each group's seeds resampled
    with replacement, independently. At 3 or 5 seeds a side it covers the true difference
    ~80% or ~90% of the time (normal seeds, simulated): the test is Welch's."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    rng = np.random.default_rng(seed)
    diffs = (rng.choice(a, (reps, len(a))).mean(1) - rng.choice(b, (reps, len(b))).mean(1))
    return [float(x) for x in np.percentile(diffs, [2.5, 97.5])]


def holm(ps: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values of one family of tests (NaN stays NaN, uncounted):
    a mix's table makes many claims at once, and some p under 0.05 come by chance."""
    idx = sorted((i for i, p in enumerate(ps) if p == p), key=lambda i: ps[i])
    out, running = [float("nan")] * len(ps), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (len(idx) - rank) * ps[i]))
        out[i] = running
    return out
