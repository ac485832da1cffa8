"""Held-out evaluation: avg@k and the unbiased pass@k estimator, scored with the task's reward.

avg@k is the mean correctness over k samples per prompt (the paper reports avg@32 at
temperature 1.0). pass@k for k below the number of samples s uses the unbiased estimator
of Chen et al. (2021): with c correct out of s,

    pass@k = 1 - C(s - c, k) / C(s, k) = 1 - prod_{i = s-c+1}^{s} (1 - k / i),

computed as a product so it stays exact-ish for large s.

CLI (`ada.cli.eval_main`): evaluate a run's checkpoint (or a Hugging Face directory) on a
benchmark file:

    python -m ada.evaluate --workdir runs/default [--step 40] --benchmark FILE.jsonl \
        [--samples 8] [--temperature 1.0] [--limit 100] [--max_prompt_len 256] [--json out.json]
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence

import jax
import numpy as np

from ada import distributed
from ada.rewards.score import score


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from c correct among n samples (requires 1 <= k <= n)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n; got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} must be in [0, n={n}]")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def summarize(correct_P: np.ndarray, samples: int, pass_k: Sequence[int] = (1,)) -> dict[str, float]:
    """avg@S (= accuracy) and pass@k (unbiased, averaged over prompts) from the number of
    correct responses of each prompt among `samples`."""
    correct_P = np.asarray(correct_P, np.int64)
    if correct_P.ndim != 1 or correct_P.size == 0:
        raise ValueError(f"correct counts must be [prompts] with prompts > 0; got {correct_P.shape}")
    accuracy = float(correct_P.sum() / (correct_P.size * samples))
    out = {f"avg@{samples}": accuracy, "accuracy": accuracy}
    for k in pass_k:
        if k > samples:
            raise ValueError(f"pass@{k} needs at least {k} samples per prompt; have {samples}")
        out[f"pass@{k}"] = float(np.mean([pass_at_k(samples, int(c), k) for c in correct_P]))
    return out


SampleFn = Callable[[Sequence[dict], int, int], list[list[str]]]


def evaluate(records: Sequence[dict], sample: SampleFn, reward, *, samples: int,
             pass_k: Sequence[int] = (1,), threshold: float = 0.5) -> dict[str, float]:
    """`eval_`-prefixed avg@k / pass@k (and accuracy per difficulty level, when records
    have one) of `samples` responses per record, each scored correct iff reward > threshold.

    `sample(records, k, first_prompt_id) -> texts [len(records)][k]`. Every process samples
    and scores its contiguous share of the records; the correct counts are summed over
    processes, so all of them return the same numbers.
    """
    pidx, pcount = jax.process_index(), jax.process_count()
    per = math.ceil(len(records) / pcount)
    mine = list(records[pidx * per:(pidx + 1) * per])
    correct = np.zeros(len(records), np.int64)
    # every process samples, even with no records: the weight handoff is collective
    texts = sample(mine, samples, pidx * per)
    if len(texts) != len(mine) or any(len(t) != samples for t in texts):
        raise ValueError("sample() must return `samples` responses for every record")
    rewards, _ = score(reward, [r for r in mine for _ in range(samples)],
                       [t for row in texts for t in row])
    correct[pidx * per: pidx * per + len(mine)] = (
        (rewards > threshold).reshape(len(mine), samples).sum(1))
    correct = np.asarray(distributed.global_sum(correct), np.int64)
    out = {f"eval_{k}": v for k, v in summarize(correct, samples, pass_k).items()}
    levels = sorted({r["difficulty"] for r in records if r.get("difficulty") is not None})
    for lv in levels:
        idx = [i for i, r in enumerate(records) if r.get("difficulty") == lv]
        out[f"eval_accuracy_level{lv}"] = float(correct[idx].sum() / (len(idx) * samples))
    return out


if __name__ == "__main__":
    from ada.cli import eval_main

    sys.exit(eval_main())
