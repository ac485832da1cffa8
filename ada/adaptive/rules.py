"""Exit rules of Reinforce-Ada: when has a prompt drawn enough to stop sampling?

A rule is a pure function `rule(pos, neg, seen, n) -> done` over per-prompt counts
(arrays of any shape; NumPy or jax, jittable). Its inputs are sums over responses: each
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

`min_needed` is the fewest further responses that could make the rule hold; the continuous
dispatcher uses it to prefer prompts whose in-flight requests cannot yet cover their need.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

Rule = Callable[..., object]


def _xp(x):
    return jnp if isinstance(x, jax.Array) else np  # tracers are jax.Arrays too


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


RULES: dict[str, Rule] = {"pos": pos_rule, "balance": balance_rule, "none": none_rule}


def _relu(x, xp):
    return xp.maximum(x, 0)


def min_needed(name: str, pos, neg, seen, n, budget: int):
    """Fewest further responses after which `name` could hold (budget - seen for `none`)."""
    xp = _xp(pos)
    if name == "pos":
        return xp.maximum(_relu(1 - pos, xp), _relu(n - seen, xp))
    if name == "balance":
        return _relu(n // 2 - pos, xp) + _relu(n - n // 2 - neg, xp)
    if name == "none":
        return _relu(budget - seen, xp)
    raise ValueError(f"unknown exit rule {name!r}; set rule to one of {sorted(RULES)}")


def get_rule(name: str) -> Rule:
    if name not in RULES:
        raise ValueError(f"unknown exit rule {name!r}; set rule to one of {sorted(RULES)}")
    return RULES[name]
