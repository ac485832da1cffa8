"""launch_tpu.sh --dry-run prints the whole plan and runs nothing (a fake gcloud proves it)."""

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "launch_tpu.sh")


def _run(args, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    marker = tmp_path / "gcloud_called"
    (fake / "gcloud").write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    (fake / "gcloud").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    r = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=60)
    return r, marker


def test_dry_run_prints_every_step(tmp_path):
    r, marker = _run(["--dry-run", "--name", "ada-t", "--zone", "us-central2-b", "--type", "v4-16",
                      "--project", "proj", "--spot", "--",
                      "--config", "configs/qwen25_math_7b.py:ada_balance",
                      "--config.train.steps=10", "--workdir", "/mnt/shared/run 1"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert not marker.exists(), "dry run must not call gcloud"
    cmds = [ln[2:] for ln in r.stdout.splitlines() if ln.startswith("+ ")]
    text = "\n".join(cmds)
    assert cmds[0].startswith("gcloud compute tpus tpu-vm describe ada-t --zone us-central2-b --project proj")
    create = [c for c in cmds if " create " in c][0]
    assert "--accelerator-type v4-16" in create and "--spot" in create
    assert any(" scp " in c and "--worker=all" in c for c in cmds)
    install = [c for c in cmds if "jax[tpu]" in c]
    assert install and "--worker=all" in install[0] and "requirements.txt" in install[0]
    run = cmds[-1]
    assert "--worker=all" in run and "ada.runner" in run
    assert "configs/qwen25_math_7b.py:ada_balance" in run and "train.steps=10" in run
    assert "/mnt/shared/run" in text


def test_git_repo_mode_and_errors(tmp_path):
    r, _ = _run(["--dry-run", "--name", "a", "--zone", "z", "--type", "v5litepod-8", "--repo",
                 "https://example.com/ada.git", "--", "--config", "configs/default.py", "--workdir",
                 "/mnt/shared/r"], tmp_path)
    assert r.returncode == 0 and "git clone" in r.stdout and " scp " not in r.stdout
    r, marker = _run(["--name", "a"], tmp_path)
    assert r.returncode == 2 and "missing --zone --type" in r.stderr and not marker.exists()
    r, _ = _run(["--dry-run", "--name", "a", "--zone", "z", "--type", "t", "--", "--config", "c.py"], tmp_path)
    assert r.returncode == 2 and "--workdir" in r.stderr
