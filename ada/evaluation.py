"""Held-out evaluation: avg@k and the unbiased pass@k estimator, scored with the task's reward.

avg@k is the mean correctness over k samples per prompt (the paper reports avg@32 at
temperature 1.0). pass@k for k below the number of samples s uses the unbiased estimator
of Chen et al. (2021): with c correct out of s,

    pass@k = 1 - C(s - c, k) / C(s, k) = 1 - prod_{i = s-c+1}^{s} (1 - k / i),

computed as a product so it stays exact-ish for large s.

Pass rates (`pass_rates`) are the same measurement per prompt: k draws of the policy, scored
by the task's reward, used to pick the paper's easy / hard training prompts. Both the run's
`data.pass_rate_range` and `python -m ada.data.difficulty` call it.

The command line is `python -m ada.evaluate` (ada/cli/eval.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from ada import distributed
from ada.data.preprocess import DifficultyFilter, cached_pass_rates
from ada.data.sources import DataError
from ada.rewards.score import correct as correct_of
from ada.rewards.score import score
from ada.rollout import Rollout

log = logging.getLogger(__name__)


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


TextsFn = Callable[[Sequence[dict], int, int], list[list[str]]]


def evaluate(records: Sequence[dict], sample: TextsFn, reward, *, samples: int,
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
        correct_of(rewards, threshold).reshape(len(mine), samples).sum(1))
    correct = np.asarray(distributed.global_sum(correct), np.int64)
    out = {f"eval_{k}": v for k, v in summarize(correct, samples, pass_k).items()}
    levels = sorted({r["difficulty"] for r in records if r.get("difficulty") is not None})
    for lv in levels:
        idx = [i for i, r in enumerate(records) if r.get("difficulty") == lv]
        out[f"eval_accuracy_level{lv}"] = float(correct[idx].sum() / (len(idx) * samples))
    return out



EVAL_KEY_SEED = 1_000_003  # every eval of a run draws with the same key: curves compare


def evaluate_policy(rollout: Rollout, params, records: Sequence[dict], *, samples: int,
                    pass_k: Sequence[int], threshold: float, seed: int) -> dict:
    """Held-out avg@k / pass@k of `params` on `records` (with `prompt_tokens`), drawn through
    `rollout` with the same key at every call; adds `time_eval_s`."""
    if not records:
        return {}
    key = jax.random.fold_in(jax.random.key(seed + EVAL_KEY_SEED), 0)
    t = time.perf_counter()

    def sample(chunk, k, first_id):
        outs = rollout.sample(params, chunk, k, key, range(first_id, first_id + len(chunk)))
        return [[o.text for o in row] for row in outs]

    m = evaluate(records, sample, rollout.reward, samples=samples, pass_k=pass_k,
                 threshold=threshold)
    m["time_eval_s"] = time.perf_counter() - t
    return m


def weighted_average(results: dict[str, dict]) -> float:
    """A suite's count-weighted avg@k (the paper's Table 1 "weighted average"): each
    benchmark's `avg_at_k` weighted by its `n` problems, i.e. the accuracy of all problems
    pooled, so a 30-problem set moves it as much as its 30 problems do."""
    total = sum(r["n"] for r in results.values())
    if not total:
        raise ValueError("a weighted average needs at least one problem")
    return sum(r["avg_at_k"] * r["n"] for r in results.values()) / total


def settings_diff(old: dict, new: dict) -> str:
    """The settings of `new` that `old` (read back from JSON) does not share, as "key: old
    then, new now" (empty when none): why saved results are refused rather than mixed."""
    new = json.loads(json.dumps(new))  # tuples as lists, as read back
    return ", ".join(f"{k}: {old.get(k)!r} then, {v!r} now" for k, v in new.items()
                     if old.get(k) != v)


# ----------------------------------------------------------------------------- pass rates


def prompt_id_for(record: dict) -> int:
    """A record's stable 32-bit prompt id (its sampling stream), from its unique `id`: its
    draws do not depend on which chunk, file or run sampled it."""
    return int.from_bytes(hashlib.sha256(str(record["id"]).encode()).digest()[:4], "little")


def pass_rates(records: Sequence[dict], rollout: Rollout, params, *, k: int, seed: int,
               threshold: float, cache_path: str, settings: dict,
               prompts_per_call: int = 64) -> tuple[dict[str, dict], dict[str, int]]:
    """Per record id {num_correct, pass_rate, rewards, ...} of k draws of `params` through
    `rollout`, each scored correct iff reward > threshold; and the counts of this call
    (`prompts_sampled`, `reward_failures`: rewards that raised or were not finite, scored 0).

    Record r draws as prompt `prompt_id_for(r)` with key(seed), so its rates are the same
    whichever command, chunk or resume computed them. Results are appended to `cache_path`
    chunk by chunk (a killed run samples only what is missing). `settings` says what made
    the rates (policy, template, sampling, reward, k, seed, threshold: build it with
    `ada.run.passrates.pass_rate_settings`); it is stored beside the cache as CACHE.settings.json,
    and a cache made with other settings is refused rather than mixed.
    """
    check_cache_settings(cache_path, settings)
    key = jax.random.key(seed)
    counts = {"prompts_sampled": 0, "reward_failures": 0}

    def rewards_fn(chunk, k):
        outs = rollout.sample(params, chunk, k, key, [prompt_id_for(r) for r in chunk])
        rewards, failed = score(rollout.reward, [r for r in chunk for _ in range(k)],
                                [o.text for row in outs for o in row])
        counts["prompts_sampled"] += len(chunk)
        counts["reward_failures"] += int(failed.sum())
        return rewards.reshape(len(chunk), k)

    cfg = DifficultyFilter(k=k, correct_threshold=threshold, prompts_per_call=prompts_per_call)
    return cached_pass_rates(records, rewards_fn, cfg, cache_path), counts


def check_cache_settings(cache: str, settings: dict) -> None:
    """Refuse a pass-rate cache made with other settings; record them for a new one."""
    side = cache + ".settings.json"
    if os.path.exists(side):
        with open(side) as f:
            what = settings_diff(json.load(f), settings)
        if what:
            raise DataError(f"pass-rate cache {cache} was made with other settings ({what}); "
                            "pass another cache or delete it")
        return
    if os.path.exists(cache) and os.path.getsize(cache):
        log.warning("%s has no %s; assuming it was made with these settings", cache, side)
    os.makedirs(os.path.dirname(os.path.abspath(side)), exist_ok=True)
    with open(side, "w") as f:
        json.dump(settings, f, indent=2, sort_keys=True)
