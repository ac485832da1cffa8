"""Setup pieces that shape what a run trains on: the warm start's (noisy) teacher and the
pass-rate filter behind the easy / hard prompt sets."""

import collections
import hashlib
import types

import pytest

from ada import config as C
from ada import warmstart
from ada.config import ConfigError
from ada.data.encode import encode_records
from ada.data.task import Task, load_task
from ada.run.passrates import filter_by_pass_rate
from ada.run.policy import initial_params, load_tokenizer_for, model_config_for


class CharTokenizer:
    eos_id = 0

    def encode(self, text):
        return [ord(ch) for ch in text]


def arithmetic_task(records):
    return Task(records, [], None, lambda r: " " + r["answer"], "arithmetic")


def test_noisy_teacher_answers_near_misses_in_the_stated_share():
    records = [{"id": f"r{i}", "answer": a, "prompt_tokens": [i]}
               for i, a in enumerate(["7", "-3", "120", "0"])]
    tok, task = CharTokenizer(), arithmetic_task(records)
    exact = warmstart.examples(records, task, tok, 0.0, seed=0)
    assert exact == [([i], tok.encode(" " + r["answer"]) + [0]) for i, r in enumerate(records)]

    noisy = warmstart.examples(records, task, tok, 0.6, seed=0)
    by_prompt = collections.defaultdict(list)
    for prompt, target in noisy:
        by_prompt[prompt[0]].append("".join(map(chr, target[:-1])).strip())
    for i, r in enumerate(records):
        answers = by_prompt[i]
        assert len(answers) == warmstart.TEACHER_COPIES
        assert answers.count(r["answer"]) == 2  # round((1 - 0.6) * 5)
        misses = sorted(int(a) - int(r["answer"]) for a in answers if a != r["answer"])
        assert len(set(misses)) == 3 and set(misses) <= set(warmstart.NEAR_MISSES)
    assert noisy == warmstart.examples(records, task, tok, 0.6, seed=0)


def test_teacher_noise_is_validated():
    c = C.build_config("configs/default.py", [("warmstart.teacher_noise", "1.0")])
    with pytest.raises(ConfigError, match="warmstart.teacher_noise"):
        C.validate(c)
    c = C.build_config("configs/default.py", [("data.source", "countdown"),
                                              ("warmstart.teacher_noise", "0.5")])
    with pytest.raises(ConfigError, match="only for data.source=arithmetic"):
        C.validate(c)
    c.warmstart.enabled = False  # no warm start, nothing for the noise to act on
    C.validate(c)
    for noise, steps in (("0.6", "0"), ("0.0", "500")):
        c = C.build_config("configs/default.py", [("warmstart.teacher_noise", noise),
                                                  ("warmstart.noise_steps", steps)])
        with pytest.raises(ConfigError, match="needs both"):
            C.validate(c)


@pytest.mark.slow
def test_noisy_teacher_phase_continues_from_the_cached_exact_phase(tmp_path):
    import jax
    import numpy as np

    from ada import warmstart

    def start(noise, noise_steps):
        c = C.build_config("configs/default.py", [
            ("data.num_train", "64"), ("warmstart.steps", "4"), ("warmstart.batch_size", "8"),
            ("warmstart.teacher_noise", noise), ("warmstart.noise_steps", noise_steps),
            ("warmstart.cache_dir", str(tmp_path))])
        C.validate(c)
        task = load_task(c)
        tok = load_tokenizer_for(c, task)
        records, _ = encode_records(task.train, tok, c.tokenizer.template,
                                          c.data.max_prompt_len)
        model_cfg = model_config_for(c, tok)
        return c, task, tok, records, model_cfg, initial_params(c, model_cfg, tok, task,
                                                                      records)

    c, task, tok, records, model_cfg, (exact, _) = start("0.0", "0")
    _, _, _, _, _, (noisy, info) = start("0.6", "3")
    assert not info["cached"]
    fresh_hash = info["sha256"]
    assert len(list((tmp_path / "warmstart").glob("*.msgpack"))) == 2  # exact phase shared
    w = c.warmstart
    expected, _ = warmstart.supervised_train(
        exact, model_cfg, warmstart.examples(records, task, tok, 0.6, w.seed), steps=3,
        batch_size=8, lr=w.noise_lr, seed=w.seed + 1, pad_id=tok.pad_id)
    _, _, _, _, _, (again, info) = start("0.6", "3")
    assert info["cached"] and info["sha256"] == fresh_hash  # the content hash of the same bytes
    assert info["sha256"] == hashlib.sha256(open(info["path"], "rb").read()).hexdigest()[:16]
    for a, b, d in zip(jax.tree.leaves(noisy), jax.tree.leaves(expected),
                       jax.tree.leaves(again), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(d))


class FakeRollout:
    """Prompt i's j-th draw is right iff j < its number of correct draws; counts calls."""

    def __init__(self, correct_of):
        self.correct_of, self.calls = correct_of, 0

    def reward(self, record, text):
        return float(text == "right")

    def sample(self, params, records, k, key, prompt_ids):
        self.calls += 1
        return [[types.SimpleNamespace(text="right" if j < self.correct_of[r["id"]] else "wrong")
                 for j in range(k)] for r in records]


def test_pass_rate_filter_keeps_the_range_and_caches(tmp_path):
    k = 8
    records = [{"id": f"p{i}", "problem": f"q{i}", "answer": "a"} for i in range(40)]
    correct_of = {r["id"]: i % (k + 1) for i, r in enumerate(records)}
    c = C.build_config("configs/default.py", [
        ("data.pass_rate_range", "(0.25, 0.5)"), ("data.pass_rate_samples", str(k)),
        ("data.prompts_per_step", "4"), ("warmstart.cache_dir", str(tmp_path))])
    rollout = FakeRollout(correct_of)
    warm = {"path": "warm.msgpack", "sha256": "0123456789abcdef"}
    kept = filter_by_pass_rate(c, records, None, None, rollout, warm)
    assert [r["id"] for r in kept] == [r["id"] for r in records
                                       if 0.25 <= correct_of[r["id"]] / k <= 0.5]
    calls = rollout.calls
    again = filter_by_pass_rate(c, records, None, None, rollout, warm)
    assert [r["id"] for r in again] == [r["id"] for r in kept] and rollout.calls == calls
    # the same warm-start file retrained to other bytes (another CPU): its pass rates are drawn
    filter_by_pass_rate(c, records, None, None, rollout, dict(warm, sha256="fedcba9876543210"))
    assert rollout.calls == calls + 1

    c.data.prompts_per_step = len(kept) + 1
    with pytest.raises(ConfigError, match="widen the range"):
        filter_by_pass_rate(c, records, None, None, rollout, warm)
