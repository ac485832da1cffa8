"""The command lines as a user meets them: bad input ends in one line and exit code 2
before anything compiles; partial problems are said, not silently absorbed."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def _run(args, timeout=300):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout, cwd=ROOT)


def _lines(text):
    return [ln for ln in text.strip().splitlines() if ln.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("row, what", [
    ('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?"\n', "line 2"),  # malformed JSON
    ('{"problem": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n', "line 2"),
])
def test_bad_data_row_is_one_line_naming_the_knob(tmp_path, row, what):
    data = tmp_path / "train.jsonl"
    data.write_text(row)
    r = _run(["ada.runner", "--config", DEFAULT, "--config.data.source=jsonl",
              f"--config.data.train_path={data}", "--config.warmstart.enabled=false",
              f"--config.warmstart.cache_dir={tmp_path / 'cache'}", "--workdir",
              str(tmp_path / "run")])
    assert r.returncode == 2, r.stderr[-2000:]
    lines = _lines(r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert str(data) in lines[0] and what in lines[0]
    assert "--config.data.on_bad_row=skip" in lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before training


def test_on_bad_row_skip_trains_on_the_good_rows(tmp_path):
    from ada import config as C
    from ada.data.task import load_task

    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "What is 1+1?", "answer": "2"}\n{"problem": "oops"\n'
                    '{"problem": "What is 2+3?", "answer": "5"}\n')
    cfg = C.build_config(DEFAULT, [("data.source", "jsonl"), ("data.train_path", str(data)),
                                   ("data.on_bad_row", "skip")])
    C.validate(cfg)
    assert [r["answer"] for r in load_task(cfg).train] == ["2", "5"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory with no checkpoint (the CLI then evaluates the initial params)."""
    from ada import config as C

    tmp = tmp_path_factory.mktemp("evalrun")
    cfg = C.build_config(DEFAULT, [("warmstart.enabled", "false"), ("data.num_train", "64"),
                                   ("warmstart.cache_dir", str(tmp / "cache")),
                                   ("sampling.max_new_tokens", "4"), ("eval.samples", "2"),
                                   ("eval.pass_k", "(1, 2)")])
    wd = tmp / "run"
    wd.mkdir()
    with open(wd / "config.json", "w") as f:
        json.dump(cfg.to_dict(), f)
    return wd


def _benchmark(path, problems):
    with open(path, "w") as f:
        for i, p in enumerate(problems):
            f.write(json.dumps({"id": f"b{i}", "problem": p, "answer": "4"}) + "\n")
    return path


def test_eval_refuses_when_every_prompt_is_too_long(tmp_path, run_dir):
    long = "Natalia sold clips to 48 of her friends in April, and then she sold half as many " * 2
    bench = _benchmark(tmp_path / "b.jsonl", [long] * 3)
    r = _run(["ada.evaluate", "--workdir", str(run_dir), "--benchmark", str(bench)])
    assert r.returncode == 2, r.stdout + r.stderr[-2000:]
    lines = _lines(r.stderr)
    assert len(lines) == 1 and "3 of 3 prompts" in lines[0] and "--max_prompt_len" in lines[0]
    assert "num_prompts" not in r.stdout


@pytest.mark.slow
def test_eval_says_how_many_prompts_it_dropped(tmp_path, run_dir):
    long = "Natalia sold clips to 48 of her friends in April, and then she sold half as many " * 2
    bench = _benchmark(tmp_path / "b.jsonl", ["What is 2+2?", long, "What is 1+3?"])
    r = _run(["ada.evaluate", "--workdir", str(run_dir), "--benchmark", str(bench)])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "1 of 3 prompts" in r.stderr and "--max_prompt_len" in r.stderr
    out = json.loads(r.stdout)
    assert (out["num_prompts"], out["dropped_prompts"]) == (2, 1)
    assert 0 <= out["eval_accuracy"] <= 1 and "eval_pass@2" in out
    r = _run(["ada.evaluate", "--workdir", str(run_dir), "--benchmark", str(bench),
              "--max_prompt_len", "256"])
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert (out["num_prompts"], out["dropped_prompts"]) == (3, 0)


def test_eval_missing_step_is_one_line(run_dir):
    r = _run(["ada.evaluate", "--workdir", str(run_dir), "--step", "7"])
    assert r.returncode == 2 and _lines(r.stderr) == [
        f"error: --step 7: no complete checkpoint in {run_dir / 'checkpoints'} "
        "(complete steps: [])"], r.stderr


def test_training_warns_when_many_prompts_are_too_long(tmp_path, caplog):
    """Prompts longer than data.max_prompt_len are dropped; when that is more than a tenth
    of the training set, the run says so and names the knob (it used to only log a count)."""
    import logging

    import numpy as np

    from ada import config as C
    from ada.data.encode import encode_records
    from ada.data.task import load_task
    from ada.run.build import build
    from ada.run.policy import load_tokenizer_for

    cfg = C.build_config(DEFAULT, [("warmstart.enabled", "false"), ("data.num_train", "64"),
                                   ("data.level_mix", "1:1,3:1"),
                                   ("warmstart.cache_dir", str(tmp_path / "cache"))])
    task = load_task(cfg)
    tok = load_tokenizer_for(cfg, task)
    lengths = [len(r["prompt_tokens"]) for r in
               encode_records(task.train, tok, cfg.tokenizer.template, 10**6)[0]]
    cfg.data.max_prompt_len = int(np.median(lengths))
    with caplog.at_level(logging.WARNING, logger="ada.run.build"):
        s = build(cfg)
    assert 0 < s.dropped_prompts < len(task.train)
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert f"{s.dropped_prompts} of {len(task.train)} training prompts" in msg
    assert "--config.data.max_prompt_len" in msg
