"""Training on multi-turn trajectories (ada/trajectory.py, ada/rl/batch.py): a row is the
prompt then the whole trajectory, and only the policy's tokens are trained. The
environment's tokens (tool output) are context: no loss term, importance weight, clip or
token count covers them."""

import dataclasses
import json
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_params

from ada.envs import ERROR_KINDS, Env, EnvConfig, EpisodeStats, ToolEnv, Turn
from ada.models import init_params, preset
from ada.rl import train
from ada.rl.batch import BatchLayout, build_train_batch
from ada.rl.losses import AGG_MODES, LossConfig, policy_loss
from ada.rl.optimizer import OptimConfig
from ada.sampling.driver import Completion, Driver, Request
from ada.sampling.engine import Engine
from ada.sampling.paged import PagedEngine
from ada.sampling.samplers import SamplingConfig
from ada.trajectory import EnvDriver, env_metrics

CFG = preset("tiny", family="llama")
LAYOUT = BatchLayout(prompt_len=8, response_len=16, pad_id=0, trim_padding=False)


def trajectories(P=2, n=2, seed=0):
    """A [P, n] collected batch of trajectories: policy turns with observations between."""
    rng = np.random.default_rng(seed)
    prompts = [{"prompt_tokens": rng.integers(1, CFG.vocab_size, 5).tolist()} for _ in range(P)]
    comps = []
    for _ in range(P):
        row = []
        for _ in range(n):
            mask = [1] * 3 + [0] * 4 + [1] * 2 + [0] * 3 + [1] * 2  # turn, obs, turn, obs, turn
            ids = rng.integers(1, CFG.vocab_size, len(mask)).tolist()
            lp = [float(-rng.uniform(0.1, 3)) if m else 0.0 for m in mask]
            row.append(types.SimpleNamespace(token_ids=ids, logprobs=lp, versions=[4] * len(ids),
                                             policy_mask=mask))
        comps.append(row)
    return types.SimpleNamespace(prompts=prompts, completions=comps,
                                 group_valid=np.ones((P, n), bool))


def env_positions(batch) -> np.ndarray:
    """[B, T] True on the environment's tokens: inside a trajectory, outside the loss mask."""
    inside = np.zeros_like(batch["mask"])
    inside[:, LAYOUT.prompt_len:] = batch["mask"][:, LAYOUT.prompt_len:]
    return inside & (batch["response_mask"] == 0)


def test_the_loss_mask_is_zero_on_the_environments_tokens():
    col = trajectories()
    batch = build_train_batch(col, np.ones((2, 2), np.float32), LAYOUT, version=5)
    env = env_positions(batch)
    assert env.sum() == 4 * 7  # every row: 4 + 3 observation tokens
    assert (batch["response_mask"].sum(axis=1) == 7).all()  # 3 + 2 + 2 policy tokens
    assert (batch["behav_logp"][env] == 0).all()


def test_the_gradient_of_an_environment_tokens_loss_term_is_exactly_zero():
    """d loss / d logp and d loss / d entropy are exactly 0 at every environment token, for
    each aggregation, with the entropy bonus, the KL term and decoupled weights on."""
    col = trajectories(seed=1)
    rng = np.random.default_rng(2)
    batch = build_train_batch(col, rng.normal(size=(2, 2)).astype(np.float32), LAYOUT, version=5)
    env = env_positions(batch)
    B, T = batch["tokens"].shape
    logp, old, ref, ent = (jnp.asarray(-rng.uniform(0.1, 3, (B, T)), jnp.float32) for _ in range(4))
    for agg in AGG_MODES:
        cfg = dataclasses.replace(LossConfig(), loss_agg=agg, entropy_coef=0.01, kl_coef=0.1)
        weight = {"weight": jnp.full((B, T), 1.3), "truncated": jnp.zeros((B, T), bool),
                  "nonfinite": jnp.zeros((B, T), bool)}
        f = lambda lp, e: policy_loss(lp, old, jnp.asarray(batch["advantages"]),
                                      jnp.asarray(batch["response_mask"]), cfg, entropy_BxT=e,
                                      ref_logp_BxT=ref, is_weight=weight)[0]
        g_logp, g_ent = jax.grad(f, argnums=(0, 1))(logp, ent)
        assert (np.asarray(g_logp)[env] == 0).all() and (np.asarray(g_ent)[env] == 0).all(), agg
        assert (np.asarray(g_logp)[batch["response_mask"] > 0] != 0).any(), agg


@pytest.mark.slow  # ~12 s: a train step compiled; the zero-gradient test is the quick one
def test_the_update_ignores_what_the_environments_tokens_were_drawn_with():
    """The same update, bit for bit, whatever behaviour log-probs and lags the environment's
    tokens carry (the stream's decoupled objective reads them: rl.max_staleness > 0):
    nothing of theirs but their place in the context reaches the update."""
    config = train.TrainConfig(optim=OptimConfig(lr=1e-3, warmup_steps=0))
    fns = train.make_train_fns(CFG, config)
    params = init_params(CFG, jax.random.key(0))
    adv = np.random.default_rng(3).normal(size=(2, 2)).astype(np.float32)
    out = []
    for garbage in (0.0, -7.5):
        col = trajectories(seed=4)
        for row in col.completions:
            for c in row:
                c.logprobs = [lp if m else garbage for lp, m in zip(c.logprobs, c.policy_mask)]
                c.versions = [v if m else 5 - int(garbage) for v, m in zip(c.versions, c.policy_mask)]
        state = fns.init_state(jax.tree.map(np.copy, params))
        batch = build_train_batch(col, adv, LAYOUT, version=5)
        batch = fns.add_logps(state, fns.shard_batch(batch))
        state, metrics = fns.train_step(state, batch)
        out.append((jax.device_get(state.params), jax.device_get(metrics)))
    jax.tree.map(np.testing.assert_array_equal, out[0][0], out[1][0])
    jax.tree.map(np.testing.assert_array_equal, out[0][1], out[1][1])


# ----------------------------------------------------------------------------- EnvDriver

class EchoEnv(Env):
    """A tool that answers each call with fixed ids (as text '3 5 7'), after `sleep`
    seconds; the episode ends at `max_turns` policy turns."""

    def __init__(self, request, sleep=0.0, max_turns=3):
        self.request, self.sleep, self.max_turns = request, sleep, max_turns
        self.stats, self.done = EpisodeStats(), False

    def step(self, policy_text, policy_tokens=None):
        time.sleep(self.sleep)
        self.stats.turns += 1
        if self.stats.turns >= self.max_turns:
            self.done = True
            turn = Turn("", True, end="max_turns")
        else:
            rng = np.random.default_rng([self.request.prompt_id, self.request.sample_idx,
                                         self.stats.turns])
            ids = rng.integers(200, 500, 2 + self.stats.turns % 3).tolist()
            turn = Turn(" ".join(map(str, ids)), False, tool="echo", tool_seconds=self.sleep)
        self.stats.record(turn)
        return turn


def encode(text):
    return [int(t) for t in text.split()]


@pytest.fixture(scope="module")
def tiny_engines():
    config = preset("tiny").replace(num_layers=1)
    params = random_params(config, seed=5)
    kw = dict(num_slots=4, max_prompt_len=16, max_new_tokens=24, chunk_size=4, num_windows=1,
              max_prefill_rows=2, eos_ids=(7,), turn_end_ids=tuple(range(100, 164)),
              sampling=SamplingConfig(temperature=1.0))
    return params, {"dense": Engine(config, slot_bucketing=False, **kw),
                    "paged": PagedEngine(config, page_size=4, **kw)}


def requests(n=6):
    rng = np.random.default_rng(0)
    return [Request(rng.integers(200, 500, 5 + i % 4).tolist(), prompt_id=i // 2,
                    sample_idx=i % 2) for i in range(n)]


@pytest.mark.parametrize("kind", ["dense", pytest.param("paged", marks=pytest.mark.slow)])
def test_a_trajectory_is_its_turns_and_observations_whatever_the_tools_take(tiny_engines, kind):
    """Six episodes on four slots: each trajectory is its policy turns with the env's
    observations between them (policy_mask 0 there, log-prob 0), its text the policy's
    turns; the same trajectories, token for token, whether the tools answer at once or
    one sleeps (the others decode meanwhile: the sleeper finishes last); log-probs up to
    float rounding (an append prefilled beside another rounds differently)."""
    params, engines = tiny_engines
    outs = []
    for sleepy in (None, 0):
        make = lambda r: EchoEnv(r, sleep=0.5 if r.prompt_id == sleepy else 0.0)
        d = EnvDriver(Driver(engines[kind], params, step_key=3), make, encode)
        order, got = [], {}
        for r in requests():
            d.submit(r)
        while d.busy():
            for c in d.step():
                order.append((c.prompt_id, c.sample_idx))
                got[order[-1]] = c
        outs.append(got)
        stats = d.stats()
        assert stats["extend_calls"] == stats["turns"] - sum(
            c.finish_reason == "length" and c.episode.end == "max_turns" for c in got.values())
        assert stats["trajectories"] == 6 and stats["policy_turns"] == sum(
            c.episode.turns for c in got.values())
        assert stats["policy_tokens"] + stats["env_tokens"] == sum(
            len(c.token_ids) for c in got.values())
        if sleepy is not None:
            assert {o[0] for o in order[-2:]} == {sleepy}, order
            assert stats["sampler_idle_s"] >= 0 and stats["tool_seconds"] >= 0.5
    for key, c in outs[0].items():
        assert (c.token_ids, c.policy_mask) == (outs[1][key].token_ids,
                                                outs[1][key].policy_mask), key
        np.testing.assert_allclose(c.logprobs, outs[1][key].logprobs, atol=1e-5)
    assert sum(c.episode.tool_calls for c in outs[0].values()) >= 3
    for c in outs[0].values():
        assert len(c.token_ids) == len(c.logprobs) == len(c.policy_mask) == len(c.versions)
        assert len(c.token_ids) <= 24
        env_lp = [lp for lp, m in zip(c.logprobs, c.policy_mask) if not m]
        assert env_lp == [0.0] * len(env_lp)
        # policy runs end at a turn-end id before each observation
        for i, m in enumerate(c.policy_mask[1:], 1):
            if c.policy_mask[i - 1] == 1 and m == 0:
                assert 100 <= c.token_ids[i - 1] < 164


def test_env_metrics_are_the_counts_per_trajectory():
    """docs/metrics.md's tool keys from an EnvDriver's counts (one process: the sums are
    the counts)."""
    counts = dict(trajectories=4, with_tool_call=3, policy_turns=9, tool_calls=6,
                  tool_truncated=1, policy_tokens=60, env_tokens=20, tool_seconds=1.5,
                  sampler_idle_s=0.25, tool_error_timeout=2)
    m = env_metrics(counts)
    assert (m["turns_per_trajectory"], m["tool_calls_per_trajectory"], m["tool_call_rate"]) == (
        9 / 4, 6 / 4, 3 / 4)
    assert m["env_token_share"] == 20 / 80 and m["tool_errors_timeout"] == 2
    assert m["tool_errors_bad_call"] == 0 and m["sampler_idle_tools_s"] == 0.25
    assert {f"tool_errors_{k}" for k in ERROR_KINDS} <= set(m)


class ScriptedDriver:
    """A Driver stand-in whose requests write `script[prompt_id]`'s turns in order (the
    first ends at a call: finish_reason "turn"; the last at EOS), one turn a step; records
    each extend's observation. The Driver's calls EnvDriver uses, nothing else."""

    def __init__(self, script):
        self.script, self.seqs, self.observed, self.ready = script, {}, {}, []

    def submit(self, r):
        seq = len(self.seqs)
        self.seqs[seq] = [r, 0]
        self.ready.append(seq)
        return seq

    def step(self):
        out, ready, self.ready = [], self.ready, []
        for seq in sorted(ready):
            r, t = self.seqs[seq]
            text = self.script[r.prompt_id][t]
            last = t == len(self.script[r.prompt_id]) - 1
            out.append(Completion(r.prompt_id, r.sample_idx, [ord(ch) for ch in text], text,
                                  [-1.0] * len(text), "eos" if last else "turn",
                                  r.prompt_tokens, seq=seq, versions=[0] * len(text), turn=t))
            self.seqs[seq][1] += 1
        return out

    def extend(self, seq, ids, max_new_tokens=None):
        self.observed.setdefault(seq, []).append("".join(map(chr, ids)))
        self.ready.append(seq)

    def end(self, seq):
        pass

    def busy(self):
        return bool(self.ready)

    def decoding(self):
        return bool(self.ready)

    def head(self):
        return None

    def max_new(self, request):
        return 10**8

    def stats(self):
        return {}


BAD = {  # kind -> (a policy turn that calls badly, what its observation says)
    "bad_call": ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>',
                 "error"),
    "unknown_tool": ('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',
                     "there is no tool 'search'"),
    "timeout": ("<tool_call>" + json.dumps({"name": "python", "arguments": {
        "code": "while True:\n    pass"}}) + "</tool_call>", "ran past"),
    "error": ("<tool_call>" + json.dumps({"name": "python", "arguments": {"code": "1/0"}})
              + "</tool_call>", "ZeroDivisionError"),
    "forbidden": ("<tool_call>" + json.dumps({"name": "python", "arguments": {
        "code": "import collections\ncollections._sys.modules['os'].fork()"}}) + "</tool_call>",
        "not allowed"),
    "write_outside": ("<tool_call>" + json.dumps({"name": "python", "arguments": {
        "code": "open('/tmp/ada_escape.txt', 'w').write('x')"}}) + "</tool_call>",
        "outside the working folder"),
    "truncated": ("<tool_call>" + json.dumps({"name": "python", "arguments": {
        "code": "print('x' * 10**7)"}}) + "</tool_call>", "x" * 100),
}


def test_every_bad_tool_call_is_an_observation_and_the_trajectories_finish():
    """Malformed JSON, an unknown tool, a timeout, an exception, a fork, a write outside its
    folder and a 10 MB print, each in one episode beside the others: the policy reads an
    error (or the cut output) and answers, every trajectory finishes, each counted by kind
    in the step's metrics; nothing raises out of the driver."""
    kinds = list(BAD)
    script = {i: [BAD[k][0], " = 408"] for i, k in enumerate(kinds)}
    inner = ScriptedDriver(script)
    env = EnvConfig(tools="calculator,python", tool_format="qwen", tool_timeout_s=1.0,
                    max_tool_output_tokens=256)
    d = EnvDriver(inner, lambda r: ToolEnv({}, None, env), lambda text: [ord(c) for c in text])
    for i in range(len(kinds)):
        d.submit(Request([1, 2, 3], prompt_id=i))
    done = {}
    while d.busy():
        done.update({c.prompt_id: c for c in d.step()})
    assert sorted(done) == list(range(len(kinds)))
    for i, kind in enumerate(kinds):
        c, (obs,) = done[i], inner.observed[i]
        assert BAD[kind][1] in obs, (kind, obs[:300])
        assert c.finish_reason == "eos" and c.text == BAD[kind][0] + " = 408"
        want = {} if kind == "truncated" else {"forbidden" if kind == "write_outside" else kind: 1}
        assert dict(c.episode.errors) == want and c.episode.truncated == (kind == "truncated")
    m = env_metrics(d.stats())
    assert m["tool_errors_forbidden"] == 2 and m["tool_outputs_truncated"] == 1
    assert all(m[f"tool_errors_{k}"] == 1 for k in ("bad_call", "unknown_tool", "timeout", "error"))
    assert m["tool_call_rate"] == 1 and m["turns_per_trajectory"] == 2
