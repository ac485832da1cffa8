"""Multi-turn decoding in the sampler (ada/sampling/turns.py), both KV caches: a request's
turn ends at a turn-end id, it parks with its cache while other slots decode, and
Driver.extend appends the observation without prefilling what is cached.

Held: a trajectory built turn by turn has the log-probs of one forward pass over the whole
sequence (prompt, turns, observations) at the policy's positions; greedy turns with appends
are greedy turns re-prefilled from scratch; a parked request does not hold up the others
and resumes with the tokens it has alone; paged preemption (of running and parked
multi-turn requests) restarts them with the same tokens; the same on a (2, 2) mesh. Tiny
random qwen2, float32 on CPU; one in eight ids ends a turn, so episodes have several."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import jit_forward, random_params
from tolerances import logprob_tol

from ada import sharding as shd
from ada.models import preset
from ada.sampling.driver import Driver, Request
from ada.sampling.engine import Engine
from ada.sampling.paged import PagedEngine
from ada.sampling.samplers import SamplingConfig

pytestmark = pytest.mark.numerics  # CI runs it again under another CPU's kernels

TURN_END = tuple(range(100, 164))  # 64 of 512 ids: a turn ends every ~8 tokens
# greedy decoding of a random model repeats itself: half of the ids end a turn there
GREEDY_TURN_END = tuple(range(64, 320))
EOS = (7,)
BUDGET = 6  # new tokens a turn
MAX_TURNS = 4
ENGINE = dict(num_slots=4, max_prompt_len=64, max_new_tokens=16, chunk_size=4, num_windows=1,
              max_prefill_rows=2, eos_ids=EOS)
SAMPLED, GREEDY = SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.0)
KEY = 3


@pytest.fixture(scope="module")
def model():
    config = preset("tiny").replace(num_layers=1)  # one layer: compiles twice as fast
    return config, random_params(config, seed=5)


def make_engine(kind, config, sampling, **kw):
    kw = {**ENGINE, "turn_end_ids": TURN_END, **kw}
    if kind == "dense":
        return Engine(config, sampling=sampling, slot_bucketing=False, **kw)
    return PagedEngine(config, sampling=sampling, page_size=4, **kw)


@pytest.fixture(scope="module")
def engines(model):
    """One engine per (backend, sampling), shared so that each program compiles once."""
    config, _ = model
    return {(kind, name): make_engine(kind, config, sampling, turn_end_ids=ids)
            for kind in ("dense", "paged") for name, sampling, ids in
            (("sampled", SAMPLED, TURN_END), ("greedy", GREEDY, GREEDY_TURN_END))}


def episodes(n_prompts=2, samples=2, seed=0, budget=BUDGET):
    """Requests: each prompt sampled `samples` times (the paged ones share its pages)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(200, 500, n).tolist() for n in (9, 12, 5)[:n_prompts]]
    return [Request(p, prompt_id=i, sample_idx=j, max_new_tokens=budget)
            for j in range(samples) for i, p in enumerate(prompts)]


def observation(request: Request, turn: int) -> list[int]:
    """The tool's output after `turn` of `request`: fixed ids, 2 to 5 of them."""
    rng = np.random.default_rng([request.prompt_id, request.sample_idx, turn])
    return rng.integers(200, 500, 2 + turn % 4).tolist()


def run(driver, requests, delay=0, max_turns=MAX_TURNS, hook=None, budget=BUDGET):
    """Step `driver` over multi-turn `requests`: a turn that ends at a turn-end id is
    extended with its observation `delay` steps later (the request parked meanwhile), until
    its episode ends (EOS, length, or `max_turns`: Driver.end). Returns per request
    (prompt_id, sample_idx): its completions and its whole sequence, prompt first."""
    seqs = {driver.submit(r): r for r in requests}
    out = {(r.prompt_id, r.sample_idx): ([], list(r.prompt_tokens)) for r in requests}
    due, steps = [], 0
    while driver.busy():
        steps += 1
        assert steps < 500, "no progress"
        for c in driver.step():
            r = seqs[c.seq]
            turns, sequence = out[(r.prompt_id, r.sample_idx)]
            assert c.finish_reason != "error", c.error
            assert c.turn == len(turns) and len(c.logprobs) == len(c.token_ids)
            turns.append(c)
            sequence.extend(c.token_ids)
            if c.finish_reason == "turn":
                if len(turns) == max_turns:
                    driver.end(c.seq)
                else:
                    obs = observation(r, c.turn)
                    sequence.extend(obs)
                    due.append((steps + delay, c.seq, obs))
        for item in [d for d in due if d[0] <= steps]:
            due.remove(item)
            driver.extend(item[1], item[2], max_new_tokens=budget)
        if hook is not None:
            hook(driver)
    return out


def assert_forward_parity(out, params, config) -> float:
    """Each episode's log-probs equal one forward pass over its whole sequence at the
    policy's positions (within float32 rounding at the logits' scale); returns the largest
    difference."""
    worst, T = 0.0, 80  # right-padded to one length: one compile
    for turns, sequence in out.values():
        n = len(sequence)
        logits = jit_forward(params, config, np.asarray([sequence + [0] * (T - n)]),
                             np.arange(T)[None], np.arange(T)[None] < n, None)[0][0, :n]
        logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
        at = len(turns[0].prompt_tokens)
        for c in turns:
            assert sequence[at:at + c.length] == c.token_ids
            want = logp[np.arange(at - 1, at - 1 + c.length), c.token_ids]
            diff = float(np.abs(want - np.asarray(c.logprobs)).max())
            assert diff < logprob_tol(logits, config), (diff, logprob_tol(logits, config))
            worst = max(worst, diff)
            at += c.length + (len(observation(c, c.turn)) if c.finish_reason == "turn" else 0)
    return worst


def assert_same_tokens(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert [(c.token_ids, c.finish_reason) for c in a[k][0]] == [
            (c.token_ids, c.finish_reason) for c in b[k][0]], k


def count_turns(out) -> int:
    return sum(c.finish_reason == "turn" for turns, _ in out.values() for c in turns)


@pytest.mark.parametrize("kind", ["dense", "paged"])
def test_turn_by_turn_log_probs_equal_one_forward_pass(model, engines, kind):
    """Sampled at temperature 1, four episodes on four slots: every turn's tokens and
    log-probs are those of the model over prompt + turns + observations; the stats count
    the appended observations."""
    config, params = model
    driver = Driver(engines[(kind, "sampled")], params, step_key=KEY)
    out = run(driver, episodes())
    assert count_turns(out) >= 4 and max(len(t) for t, _ in out.values()) >= 3, out
    diff = assert_forward_parity(out, params, config)
    print(f"{kind}: max |dlogprob| {diff:.2e}")
    stats = driver.stats()
    extends = sum(c.finish_reason == "turn" and c.turn + 1 < MAX_TURNS
                  for turns, _ in out.values() for c in turns)
    assert stats["extend_calls"] == extends and stats["turns"] == count_turns(out)
    assert stats["appended_tokens"] == stats["append_prefilled_tokens"] == sum(
        len(observation(c, c.turn)) for turns, _ in out.values() for c in turns
        if c.finish_reason == "turn" and c.turn + 1 < MAX_TURNS)
    assert 1 <= stats["append_prefills"] <= extends
    assert not driver.busy() and driver.free_slots() == ENGINE["num_slots"]


@pytest.mark.parametrize("kind", ["dense", "paged"])
def test_greedy_appends_equal_re_prefilling_every_turn(model, engines, kind):
    """Greedy: turn k drawn after appends equals turn k drawn from prompt + everything so
    far submitted as a new prompt (prefilled from scratch)."""
    config, params = model
    engine = engines[(kind, "greedy")]
    out = run(Driver(engine, params), episodes(samples=1))
    assert count_turns(out) >= 2
    fresh, want = [], []
    for turns, sequence in out.values():
        at = len(turns[0].prompt_tokens)
        for c in turns:
            fresh.append(Request(sequence[:at], prompt_id=100 + len(fresh), max_new_tokens=BUDGET))
            want.append((c.token_ids, c.finish_reason))
            at += c.length + (len(observation(c, c.turn)) if c.finish_reason == "turn" else 0)
    driver = Driver(engine, params)
    got = driver.generate_all(fresh)
    assert [(c.token_ids, c.finish_reason) for c in got] == want
    for c in got:  # their turns ended at a turn-end id: parked until ended
        if c.finish_reason == "turn":
            driver.end(c.seq)
    assert not driver.busy()


@pytest.mark.parametrize("kind", ["dense", "paged"])
def test_a_parked_request_does_not_hold_up_the_others(model, engines, kind):
    """Request A parks after its first turn; B, on the other slot, decodes to its end while
    A waits; A extended later draws what it draws alone (extended at once). Extending or
    ending a request that is not parked raises, and so does an observation past the slot's
    cache or the vocabulary (A stays parked); `end` frees the slot."""
    config, params = model
    engine = engines[(kind, "sampled")]
    a, b = episodes(n_prompts=2, samples=1)
    alone = run(Driver(engine, params, step_key=KEY), [a], max_turns=2)[(0, 0)][0]
    assert alone[0].finish_reason == "turn", "A's first turn must end at a turn-end id"
    driver = Driver(engine, params, step_key=KEY)
    sa, sb = driver.submit(a), driver.submit(b)
    parked_at, b_steps, steps = None, [], 0
    while parked_at is None or driver.running.keys() != {s for s, x in driver.running.items()
                                                          if x.seq == sa}:
        steps += 1
        for c in driver.step():
            if c.seq == sa:
                assert c.token_ids == alone[0].token_ids and c.finish_reason == "turn"
                parked_at = steps
                continue
            b_steps.append(steps)
            if c.finish_reason == "turn" and c.turn + 1 < MAX_TURNS:  # B goes on at once
                driver.extend(sb, observation(b, c.turn), max_new_tokens=BUDGET)
            elif c.finish_reason == "turn":
                driver.end(sb)
    assert b_steps[-1] > parked_at  # B decoded (and ended) while A was parked
    assert driver.busy() and [s.parked for s in driver.running.values()] == [True]
    with pytest.raises(ValueError, match="not parked"):
        driver.extend(sb, [1, 2])
    room = engine.cache_len - len(a.prompt_tokens) - len(alone[0].token_ids)
    for bad, why in (([300] * room, "engine.cache_len"), ([config.vocab_size], "vocabulary"),
                     ([], "no tokens")):
        with pytest.raises(ValueError, match=why):
            driver.extend(sa, bad)  # refused: A stays parked
    with pytest.raises(ValueError, match="must be in"):
        driver.extend(sa, [300], max_new_tokens=room)
    driver.extend(sa, observation(a, 0), max_new_tokens=BUDGET)
    with pytest.raises(ValueError, match="not parked"):
        driver.end(sa)  # running again
    got = None
    while got is None:
        got = next((c for c in driver.step() if c.seq == sa), None)
    assert (got.token_ids, got.logprobs) == (alone[1].token_ids, alone[1].logprobs)
    assert got.turn == 1 and (got.prompt_id, got.sample_idx) == (a.prompt_id, a.sample_idx)
    if got.finish_reason == "turn":
        driver.end(sa)
    assert not driver.busy() and driver.free_slots() == ENGINE["num_slots"]


@pytest.mark.slow  # ~10 s under load
def test_paged_preemption_of_multi_turn_requests_restarts_them_with_the_same_tokens(
        model, engines):
    """A pool with one request's worst case (20 usable pages of 4 tokens) for eight
    episodes of 12-token turns on four slots, observations appended two steps late: running
    and parked multi-turn requests are preempted, restarted with their context appended
    again, and draw the tokens the full reservation draws (keys count the request's
    tokens)."""
    config, params = model
    reqs, kw = episodes(n_prompts=3, samples=3, budget=12)[:8], dict(delay=2, budget=12)
    full = run(Driver(engines[("paged", "sampled")], params, step_key=KEY), reqs, **kw)
    small = Driver(make_engine("paged", config, SAMPLED, num_pages=21, max_prefill_rows=1),
                   params, step_key=KEY)
    restarts, requeue = [], small.requeue

    def logged(slot):
        s = small.running[slot]
        restarts.append((bool(s.context), s.parked))
        requeue(slot)

    small.requeue = logged
    out = run(small, reqs, hook=lambda d: d.backend.alloc.check(), **kw)
    assert_same_tokens(full, out)
    assert (True, False) in restarts and (True, True) in restarts, restarts
    stats = small.stats()
    assert stats["preemptions"] == len(restarts)
    assert stats["append_prefilled_tokens"] > stats["appended_tokens"]  # contexts again
    assert_forward_parity(out, params, config)


@pytest.mark.slow
def test_multi_turn_on_a_mesh_equals_unsharded(model, engines):
    """On a (data 2, tensor 2) sampler mesh (the paged pool split with its slots), both
    backends draw the unsharded engine's turns, with the model's log-probs."""
    config, params = model
    reqs = episodes()
    want = run(Driver(engines[("dense", "sampled")], params, step_key=KEY), reqs)
    for kind in ("dense", "paged"):
        engine = make_engine(kind, config, SAMPLED, mesh=shd.local_mesh(2, 2))
        out = run(Driver(engine, params, step_key=KEY), reqs)
        assert_same_tokens(want, out)
        print(f"{kind} on a mesh: max |dlogprob| {assert_forward_parity(out, params, config):.2e}")
