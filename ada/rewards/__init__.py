"""Rewards: `reward(record, response_text) -> float`, never raises, never hangs.

  math        ada.rewards.math_verifier.math_reward  (math-verify under a hard time limit)
  arithmetic  ada.rewards.tasks.arithmetic_reward     (exact, synthetic)
  countdown   ada.rewards.tasks.countdown_reward      (exact, synthetic)

`get_reward_fn(name)` returns one of these. Score batches with ada.rewards.score.score,
which uses a reward's `score_batch` (math: parallel verifier workers) and holds any reward,
including user ones, to the contract. Importing this package does not import sympy; the
math verifier is loaded on first use. A foundation: rewards import no other part of ada.
"""

from __future__ import annotations

from collections.abc import Callable

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


__all__ = ["REWARD_NAMES", "RewardFn", "get_reward_fn"]
