"""End to end: a tiny run, exact resume after SIGKILL, half-written checkpoints ignored."""

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ada import config as C
from ada.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
STEPS = 6


def tiny_overrides(cache):
    return [
        ("data.num_train", "200"), ("data.num_eval", "12"), ("data.prompts_per_step", "4"),
        ("adaptive.samples_per_round", "4"), ("adaptive.max_rounds", "2"),
        ("sampling.num_slots", "32"), ("sampling.max_new_tokens", "6"),
        ("train.steps", str(STEPS)), ("eval.every", "3"), ("eval.samples", "2"),
        ("eval.pass_k", "(1,2)"), ("checkpoint.every", "1"), ("checkpoint.keep", "2"),
        ("warmstart.steps", "60"), ("warmstart.noise_steps", "20"), ("warmstart.cache_dir", cache),
        ("log.progress", "false"),
        ("log.plots", "false"), ("optim.lr", "1e-3"), ("optim.warmup_steps", "1"),
    ]


def _args(overrides):
    return [f"--config.{k}={v}" for k, v in overrides]


def _final_params(workdir):
    from ada.checkpoint import Checkpointer

    state, meta = Checkpointer(os.path.join(workdir, "checkpoints")).restore_params()
    return state, meta


def _strip_times(rows):
    from ada.metrics import is_timing

    return [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("adacache"))


@pytest.mark.slow
def test_end_to_end_and_exact_resume_after_sigkill(tmp_path, cache):
    import jax

    from ada.loop import train

    ov = tiny_overrides(cache)
    # A: uninterrupted, in this process
    cfg = C.build_config(DEFAULT, ov)
    C.validate(cfg, str(tmp_path / "a"))
    summary = train(cfg, str(tmp_path / "a"))
    assert summary["steps"] == STEPS
    rows_a = read_jsonl(str(tmp_path / "a" / "metrics.jsonl"))
    assert [r["step"] for r in rows_a] == list(range(STEPS + 1))
    for r in rows_a[1:]:
        for k in ("reward_round0_mean", "reward_mean", "zero_variance_share", "samples_per_prompt",
                  "grad_norm", "entropy"):
            assert r[k] is not None and np.isfinite(r[k]), (k, r)
        assert 0 <= r["zero_variance_share"] <= 1
        assert 1 <= r["samples_per_prompt"] <= 8  # M x N budget
    assert all("eval_accuracy" in rows_a[s] for s in (0, 3, 6))
    assert os.path.exists(tmp_path / "a" / "summary.json")
    assert sorted(os.listdir(tmp_path / "a" / "checkpoints")) == ["5", "6"]  # keep-last-2

    # B: the same run in a subprocess, SIGKILLed after a random step, then resumed
    wd = str(tmp_path / "b")
    cmd = [sys.executable, "-m", "ada.runner", "--config", DEFAULT, *_args(ov), "--workdir", wd]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    kill_after = random.Random().randint(1, STEPS - 2)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            rows = read_jsonl(os.path.join(wd, "metrics.jsonl"))
            if rows and rows[-1]["step"] >= kill_after:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    killed_at = read_jsonl(os.path.join(wd, "metrics.jsonl"))[-1]["step"]
    assert killed_at < STEPS
    # plant a half-written checkpoint with a later step number: it must be skipped
    ck = os.path.join(wd, "checkpoints")
    os.makedirs(os.path.join(ck, "99", "state"))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ignoring incomplete checkpoint" in r.stderr and "/99" in r.stderr
    rows_b = read_jsonl(os.path.join(wd, "metrics.jsonl"))
    assert _strip_times(rows_b) == _strip_times(rows_a)
    pa, ma = _final_params(str(tmp_path / "a"))
    pb, mb = _final_params(wd)
    la, lb = jax.tree.leaves(pa), jax.tree.leaves(pb)
    assert len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))
    assert ma["data"] == mb["data"] and ma["sampler"] == mb["sampler"]
    run_cfg = json.load(open(os.path.join(wd, "config.json")))
    assert run_cfg["method"] == "ada_balance"


@pytest.mark.slow
@pytest.mark.parametrize("method, extra", [
    ("dapo", [("adaptive.dapo_max_batches", "3")]),
    ("ada_balance", [("adaptive.scheduler", "continuous")]),
])
def test_dapo_and_continuous_scheduler_run_end_to_end(tmp_path, cache, method, extra):
    """The runner drives DAPO (drawing extra prompts one by one) and the continuous
    scheduler (through the slot driver); samples count every response drawn."""
    from ada.loop import train

    ov = [*tiny_overrides(cache), ("train.steps", "2"), ("eval.every", "0"), ("method", method),
          *extra]
    cfg = C.build_config(DEFAULT, ov)
    C.validate(cfg, str(tmp_path))
    assert train(cfg, str(tmp_path))["steps"] == 2
    rows = read_jsonl(str(tmp_path / "metrics.jsonl"))[1:]
    P, n = cfg.data.prompts_per_step, cfg.adaptive.n
    budget = cfg.adaptive.samples_per_round * cfg.adaptive.max_rounds
    for r in rows:
        if method == "dapo":  # n per drawn prompt, the dropped prompts' responses included
            assert r["samples"] % n == 0 and P * n <= r["samples"] <= 3 * P * n, r["samples"]
        else:  # balance exits need >= n responses; the cap is M x N
            assert P * n <= r["samples"] <= P * budget, r["samples"]


def test_minibatch_row_order_puts_whole_prompts_in_each_minibatch():
    from ada.rl.batch import minibatch_row_order

    P, n, K = 8, 4, 4
    order = minibatch_row_order(P, n, K)
    assert sorted(order) == list(range(P * n))
    for k in range(K):
        rows = order[k::K]  # what the train step's strided split gives mini-batch k
        prompts = {int(r) // n for r in rows}
        assert len(rows) == len(prompts) * n  # all n responses of each prompt, nothing else
        assert all({p * n + j for j in range(n)} <= set(rows.tolist()) for p in prompts)
    np.testing.assert_array_equal(minibatch_row_order(P, n, 1), np.arange(P * n))
    with pytest.raises(ValueError, match="mini_batches"):
        minibatch_row_order(6, n, 4)


@pytest.mark.slow
def test_kl_temperature_minibatches_and_hf_export_end_to_end(tmp_path, cache):
    """loss.kl_coef > 0 trains against the initial policy (it used to crash inside the
    jitted step: no reference log-probs were ever built), at sampling temperature 0.7 with
    two mini-batches, and checkpoint.export_hf writes a directory transformers loads: the
    model, and a tokenizer that encodes like ada's (it used to be a tokenizer.json copied
    as tokenizer.model) and applies the run's template as ada does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ada.loop import train
    from ada.templates import encode_prompt

    ov = [*tiny_overrides(cache), ("train.steps", "2"), ("eval.every", "0"),
          ("loss.kl_coef", "0.1"), ("loss.kl_estimator", "k3"), ("train.mini_batches", "2"),
          ("sampling.temperature", "0.7"), ("checkpoint.export_hf", "true")]
    cfg = C.build_config(DEFAULT, ov)
    C.validate(cfg, str(tmp_path))
    summary = train(cfg, str(tmp_path))
    rows = read_jsonl(str(tmp_path / "metrics.jsonl"))[1:]
    assert len(rows) == 2 and all(np.isfinite(r["kl"]) and r["kl"] >= 0 for r in rows)
    assert rows[-1]["kl"] > 0  # the policy moved away from the frozen reference

    out = summary["hf"]
    from ada.data.task import load_task
    from ada.run.policy import load_tokenizer_for

    tok = load_tokenizer_for(cfg, load_task(cfg))
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == tok.vocab_size
    hf_tok = AutoTokenizer.from_pretrained(out)
    ids = encode_prompt(tok, cfg.tokenizer.template, "What is 12 + 34?")
    text = tok.decode(ids)
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
    # the export carries the run's prompt format (it had no chat_template: issue 46)
    chat = hf_tok.apply_chat_template([{"role": "user", "content": "What is 12 + 34?"}],
                                      add_generation_prompt=True, tokenize=True)
    assert list(getattr(chat, "input_ids", chat)) == ids


def test_kl_coef_below_zero_is_refused_before_any_compile(tmp_path):
    cfg = C.build_config(DEFAULT, [("loss.kl_coef", "-0.1")])
    with pytest.raises(C.ConfigError, match="loss.kl_coef"):
        C.validate(cfg, str(tmp_path))


@pytest.mark.slow
def test_run_seconds_add_up_over_a_resume_and_a_rerun_changes_no_figure(tmp_path, cache):
    """summary.json's `seconds` is the run's training time over every segment (kept in the
    checkpoint meta), `invocation_seconds` this command's. Broken, the resumed run counts only
    its last segment (it used to), or a re-run of the finished run writes its own ~0 s over
    the run's figure (it used to: 0.004 s)."""
    from ada.checkpoint import Checkpointer
    from ada.loop import train

    ov = [*tiny_overrides(cache), ("train.steps", "2"), ("eval.every", "0"),
          ("warmstart.enabled", "false")]
    cfg = C.build_config(DEFAULT, ov)
    wd = str(tmp_path / "run")
    C.validate(cfg, wd)
    first = train(cfg, wd, stop_after=1)  # one segment, then a resume
    assert first["steps"] == 1 and 0 < first["seconds"] < first["invocation_seconds"]
    _, meta = Checkpointer(os.path.join(wd, "checkpoints")).restore_params(1)
    assert meta["seconds"] == first["seconds"]
    done = train(cfg, wd)
    own = done["seconds"] - first["seconds"]  # the second segment's training
    assert 0 < own < done["invocation_seconds"]
    saved = json.load(open(os.path.join(wd, "summary.json")))
    again = train(cfg, wd)  # finished: nothing trains
    assert json.load(open(os.path.join(wd, "summary.json"))) == dict(
        saved, invocation_seconds=again["invocation_seconds"])
    assert again["seconds"] == done["seconds"]


def test_print_alone_prints_the_one_command_and_trains_nothing(tmp_path, capsys):
    """`--print` without `--sweep` validates and prints the command it would run (it used to
    be ignored: a real run trained); the printed command is the same run (its overrides
    parse back), and no output directory is left."""
    from ada.cli.train import main

    wd = tmp_path / "run"
    assert main(["--config", f"{DEFAULT}:grpo", "--config.train.steps=3", "--workdir", str(wd),
                 "--print"]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    argv = shlex.split(line)
    assert argv[:3] == [sys.executable, "-m", "ada.runner"] and "--print" not in argv
    assert argv[argv.index("--config") + 1] == f"{DEFAULT}:grpo"
    assert argv[argv.index("--workdir") + 1] == str(wd)
    assert C.parse_override_args(argv[3:])[0] == [("train.steps", "3")]
    assert not wd.exists()
    assert main(["--config.train.steps=0", "--workdir", str(wd), "--print"]) == 2  # validated
    assert capsys.readouterr().err.count("\n") == 1


def test_sweep_and_flag_misuse_is_one_line(tmp_path, capsys):
    """A sweep file's get_sweep that raises (a bad `:arg`) is one line naming the call and
    its line, exit 2, as get_config's errors are (it was a 22-line traceback, exit 1);
    `--diff` alone names --print_config (it said "no output directory")."""
    from ada.cli.train import main

    sweep = os.path.join(ROOT, "configs", "sweep_methods.py")
    assert main(["--sweep", f"{sweep}:x", "--workdir", str(tmp_path), "--print"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: get_sweep('x') in {sweep}, line ") and "ValueError" in line
    assert main(["--sweep", f"{sweep}:0", "--workdir", str(tmp_path), "--print"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3  # 3 methods x seed 0
    assert main(["--diff"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--print_config" in line and "output directory" not in line
