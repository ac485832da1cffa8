"""The embedded tool task (configs/tools.py): its records and split, the tokenizer's markers
(single pieces only in a run with tools), turn_end_ids, the warm start's traces with the
observation masked out of the loss, and the default run's warm start left as it was."""

import hashlib
import json
from fractions import Fraction

import jax
import numpy as np
import pytest

from ada import config as C
from ada import warmstart
from ada.data.encode import encode_records
from ada.data.synthetic import ARITHMETIC_LEVELS, TOOL_MIX, make_dataset, split_of
from ada.data.task import load_task
from ada.envs import EnvConfig, ToolEnv
from ada.envs.tokens import markers, run_format, turn_end_ids
from ada.errors import ConfigError
from ada.models import init_params, preset
from ada.rewards import get_reward_fn
from ada.rewards.tasks import parse_expression
from ada.run.policy import initial_params, load_tokenizer_for, model_config_for
from ada.templates import render_prompt
from ada.tokenizer import synthetic_tokenizer, train_sentencepiece

TAGS = ("<calc>", "</calc>", "<out>", "</out>")
ENV = EnvConfig(tools="calculator", tool_format="tags", max_turns=2)


def records(n=120, split="train"):
    return make_dataset("arithmetic", n, seed=0, difficulty_mix=TOOL_MIX, split=split)


def texts_of(recs):
    return [render_prompt("plain", r["problem"]) + " " + r["answer"] for r in recs]


@pytest.fixture(scope="module")
def tools_tok(tmp_path_factory):
    return synthetic_tokenizer(texts_of(records()), 96, tmp_path_factory.mktemp("tok"),
                               markers("tags"))


def test_records_are_deterministic_past_the_head_and_split_by_hash():
    train, test = records(), records(40, "test")
    assert train == records() and test == records(40, "test")
    assert {r["difficulty"] for r in train} == set(TOOL_MIX)
    assert not {r["expression"] for r in train} & {r["expression"] for r in test}
    for r in train + test:
        assert set(r) >= {"id", "problem", "answer", "task", "difficulty", "split"}
        level = ARITHMETIC_LEVELS[r["difficulty"]]
        operands = r["expression"].replace("*", "+").split("+")
        assert len(operands) == level.num_operands
        assert Fraction(r["answer"]) == parse_expression(r["expression"]).value
        assert split_of(f"arithmetic:{r['expression']}") == r["split"]
    reward = get_reward_fn("arithmetic")
    r = train[0]  # the policy's text: its call, then '=' and the copied answer (no <out>)
    assert reward(r, f" <calc>{r['expression']}</calc> = {r['answer']}") == 1.0
    assert reward(r, f" <calc>{r['expression']}</calc>") == 0.0
    assert reward(r, f" {r['answer']}") == 1.0


def test_markers_are_single_pieces_only_in_a_tool_tokenizer(tools_tok, tmp_path):
    texts = texts_of(records())
    for m in TAGS:
        i = tools_tok.token_to_id(m)
        assert i is not None and i in tools_tok.encode(f"12{m}34")
        assert tools_tok.decode([i]) == m
    plain = synthetic_tokenizer(texts, 96, tmp_path)
    assert [plain.token_to_id(m) for m in TAGS] == [None] * 4
    # without markers: today's file under today's name (ada/run/policy.py's cache)
    h = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]
    assert plain.path == str(tmp_path / f"sp-96-{h}.model")
    today = train_sentencepiece(texts, 96, tmp_path / "today" / "sp.model")
    assert open(plain.path, "rb").read() == open(today.path, "rb").read()
    assert synthetic_tokenizer(texts, 96, tmp_path, markers("tags")).path != plain.path


def test_turn_end_ids_are_the_markers_or_one_line_naming_the_knob(tools_tok, tmp_path):
    stops = run_format("tags").stops
    assert turn_end_ids(tools_tok, stops, "tags") == tuple(tools_tok.token_to_id(s) for s in stops)
    plain = synthetic_tokenizer(texts_of(records()), 96, tmp_path)
    with pytest.raises(ConfigError, match=r"env.tool_format='tags'.*'</calc>' is \d+ tokens") as e:
        turn_end_ids(plain, stops, "tags")
    assert "\n" not in str(e.value)


def traces(tok, n=60, call=0.4, wrong=0.2):
    recs, _ = encode_records(records(n), tok, "plain", 64)
    return recs, warmstart.tool_examples(recs, tok, warmstart.ToolTraces(ENV, n, call, wrong), 0)


def test_tool_warm_start_holds_the_three_traces_with_the_observation_masked(tools_tok):
    recs, ex = traces(tools_tok)
    calc, eos = tools_tok.token_to_id("<calc>"), tools_tok.eos_id
    kinds = []
    for r, (prompt, target, mask) in zip(recs, ex, strict=True):
        assert prompt == r["prompt_tokens"] and len(mask) == len(target) and target[-1] == eos
        if calc not in target:
            assert set(mask) == {1} and tools_tok.decode(target).strip() != r["answer"]
            kinds.append("no_call")
            continue
        # the observation exactly as a ToolEnv writes it and the env driver encodes it
        call = f" <calc>{r['expression']}</calc>"
        obs = tools_tok.encode(ToolEnv(r, None, ENV, tokenizer=tools_tok).step(call).observation)
        turn = tools_tok.encode(call)
        assert obs == tools_tok.encode(f"<out>{r['answer']}</out>")
        assert target[: len(turn) + len(obs)] == turn + obs
        assert mask == [1] * len(turn) + [0] * len(obs) + [1] * (len(target) - len(turn) - len(obs))
        copy = tools_tok.decode(target[len(turn) + len(obs):]).removeprefix(" = ")
        assert len(copy) == len(r["answer"])
        kinds.append("call" if copy == r["answer"] else "wrong_copy")
    assert [kinds.count(k) for k in ("call", "wrong_copy", "no_call")] == [24, 12, 24]
    assert ex == traces(tools_tok)[1]  # deterministic


@pytest.mark.slow  # ~8 s under load: a warm start compiled
def test_a_tiny_tool_warm_start_trains_nothing_on_the_observation(tools_tok):
    _, ex = traces(tools_tok, 16)
    T = max(len(p) + len(t) for p, t, _ in ex)
    tokens, _, loss_mask = warmstart._batch(ex, tools_tok.pad_id, T)
    out = [tools_tok.token_to_id(m) for m in ("<out>", "</out>")]
    assert loss_mask[np.isin(tokens, out)].sum() == 0  # never taught to write tool output
    for i, (prompt, target, mask) in enumerate(ex):
        np.testing.assert_array_equal(loss_mask[i, len(prompt): len(prompt) + len(target)], mask)
        assert loss_mask[i, : len(prompt)].sum() == 0
    cfg = preset("tiny", vocab_size=tools_tok.vocab_size)
    params, loss = warmstart.supervised_train(init_params(cfg, jax.random.key(0)), cfg, ex,
                                              steps=3, batch_size=8, lr=3e-3, seed=0,
                                              pad_id=tools_tok.pad_id)
    assert np.isfinite(loss)


def test_the_default_runs_warm_start_keys_and_examples_are_unchanged(tmp_path, monkeypatch):
    """The keys and examples of the default run's two phases (on 64 records) as they were
    before tool runs (commit f26c357): the default tokenizer and warm start are untouched."""
    c = C.build_config("configs/default.py", [("data.num_train", "64"), ("data.num_eval", "8"),
                                              ("warmstart.cache_dir", str(tmp_path))])
    C.validate(c)
    task = load_task(c)
    tok = load_tokenizer_for(c, task)
    recs, _ = encode_records(task.train, tok, c.tokenizer.template, c.data.max_prompt_len)
    seen = []

    def fake_warm_start(model_cfg, examples, *, key_parts, **kw):
        flat = json.dumps([[list(map(int, part)) for part in e] for e in examples])
        seen.append((key_parts, hashlib.sha256(flat.encode()).hexdigest()[:16]))
        return {}, {"cached": True}

    monkeypatch.setattr(warmstart, "warm_start", fake_warm_start)
    initial_params(c, model_config_for(c, tok), tok, task, recs)
    assert seen == [("5e74a63443054a10", "d836f2697f900af3"),
                    ("2fac18512dc61246", "0c9869f1262009d8")]
