"""benchmarks/device_check.py, the one prepared device check, smoke-run on this CPU at tiny
shapes (--tiny): it must write every figure it promises, positive and finite, with the
memory ledger's ratios where they mean something here."""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # ~80 s on a shared 2-core CPU: a short RL run, its plan and two decoders
def test_tiny_device_check_writes_every_figure(tmp_path):
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "device_check.py"),
                        "--tiny", "--json", str(out)], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    fig = json.loads(out.read_text())
    assert fig["device"] == "cpu" and fig["preset"] == "tiny" and fig["shapes"]["layers"] == 2
    assert set(fig["decode_tok_s"]) == {"dense", "paged"}
    positive = [*fig["decode_tok_s"].values(), fig["rl_step_s"], fig["mfu"], fig["peak_flops"]]
    assert all(math.isfinite(v) and v > 0 for v in positive), fig
    assert fig["mfu"] < 1 and fig["decode_slots"] == 16 and "num_slots" in fig["slots_from"]
    # the CPU reports no memory stats: live arrays, whose boundaries hold exact ledger parts
    assert fig["source"].startswith("jax.live_arrays")
    assert set(fig["peak_vs_ledger"]) == {"init", "collect", "update", "handoff", "save"}
    for phase in ("init", "update", "handoff"):
        assert 0.5 < fig["peak_vs_ledger"][phase] < 2, (phase, fig)
