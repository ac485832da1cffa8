"""The success memory, the budget allocation and per-prompt caps in the collector, against
float64 references, brute force and today's collection."""

import dataclasses
import importlib.util
import itertools
import math
import os

import jax
import numpy as np
import pytest

from ada.adaptive import allocation, success
from ada.adaptive.allocation import AllocConfig, allocate
from ada.adaptive.collect import Collector
from ada.adaptive.simulate import (
    Arm,
    SimulatedDriver,
    SimulatedPolicy,
    Trajectory,
    prompt_stream,
    rounds_counts,
    run_arm,
    sim_reward,
)
from ada.methods import collect_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_memory_matches_per_draw_reference():
    """success.update/posterior equal a loop that decays and adds one draw at a time (ids
    repeat within a step). Breaks if the decay is applied per visit instead of per step, if
    a repeated id is decayed twice, or if the population prior is not the decayed rate."""
    rng = np.random.default_rng(0)
    D, h, s = 10, 3.0, 2.0
    mem = success.init(D)
    pos, neg, last = [0.0] * D, [0.0] * D, [0] * D
    pop, pop_last = [0.0, 0.0], 0
    for step in (1, 2, 5, 6, 13):
        ids = rng.integers(0, D, 6)
        dp, dn = rng.integers(0, 5, 6), rng.integers(0, 5, 6)
        mem = success.update(mem, ids, dp, dn, step, h)
        for i, a, b in zip(ids, dp, dn, strict=True):
            k = 2.0 ** (-(step - last[i]) / h)
            pos[i], neg[i], last[i] = pos[i] * k + a, neg[i] * k + b, step
            k = 2.0 ** (-(step - pop_last) / h)
            pop, pop_last = [pop[0] * k + a, pop[1] * k + b], step
    t = 17
    k = 2.0 ** (-(t - pop_last) / h)
    m = (1 + pop[0] * k) / (2 + (pop[0] + pop[1]) * k)
    want_a = [s * m + pos[i] * 2.0 ** (-(t - last[i]) / h) for i in range(D)]
    want_b = [s * (1 - m) + neg[i] * 2.0 ** (-(t - last[i]) / h) for i in range(D)]
    a, b = success.posterior(mem, np.arange(D), t, h, s)
    np.testing.assert_allclose(a, want_a, rtol=1e-12)
    np.testing.assert_allclose(b, want_b, rtol=1e-12)


def test_expected_value_matches_beta_functions():
    """expected_value's moments equal B(alpha + a, beta + b) / B(alpha, beta) by lgamma, and
    value(1) = 0. Breaks if a rising-factorial index is off by one."""
    alpha, beta = np.array([0.3, 2.0, 7.5]), np.array([1.7, 0.4, 3.0])
    got = allocation.expected_value(alpha, beta, 6, (1, 2))

    def mom(al, be, a, b):
        return math.exp(math.lgamma(al + a) + math.lgamma(be + b) - math.lgamma(al + be + a + b)
                        - math.lgamma(al) - math.lgamma(be) + math.lgamma(al + be))

    for i, (al, be) in enumerate(zip(alpha, beta, strict=True)):
        for N in range(1, 7):
            want = mom(al, be, 1, 2) - mom(al, be, 1 + N, 2) - mom(al, be, 1, 2 + N)
            assert got[i, N] == pytest.approx(want, rel=1e-10, abs=1e-15)
    np.testing.assert_allclose(got[:, 1], 0.0, atol=1e-15)


@pytest.mark.parametrize("rule", ["knapsack", "variance"])
def test_greedy_is_optimal_by_brute_force(rule):
    """With no exploration or skipping, the caps maximise the summed expected value over every
    integer split of the budget with floor <= cap <= max_cap. Breaks if the greedy takes a
    non-prefix increment (e.g. the 0 -> 1 increment of 0 clamps the rest) or misses a unit."""
    rng = np.random.default_rng(1)
    for _ in range(40):
        P, max_cap, floor = int(rng.integers(2, 5)), int(rng.integers(2, 7)), int(rng.integers(1, 3))
        floor = min(floor, max_cap)
        budget = int(rng.integers(P * floor, P * max_cap + 3))
        alpha, beta = rng.gamma(1.0, 2.0, P) + 0.05, rng.gamma(1.0, 2.0, P) + 0.05
        cfg = AllocConfig(rule, budget=budget, floor=floor, max_cap=max_cap, explore=0.0)
        caps = allocate(cfg, alpha, beta).caps
        values = allocation.expected_value(alpha, beta, max_cap, allocation._WEIGHT[rule])
        total = min(budget, P * max_cap)
        best = max(sum(values[i, c] for i, c in enumerate(cs))
                   for cs in itertools.product(range(floor, max_cap + 1), repeat=P)
                   if sum(cs) == total)
        assert caps.sum() == total and caps.min() >= floor and caps.max() <= max_cap
        assert sum(values[i, c] for i, c in enumerate(caps)) == pytest.approx(best, rel=1e-12)


def test_explore_skip_and_errors():
    """explore = 1 spreads the budget evenly; a prompt whose own record says no signal is
    skipped (8 of 8 correct at max_cap 8: P(all equal) = 9/17) and its share goes to the
    others, while a prompt the population prior alone calls sure (no record) is not; a
    budget below the floors is a one-line error naming it."""
    a, b = np.array([1.0, 1.0, 40.0, 400.0]), np.array([1.0, 1.0, 0.01, 0.01])
    evidence = (np.array([0.0, 0.0, 0.0, 8.0]), np.array([0.0, 0.0, 0.0, 0.0]))
    even = allocate(AllocConfig("knapsack", budget=18, floor=2, max_cap=8, explore=1.0), a, b)
    assert even.caps.max() - even.caps.min() <= 1 and even.caps.sum() == 18
    cfg = AllocConfig("knapsack", budget=18, floor=2, max_cap=8, skip_above=0.5)
    got = allocate(cfg, a, b, evidence)
    assert got.skipped.tolist() == [False, False, False, True] and got.caps[3] == 0
    assert got.caps.sum() == 18 and got.metrics()["skipped_prompts"] == 1
    assert not allocate(cfg, a, b).skipped.any()  # no records given: nothing to skip on
    with pytest.raises(ValueError, match="budget=5 < 4 prompts x floor=2"):
        allocate(AllocConfig("knapsack", budget=5, floor=2, max_cap=8), a, np.ones(4))
    with pytest.raises(ValueError, match="allocation='greedy'"):
        AllocConfig("greedy")


def test_resume_gives_identical_allocations(tmp_path):
    """Memory saved mid-run (np.savez of `state`) and restored gives the same caps, bit for
    bit, as the run that never stopped. Breaks if any state (e.g. the population's last
    step) is left out of the tree or rounded on the way."""
    rng = np.random.default_rng(2)
    D, P = 40, 8
    cfg = AllocConfig("knapsack", budget=4 * P, floor=2, max_cap=16, explore=0.1)
    batches = [rng.choice(D, P, replace=False) for _ in range(12)]
    rates = rng.random(D)

    def run(mem, steps):
        caps = []
        for t in steps:
            ids = batches[t]
            got = allocate(cfg, *success.posterior(mem, ids, t, 3.0))
            draws = np.random.default_rng(t).random((P, 16)) < rates[ids, None]
            pos = np.array([d[:c].sum() for d, c in zip(draws, got.caps, strict=True)])
            mem = success.update(mem, ids, pos, got.caps - pos, t, 3.0)
            caps.append(got.caps)
        return mem, caps

    full_mem, full = run(success.init(D), range(12))
    mem, first = run(success.init(D), range(6))
    np.savez(tmp_path / "mem.npz", **success.state(mem))
    restored = success.from_state(dict(np.load(tmp_path / "mem.npz")))
    end_mem, second = run(restored, range(6, 12))
    for x, y in zip(full, first + second, strict=True):
        np.testing.assert_array_equal(x, y)
    for k, v in success.state(full_mem).items():
        np.testing.assert_array_equal(v, success.state(end_mem)[k])


@pytest.fixture(scope="module")
def prompts():
    return list(itertools.islice(prompt_stream("skewed", seed=9), 20))


@pytest.mark.parametrize("method,scheduler", [("ada_balance", "rounds"), ("ada_pos", "rounds"),
                                              ("grpo", "rounds"),
                                              ("ada_balance", "continuous")])
def test_caps_of_the_budget_are_todays_collection(prompts, method, scheduler):
    """allocation `none` (every cap M x N) collects exactly what caps=None does: every array,
    round record and count. Breaks if the cap path changes a round's requests, the dispatch
    order or the pool's width."""
    cfg = collect_config(method, scheduler=scheduler)
    pol = SimulatedPolicy(seed=3)
    caps = allocate(AllocConfig("none", max_cap=cfg.budget), np.ones(20), np.ones(20)).caps
    a, b = (Collector(cfg, sim_reward, driver=SimulatedDriver(pol, 11)).collect(
        prompts, jax.random.key(4), caps=c) for c in (None, caps))
    for f in ("sample_idx", "rewards", "group_valid", "done", "mixed", "samples"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    for f in ("pos", "neg", "s1", "s2"):
        np.testing.assert_array_equal(getattr(a.pool, f), getattr(b.pool, f))
    drop = lambda d: {k: v for k, v in d.items() if k != "seconds"}  # noqa: E731
    assert drop(a.metrics) == drop(b.metrics)
    assert [drop(r) for r in a.rounds] == [drop(r) for r in b.rounds]


@pytest.mark.parametrize("rule", ["balance", "pos", "none"])
def test_per_prompt_caps_match_the_study_simulator(prompts, rule):
    """The collector under per-prompt caps (0, below n, not a multiple of M, M x N) draws
    what `rounds_counts` (the budget study's engine) says on the same outcomes; the
    continuous scheduler never passes a cap; a cap above M x N is an error. Breaks if a
    last round overshoots its cap."""
    pol = SimulatedPolicy(seed=5)
    cfg = dataclasses.replace(collect_config("ada_balance"), rule=rule)
    caps = np.array([0, 3, 8, 13, 32] * 4)
    out = Collector(cfg, sim_reward, driver=SimulatedDriver(pol, 9)).collect(
        prompts, jax.random.key(0), caps=caps)
    table = np.array([[pol.outcome(p, j)[0] for j in range(32)] for p in prompts])
    drawn, pos, neg, mixed = rounds_counts(table, caps, rule, cfg.n, cfg.samples_per_round)
    np.testing.assert_array_equal(out.samples, drawn)
    np.testing.assert_array_equal(out.pool.pos, pos)
    np.testing.assert_array_equal(out.pool.neg, neg)
    np.testing.assert_array_equal(out.mixed, mixed)
    cont = Collector(dataclasses.replace(cfg, scheduler="continuous"), sim_reward,
                     driver=SimulatedDriver(pol, 9)).collect(prompts, jax.random.key(0), caps=caps)
    assert np.all(cont.samples <= caps)
    with pytest.raises(ValueError, match=r"caps must be 20 integers in \[0, 32\]"):
        Collector(cfg, sim_reward, driver=SimulatedDriver(pol, 9)).collect(
            prompts, jax.random.key(0), caps=caps + 1)


def _study():
    spec = importlib.util.spec_from_file_location(
        "allocation_sim", os.path.join(ROOT, "experiments", "allocation_sim.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_study_fit_recovers_a_beta_and_runs_are_seeded():
    """experiments/allocation_sim.py: `fit` recovers Beta(a, b) from its own statistics (the
    fits of real runs rest on it), and `run_arm` is a pure function of its seed, with GRPO
    drawing exactly its group per prompt. Breaks if a statistic's formula and its fit drift
    apart, or the simulator reads unseeded randomness."""
    study = _study()
    s = study.beta_stats(np.log([2.5]), np.log([0.4]))
    a, b = study.fit({k: float(s[k][0]) for k in ("lacking_pos", "draws", "lacking_neg")})
    assert a == pytest.approx(2.5, rel=0.03) and b == pytest.approx(0.4, rel=0.03)
    traj = Trajectory((0, 10), ((2.0, 2.0), (4.0, 1.0)))
    arm = Arm("k", "balance", 8, 4, alloc=AllocConfig("knapsack", budget=64, max_cap=32))
    one, two = (run_arm(arm, traj, 60, 16, 6, seed=3) for _ in range(2))
    assert one == two and one["samples"] <= 6 * 64
    grpo = run_arm(Arm("grpo", "none", 4, 1), traj, 60, 16, 6, seed=3)
    assert grpo["samples"] == 6 * 16 * 4 and grpo["prompts"] == 6 * 16
