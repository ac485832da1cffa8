"""Exit rules vs a brute-force Python reference (the verl fork's conditions), and each rule's
`min_needed` against its own `done` (every rule in RULES: a new one is checked too)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ada.adaptive import rules

P = 16  # one shape for every example: each rule compiles once


def ref_done(name, pos, neg, seen, n):
    if name == "pos":
        return pos >= 1 and seen >= n
    if name == "balance":
        return pos >= n // 2 and neg >= n - n // 2
    return False


_JITTED = {name: jax.jit(rule.done) for name, rule in rules.RULES.items()}

counts = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=P, max_size=P)


@settings(max_examples=30, deadline=None)
@given(counts=counts, n=st.integers(2, 9), name=st.sampled_from(sorted(rules.RULES)))
def test_rules_match_reference_jit_and_numpy(counts, n, name):
    pos = np.array([c[0] for c in counts])
    neg = np.array([c[1] for c in counts])
    seen = pos + neg
    want = np.array([ref_done(name, int(a), int(b), int(a + b), n) for a, b in counts])
    got_jit = _JITTED[name](jnp.asarray(pos), jnp.asarray(neg), jnp.asarray(seen), n)
    got_np = rules.RULES[name].done(pos, neg, seen, n)
    assert isinstance(got_np, np.ndarray)  # host path stays NumPy (no device round trip)
    np.testing.assert_array_equal(np.asarray(got_jit), want)
    np.testing.assert_array_equal(got_np, want)


def test_balance_odd_n_keeps_extra_member_negative():
    # n = 5: 2 positives and 3 negatives, like the reference's n // 2 / n - n // 2
    assert rules.balance_rule(2, 3, 5, 5)
    assert not rules.balance_rule(3, 2, 5, 5)


@pytest.mark.parametrize("name", sorted(rules.RULES))
def test_min_needed_is_exact(name):
    """After k < need more responses the rule cannot hold; after `need` it can (for `none`,
    which never holds, need is the budget left); `done` itself is held to the reference
    above. Breaking it: a rule whose min_needed over- or undercounts (the dispatcher then
    favours the wrong prompts)."""
    n, budget = 4, 32
    rule = rules.RULES[name]
    for pos, neg in itertools.product(range(5), range(5)):
        seen = pos + neg
        need = int(rule.min_needed(np.int64(pos), np.int64(neg), np.int64(seen), n, budget))
        reachable = [k for k in range(budget - seen + 1)
                     if any(rule.done(pos + a, neg + k - a, seen + k, n) for a in range(k + 1))]
        assert need == (reachable[0] if reachable else budget - seen), (pos, neg, need)


def test_unknown_rule_names_the_setting():
    with pytest.raises(ValueError, match="rule"):
        rules.get_rule("balanced")
