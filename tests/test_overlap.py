"""Overlap changes when work runs, never what it computes: with a round's responses scored
while the engine decodes on (adaptive.overlap_scoring), the RL steps give the same
parameters and metrics, bit for bit, as scoring each round at its end."""

import jax
import numpy as np
import pytest

from ada.adaptive.collect import Collector
from ada.methods import collect_config
from ada.models import init_params, preset
from ada.rl.batch import BatchLayout
from ada.rl.train import TrainConfig, make_train_fns
from ada.rollout import Rollout
from ada.sampling.engine import Engine
from ada.sampling.samplers import SamplingConfig
from ada.step import rl_step

CFG = preset("tiny", vocab_size=64)
NEW = 6


class IdText:
    def decode(self, ids, skip_special=True):
        return " ".join(map(str, ids))


def reward(record, text):
    """Deterministic in the text, mixed across responses, and failing for some."""
    s = sum(map(int, text.split()))
    if s % 11 == 0:
        raise RuntimeError("a reward that fails")
    return float(s % 3 == record["r"])


@pytest.fixture(scope="module")
def engine():
    return Engine(CFG, num_slots=16, max_prompt_len=8, max_new_tokens=NEW, chunk_size=2,
                  sampling=SamplingConfig(temperature=1.0), eos_ids=(3,))


def run(engine, overlap: bool, method: str, steps: int = 2):
    cc = collect_config(method, n=4, samples_per_round=4, max_rounds=3, positive_threshold=0.5,
                        overlap_scoring=overlap)
    rollout = Rollout(engine, IdText(), cc, reward)
    fns = make_train_fns(CFG, TrainConfig())
    state = fns.init_state(init_params(CFG, jax.random.key(0)))
    layout = BatchLayout(prompt_len=engine.max_prompt_len, response_len=NEW, pad_id=0)
    rng = np.random.default_rng(0)
    prompts = [dict(prompt_tokens=rng.integers(4, 64, 5).tolist(), r=i % 3) for i in range(4)]
    metrics = []
    for s in range(steps):
        state, m, _ = rl_step(state, prompts, jax.random.key(s), rollout=rollout, fns=fns,
                              method=method, layout=layout)
        metrics.append({k: v for k, v in m.items() if not k.startswith("time_")})
    return jax.device_get(state.params), metrics


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ada_balance", "grpo"])
def test_overlap_scoring_is_bit_identical(engine, method, monkeypatch):
    calls = []
    score = Collector._score
    monkeypatch.setattr(Collector, "_score", lambda self, *a: calls.append(1) or score(self, *a))
    params_off, metrics_off = run(engine, False, method)
    rounds = len(calls)
    params_on, metrics_on = run(engine, True, method)
    assert len(calls) - rounds > rounds, "overlap should score each driver step's responses"
    assert metrics_on == metrics_off
    assert any(m["reward_failures"] for m in metrics_on)
    for a, b in zip(jax.tree.leaves(params_on), jax.tree.leaves(params_off), strict=True):
        np.testing.assert_array_equal(a, b)
