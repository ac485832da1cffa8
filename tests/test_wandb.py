"""W&B logging (`log.wandb`) in offline mode: a run logs, is preempted (SIGTERM), resumes, and
its offline directories hold one run id with every step once; a missing package is one line."""

import glob
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from ada.metrics import read_jsonl

pytest.importorskip("wandb")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
STEPS = 6
BLOCK = 32768  # the .wandb file is a leveldb-style log of protobuf Records in 32 KiB blocks


def wandb_records(path):
    """The Records of an offline run file (wandb has no public reader)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last fragment of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def logged(workdir):
    """{run ids}, [history steps in file order] over every offline run directory."""
    ids, steps = set(), []
    for f in sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))):
        for r in wandb_records(f):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                ids.add(r.run.run_id)
            elif kind == "history":
                steps.append(r.history.step.num)
    return ids, steps


def command(workdir, cache, *extra):
    over = {"data.num_train": 200, "data.num_eval": 12, "data.prompts_per_step": 4,
            "adaptive.samples_per_round": 4, "adaptive.max_rounds": 2,
            "sampling.num_slots": 32, "sampling.max_new_tokens": 6, "train.steps": STEPS,
            "eval.every": 3, "eval.samples": 2, "eval.pass_k": "(1,2)", "checkpoint.every": 2,
            "warmstart.steps": 60, "warmstart.noise_steps": 20, "warmstart.cache_dir": cache,
            "log.progress": "false", "log.wandb": "true"}
    return [sys.executable, "-m", "ada.runner", "--config", DEFAULT, "--workdir", workdir,
            *[f"--config.{k}={v}" for k, v in over.items()], *extra]


@pytest.mark.slow
def test_offline_run_resumes_the_same_wandb_run_with_each_step_once(tmp_path):
    wd, cache = str(tmp_path / "run"), str(tmp_path / "cache")
    env = dict(os.environ, JAX_PLATFORMS="cpu", WANDB_MODE="offline", WANDB_SILENT="true")
    proc = subprocess.Popen(command(wd, cache), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    try:  # preempt after step 3: the loop checkpoints the step it is in and exits 143
        while time.time() < deadline:
            rows = read_jsonl(os.path.join(wd, "metrics.jsonl"))
            if rows and rows[-1]["step"] >= 3:
                break
            assert proc.poll() is None, "the run ended before it could be preempted"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
    finally:
        assert proc.wait(timeout=120) == 143  # checkpointed: restart me (docs/reliability.md)
    first_ids, first_steps = logged(wd)
    assert len(first_ids) == 1 and 3 in first_steps and max(first_steps) < STEPS, first_steps
    r = subprocess.run(command(wd, cache), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ids, steps = logged(wd)
    assert ids == first_ids  # the resumed process continued the same W&B run
    assert sorted(steps) == list(range(STEPS + 1)) and len(steps) == len(set(steps))
    assert len(glob.glob(os.path.join(wd, "wandb", "offline-run-*"))) == 2  # one per process


@pytest.mark.slow
def test_missing_wandb_is_one_line_before_anything_runs(tmp_path):
    """A Python without wandb (a path entry that shadows it with an empty module that
    raises ImportError) gets one error line naming the extra, and no run directory."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "wandb.py").write_text("raise ImportError('no wandb here')\n")
    wd = tmp_path / "run"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=f"{shadow}{os.pathsep}{ROOT}")
    r = subprocess.run(command(str(wd), str(tmp_path / "cache")), env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "pip install -e '.[wandb]'" in errors[0], r.stderr[-2000:]
    assert not os.path.exists(wd / "metrics.jsonl")
