"""benchmarks/decode.py's accelerator mode (--device), smoke-run on this CPU with a tiny
model and a stand-in memory size: both caches run at the slots that fit and the JSON holds
measured tokens/s for each; the bandwidth table matches device kinds by their longest
prefix."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_device_mode_runs_dense_and_paged_at_the_slots_that_fit(tmp_path):
    out = tmp_path / "dev.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "decode.py"),
                        "--device", "tiny", "--hbm-gib", "0.004", "--prompt", "16", "--new",
                        "64", "--chunk", "8", "--max-slots", "32", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    fig = json.loads(out.read_text())
    assert fig["device"] == "cpu" and fig["hbm_bandwidth"] is None
    for kind in ("dense", "paged"):
        run = fig["runs"][kind]
        assert 1 <= run["slots"] <= run["slots_that_fit"] and run["tokens_per_s"] > 0
        assert run["tokens"] >= run["slots"]  # every request drew at least one token
    assert fig["runs"]["paged"]["slots_that_fit"] > fig["runs"]["dense"]["slots_that_fit"]


def test_bandwidth_by_the_longest_device_kind_prefix():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from decode import hbm_bandwidth
    finally:
        sys.path.pop(0)
    assert hbm_bandwidth("TPU v5 lite") == 8.19e11 and hbm_bandwidth("TPU v5") == 2.765e12
    assert hbm_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert hbm_bandwidth("NVIDIA H100 PCIe") == 2.0e12 and hbm_bandwidth("cpu") is None
