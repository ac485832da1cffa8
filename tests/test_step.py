"""One RL step (ada/step.py): the README's library example computes the advantages the
step trains on, for every method, and the step's metrics mean what they say."""

import itertools
import os
import re

import jax
import numpy as np
import pytest

from ada import config as C
from ada import step
from ada.adaptive.simulate import SimulatedDriver, SimulatedPolicy, prompt_stream, sim_reward
from ada.methods import METHODS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")


def readme_example() -> str:
    """The Python block of the README's 'The method as a library' section."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index("## The method as a library"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("method", list(METHODS))
def test_readme_example_advantages_equal_the_steps(method, monkeypatch):
    """Run the README's snippet for `method`, then hand its collected batch to rl_step as the
    runner calls it (configs/default.py:method) and catch the advantages it builds the train
    batch from: they must be the same numbers."""
    stream = prompt_stream("skewed", seed=3)
    prompts = list(itertools.islice(stream, 8))
    my_driver = SimulatedDriver(SimulatedPolicy(seed=1), num_slots=8)
    code = readme_example().replace('method = "ada_balance"', f"method = {method!r}")
    scope = dict(reward_fn=sim_reward, my_driver=my_driver, prompts=prompts,
                 key=jax.random.key(0), more=stream)
    exec(compile(code, "README.md", "exec"), scope)
    collected, readme_adv = scope["batch"], scope["adv"]

    cfg = C.build_config(f"{DEFAULT}:{method}")
    captured = {}

    def spy(collected, adv_PxN, *layout_and_lengths, **version):
        captured["adv"] = adv_PxN
        raise _Stop

    class Rollout:
        def collect(self, params, prompts, key, more_prompts=None, caps=None):
            return collected

    class State:
        params = None

    monkeypatch.setattr(step, "build_train_batch", spy)
    with pytest.raises(_Stop):
        step.rl_step(State(), prompts, jax.random.key(0), rollout=Rollout(), fns=None,
                     method=cfg.method, layout=None, normalize_std=cfg.adaptive.normalize_std)
    np.testing.assert_array_equal(captured["adv"], readme_adv)
    # and the normalisation is the method's: GRPO-style divides by the std, Ada does not
    if METHODS[method].normalize_std and collected.mixed.any():
        p = int(np.argmax(collected.mixed))
        assert np.std(readme_adv[p], ddof=1) == pytest.approx(1.0, abs=1e-3)


def test_rl_step_hands_its_caps_to_the_collection(monkeypatch):
    """A budget split's per-prompt caps reach the collection (dropping them would sample
    M x N a prompt, as if allocation=none)."""
    got = {}

    class Rollout:
        def collect(self, params, prompts, key, more_prompts=None, caps=None):
            got["caps"] = caps
            raise _Stop

    class State:
        params = None

    with pytest.raises(_Stop):
        step.rl_step(State(), [{}, {}], jax.random.key(0), rollout=Rollout(), fns=None,
                     method="ada_knapsack", layout=None, caps=np.array([2, 7]))
    assert got["caps"].tolist() == [2, 7]


def test_update_effect_equals_numpy():
    """The update diagnostics against a float64 NumPy reference."""
    rng = np.random.default_rng(0)
    before, after = rng.normal(size=12), rng.normal(size=12)
    adv = np.array([0.5, -0.2, 0.0, 0.7, -0.4, -0.1, 0.0, 0.3, -0.3, 0.2, -0.6, 0.0])
    mask = (rng.random((12, 7)) < 0.6).astype(np.float32)
    got = jax.device_get(step._update_effect(np.float32(before), np.float32(after),
                                             np.float32(adv), mask))
    change, pos, neg = after - before, adv > 0, adv < 0
    want = {"adv_pos_mean": adv[pos].mean(), "adv_neg_mean": adv[neg].mean(),
            "logp_change_pos": change[pos].mean(), "logp_change_neg": change[neg].mean(),
            "update_kl": -change.sum() / mask.sum()}
    assert set(got) == set(want)
    for k, v in want.items():
        assert float(got[k]) == pytest.approx(v, rel=1e-5, abs=1e-6), k
