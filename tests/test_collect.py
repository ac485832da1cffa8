"""Collector: round loop and continuous scheduler vs a brute-force reference of the rounds."""

import dataclasses
import importlib.util
import itertools
import os

import jax
import numpy as np
import pytest

from ada.adaptive import rules
from ada.adaptive.collect import (
    CollectConfig,
    Collector,
    DispatchPolicy,
    SampleRequest,
)
from ada.adaptive.simulate import (
    SimPrompt,
    SimulatedDriver,
    SimulatedPolicy,
    prompt_stream,
    sim_reward,
)
from ada.methods import collect_config as method_config
from ada.rl.advantages import advantages

THR = 0.5
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def outcomes(prompts, policy, budget):
    """The fixed reward of every (prompt, sample_idx) the simulator would produce."""
    return [[float(policy.outcome(p, s)[0]) for s in range(budget)] for p in prompts]


def ref_rounds(table, rule, n, M, N):
    """Brute-force verl round loop: (samples drawn, done) per prompt."""
    out = []
    for rewards in table:
        drawn, done = 0, False
        for _ in range(N):
            if done:
                break
            drawn += M
            pool = rewards[:drawn]
            pos = sum(x > THR for x in pool)
            done = {"pos": pos >= 1 and drawn >= n,
                    "balance": pos >= n // 2 and drawn - pos >= n - n // 2, "none": False}[rule]
        out.append((drawn, done))
    return out


def ref_sequential(table, rule, n, budget):
    """One response at a time: stop at the first prefix where the rule holds."""
    out = []
    for rewards in table:
        for k in range(1, budget + 1):
            pos = sum(x > THR for x in rewards[:k])
            if rules.RULES[rule].done(pos, k - pos, k, n):
                out.append((k, True))
                break
        else:
            out.append((budget, False))
    return out


@pytest.fixture(scope="module")
def prompts():
    return list(itertools.islice(prompt_stream("skewed", seed=5), 24))


def check_groups(out, n, budget):
    P = len(out.prompts)
    assert out.sample_idx.shape == out.rewards.shape == (P, n)
    assert out.group_valid.all()
    for p in range(P):
        members = out.sample_idx[p]
        assert len(set(members.tolist())) == n and members.max() < out.samples[p] <= budget
        assert [c.sample_idx for c in out.completions[p]] == members.tolist()
        assert all(c.prompt_id % P == p for c in out.completions[p])
    assert np.all(out.pool.seen == out.samples)  # late responses are in the pool too


@pytest.mark.parametrize("rule", ["pos", "balance", "none"])
def test_rounds_match_reference(prompts, rule):
    pol = SimulatedPolicy(seed=1)
    cfg = CollectConfig(rule=rule, n=4, samples_per_round=3, max_rounds=4, positive_threshold=THR)
    out = Collector(cfg, sim_reward, driver=SimulatedDriver(pol, 7)).collect(
        prompts, jax.random.key(0))
    want = ref_rounds(outcomes(prompts, pol, cfg.budget), rule, 4, 3, 4)
    assert [(int(s), bool(d)) for s, d in zip(out.samples, out.done, strict=False)] == want
    check_groups(out, 4, cfg.budget)
    assert out.rounds[0]["active_prompts"] == len(prompts)
    assert sum(r["samples"] for r in out.rounds) == out.metrics["samples"] == sum(w[0] for w in want)
    # rounds never leave requests late
    assert out.metrics["late_samples"] == 0
    # after each round, the round's prompts short of a balanced group's positives / negatives
    table = outcomes(prompts, pol, cfg.budget)
    for r, rd in enumerate(out.rounds):
        pools = [table[p][:3 * (r + 1)] for p in range(len(prompts)) if want[p][0] > 3 * r]
        assert rd["active_prompts"] == len(pools)
        assert rd["lacking_pos"] == sum(sum(x > THR for x in q) < 2 for q in pools)
        assert rd["lacking_neg"] == sum(sum(x <= THR for x in q) < 2 for q in pools)


def test_continuous_one_slot_is_sequential(prompts):
    pol = SimulatedPolicy(seed=2)
    cfg = method_config("ada_balance", scheduler="continuous")
    out = Collector(cfg, sim_reward, driver=SimulatedDriver(pol, 1)).collect(
        prompts, jax.random.key(0))
    want = ref_sequential(outcomes(prompts, pol, cfg.budget), "balance", 4, cfg.budget)
    assert [(int(s), bool(d)) for s, d in zip(out.samples, out.done, strict=False)] == want
    check_groups(out, 4, cfg.budget)


@pytest.mark.parametrize("slots", [5, 64])
def test_continuous_same_exit_decisions_as_rounds(prompts, slots):
    pol = SimulatedPolicy(seed=3)
    rounds = Collector(method_config("ada_balance"), sim_reward,
                       driver=SimulatedDriver(pol, 16)).collect(prompts, jax.random.key(1))
    cont = Collector(method_config("ada_balance", scheduler="continuous"), sim_reward,
                     driver=SimulatedDriver(pol, slots)).collect(prompts, jax.random.key(1))
    np.testing.assert_array_equal(cont.done, rounds.done)
    np.testing.assert_array_equal(cont.mixed, rounds.mixed)
    assert np.all(cont.samples <= 32)
    assert cont.metrics["samples"] <= rounds.metrics["samples"]
    check_groups(cont, 4, 32)
    # the pool's counts decide: done == rule(counts) for every prompt (late ones included)
    s = cont.pool
    np.testing.assert_array_equal(cont.done, rules.balance_rule(s.pos, s.neg, s.seen, 4))


def test_selection_does_not_depend_on_slots_or_arrival(prompts):
    pol = SimulatedPolicy(seed=4)
    a, b = (Collector(method_config("exhaustive"), sim_reward,
                      driver=SimulatedDriver(pol, k)).collect(prompts, jax.random.key(7))
            for k in (3, 50))
    np.testing.assert_array_equal(a.sample_idx, b.sample_idx)
    np.testing.assert_array_equal(a.rewards, b.rewards)


def test_grpo_keeps_its_one_round(prompts):
    out = Collector(method_config("grpo", n=4), sim_reward,
                    driver=SimulatedDriver(SimulatedPolicy(), 8)).collect(prompts, jax.random.key(0))
    assert np.all(out.samples == 4)
    assert np.all(np.sort(out.sample_idx, axis=1) == np.arange(4))
    # GRPO's pool is its group: pool and group baselines share the mean
    a_pool, a_group = (np.asarray(advantages(out.rewards, stats_from=stats, pool=out.pool,
                                             group_valid_PxN=out.group_valid, norm_by_std=False))
                       for stats in ("pool", "group"))
    np.testing.assert_allclose(a_pool, a_group, atol=1e-6)


def test_dapo_fills_with_mixed_groups():
    stream = prompt_stream("skewed", seed=9)
    first = list(itertools.islice(stream, 16))
    out = Collector(method_config("dapo"), sim_reward,
                    driver=SimulatedDriver(SimulatedPolicy(), 8)).collect(
        first, jax.random.key(0), more_prompts=stream)
    assert out.mixed.all() and out.metrics["unfilled"] == 0
    assert out.metrics["samples"] == 4 * out.metrics["prompts_drawn"]
    assert out.metrics["prompt_batches"] > 1
    # the step logs every draw as sampling cost, the discarded batches' too
    from ada.step import step_metrics
    assert step_metrics(out, {})["samples"] == out.metrics["samples"] > out.samples.sum()
    assert len({p.uid for p in out.prompts}) == 16
    for p, comps in zip(out.prompts, out.completions, strict=False):  # groups stay with their prompt
        assert [float(c.text) for c in comps] == [
            float(SimulatedPolicy().outcome(p, c.sample_idx)[0]) for c in comps]


def test_dapo_keeps_shape_when_prompts_run_out():
    first = [SimPrompt(i, 0.0) for i in range(4)]  # all-wrong: never mixed
    out = Collector(method_config("dapo"), sim_reward,
                    driver=SimulatedDriver(SimulatedPolicy(), 4)).collect(
        first, jax.random.key(0), more_prompts=[SimPrompt(9, 0.0)])
    assert out.rewards.shape == (4, 4) and out.metrics["unfilled"] == 4
    assert out.metrics["mixed_share"] == 0.0


def test_bad_rewards_score_zero_and_are_counted(prompts):
    calls = itertools.count()

    def flaky(prompt, text):
        k = next(calls) % 4
        if k == 0:
            raise RuntimeError("verifier crashed")
        return [None, float("nan"), float(text)][k - 1]

    out = Collector(method_config("grpo"), flaky,
                    driver=SimulatedDriver(SimulatedPolicy(), 8)).collect(prompts, jax.random.key(0))
    n_req = 4 * len(prompts)
    assert out.metrics["reward_failures"] == 3 * n_req // 4
    assert out.metrics["samples"] == n_req and out.rewards.shape == (len(prompts), 4)
    assert np.isfinite(out.rewards).all()


class ReversingDriver(SimulatedDriver):
    """A SimulatedDriver that hands back each step's completions in reverse order."""

    def step(self):
        return super().step()[::-1]


@pytest.mark.parametrize("overlap", [True, False])
def test_rounds_do_not_depend_on_arrival_order_or_slots(prompts, overlap):
    """A round of many slots, finished responses reversed, gives the batch of a round
    trickling through 3 slots; with or without overlapped scoring."""
    pol = SimulatedPolicy(seed=6)
    cfg = method_config("ada_pos", overlap_scoring=overlap)
    a = Collector(cfg, sim_reward, driver=ReversingDriver(pol, 256), process_index=2,
                  process_count=3).collect(prompts, jax.random.key(3))
    b = Collector(cfg, sim_reward, driver=SimulatedDriver(pol, 3),
                  process_index=2, process_count=3).collect(prompts, jax.random.key(3))
    first = 2 * len(prompts)  # engine-facing ids: this process's global rows
    assert all(c.prompt_id >= first for row in b.completions for c in row)
    np.testing.assert_array_equal(a.sample_idx, b.sample_idx)
    np.testing.assert_array_equal(a.samples, b.samples)


@pytest.mark.parametrize("kwargs, setting", [
    (dict(samples_per_round=1, max_rounds=3, n=4), "samples_per_round or max_rounds"),
    (dict(n=1), "raise n"),
    (dict(positive_threshold=1.0), "outside the reward range"),
    (dict(positive_threshold=-0.5), "outside the reward range"),
    (dict(reward_range=(1.0, 2.0), positive_threshold=1.5), "failed reward"),
    (dict(dapo_max_batches=0), "dapo_max_batches"),
    (dict(rule="balanced"), "rule="),
    (dict(scheduler="async"), "scheduler="),
])
def test_config_rejects_inconsistent_settings(kwargs, setting):
    with pytest.raises(ValueError, match=setting):
        CollectConfig(**kwargs)


def test_config_fields_are_the_adaptive_knobs():
    """A CollectConfig field named as a knob of the `adaptive` config section has that knob's
    default, so a CollectConfig built in code behaves as a run's."""
    spec = importlib.util.spec_from_file_location("_common", os.path.join(ROOT, "configs", "common.py"))
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    knobs = common.base().adaptive
    fields = {f.name: f.default for f in dataclasses.fields(CollectConfig)}
    shared = sorted(set(fields) & set(knobs.keys()))
    assert {"positive_threshold", "dapo_max_batches", "reward_range", "scheduler"} <= set(shared)
    for name in shared:
        want = tuple(knobs[name]) if isinstance(fields[name], tuple) else knobs[name]
        assert fields[name] == want, name


def test_collector_needs_an_engine():
    with pytest.raises(ValueError, match="driver"):
        Collector(method_config("ada_balance"), sim_reward, driver=None)
    with pytest.raises(ValueError, match="more_prompts"):
        Collector(method_config("dapo"), sim_reward,
                  driver=SimulatedDriver(SimulatedPolicy(), 4)).collect(
            [SimPrompt(0, 0.5)], jax.random.key(0))


def test_dispatch_policy_prefers_uncovered_then_least_loaded():
    pol = DispatchPolicy("balance", n=4, budget=32)
    done = np.array([False, False, False, True])
    dispatched = np.array([4, 1, 0, 0])
    inflight = np.array([4, 1, 0, 0])
    pos = neg = np.zeros(4, int)
    # prompt 0's 4 in flight cover its need of 4; 3 is done; 2 (idle) first, then the tie
    # 1 vs 2 (one in flight each, one dispatched each) goes to the lower id
    assert pol.pick(3, done, dispatched, inflight, pos, neg) == [2, 1, 2]
    assert pol.pick(5, done, dispatched, inflight, pos, neg) == [2, 1, 2, 1, 2]
    # once every need is covered, the least loaded prompt gets the slot (work-conserving)
    assert pol.pick(2, done, [4, 4, 0, 0], [4, 5, 0, 0], pos, neg) == [2, 2]
    assert pol.pick(2, done, [4, 4, 4, 0], [4, 5, 4, 0], pos, neg) == [0, 2]


def test_request_echoes_ids():
    r = SampleRequest(3, 5, "p")
    assert (r.prompt_id, r.sample_idx, r.prompt) == (3, 5, "p")


class _BatchReward:
    """A reward with a batch form: records calls; item i of a batch can be made to fail."""

    def __init__(self, fail_batch=False):
        self.batch_calls, self.item_calls, self.fail_batch = [], 0, fail_batch

    def __call__(self, prompt, text):
        self.item_calls += 1
        return sim_reward(prompt, text)

    def score_batch(self, prompts, texts):
        self.batch_calls.append(len(texts))
        if self.fail_batch:
            raise RuntimeError("verifier pool died")
        out = [sim_reward(p, t) for p, t in zip(prompts, texts, strict=True)]
        out[0] = float("nan")  # one bad score: counted, scored 0, the rest kept
        return out


@pytest.mark.parametrize("scheduler", ["rounds", "continuous"])
def test_batch_reward_scores_each_round_in_one_call(prompts, scheduler):
    """A reward_fn with score_batch is called once per round (per driver step when
    continuous) instead of once per response; a failing batch call falls back to per-item
    scoring, so the result equals the plain reward's."""
    cfg = method_config("ada_balance", scheduler=scheduler)
    pol = SimulatedPolicy(seed=2)
    plain = Collector(cfg, sim_reward, driver=SimulatedDriver(pol, 16)).collect(
        prompts, jax.random.key(0))
    rw = _BatchReward()
    got = Collector(cfg, rw, driver=SimulatedDriver(pol, 16)).collect(prompts, jax.random.key(0))
    assert rw.item_calls == 0 and len(rw.batch_calls) == got.metrics["reward_failures"] >= 1
    assert sum(rw.batch_calls) == int(got.samples.sum())
    fallback = _BatchReward(fail_batch=True)
    again = Collector(cfg, fallback, driver=SimulatedDriver(pol, 16)).collect(
        prompts, jax.random.key(0))
    assert fallback.item_calls == int(again.samples.sum())
    np.testing.assert_array_equal(again.rewards, plain.rewards)
    np.testing.assert_array_equal(again.sample_idx, plain.sample_idx)


class RecordingDriver(SimulatedDriver):
    """A SimulatedDriver that remembers every engine-facing prompt id it was asked for."""

    def __init__(self, *args):
        super().__init__(*args)
        self.prompt_ids = set()

    def submit(self, request):
        self.prompt_ids.add(request.prompt_id)
        super().submit(request)


def test_dapo_prompt_ids_are_unique_across_processes():
    """Two processes, each DAPO drawing three prompt batches (all-wrong prompts never fill):
    no two prompts anywhere share an engine-facing id, so none share a sampling stream. The
    old ids (b * P + process * P) gave process 0's second batch process 1's first ids."""
    P = 4
    seen = []
    for pidx in range(2):
        first = [SimPrompt(100 * pidx + i, 0.0) for i in range(P)]
        more = [SimPrompt(100 * pidx + 10 + i, 0.0) for i in range(2 * P)]
        drv = RecordingDriver(SimulatedPolicy(), 8)
        out = Collector(method_config("dapo", dapo_max_batches=3), sim_reward, driver=drv,
                        process_index=pidx, process_count=2).collect(
            first, jax.random.key(0), more_prompts=more)
        assert out.metrics["prompt_batches"] == 3 and len(drv.prompt_ids) == 3 * P
        seen.append(drv.prompt_ids)
    assert not seen[0] & seen[1], sorted(seen[0] & seen[1])


@pytest.mark.parametrize("method", ["ada_balance", "grpo"])
def test_round0_reward_is_the_policys_accuracy(method):
    """reward_round0_mean's numerator/denominator cover the first M draws of every prompt:
    the policy's own accuracy, not the kept groups (which balance pulls to 1/2)."""
    prompts = [SimPrompt(i, p) for i, p in enumerate([0.05, 0.1, 0.2, 0.9, 0.95, 0.5])]
    pol = SimulatedPolicy(seed=4)
    cfg = method_config(method, n=4, samples_per_round=8, max_rounds=4)
    out = Collector(cfg, sim_reward, driver=SimulatedDriver(pol, 16)).collect(
        prompts, jax.random.key(0))
    M = cfg.samples_per_round
    expect = [float(pol.outcome(p, s)[0]) for p in prompts for s in range(M)]
    assert out.metrics["round0_samples"] == len(expect)
    assert out.metrics["round0_reward_sum"] == pytest.approx(sum(expect))
    if method == "ada_balance":
        kept = out.rewards[out.group_valid].mean()
        assert abs(kept - 0.5) < abs(np.mean(expect) - 0.5)
