"""Selection vs a brute-force transcription of the verl fork's down-sampling (loops, ints)."""

import math
from fractions import Fraction

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ada.adaptive.select import select

P, S, THR = 6, 12, 0.7  # one shape for every example


def ref_targets(pos, neg, n, mode):
    """(done, kept positives, kept negatives) by the reference's own steps."""
    seen = pos + neg
    done = {"pos": pos >= 1 and seen >= n, "balance": pos >= n // 2 and neg >= n - n // 2,
            "none": False}[mode]
    take = min(n, seen)
    if mode == "pos" and not done:  # positive_focused fallback
        tp = math.ceil(Fraction(pos, max(seen, 1)) * n)
        tp = max(min(tp, take - 1), 1)
        tn = take - tp
    else:  # downsample_cache / balanced fallback
        tp = min(n // 2, pos)
        tn = min(take - tp, neg)
    ap, an = min(pos, tp), min(neg, tn)
    if ap + an < take:  # fill from the other kind
        if pos > ap:
            ap += min(pos - ap, take - ap - an)
        elif neg > an:
            an += min(neg - an, take - ap - an)
    return done, ap, an


# No subnormal rewards: XLA:CPU flushes them to zero when comparing, so the device would see
# 1e-45 == 0.0 where NumPy does not (no real reward is subnormal).
pools = st.lists(
    st.lists(st.one_of(st.sampled_from([0.0, 1.0]),
                       st.floats(-1, 2, width=32, allow_subnormal=False)),
             min_size=0, max_size=S),
    min_size=P, max_size=P)


def to_arrays(rows):
    r = np.zeros((P, S), np.float32)
    v = np.zeros((P, S), bool)
    for p, row in enumerate(rows):
        r[p, : len(row)] = row
        v[p, : len(row)] = True
    return r, v


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(rows=pools, n=st.sampled_from([2, 3, 4]), mode=st.sampled_from(["pos", "balance", "none"]),
       seed=st.integers(0, 2**16))
def test_select_matches_reference(rows, n, mode, seed):
    r, v = to_arrays(rows)
    idx, stats = select(r, v, n, mode, jax.random.key(seed), THR)
    idx = np.asarray(idx)
    gv = np.asarray(stats["group_valid"])
    assert idx.shape == (P, n) and gv.shape == (P, n)
    for p, row in enumerate(rows):
        labels = [x > THR for x in row]
        pos, neg = sum(labels), len(labels) - sum(labels)
        done, ap, an = ref_targets(pos, neg, n, mode)
        assert bool(stats["done"][p]) == done
        members = idx[p][gv[p]]
        assert len(members) == min(n, len(row)) == ap + an      # exactly n when the pool allows
        assert len(set(members.tolist())) == len(members)       # nobody twice
        assert all(0 <= m < len(row) for m in members)          # from its own pool
        assert np.all(idx[p][~gv[p]] == -1)
        kept_pos = sum(labels[m] for m in members)
        assert (kept_pos, len(members) - kept_pos) == (ap, an)
        if mode == "balance" and pos >= n // 2 and neg >= n - n // 2:
            assert kept_pos == n // 2                           # balanced whenever possible
        np.testing.assert_array_equal(np.asarray(stats["rewards"][p])[gv[p]], r[p, members])
        kept = r[p, members]
        assert bool(stats["mixed"][p]) == (len(kept) > 0 and bool(np.any(kept != kept[0])))
    # deterministic given the key
    idx2, _ = select(r, v, n, mode, jax.random.key(seed), THR)
    np.testing.assert_array_equal(idx, np.asarray(idx2))


def test_pos_fallback_proportional_keeps_both_kinds():
    # never-exited `pos` pool (seen < n is the only way with both kinds): 1 pos, 2 neg, n = 4
    r, v = to_arrays([[1.0, 0.0, 0.0]] + [[]] * (P - 1))
    idx, st_ = select(r, v, 4, "pos", jax.random.key(0), THR)
    kept = np.asarray(st_["rewards"])[0][np.asarray(st_["group_valid"])[0]]
    assert not bool(st_["done"][0]) and sorted(kept.tolist()) == [0.0, 0.0, 1.0]
    # a done `pos` pool: n // 2 positives first, then negatives
    r, v = to_arrays([[1.0, 1.0, 1.0, 0.0, 0.0, 1.0]] * P)
    idx, st_ = select(r, v, 4, "pos", jax.random.key(0), THR)
    np.testing.assert_array_equal(np.asarray(st_["rewards"]), [[1.0, 1.0, 0.0, 0.0]] * P)


def test_selection_within_a_kind_is_uniform():
    """Each of 6 positives is kept with probability 2/6 under `balance`, n = 4."""
    row = [1.0] * 6 + [0.0] * 6
    r, v = to_arrays([row] * P)
    counts = np.zeros(S)
    trials = 100
    for t in range(trials):
        idx, _ = select(r, v, 4, "balance", jax.random.key(t), THR)
        for m in np.asarray(idx).ravel():
            counts[m] += 1
    freq = counts / (trials * P)
    np.testing.assert_allclose(freq, 2 / 6, atol=0.06)  # 600 draws per entry: sd ~ 0.02


def test_pool_narrower_than_n_is_rejected():
    with pytest.raises(ValueError, match="columns < n"):
        select(np.zeros((2, 3), np.float32), np.ones((2, 3), bool), 4, "balance",
               jax.random.key(0), THR)


def test_selection_of_a_prompt_does_not_depend_on_its_batch():
    """A prompt keeps the same members whether it is selected among 6 rows or alone with its
    global id (what makes a 2-process run keep the same responses as a 1-process run)."""
    rng = np.random.default_rng(3)
    r = rng.integers(0, 2, (P, S)).astype(np.float32)
    v = np.ones((P, S), bool)
    ids = np.arange(100, 100 + P)
    key = jax.random.key(7)
    full, _ = select(r, v, 4, "balance", key, THR, ids)
    for p in range(P):
        alone, _ = select(r[p:p + 1], v[p:p + 1], 4, "balance", key, THR, ids[p:p + 1])
        np.testing.assert_array_equal(np.asarray(alone)[0], np.asarray(full)[p])
    other, _ = select(r, v, 4, "balance", key, THR, ids + 1)
    assert not np.array_equal(np.asarray(other), np.asarray(full))
