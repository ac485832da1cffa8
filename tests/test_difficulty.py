"""Pass-rate sampling through the engine (ada.data.difficulty) and its resumable CLI.

One tiny random Qwen2 saved as a Hugging Face directory, with a SentencePiece tokenizer
trained offline into it (58 tokens < the model's 128 rows, so the sampler also meets ids
the tokenizer does not know). The reward is a pure function of the response text, so
every reward the sampler returns is checked against completions drawn independently with
the Driver.
"""

import json
import re

import numpy as np
import pytest
from tiny_hf import make_tiny_hf

from ada.data import difficulty
from ada.data.difficulty import engine_sample_fn, make_engine, prompt_id_for
from ada.models.hf import load_hf
from ada.sampling.driver import Driver, Request
from ada.templates import encode_prompt, render_prompt
from ada.tokenizer import load_tokenizer, train_sentencepiece

MAX_PROMPT = 32
MAX_NEW = 6
SLOTS = 8


def expected_reward(text: str) -> float:
    """What parity_reward scores (its exceptions count as 0)."""
    return 0.0 if len(text) % 3 == 0 else float(len(text) % 2 == 0)


def parity_reward(record, text):
    """1 iff the response has an even number of characters; raises on multiples of 3 (the
    sampler must score those 0, not crash)."""
    if len(text) % 3 == 0:
        raise RuntimeError("a reward that breaks its contract")
    return float(len(text) % 2 == 0)


def problems(n, start=0):
    return [{"id": f"p{i}", "problem": f"What is {3 * i + 1} + {i + 2}?",
             "answer": str(4 * i + 3)} for i in range(start, start + n)]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    d = tmp_path_factory.mktemp("policy")
    make_tiny_hf("qwen2", d, vocab_size=128, seed=1)
    texts = [render_prompt("plain", r["problem"]) + " " + r["answer"] for r in problems(60)]
    train_sentencepiece(texts, 64, d / "tokenizer.model")
    tok = load_tokenizer(d)
    params, cfg = load_hf(d)
    assert tok.vocab_size < cfg.vocab_size
    engine = make_engine(cfg, tok, max_prompt_tokens=MAX_PROMPT, max_new_tokens=MAX_NEW,
                         num_slots=SLOTS)
    return d, tok, params, cfg, engine


def reference(engine, params, tok, records, k, step_key):
    """Completions drawn straight from the Driver, and their rewards."""
    reqs = [Request(encode_prompt(tok, "plain", r["problem"]), prompt_id_for(r), j)
            for r in records for j in range(k)]
    outs = Driver(engine, params, step_key=step_key).generate_all(reqs)  # no detokenizer
    ids = [c.token_ids for c in outs]
    texts = [tok.decode([t for t in c.token_ids if t < tok.vocab_size]) for c in outs]
    rewards = np.array([expected_reward(t) for t in texts]).reshape(len(records), k)
    return ids, rewards


def test_sample_fn_rewards_match_independent_completions(policy):
    _, tok, params, _, engine = policy
    recs, k = problems(3), 4
    sampler = engine_sample_fn(engine, params, tok, "plain", parity_reward,
                               max_prompt_tokens=MAX_PROMPT, step_key=7)
    rewards = sampler(recs, k)
    assert rewards.shape == (3, 4) and rewards.dtype == np.float64
    ref_ids, ref_rewards = reference(engine, params, tok, recs, k, 7)
    np.testing.assert_array_equal(rewards, ref_rewards)
    got_ids = [c.token_ids for row in sampler.last_completions for c in row]
    assert got_ids == ref_ids
    texts = [c.text for row in sampler.last_completions for c in row]
    assert sampler.reward_failures == sum(len(t) % 3 == 0 for t in texts) > 0
    assert 0 < rewards.sum() < rewards.size  # the check can tell rows apart
    assert any(t >= tok.vocab_size for i in got_ids for t in i)  # padded ids decode to nothing

    # Deterministic given step_key; another key draws other responses.
    again = engine_sample_fn(engine, params, tok, "plain", parity_reward,
                             max_prompt_tokens=MAX_PROMPT, step_key=7)
    np.testing.assert_array_equal(again(recs, k), rewards)
    assert [c.token_ids for row in again.last_completions for c in row] == got_ids
    other = engine_sample_fn(engine, params, tok, "plain", parity_reward,
                             max_prompt_tokens=MAX_PROMPT, step_key=8)
    other(recs, k)
    assert [c.token_ids for row in other.last_completions for c in row] != got_ids
    # A prompt's draws follow its id, not its position in the chunk (what resume relies on).
    alone = again(recs[2:], k)
    np.testing.assert_array_equal(alone, rewards[2:])
    assert [c.token_ids for c in again.last_completions[0]] == got_ids[2 * k:]
    assert (sampler.calls, sampler.prompts_sampled) == (1, 3)


def test_sample_fn_refuses_long_prompts_and_bad_settings(policy):
    _, tok, params, _, engine = policy
    sampler = engine_sample_fn(engine, params, tok, "plain", parity_reward, max_prompt_tokens=16)
    long = {"id": "long-one", "problem": "What is " + " + ".join(["12"] * 10) + "?", "answer": "1"}
    with pytest.raises(ValueError, match=r"record 'long-one'.*max_prompt_tokens=16.*filter_by_length"):
        sampler(problems(1) + [long], 2)
    assert sampler.calls == 0
    with pytest.raises(ValueError, match="k=0"):
        sampler(problems(1), 0)
    with pytest.raises(ValueError, match="exceeds the engine's largest prompt bucket"):
        engine_sample_fn(engine, params, tok, "plain", parity_reward, max_prompt_tokens=64)
    with pytest.raises(ValueError, match="single token"):  # ChatML markers are not in this vocab
        engine_sample_fn(engine, params, tok, "qwen25_math", parity_reward,
                         max_prompt_tokens=MAX_PROMPT)


# ----------------------------------------------------------------------------- CLI


def write_input(path):
    recs = problems(4)
    rows = recs + [
        {"id": "dup", "problem": "what is  1 + 2 ?", "answer": "3"},  # p0, respaced
        {"id": "badgold", "problem": "Broken gold.", "answer": "\\frac{"},
        {"id": "toolong", "problem": "What is " + " + ".join(["7"] * 30) + "?", "answer": "210"},
    ]
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return recs


def cli_args(d, inp, out, *extra):
    return ["--input", str(inp), "--output", str(out), "--model", str(d), "--k", "4",
            "--preset", "hard", "--max-pass-rate", "0.5", "--template", "plain",
            "--max-new-tokens", str(MAX_NEW), "--max-prompt-tokens", str(MAX_PROMPT),
            "--num-slots", str(SLOTS), "--seed", "3",
            "--reward", "test_difficulty:parity_reward", *extra]


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_cli_filters_caches_and_resumes(policy, tmp_path, capsys, monkeypatch):
    d, tok, params, _, engine = policy
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    recs = write_input(inp)
    assert difficulty.main(cli_args(d, inp, out)) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cache = tmp_path / "out.jsonl.passrates.jsonl"
    assert summary["cache"] == str(cache) and summary["prompts_sampled"] == 4
    entries = {e["id"]: e for e in read_jsonl(cache)}
    assert sorted(entries) == ["p0", "p1", "p2", "p3"]

    # The cached rewards are the engine sampler's on the same prompts (same seed, template).
    _, ref = reference(engine, params, tok, recs, 4, 3)
    np.testing.assert_array_equal([entries[r["id"]]["rewards"] for r in recs], ref)
    # hard preset, max pass rate overridden: solved at least once and pass rate <= 0.5.
    keep = [r["id"] for r, row in zip(recs, ref, strict=True) if 1 <= (row >= 0.5).sum() <= 2]
    assert 0 < len(keep) < 4
    kept = read_jsonl(out)
    assert [r["id"] for r in kept] == keep
    assert all(r["pass_rate"] == entries[r["id"]]["pass_rate"] for r in kept)
    assert {k: summary[k] for k in ("input", "too_long", "duplicates", "unparseable", "filtered",
                                    "kept")} == {"input": 7, "too_long": 1, "duplicates": 1,
                                                 "unparseable": 1, "filtered": 4 - len(keep),
                                                 "kept": len(keep)}

    # Rerun with the full cache: the engine is never asked for a response.
    def no_engine(self, requests):
        raise AssertionError("the engine was called although every prompt is cached")

    with monkeypatch.context() as m:
        m.setattr(Driver, "generate_all", no_engine)
        out.unlink()
        assert difficulty.main(cli_args(d, inp, out)) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["prompts_sampled"] == 0 and read_jsonl(out) == kept

    # Killed after the first prompt's line: the rerun samples only the other three and
    # ends where the uninterrupted run did.
    lines = cache.read_text().splitlines(keepends=True)
    cache.write_text(lines[0])
    asked = []
    real = Driver.generate_all

    def counting(self, requests):
        asked.extend(sorted({r.prompt_id for r in requests}))
        return real(self, requests)

    with monkeypatch.context() as m:
        m.setattr(Driver, "generate_all", counting)
        assert difficulty.main(cli_args(d, inp, out)) == 0
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    first = json.loads(lines[0])["id"]
    assert resumed["prompts_sampled"] == 3
    assert sorted(asked) == sorted(prompt_id_for(r) for r in recs if r["id"] != first)
    assert read_jsonl(out) == kept
    assert {e["id"]: e for e in read_jsonl(cache)} == entries

    # Another seed (or policy, template, ...) must not reuse these rates.
    assert difficulty.main(cli_args(d, inp, out, "--seed", "4")) == 2  # last flag wins
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and re.search(r"error: pass-rate cache .*other settings \(seed: 3 then, 4 now\)", err), err


@pytest.mark.parametrize("change,message", [
    ({"--input": "missing.jsonl"}, r"--input .*missing\.jsonl: no such file"),
    ({"--k": "0"}, r"--k must be >= 1 \(got 0\)"),
    ({"--model": "no_such_model_dir"}, r"--model .*no_such_model_dir: no such directory"),
    ({"--max-pass-rate": "1.5"}, r"max_pass_rate \(1\.5\) <= 1"),
])
def test_cli_bad_input_is_one_line(policy, tmp_path, capsys, change, message):
    d = policy[0]
    inp = tmp_path / "in.jsonl"
    write_input(inp)
    args = cli_args(d, inp, tmp_path / "out.jsonl")
    for flag, value in change.items():
        args[args.index(flag) + 1] = str(tmp_path / value) if "missing" in value or "no_such" in value else value
    assert difficulty.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert re.search(message, err[0]), err[0]
    assert not (tmp_path / "out.jsonl").exists()


def test_cli_workdir_without_config_is_refused(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    write_input(inp)
    assert difficulty.main(["--input", str(inp), "--output", str(tmp_path / "o.jsonl"),
                            "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "config.json not found" in err and "\n" not in err


def test_cli_workdir_samples_with_the_latest_checkpoint(tmp_path, capsys):
    """--workdir rebuilds the run (tokenizer, model config, template) and samples with the
    params of its latest checkpoint, not the run's initial ones."""
    import os

    import jax

    from ada import config as C
    from ada import setup
    from ada.checkpoint import Checkpointer
    from ada.data.iterator import PromptIterator
    from ada.loop import state_tree
    from ada.models import init_params

    default = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "configs", "default.py")
    cfg = C.build_config(default, [
        ("data.num_train", "40"), ("data.num_eval", "4"), ("data.prompts_per_step", "4"),
        ("warmstart.enabled", "false"),
        ("warmstart.cache_dir", str(tmp_path / "cache")), ("sampling.max_new_tokens", str(MAX_NEW)),
    ])
    wd = tmp_path / "run"
    wd.mkdir()
    with open(wd / "config.json", "w") as f:  # as ada.loop.train writes it
        json.dump(cfg.to_dict(), f, indent=2, sort_keys=True, default=str)
    run = setup.build(cfg)
    state = run.fns.init_state(run.params)
    trained = init_params(run.model_cfg, jax.random.key(123))  # stands in for a later step
    ckpt = Checkpointer(str(wd / "checkpoints"))
    ckpt.save(5, state_tree(state.replace(params=trained), jax.random.key_data(jax.random.key(0))),
              {"data": PromptIterator(run.train_records, 4).get_state()})
    ckpt.close()

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    recs = problems(4)
    with open(inp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    argv = ["--input", str(inp), "--output", str(out), "--workdir", str(wd), "--k", "4",
            "--max-pass-rate", "1", "--no-require-one-correct", "--num-slots", str(SLOTS),
            "--seed", "3", "--reward", "test_difficulty:parity_reward"]
    assert difficulty.main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["policy"] == f"run {wd} step 5" and summary["kept"] == 4
    cached = np.array([e["rewards"] for e in read_jsonl(summary["cache"])])

    engine = make_engine(run.model_cfg, run.tokenizer, max_prompt_tokens=cfg.data.max_prompt_len,
                         max_new_tokens=MAX_NEW, num_slots=SLOTS)
    tok = run.tokenizer
    _, from_ckpt = reference(engine, trained, tok, recs, 4, 3)
    _, from_init = reference(engine, run.params, tok, recs, 4, 3)
    np.testing.assert_array_equal(cached, from_ckpt)
    assert not np.array_equal(cached, from_init)
