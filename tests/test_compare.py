"""experiments/compare_methods.py: the summary's numbers from known metric rows."""

import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "compare_methods", os.path.join(ROOT, "experiments", "compare_methods.py"))
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)


def fake_run(samples_per_step, accs, entropy, seconds):
    """Metric rows as the loop writes them: an eval row at step 0, then one per step with an
    eval every 2 steps."""
    rows = [{"step": 0, "eval_accuracy": accs[0]}]
    total = 0
    for step in range(1, 2 * (len(accs) - 1) + 1):
        total += samples_per_step
        row = {"step": step, "samples_total": total, "zero_variance_share": 0.25,
               "entropy": entropy + step, "time_collect_s": 1.0, "time_update_s": 0.5,
               "reward_round0_mean": 0.3, "samples_per_prompt": samples_per_step / 8,
               "lacking_pos_share_round0": 0.5, "lacking_neg_share_round0": 0.1}
        if step % 2 == 0:
            row["eval_accuracy"] = accs[step // 2]
        rows.append(row)
    return rows, {"seconds": seconds}


def test_summary_fields_and_equal_sample_accuracy(tmp_path):
    runs = {
        "grpo": [fake_run(32, [0.2, 0.3, 0.4], 1.0, 10.0), fake_run(32, [0.2, 0.3, 0.5], 1.0, 12.0)],
        "ada_balance": [fake_run(64, [0.2, 0.4, 0.6], 2.0, 20.0),
                        fake_run(64, [0.2, 0.5, 0.6], 2.0, 22.0)],
    }
    s = compare.summarize(runs)
    assert s["equal_samples_budget"] == 128  # GRPO's whole budget: 4 steps x 32
    g, a = s["grpo"], s["ada_balance"]
    assert g["final_eval_accuracy"] == pytest.approx(0.45)
    assert g["final_eval_accuracy_std"] == pytest.approx(0.05)
    assert a["final_eval_accuracy"] == pytest.approx(0.6)
    assert a["eval_accuracy_at_equal_samples"] == pytest.approx(0.45)  # its step-2 evals
    assert a["samples_drawn"] == 256 and g["samples_drawn"] == 128
    assert a["final_entropy"] == pytest.approx(6.0) and a["wall_clock_s"] == pytest.approx(21.0)
    assert g["zero_variance_share"] == pytest.approx(0.25)
    for key in ("final_eval_accuracy", "final_eval_accuracy_std", "eval_accuracy_at_equal_samples",
                "samples_drawn", "zero_variance_share", "final_entropy", "wall_clock_s"):
        assert np.isfinite(a[key]) and np.isfinite(g[key])
    clocked = compare.with_clock(runs["grpo"][0][0])
    assert [r["wall_s"] for r in clocked[:3]] == [0.0, 1.5, 3.0]
    assert [r["samples_total"] for r in clocked[:3]] == [0, 32, 64]

    compare.plot(runs, str(tmp_path / "c.png"), "test")
    assert os.path.getsize(tmp_path / "c.png") > 10_000


def test_unknown_mix_is_refused(capsys):
    assert compare.main(["--workdir", "/tmp/unused", "--mixes", "medium"]) == 2
    assert "medium" in capsys.readouterr().err
