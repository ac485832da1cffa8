"""Exit rules of Reinforce-Ada: when has a prompt drawn enough to stop sampling?

A rule's `done(pos, neg, seen, n)` is a pure function over per-prompt counts (arrays of
any shape; NumPy or jax, jittable) giving a mask. Its inputs are sums over responses: each
process decides for its own prompts (generation is process-local), and counts summed
across hosts would give every host the same decision (nothing sums them today).

  pos      done when pos >= 1 and seen >= n
  balance  done when pos >= n // 2 and neg >= n - n // 2
  none     never done (GRPO, exhaustive sampling, DAPO: the budget alone ends sampling)

Semantics follow the official verl fork (`reinforce_ada_choice`: "positive_focused" = pos,
"balanced" = balance). Two decisions of ours, both no-ops at the paper's setting (M=8 >= n=4):
  * `pos` also asks for `seen >= n`, so every exited pool can fill a group of exactly n
    distinct responses (the fixed [P, n] output). With rounds of M >= n the reference never
    exits with fewer than n, so the decisions agree.
  * odd n is allowed for `balance`; like the reference, the extra member is a negative
    (n // 2 positives, n - n // 2 negatives), e.g. n=5 -> 2 positive + 3 negative.

A rule is one record, `ExitRule(done, min_needed)`: `min_needed(pos, neg, seen, n, budget)`
is the fewest further responses after which `done` could hold (the budget left when it
never can); the continuous dispatcher uses it to prefer prompts whose in-flight requests
cannot yet cover their need. A rule cannot be made without both halves, and
tests/test_rules.py checks every rule in RULES: its `min_needed` against its own `done`.

Its third field, `unfinished_fill`, says how a prompt that never exited fills its kept group
(balanced, or proportional to its pass rate as `pos` does). Adding a rule is one entry here
(then a Method row naming it in ada/methods.py), e.g. "two positives, and n to choose from":

    "pos2": ExitRule(
        done=lambda pos, neg, seen, n: (pos >= 2) & (seen >= n),
        min_needed=lambda pos, neg, seen, n, budget: _xp(pos).maximum(
            _relu(2 - pos), _relu(n - seen))),
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def _xp(x):
    return jnp if isinstance(x, jax.Array) else np  # tracers are jax.Arrays too


def _relu(x):
    return _xp(x).maximum(x, 0)


@dataclasses.dataclass(frozen=True)
class ExitRule:
    """When a prompt has drawn enough (`done`), and how far it is from that (`min_needed`);
    both over per-prompt counts, NumPy in, NumPy out, jax in, jax out (jittable)."""

    done: Callable  # (pos, neg, seen, n) -> bool mask
    min_needed: Callable  # (pos, neg, seen, n, budget) -> int counts
    # how a prompt that never exited fills its kept group (ada/adaptive/select.py):
    # "balanced", or "proportional" to its pool's pass rate (the reference's pos fallback)
    unfinished_fill: str = "balanced"


def pos_rule(pos, neg, seen, n):
    """At least one positive, and at least n responses to choose the group from."""
    del neg
    return (pos >= 1) & (seen >= n)


def balance_rule(pos, neg, seen, n):
    """At least n // 2 positives and n - n // 2 negatives."""
    del seen
    return (pos >= n // 2) & (neg >= n - n // 2)


def none_rule(pos, neg, seen, n):
    """Never exits early: plain GRPO / exhaustive sampling up to the budget."""
    del neg, seen, n
    xp = _xp(pos)
    return xp.zeros(xp.shape(pos), bool)


RULES: dict[str, ExitRule] = {
    "pos": ExitRule(pos_rule, lambda pos, neg, seen, n, budget: _xp(pos).maximum(
        _relu(1 - pos), _relu(n - seen)), unfinished_fill="proportional"),
    "balance": ExitRule(balance_rule, lambda pos, neg, seen, n, budget:
                        _relu(n // 2 - pos) + _relu(n - n // 2 - neg)),
    "none": ExitRule(none_rule, lambda pos, neg, seen, n, budget: _relu(budget - seen)),
}


def get_rule(name: str) -> ExitRule:
    if name not in RULES:
        raise ValueError(f"unknown exit rule {name!r}; set rule to one of {sorted(RULES)}")
    return RULES[name]
