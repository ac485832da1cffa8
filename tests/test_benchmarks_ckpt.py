"""benchmarks/checkpoint_save.py runs: the real run through the Trainer seam, unpatched,
then saves of its state.

It once timed steps by replacing `loop.rl_step`, which the stream removed, and died with
AttributeError while docs/reliability.md told users to run it; nothing noticed. It now
times `Trainer.step` and saves with `Trainer.save` / `RunState.save`."""

import importlib.util
import json
import os

import pytest

from ada import loop
from ada.run.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "checkpoint_save", os.path.join(ROOT, "benchmarks", "checkpoint_save.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

TINY = {"warmstart.enabled": "false", "data.num_train": 200, "data.num_eval": 8,
        "data.prompts_per_step": 4, "adaptive.samples_per_round": 4, "adaptive.max_rounds": 2,
        "sampling.num_slots": 16, "sampling.max_new_tokens": 6, "log.tensorboard": "false",
        "log.update_diagnostics": "false"}


def test_checkpoint_save_benchmark_runs_tiny(tmp_path):
    """A 3-step run saving every 2 steps, one timed save: every figure is there, the ratios
    are of the figures measured in the same process, and no attribute of ada.loop or of
    the Trainer is replaced (before or after). Breaks if the benchmark patches or needs a
    name the seam does not have, or if it saves anything but the run's steps (2, 3)."""
    before, methods = dict(vars(loop)), dict(vars(Trainer))
    out = bench.main(["--steps", "3", "--every", "2", "--saves", "1", "--workdir",
                      str(tmp_path / "run"), "--json", str(tmp_path / "out.json"),
                      *[f"--config.{k}={v}" for k, v in TINY.items()]])
    assert {k: id(v) for k, v in vars(loop).items()} == {k: id(v) for k, v in before.items()}
    assert dict(vars(Trainer)) == methods
    assert json.loads((tmp_path / "out.json").read_text()) == out
    assert out["step_s"] > 0 and out["after_save_s"] > 0
    assert 0 < out["save_call_s"] <= out["save_sync_s"]  # the call is part of the sync save
    assert out["ratio"] == pytest.approx((out["step_s"] + out["save_call_s"]) / out["step_s"])
    assert out["ratio_sync"] >= out["ratio"] > 1
    assert out["after_ratio"] == pytest.approx(out["after_save_s"] / out["step_s"])
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["2", "3"]
