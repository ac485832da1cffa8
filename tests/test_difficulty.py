"""Pass rates through the engine (`ada.evaluation.pass_rates`) and the resumable difficulty
command (`ada.cli.difficulty`, run as `python -m ada.data.difficulty`).

Two policies:

* a tiny random Qwen2 saved as a Hugging Face directory, with a SentencePiece tokenizer
  trained offline into it (fewer tokens than the model's 128 rows, so the sampler also
  meets ids the tokenizer does not know): the `--model` path;
* a run directory (config.json from configs/default.py on a small JSONL file, no
  checkpoint: its seeded initial params): the `--workdir` path, and the run's own
  `data.pass_rate_range`, which must give the same rates (issue 26: one pass_rates).

The reward is a pure function of the response text (a random policy solves no arithmetic,
so an exact-answer reward would be 0 everywhere and any comparison would pass vacuously);
every rate is checked against completions drawn independently with the Driver.
"""

import copy
import glob
import hashlib
import json
import os
import re

import jax
import numpy as np
import pytest
from tiny_hf import make_tiny_hf

from ada import config as C
from ada.cli import difficulty
from ada.data.sources import DataError
from ada.evaluation import pass_rates, prompt_id_for
from ada.models.hf import load_hf
from ada.rollout import Rollout
from ada.run.build import build
from ada.run.passrates import PASS_RATE_SEED
from ada.sampling.backends import make_engine
from ada.sampling.driver import Driver, Request
from ada.templates import encode_prompt, render_prompt
from ada.tokenizer import load_tokenizer, train_sentencepiece

MAX_PROMPT = 32
MAX_NEW = 6
SLOTS = 8
K = 4
DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                       "default.py")


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


def write_jsonl(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def reference(engine, params, tok, template, records, k, seed):
    """Completions drawn straight from the Driver (no detokenizer, no Rollout), and the
    rewards recounted from their decoded texts."""
    reqs = [Request(encode_prompt(tok, template, r["problem"]), prompt_id_for(r), j)
            for r in records for j in range(k)]
    step_key = jax.random.key_data(jax.random.key(seed))
    outs = Driver(engine, params, step_key=step_key).generate_all(reqs)
    ids = [c.token_ids for c in outs]
    texts = [tok.decode([t for t in c.token_ids if t < tok.vocab_size]) for c in outs]
    rewards = np.array([expected_reward(t) for t in texts]).reshape(len(records), k)
    return ids, rewards


# ----------------------------------------------------------------------------- the HF model


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    d = tmp_path_factory.mktemp("policy")
    make_tiny_hf("qwen2", d, vocab_size=128, seed=1)
    texts = [render_prompt("plain", r["problem"]) + " " + r["answer"] for r in problems(60)]
    train_sentencepiece(texts, 64, d / "tokenizer.model")
    tok = load_tokenizer(d)
    params, cfg = load_hf(d)
    assert tok.vocab_size < cfg.vocab_size
    return d, tok, params, cfg


def cli_args(d, inp, out, *extra):
    return ["--input", str(inp), "--output", str(out), "--model", str(d), "--k", str(K),
            "--preset", "hard", "--max-pass-rate", "0.5", "--template", "plain",
            "--max-new-tokens", str(MAX_NEW), "--max-prompt-tokens", str(MAX_PROMPT),
            "--num-slots", str(SLOTS), "--seed", "3",
            "--reward", "test_difficulty:parity_reward", *extra]


@pytest.fixture(scope="module")
def engine(policy, tmp_path_factory):
    """The engine the command builds for cli_args (`make_engine` on its config)."""
    d, tok, _, cfg = policy
    tmp = tmp_path_factory.mktemp("engine")
    args = difficulty.build_parser().parse_args(cli_args(d, write_jsonl(tmp / "i.jsonl", []),
                                                         tmp / "o.jsonl"))
    config = difficulty.policy_config(args)
    assert (config.tokenizer.template, config.data.max_prompt_len,
            config.sampling.max_new_tokens, config.sampling.num_slots) == (
        "plain", MAX_PROMPT, MAX_NEW, SLOTS)
    return make_engine(config, cfg, tok)


def test_prompt_id_is_a_stable_hash_of_the_id():
    a = {"id": "p7", "problem": "x", "answer": "1"}
    assert prompt_id_for(a) == prompt_id_for({"id": "p7", "problem": "other", "answer": "2"})
    # fixed across releases: a cache written by one version is read by the next
    assert prompt_id_for(a) == int.from_bytes(hashlib.sha256(b"p7").digest()[:4], "little")
    assert prompt_id_for({"id": 7}) == prompt_id_for({"id": "7"})
    ids = {prompt_id_for({"id": f"p{i}"}) for i in range(1000)}
    assert len(ids) == 1000 and all(0 <= i < 2**32 for i in ids)


@pytest.mark.slow
def test_pass_rates_match_independent_completions(policy, engine, tmp_path):
    _, tok, params, _ = policy
    recs = [dict(r, prompt_tokens=encode_prompt(tok, "plain", r["problem"])) for r in problems(3)]
    rollout = Rollout(engine, tok, None, parity_reward)

    def rates(records, seed, name, per_call=64):
        return pass_rates(records, rollout, params, k=K, seed=seed, threshold=0.5,
                          cache_path=str(tmp_path / name), settings={"seed": seed},
                          prompts_per_call=per_call)

    res, counts = rates(recs, 7, "a.jsonl")
    ref_ids, ref = reference(engine, params, tok, "plain", recs, K, 7)
    got = np.array([res[r["id"]]["rewards"] for r in recs])
    np.testing.assert_array_equal(got, ref)
    for r, row in zip(recs, ref, strict=True):  # brute-force recount: reward > threshold
        n = int((row > 0.5).sum())
        assert res[r["id"]]["num_correct"] == n and res[r["id"]]["pass_rate"] == n / K
    assert 0 < ref.sum() < ref.size  # the check can tell rows apart
    assert counts["prompts_sampled"] == 3
    # rewards that raised are scored 0 and counted
    outs = rollout.sample(params, recs, K, jax.random.key(7), [prompt_id_for(r) for r in recs])
    assert [c.token_ids for row in outs for c in row] == ref_ids
    texts = [c.text for row in outs for c in row]
    assert counts["reward_failures"] == sum(len(t) % 3 == 0 for t in texts) > 0
    assert any(t >= tok.vocab_size for i in ref_ids for t in i)  # padded ids decode to nothing

    # Another seed draws other responses.
    assert reference(engine, params, tok, "plain", recs, K, 8)[0] != ref_ids
    # A record's draws follow its id, not the chunk it is in nor its position there.
    alone, _ = rates(recs[::-1], 7, "b.jsonl", per_call=1)
    assert {i: e["rewards"] for i, e in alone.items()} == {i: e["rewards"] for i, e in res.items()}
    tail = rollout.sample(params, recs[2:], K, jax.random.key(7), [prompt_id_for(recs[2])])
    assert [c.token_ids for c in tail[0]] == ref_ids[2 * K:]
    # Fully cached: nothing sampled.
    again, counts = rates(recs, 7, "a.jsonl")
    assert again == res and counts["prompts_sampled"] == 0


def test_pass_rates_refuse_a_cache_made_with_other_settings(policy, engine, tmp_path):
    _, tok, params, _ = policy
    recs = [dict(r, prompt_tokens=encode_prompt(tok, "plain", r["problem"])) for r in problems(2)]
    rollout = Rollout(engine, tok, None, parity_reward)
    cache = str(tmp_path / "c.jsonl")
    settings = {"template": "plain", "seed": 0, "range": (0, 1)}
    pass_rates(recs, rollout, params, k=2, seed=0, threshold=0.5, cache_path=cache,
               settings=settings)
    with open(cache + ".settings.json") as f:
        assert json.load(f) == {"template": "plain", "seed": 0, "range": [0, 1]}
    # tuples compare equal to the lists read back: the same settings reuse the cache
    _, counts = pass_rates(recs, rollout, params, k=2, seed=0, threshold=0.5, cache_path=cache,
                           settings=dict(settings))
    assert counts["prompts_sampled"] == 0
    with pytest.raises(DataError, match=re.escape(f"pass-rate cache {cache} was made with other "
                                                  "settings (template: 'plain' then, 'qwen3' "
                                                  "now)")):
        pass_rates(recs, rollout, params, k=2, seed=0, threshold=0.5, cache_path=cache,
                   settings=dict(settings, template="qwen3"))


# ----------------------------------------------------------------------------- CLI, --model


def write_input(path):
    recs = problems(4)
    rows = recs + [
        {"id": "dup", "problem": "what is  1 + 2 ?", "answer": "3"},  # p0, respaced
        {"id": "badgold", "problem": "Broken gold.", "answer": "\\frac{"},
        {"id": "toolong", "problem": "What is " + " + ".join(["7"] * 30) + "?", "answer": "210"},
    ]
    write_jsonl(path, rows)
    return recs


def test_cli_filters_caches_and_resumes(policy, engine, tmp_path, capsys, monkeypatch):
    d, tok, params, _ = policy
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    recs = write_input(inp)
    assert difficulty.main(cli_args(d, inp, out)) == 0
    summary = last_json(capsys)
    cache = tmp_path / "out.jsonl.passrates.jsonl"
    assert summary["cache"] == str(cache) and summary["prompts_sampled"] == 4
    assert summary["policy"] == f"model {d}" and summary["k"] == K
    entries = {e["id"]: e for e in read_jsonl(cache)}
    assert sorted(entries) == ["p0", "p1", "p2", "p3"]
    with open(str(cache) + ".settings.json") as f:
        side = json.load(f)
    want = {"policy": os.path.abspath(d), "template": "plain", "instruction": None,
            "reward": "test_difficulty:parity_reward", "threshold": 0.5, "k": K, "seed": 3,
            "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": MAX_NEW,
            "max_prompt_len": MAX_PROMPT}
    assert {k: side.get(k) for k in want} == want  # what made the rates

    # The cached rewards are the Driver's on the same prompts (same seed, template).
    _, ref = reference(engine, params, tok, "plain", recs, K, 3)
    np.testing.assert_array_equal([entries[r["id"]]["rewards"] for r in recs], ref)
    assert [entries[r["id"]]["num_correct"] for r in recs] == [int((row > 0.5).sum())
                                                               for row in ref]
    # hard preset, max pass rate overridden: solved at least once and pass rate <= 0.5.
    keep = [r["id"] for r, row in zip(recs, ref, strict=True) if 1 <= (row > 0.5).sum() <= 2]
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
        again = last_json(capsys)
        assert again["prompts_sampled"] == 0 and read_jsonl(out) == kept
        # another pass-rate range re-filters without sampling
        assert difficulty.main(cli_args(d, inp, tmp_path / "all.jsonl", "--cache", str(cache),
                                        "--max-pass-rate", "1",
                                        "--no-require-one-correct")) == 0
        wide = last_json(capsys)
        assert wide["prompts_sampled"] == 0 and wide["kept"] == 4

    # Killed after the first prompt's line: the rerun samples only the other three, a few
    # at a time (--prompts-per-call), and ends where the uninterrupted run did.
    lines = cache.read_text().splitlines(keepends=True)
    cache.write_text(lines[0])
    asked = []
    real = Driver.generate_all

    def counting(self, requests):
        asked.append(sorted({r.prompt_id for r in requests}))
        return real(self, requests)

    with monkeypatch.context() as m:
        m.setattr(Driver, "generate_all", counting)
        assert difficulty.main(cli_args(d, inp, out, "--prompts-per-call", "2")) == 0
    resumed = last_json(capsys)
    first = json.loads(lines[0])["id"]
    assert resumed["prompts_sampled"] == 3 and [len(a) for a in asked] == [2, 1]
    assert sorted(sum(asked, [])) == sorted(prompt_id_for(r) for r in recs if r["id"] != first)
    assert read_jsonl(out) == kept
    assert {e["id"]: e for e in read_jsonl(cache)} == entries

    # Another seed (or policy, template, ...) must not reuse these rates.
    for flag, value, what in (("--seed", "4", "seed: 3 then, 4 now"),
                              ("--temperature", "0.5", "temperature: 1.0 then, 0.5 now"),
                              ("--max-new-tokens", "5", "max_new_tokens: 6 then, 5 now")):
        assert difficulty.main(cli_args(d, inp, out, flag, value)) == 2  # last flag wins
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith(f"error: pass-rate cache {cache} was made "
                                                  f"with other settings ({what})"), err
    assert {e["id"]: e for e in read_jsonl(cache)} == entries  # left as it was


@pytest.mark.parametrize("change,message", [
    ({"--input": "missing.jsonl"}, r"--input .*missing\.jsonl: no such file"),
    ({"--k": "0"}, r"--k must be >= 1 \(got 0\)"),
    # the dashed spellings are aliases of the flags, which are written with underscores
    ({"--prompts-per-call": "0"}, r"--prompts_per_call must be >= 1 \(got 0\)"),
    ({"--num_slots": "0"}, r"--num_slots must be >= 1 \(got 0\)"),
    ({"--max-new-tokens": "0"}, r"--max_new_tokens must be >= 1 \(got 0\)"),
    ({"--top_p": "0"}, r"--top_p 0\.0 must be in \(0, 1\]"),
    ({"--problem_key": "question"},
     r"--input .*in\.jsonl: line 1: missing column 'question' .*; pass --problem_key with the"),
    ({"--model": "no_such_model_dir"}, r"--model .*no_such_model_dir: no such directory"),
    ({"--max-pass-rate": "1.5"}, r"max_pass_rate \(1\.5\) <= 1"),
    ({"--template": "nope"}, r"--template: unknown prompt template 'nope'"),
    ({"--reward": "no_such_module:fn"}, r"--reward='no_such_module:fn' cannot be imported"),
    ({"--max-prompt-tokens": "3"}, r"none of 7 prompts fits --max_prompt_tokens 3"),
])
def test_cli_bad_input_is_one_line(policy, tmp_path, capsys, change, message):
    d = policy[0]
    inp = tmp_path / "in.jsonl"
    write_input(inp)
    args = cli_args(d, inp, tmp_path / "out.jsonl")
    for flag, value in change.items():
        if flag not in args:
            args += [flag, value]
        args[args.index(flag) + 1] = (str(tmp_path / value) if "missing" in value
                                      or "no_such_model" in value else value)
    assert difficulty.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert re.search(message, err[0]), err[0]
    assert not (tmp_path / "out.jsonl").exists()


def test_cli_old_chunk_size_flag_is_gone(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        difficulty.main(["--input", "x", "--output", "y", "--model", "m", "--chunk-size", "8"])
    assert e.value.code == 2 and "--chunk-size" in capsys.readouterr().err


def test_cli_refuses_a_template_the_tokenizer_cannot_encode(policy, tmp_path, capsys):
    d = policy[0]
    inp = tmp_path / "in.jsonl"
    write_jsonl(inp, problems(2))
    args = cli_args(d, inp, tmp_path / "out.jsonl", "--template", "qwen3",
                    "--max-prompt-tokens", "64", "--max-pass-rate", "1",
                    "--no-require-one-correct")
    assert difficulty.main(args) == 2
    assert "single token" in capsys.readouterr().err


def test_cli_workdir_without_config_is_refused(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    write_input(inp)
    assert difficulty.main(["--input", str(inp), "--output", str(tmp_path / "o.jsonl"),
                            "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --workdir {tmp_path} is not a run directory (no config.json)"


# ----------------------------------------------------------------------------- a run directory


TRAIN = [{"id": f"t{i}", "problem": f"What is {7 * i % 50 + 3} + {i % 9 + 1}?",
          "answer": str(7 * i % 50 + 3 + i % 9 + 1)} for i in range(24)]


def run_config(train_path, cache_dir, *overrides):
    """A small run on a JSONL file: the random init of the tiny preset, scored by
    parity_reward (as the run's data.reward), few slots, short responses."""
    return C.build_config(DEFAULT, [
        ("data.source", "jsonl"), ("data.train_path", str(train_path)),
        ("data.reward", "test_difficulty:parity_reward"), ("data.prompts_per_step", "2"),
        ("data.max_prompt_len", "64"), ("data.pass_rate_samples", str(K)),
        ("warmstart.enabled", "false"), ("warmstart.cache_dir", str(cache_dir)),
        ("tokenizer.vocab_size", "64"), ("sampling.max_new_tokens", str(MAX_NEW)),
        ("sampling.num_slots", str(SLOTS)), *overrides])


def save_run(workdir, config):
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:  # as ada.loop.train writes it
        json.dump(config.to_dict(), f, indent=2, sort_keys=True, default=str)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory with no checkpoint, built once by `build` with
    data.pass_rate_range set: its pass rates are in the one file under passrates/."""
    tmp = tmp_path_factory.mktemp("run")
    train = write_jsonl(tmp / "train.jsonl", TRAIN)
    config = run_config(train, tmp / "cache", ("data.pass_rate_range", "(0.0, 0.5)"))
    save_run(tmp / "run", config)
    built = build(config)
    caches = glob.glob(str(tmp / "cache" / "passrates" / "*.jsonl"))
    assert len(caches) == 1, caches
    return {"dir": tmp / "run", "config": config, "setup": built, "train": train,
            "cache": caches[0], "tmp": tmp}


def workdir_args(run, inp, out, *extra):
    return ["--input", str(inp), "--output", str(out), "--workdir", str(run["dir"]),
            "--k", str(K), "--max-pass-rate", "1", "--no-require-one-correct", *extra]


def test_setup_pass_rate_filter_matches_the_driver(run_dir):
    """The run's data.pass_rate_range: the rates in its cache are the Driver's draws of the
    initial params (record r as prompt prompt_id_for(r), key PASS_RATE_SEED), and the kept
    prompts are those in the range."""
    built, config = run_dir["setup"], run_dir["config"]
    entries = {e["id"]: e for e in read_jsonl(run_dir["cache"])}
    assert sorted(entries) == sorted(r["id"] for r in TRAIN)
    recs = list(TRAIN)
    engine = make_engine(config, built.model_cfg, built.tokenizer)
    _, ref = reference(engine, built.params, built.tokenizer, "plain", recs, K,
                       PASS_RATE_SEED)
    np.testing.assert_array_equal([entries[r["id"]]["rewards"] for r in recs], ref)
    assert 0 < ref.sum() < ref.size
    n = (ref > config.adaptive.positive_threshold).sum(1)
    assert [entries[r["id"]]["num_correct"] for r in recs] == n.tolist()
    assert [r["id"] for r in built.train_records] == [
        r["id"] for r, c in zip(recs, n, strict=True) if c <= K / 2]
    assert 0 < len(built.train_records) < len(recs)  # the range (0, 0.5) dropped some


def test_cli_workdir_gives_the_rates_of_the_runs_pass_rate_filter(run_dir, tmp_path, capsys,
                                                                   monkeypatch):
    """Issue 26: `--workdir RUN` (no checkpoint: the run's initial params) and the run's own
    data.pass_rate_range give the same rates for the same prompts, and share the cache key."""
    out = tmp_path / "out.jsonl"
    assert difficulty.main(workdir_args(run_dir, run_dir["train"], out)) == 0
    summary = last_json(capsys)
    assert summary["policy"] == f"run {run_dir['dir']} step init"
    assert summary["prompts_sampled"] == len(TRAIN) and summary["kept"] == len(TRAIN)
    from_cli = {e["id"]: e for e in read_jsonl(summary["cache"])}
    from_run = {e["id"]: e for e in read_jsonl(run_dir["cache"])}
    assert {i: (e["num_correct"], e["rewards"]) for i, e in from_cli.items()} == {
        i: (e["num_correct"], e["rewards"]) for i, e in from_run.items()}
    assert from_cli == from_run
    # the same settings: the command accepts the run's cache and samples nothing
    with open(summary["cache"] + ".settings.json") as f, \
            open(run_dir["cache"] + ".settings.json") as g:
        assert json.load(f) == json.load(g)

    def no_engine(self, requests):
        raise AssertionError("the engine was called although every prompt is cached")

    monkeypatch.setattr(Driver, "generate_all", no_engine)
    assert difficulty.main(workdir_args(run_dir, run_dir["train"], tmp_path / "o2.jsonl",
                                        "--cache", run_dir["cache"])) == 0
    assert last_json(capsys)["prompts_sampled"] == 0
    assert read_jsonl(tmp_path / "o2.jsonl") == read_jsonl(out)


@pytest.mark.slow
def test_template_change_invalidates_the_pass_rate_cache(run_dir, capsys, monkeypatch):
    """Another tokenizer.template: the run samples again into another cache file (its old
    one untouched), and the command refuses the old cache with one line naming it."""
    before = open(run_dir["cache"], "rb").read()
    config = copy.deepcopy(run_dir["config"])
    config.tokenizer.template = "qwen3"
    build(config)
    caches = sorted(glob.glob(os.path.join(os.path.dirname(run_dir["cache"]), "*.jsonl")))
    assert len(caches) == 2 and run_dir["cache"] in caches
    other = next(c for c in caches if c != run_dir["cache"])
    assert sorted(e["id"] for e in read_jsonl(other)) == sorted(r["id"] for r in TRAIN)
    with open(other + ".settings.json") as f:
        assert json.load(f)["template"] == "qwen3"
    assert open(run_dir["cache"], "rb").read() == before

    # the run's own template again: its cache, nothing sampled
    def no_engine(self, requests):
        raise AssertionError("the engine was called although every prompt is cached")

    with monkeypatch.context() as m:
        m.setattr(Driver, "generate_all", no_engine)
        build(copy.deepcopy(run_dir["config"]))

    # the command: a chat template this run's tokenizer cannot encode is refused before any
    # sampling; another prompt text (the instruction) on the run's cache is refused by name
    out = run_dir["tmp"] / "refused.jsonl"
    assert difficulty.main(workdir_args(run_dir, run_dir["train"], out, "--template", "qwen3",
                                        "--cache", run_dir["cache"])) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: --template") and "qwen3" in err, err
    assert difficulty.main(workdir_args(run_dir, run_dir["train"], out, "--instruction",
                                        "Answer briefly.", "--cache", run_dir["cache"])) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(
        f"error: pass-rate cache {run_dir['cache']} was made with other settings "
        "(instruction: None then, 'Answer briefly.' now)"), err
    assert not out.exists() and open(run_dir["cache"], "rb").read() == before


@pytest.mark.slow
def test_cli_workdir_samples_with_the_latest_checkpoint(run_dir, tmp_path, capsys):
    """--workdir rebuilds the run (tokenizer, model config, template) and samples with the
    params of its latest checkpoint, not the run's initial ones; --step picks another."""
    from ada.checkpoint import Checkpointer
    from ada.data.iterator import PromptIterator
    from ada.models import init_params
    from ada.run.state import state_tree

    built = run_dir["setup"]
    wd = tmp_path / "run"
    save_run(wd, run_dir["config"])
    state = built.fns.init_state(built.params)
    trained = init_params(built.model_cfg, jax.random.key(123))  # stands in for a later step
    ckpt = Checkpointer(str(wd / "checkpoints"))
    ckpt.save(5, state_tree(state.replace(params=trained), jax.random.key_data(jax.random.key(0))),
              {"data": PromptIterator(built.train_records, 2).get_state()})
    ckpt.close()

    recs = problems(12)
    inp, out = write_jsonl(tmp_path / "in.jsonl", recs), tmp_path / "out.jsonl"
    argv = ["--input", str(inp), "--output", str(out), "--workdir", str(wd), "--k", str(K),
            "--max-pass-rate", "1", "--no-require-one-correct", "--seed", "3"]
    assert difficulty.main(argv) == 0
    summary = last_json(capsys)
    assert summary["policy"] == f"run {wd} step 5" and summary["kept"] == len(recs)
    cached = {e["id"]: e["rewards"] for e in read_jsonl(summary["cache"])}
    cached = np.array([cached[r["id"]] for r in recs])

    engine = make_engine(run_dir["config"], built.model_cfg, built.tokenizer)
    tok = built.tokenizer
    ckpt_ids, from_ckpt = reference(engine, trained, tok, "plain", recs, K, 3)
    init_ids, from_init = reference(engine, built.params, tok, "plain", recs, K, 3)
    np.testing.assert_array_equal(cached, from_ckpt)
    assert ckpt_ids != init_ids and not np.array_equal(cached, from_init)

    assert difficulty.main(argv + ["--step", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and re.search(r"error: --step 4: no complete checkpoint in .*"
                                         r"\(complete steps: \[5\]\)", err), err
