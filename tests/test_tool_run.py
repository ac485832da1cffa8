"""A tool run end to end through the real entry point (configs/tools.py, cut to a few steps
and a short warm start): the policy's turns end at </calc>, the calculator answers, the
trajectories train, the stream and its resume work unchanged, and every tool metric of
docs/metrics.md is written."""

import os
import subprocess
import sys

import pytest

from ada.metrics import read_jsonl
from ada.trajectory import env_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"warmstart.steps": 60, "warmstart.tool_traces": 256, "data.num_train": 256,
        "data.num_eval": 16, "data.prompts_per_step": 8, "sampling.num_slots": 32,
        "eval.every": 2, "checkpoint.every": 1, "rl.max_staleness": 1,
        "log.progress": "false", "log.plots": "false", "log.tensorboard": "false"}


def run(wd, steps):
    cmd = [sys.executable, "-m", "ada.runner", "--config", os.path.join(ROOT, "configs", "tools.py"),
           "--workdir", str(wd), f"--config.train.steps={steps}",
           *(f"--config.{k}={v}" for k, v in TINY.items())]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.slow  # ~60 s: two runs, a warm start
def test_a_tool_run_trains_on_trajectories_and_resumes(tmp_path):
    wd = tmp_path / "tools"
    r = run(wd, 2)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run(wd, 3)  # resumed from step 2's checkpoint: one more step
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resum" in r.stderr.lower(), r.stderr[-2000:]
    rows = read_jsonl(os.path.join(wd, "metrics.jsonl"))
    assert [x["step"] for x in rows] == [0, 1, 2, 3]
    for row in rows[1:]:
        assert set(env_metrics({})) <= set(row), sorted(set(env_metrics({})) - set(row))
        assert row["policy_tokens"] > 0 and row["turns_per_trajectory"] >= 1
        assert 0 <= row["tool_call_rate"] <= 1 and 0 <= row["env_token_share"] < 1
    # the warm start teaches the call format: some trajectories call, and their outputs
    # are appended (the calculator never fails on a readable call)
    assert sum(row["env_tokens"] for row in rows[1:]) > 0
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[2]
