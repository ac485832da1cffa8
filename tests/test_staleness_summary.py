"""experiments/staleness.py's speed at matched steps: each variant's seconds to the same step
against its baseline's, seed by seed (the claim it replaced, "1.34x faster to 0.7", was one
seed's eval landing on the other side of 0.7)."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "staleness", os.path.join(ROOT, "experiments", "staleness.py"))
staleness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(staleness)


def run(variant, seed, seconds_per_step, acc_at_50, load):
    curve = [{"step": s, "seconds": seconds_per_step * s, "samples": 10 * s} for s in range(101)]
    for s in (0, 50, 100):
        curve[s]["eval_accuracy"] = acc_at_50 if s == 50 else 0.3 + 0.006 * s
    return {"method": variant, "seed": seed, "curve": curve, "loadavg_before": [load, 0, 0],
            "loadavg_after": [load + 1, 0, 0], **{k: 0.0 for k in staleness.STREAM}}


def test_speedup_is_paired_by_seed_at_matched_steps():
    """The split runs are compared with k0_split, the rest with k0, seed by seed: a ratio
    of the seconds to the same step, mean and std over seeds, and each side's load range.
    Pairing the wrong baseline or seed, or reading seconds to the accuracy target instead,
    fails: seed 1 of k2_split crosses 0.7 at step 50 (seconds to 0.7 would say 2x faster),
    while its seconds per step are 0.9 against 1.0."""
    records = {
        "k0": [run("k0", s, 2.0, 0.69, 1.0) for s in (0, 1)],
        "k2": [run("k2", s, 2.0, 0.69, 1.0) for s in (0, 1)],
        "k0_split": [run("k0_split", s, 1.0, 0.69, 2.0) for s in (0, 1)],
        "k2_split": [run("k2_split", 0, 0.9, 0.69, 4.0), run("k2_split", 1, 0.8, 0.71, 4.0)],
    }
    out = staleness.summarize(records, 0.7, at=(50, 100))
    rows = {r["a"]: r for r in out["speedup"]}
    assert set(rows) == {"k2", "k2_split"}
    assert rows["k2"]["b"] == "k0" and rows["k2_split"]["b"] == "k0_split"
    st = rows["k2_split"]["steps"]["100"]
    assert st["ratio"] == pytest.approx([1 / 0.9, 1 / 0.8])
    assert st["seconds_a_mean"] == pytest.approx(85.0)
    assert rows["k2_split"]["load_a"] == [4.0, 5.0] and rows["k2_split"]["load_b"] == [2.0, 3.0]
    assert rows["k2"]["steps"]["50"]["ratio_mean"] == pytest.approx(1.0)
    md = staleness.table(out)
    assert "| k2_split vs k0_split (2) | 1.18 ± 0.10 | 1.18 ± 0.10 |" in md
