"""launch_tpu.sh --dry-run prints the whole plan and runs nothing (a fake gcloud proves it);
with --spot it keeps the run going through a preemption until the run exits 0 (a fake gcloud
that plays a VM's states)."""

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
    restart = [c for c in cmds if "ada.runner" in c][0]  # each worker reruns it after a 143
    assert "[ $rc -eq 143 ] || break" in restart and "run.rc" in restart
    watch = cmds[cmds.index(restart) + 1:]
    assert watch[0] == ("every 60 s: gcloud compute tpus tpu-vm describe ada-t --zone us-central2-b "
                        "--project proj '--format=value(state)'")
    assert "cat ~/ada/run.rc" in watch[1] and "0 -> done" in watch[1]
    assert watch[2].startswith("  PREEMPTED|TERMINATED or NOT_FOUND: gcloud compute tpus tpu-vm "
                               "delete ada-t") and "steps 1-4 again" in watch[2]
    assert any(" scp " in c and "--worker=all" in c for c in cmds)
    install = [c for c in cmds if "jax[tpu]" in c]
    assert install and "--worker=all" in install[0] and "requirements.txt" in install[0]
    run = restart
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


def test_queued_resources_variant(tmp_path):
    r, marker = _run(["--dry-run", "--name", "q", "--zone", "z", "--type", "v5litepod-16",
                      "--queued", "--", "--workdir", "/mnt/shared/r"], tmp_path)
    assert r.returncode == 0 and not marker.exists(), r.stderr
    cmds = [ln[2:] for ln in r.stdout.splitlines() if ln.startswith("+ ")]
    assert cmds[1] == ("gcloud compute tpus queued-resources create q --zone z --node-id q "
                       "--accelerator-type v5litepod-16 --runtime-version tpu-ubuntu2204-base --spot")
    assert "queued-resources describe q --zone z '--format=value(state.state)'" in cmds[2]
    assert any(c.startswith("  SUSPENDED|FAILED or NOT_FOUND: gcloud compute tpus "
                            "queued-resources delete q --zone z --force --quiet") for c in cmds)


_GCLOUD = """#!/bin/bash
echo "$*" >> {d}/calls
next() {{ n=$(cat {d}/$1.n 2>/dev/null || echo 0); echo $((n + 1)) > {d}/$1.n; sed -n "$((n + 1))p" {d}/$1; }}
case "$*" in
  *describe*--format*) next states ;;
  *"cat ~/ada/run.rc"*) next rcs ;;
esac
exit 0
"""


def _supervise(tmp_path, states, rcs):
    """launch_tpu.sh --spot against a fake gcloud whose watch polls see `states` and whose
    workers' run.rc reads `rcs`, one a poll; returns (result, the gcloud calls)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "gcloud").write_text(_GCLOUD.format(d=tmp_path))
    (fake / "gcloud").chmod(0o755)
    (tmp_path / "states").write_text("\n".join(states) + "\n")
    (tmp_path / "rcs").write_text("\n".join(rcs) + "\n")
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", ADA_WATCH_S="0")
    r = subprocess.run(["bash", SCRIPT, "--name", "s", "--zone", "z", "--type", "v4-8", "--spot",
                        "--repo", "https://example.com/ada.git", "--", "--workdir", "/mnt/r"],
                       capture_output=True, text=True, env=env, timeout=60)
    return r, (tmp_path / "calls").read_text().splitlines()


def test_spot_recreates_a_preempted_vm_and_resumes_until_exit_0(tmp_path):
    r, calls = _supervise(tmp_path, ["READY", "PREEMPTED", "READY", "READY"], ["", "", "0"])
    assert r.returncode == 0 and "the run is done (exit 0)" in r.stdout, r.stdout + r.stderr
    assert "making it again" in r.stdout
    starts = [i for i, c in enumerate(calls) if "ada.runner" in c]
    delete = next(i for i, c in enumerate(calls) if c.startswith("compute tpus tpu-vm delete s"))
    create = [i for i, c in enumerate(calls) if c.startswith("compute tpus tpu-vm create s")]
    assert len(starts) == 2 and starts[0] < delete < create[-1] < starts[1], calls
    assert "--spot" in calls[create[-1]]


def test_spot_stops_on_a_crash_code_seen_twice(tmp_path):
    r, calls = _supervise(tmp_path, ["READY", "READY", "READY"], ["1", "1"])
    assert r.returncode == 1 and "the run stopped with exit 1" in r.stderr, r.stdout + r.stderr
    assert sum("ada.runner" in c for c in calls) == 1 and not any(" delete " in c for c in calls)
