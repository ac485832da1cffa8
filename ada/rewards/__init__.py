"""Rewards: `reward(record, response_text) -> float`, never raises, never hangs.

  math        ada.rewards.math_verifier.math_reward  (math-verify under a hard time limit)
  arithmetic  ada.rewards.tasks.arithmetic_reward     (exact, synthetic)
  countdown   ada.rewards.tasks.countdown_reward      (exact, synthetic)

`get_reward_fn(name)` returns one of these. `score_records` scores a batch, sending math
records through a `MathVerifier` (parallel worker processes) and the synthetic ones
through their exact checkers. Importing this package does not import sympy; the math
verifier is loaded on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

RewardFn = Callable[[dict, str], float]
REWARD_NAMES = ("math", "arithmetic", "countdown")


def get_reward_fn(name: str) -> RewardFn:
    """The reward function called `name` (one of REWARD_NAMES)."""
    if name == "math":
        from ada.rewards.math_verifier import math_reward

        return math_reward
    if name in ("arithmetic", "countdown"):
        from ada.rewards import tasks

        return getattr(tasks, f"{name}_reward")
    raise ValueError(f"unknown reward {name!r}; choose one of {REWARD_NAMES}")


def score_records(
    records: Sequence[dict],
    responses: Sequence[str],
    verifier=None,
    default_task: str = "math",
) -> np.ndarray:
    """float32 [N] rewards; each record's 'task' field (else `default_task`) picks its reward.

    Math records go through `verifier` (an ada.rewards.math_verifier.MathVerifier) in one
    parallel batch; without one, through the shared one-worker default pool.
    """
    if len(records) != len(responses):
        raise ValueError(f"score_records: {len(records)} records but {len(responses)} responses")
    out = np.zeros(len(records), np.float32)
    math_idx = []
    for i, (record, response) in enumerate(zip(records, responses, strict=True)):
        task = record.get("task", default_task) if isinstance(record, dict) else default_task
        if task in ("arithmetic", "countdown"):
            out[i] = get_reward_fn(task)(record, response)
        else:  # "math", or any other name: a math-style dataset (gsm8k, math500, ...)
            math_idx.append(i)
    if math_idx:
        from ada.rewards import math_verifier

        chosen = [records[i] for i in math_idx], [responses[i] for i in math_idx]
        if verifier is None:
            verifier = math_verifier.default_verifier()
        out[math_idx] = verifier.score(*chosen)
    return out


__all__ = ["REWARD_NAMES", "RewardFn", "get_reward_fn", "score_records"]
