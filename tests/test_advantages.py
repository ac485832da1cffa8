"""Pool statistics and advantages vs float64 NumPy / the verl fork's formulas."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ada.adaptive.pool import Pool, PoolStats
from ada.rl.advantages import EPS, advantages

P, S, N, THR = 5, 10, 4, 0.7


def stats_from_pool(rewards_PxS, valid_PxS, threshold, shift: float = 0.0) -> PoolStats:
    """PoolStats of a padded pool array, summed in jnp (the moments' float32 path)."""
    r = jnp.asarray(rewards_PxS)
    v = jnp.asarray(valid_PxS, bool)
    is_pos = v & (r > threshold)
    d = jnp.where(v, r - shift, 0.0)
    return PoolStats(pos=jnp.sum(is_pos, axis=1, dtype=jnp.int32),
                     neg=jnp.sum(v & ~is_pos, axis=1, dtype=jnp.int32),
                     s1=jnp.sum(d, axis=1), s2=jnp.sum(d * d, axis=1), shift=float(shift))


def ref_moments(xs):
    if len(xs) <= 1:
        return 0.0, 1.0
    return float(np.mean(xs)), float(np.std(np.asarray(xs, np.float64), ddof=1))


def ref_adv(kept, pool_mean, pool_std, stats_from, norm):
    if stats_from == "pool":
        m, s = pool_mean, max(pool_std, EPS) + EPS
    else:
        m, s = ref_moments(kept)
        s = s + EPS
    return [(x - m) / s if norm else x - m for x in kept]


rewards = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0, 1, width=32))
pools = st.lists(st.lists(rewards, min_size=1, max_size=S), min_size=P, max_size=P)


def host_pool(rows, shift=THR):
    pool = Pool(P, S, THR, shift=shift)
    for p, row in enumerate(rows):
        for x in row:
            i = pool.next_sample_idx(p)
            pool.add(p, i, x, completion=None)
    return pool


@settings(max_examples=40, deadline=None)
@given(rows=pools, stats_from=st.sampled_from(["pool", "group"]), norm=st.booleans())
def test_advantages_match_reference(rows, stats_from, norm):
    pool = host_pool(rows)
    mean, std = pool.stats.mean_std()
    kept = np.zeros((P, N), np.float32)
    valid = np.zeros((P, N), bool)
    for p, row in enumerate(rows):
        want_m, want_s = ref_moments(row)
        assert mean[p] == pytest.approx(want_m, abs=1e-12)
        # below the sums' rounding resolution (std ~4e-8 here) a pool reports std 0 on
        # purpose (pool.moments); the advantage's std clamp (EPS) is far above either
        assert std[p] == pytest.approx(want_s, abs=5e-8)
        assert (pool.stats.pos[p], pool.stats.neg[p]) == (sum(x > THR for x in row),
                                                           sum(x <= THR for x in row))
        k = row[:N]
        kept[p, : len(k)] = k
        valid[p, : len(k)] = True
    got = np.asarray(advantages(kept, stats_from=stats_from, pool=pool.stats,
                                group_valid_PxN=valid, norm_by_std=norm))
    for p, row in enumerate(rows):
        k = [float(x) for x in kept[p, valid[p]]]
        want = ref_adv(k, *ref_moments(row), stats_from, norm)
        np.testing.assert_allclose(got[p, valid[p]], want, rtol=2e-5, atol=2e-5)
        assert np.all(got[p, ~valid[p]] == 0)
    # the jnp pool statistics of the padded arrays agree with the host running sums
    js = stats_from_pool(pool.rewards, pool.valid, THR, shift=THR)
    np.testing.assert_array_equal(np.asarray(js.pos), pool.stats.pos)
    np.testing.assert_allclose(np.asarray(js.mean_std()[0]), mean, atol=1e-5)
    # float32 sums resolve a std only down to ~sqrt(16 * eps32 * s2 / c) ~ 1e-3 here
    np.testing.assert_allclose(np.asarray(js.mean_std()[1]), std, atol=1e-3)


@pytest.mark.parametrize("value", [0.0, 1.0, 0.3])
@pytest.mark.parametrize("count", [2, 3, 7, S])
def test_uniform_pool_has_zero_std_in_both_precisions(value, count):
    """Regression (hypothesis found it): shifted sums of identical rewards leave rounding
    noise (1e-8 in float64, 3e-4 in float32) that must read as std 0."""
    pool = host_pool([[value] * count] * P)
    assert np.all(pool.stats.mean_std()[1] == 0.0)
    js = stats_from_pool(pool.rewards.astype(np.float32), pool.valid, THR, shift=THR)
    assert np.all(np.asarray(js.mean_std()[1]) == 0.0)


def test_one_sample_pool_is_mean0_std1():
    pool = host_pool([[0.9]] * P)
    a = np.asarray(advantages(np.full((P, N), 0.9, np.float32), pool=pool.stats))
    np.testing.assert_allclose(a, 0.9 / (1 + EPS), rtol=1e-6)


def test_uniform_pool_clamps_std():
    pool = host_pool([[1.0] * 6] * P)
    a = np.asarray(advantages(np.ones((P, N), np.float32), pool=pool.stats))
    assert np.all(np.isfinite(a)) and np.all(a == 0)


def test_running_sums_are_numerically_sane():
    """Rewards 1e4 + small noise: shifted sums keep the std; raw sums would not in float64."""
    rng = np.random.default_rng(0)
    xs = 1e4 + 1e-3 * rng.standard_normal(1000)
    st_ = PoolStats.empty(1, shift=1e4)
    for x in xs:
        d = x - st_.shift
        st_.s1[0] += d
        st_.s2[0] += d * d
        st_.pos[0] += 1
    m, s = st_.mean_std()
    assert m[0] == pytest.approx(np.mean(xs), rel=1e-12)
    assert s[0] == pytest.approx(np.std(xs, ddof=1), rel=1e-6)
    raw_var = (np.sum(xs**2) - np.sum(xs) ** 2 / xs.size) / (xs.size - 1)  # unshifted sums
    assert abs(np.sqrt(max(raw_var, 0)) / np.std(xs, ddof=1) - 1) > 0.01  # they do fail


def test_bad_stats_from_names_the_option():
    with pytest.raises(ValueError, match="stats_from"):
        advantages(jnp.zeros((1, 2)), stats_from="global")
