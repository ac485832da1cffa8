"""Scoring responses with a reward function: the one place that holds rewards to their contract,
and the one rule for which scores count as correct (`correct`).

Collection, evaluation and the difficulty filter all score through `score`, so they agree
on what a failed reward is, and call `correct` (reward > threshold), so they agree on what
a correct response is. A reward is user code or a verifier run on model output: it
may raise, return None, NaN, inf or something that is not a number. None of that may stop
a batch or be read as a real score, so such an item scores FAILURE_SCORE (0) and is
flagged in `failed` for the caller to count.

A reward function with a `score_batch(records, responses)` attribute (as
ada.rewards.math_verifier.math_reward, which fans out over a verifier process pool) is
called once for the whole batch; one item at a time would leave the pool idle. If that
call raises or returns the wrong number of values, every item is scored alone, so one bad
response cannot zero the others.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

FAILURE_SCORE = 0.0  # what a failed reward scores (the collector's reward_range must hold it)


def correct(rewards, threshold):
    """Whether each reward counts as correct: `rewards > threshold`, strictly.

    Strict, so a reward equal to the threshold is incorrect: the threshold may be the low
    end of the reward range (low <= threshold < high, `ada.adaptive.collect.threshold_problem`),
    and at threshold 0 a failed reward (FAILURE_SCORE, 0) or a plain 0 never counts as
    correct, while every reward above it does. Rewards: a float, a NumPy or a jax array
    (also traced under jit); returns a bool or a bool array of the same shape.
    """
    return rewards > threshold


def _checked(value: Any) -> tuple[float, bool]:
    """(score, failed): None, NaN, inf, text or anything float() refuses is a failure."""
    if isinstance(value, (str, bytes)):  # float("1") would accept a reward's text output
        return FAILURE_SCORE, True
    try:
        r = float(value)
    except Exception:  # noqa: BLE001 - a reward's return value may fail to convert any way
        return FAILURE_SCORE, True
    if not math.isfinite(r):
        return FAILURE_SCORE, True
    return r, False


def _one(reward_fn: Callable, record: Any, response: Any) -> tuple[float, bool]:
    try:
        value = reward_fn(record, response)
    except Exception:  # noqa: BLE001 - a bad reward must not kill the batch
        return FAILURE_SCORE, True
    return _checked(value)


def score(
    reward_fn: Callable[[Any, Any], Any],
    records: Sequence[Any],
    responses: Sequence[Any],
) -> tuple[np.ndarray, np.ndarray]:
    """(scores float64 [N], failed bool [N]) of `reward_fn(records[i], responses[i])`.

    Never raises because of the reward (see the module docstring); raises ValueError only
    when records and responses differ in length.
    """
    if len(records) != len(responses):
        raise ValueError(f"score: {len(records)} records but {len(responses)} responses")
    n = len(records)
    results = None
    batch = getattr(reward_fn, "score_batch", None)
    if batch is not None and n:
        try:
            values = list(batch(records, responses))
        except Exception as e:  # noqa: BLE001
            log.warning("%s.score_batch raised (%s: %.200s); scoring the %d items one by one",
                        getattr(reward_fn, "__name__", "reward"), type(e).__name__, e, n)
        else:
            if len(values) == n:
                results = [_checked(v) for v in values]
            else:
                log.warning("%s.score_batch returned %d values for %d items; scoring them "
                            "one by one", getattr(reward_fn, "__name__", "reward"),
                            len(values), n)
    if results is None:
        results = [_one(reward_fn, rec, resp)
                   for rec, resp in zip(records, responses, strict=True)]
    scores = np.fromiter((s for s, _ in results), np.float64, count=n)
    failed = np.fromiter((f for _, f in results), bool, count=n)
    return scores, failed


__all__ = ["FAILURE_SCORE", "correct", "score"]
