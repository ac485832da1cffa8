"""Held-out evaluation: avg@k and the unbiased pass@k estimator, scored with the verifier.

avg@k is the mean correctness over k samples per prompt (the paper reports avg@32 at
temperature 1.0). pass@k for k below the number of samples s uses the unbiased estimator
of Chen et al. (2021): with c correct out of s,

    pass@k = 1 - C(s - c, k) / C(s, k) = 1 - prod_{i = s-c+1}^{s} (1 - k / i),

computed as a product so it stays exact-ish for large s.

CLI: evaluate a run's checkpoint (or a Hugging Face directory) on a benchmark file:

    python -m ada.evaluate --workdir runs/default [--step 40] --benchmark FILE.jsonl \
        [--samples 8] [--temperature 1.0] [--limit 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from c correct among n samples (requires 1 <= k <= n)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n; got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} must be in [0, n={n}]")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def summarize(correct_PxS: np.ndarray, pass_k: Sequence[int] = (1,)) -> dict[str, float]:
    """avg@S, pass@k (unbiased, averaged over prompts) and accuracy (= avg@S)."""
    correct_PxS = np.asarray(correct_PxS, dtype=bool)
    if correct_PxS.ndim != 2 or correct_PxS.shape[0] == 0:
        raise ValueError(f"correctness must be [prompts, samples] with prompts > 0; got {correct_PxS.shape}")
    P, S = correct_PxS.shape
    c_P = correct_PxS.sum(axis=1)
    out = {f"avg@{S}": float(correct_PxS.mean()), "accuracy": float(correct_PxS.mean())}
    for k in pass_k:
        if k > S:
            raise ValueError(f"pass@{k} needs at least {k} samples per prompt; have {S}")
        out[f"pass@{k}"] = float(np.mean([pass_at_k(S, int(c), k) for c in c_P]))
    out["num_prompts"] = P
    out["samples"] = S
    return out


GenerateFn = Callable[[Sequence[dict], int], list[list[str]]]
RewardFn = Callable[[dict, str], float]


def evaluate(records: Sequence[dict], generate: GenerateFn, reward: RewardFn, samples: int,
             pass_k: Sequence[int] = (1,), threshold: float = 0.5) -> tuple[dict, np.ndarray]:
    """Sample `samples` responses per record, score each, return (summary, correct [P, S])."""
    texts = generate(records, samples)
    if len(texts) != len(records) or any(len(t) != samples for t in texts):
        raise ValueError("generate() must return `samples` responses for every record")
    correct = np.zeros((len(records), samples), bool)
    for i, (rec, outs) in enumerate(zip(records, texts, strict=True)):
        for j, text in enumerate(outs):
            try:
                r = float(reward(rec, text))
            except Exception:  # the reward contract says never raise; be safe anyway
                r = 0.0
            correct[i, j] = np.isfinite(r) and r > threshold
    return summarize(correct, pass_k), correct


# ----------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ada.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", help="a run directory (its config.json and checkpoints/)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--model", default="", help="a Hugging Face model directory instead of a run")
    p.add_argument("--config", default="", help="config for --model (default configs/default.py)")
    p.add_argument("--benchmark", default="", help="JSONL with problem/answer rows (default: the run's eval split)")
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--max_new_tokens", type=int, default=None)
    p.add_argument("--pass_k", default="", help="comma-separated k values")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N prompts")
    p.add_argument("--json", default="", help="write the summary here")
    args = p.parse_args(argv)

    from ada.config import ConfigError

    try:
        from ada import runner

        summary = runner.evaluate_cli(args)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2, sort_keys=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
