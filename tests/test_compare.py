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


def fake_run(samples_per_step, accs, step_s, entropy=1.0):
    """Clocked metric rows as the loop writes them (an eval row at step 0, one row per step,
    an eval every 2 steps) and the run's record."""
    rows = [{"step": 0, "eval_accuracy": accs[0]}]
    total = 0
    for step in range(1, 2 * (len(accs) - 1) + 1):
        total += samples_per_step
        row = {"step": step, "samples_total": total, "zero_variance_share": 0.25,
               "entropy": entropy + step, "time_collect_s": step_s - 0.5, "time_update_s": 0.5,
               "reward_round0_mean": 0.3, "samples_per_prompt": samples_per_step / 8,
               "lacking_pos_share_round0": 0.5, "lacking_neg_share_round0": 0.1}
        if step % 2 == 0:
            row["eval_accuracy"] = accs[step // 2]
        rows.append(row)
    rows = compare.with_clock(rows)
    return rows, compare.record(rows, mix="hard", method="x", seed=0)


def test_summary_at_equal_steps_samples_seconds_and_to_target(tmp_path):
    """Every figure against a hand computation: GRPO draws 32 samples a step in 1.5 s, Ada
    64 in 3 s; evals every 2 steps; the first step's seconds are not counted."""
    runs = {
        "grpo": [fake_run(32, [0.2, 0.3, 0.4], 1.5), fake_run(32, [0.2, 0.3, 0.5], 1.5)],
        "ada_balance": [fake_run(64, [0.2, 0.4, 0.6], 3.0, entropy=2.0),
                        fake_run(64, [0.2, 0.5, 0.6], 3.0, entropy=2.0)],
    }
    assert [p["seconds"] for p in runs["grpo"][0][1]["curve"]] == [0.0, 1.5, 4.5]
    assert [p["samples"] for p in runs["ada_balance"][0][1]["curve"]] == [0, 128, 256]
    s = compare.summarize(runs, target=0.45)
    assert (s["equal_samples"], s["equal_seconds"]) == (128, 4.5)  # GRPO's whole run
    g, a = s["variants"]["grpo"], s["variants"]["ada_balance"]
    assert (g["equal_steps"], g["equal_steps_std"]) == pytest.approx((0.45, 0.05))
    assert (a["equal_steps"], a["equal_steps_std"]) == pytest.approx((0.6, 0.0))
    assert a["equal_samples"] == pytest.approx(0.45)  # its step-2 evals, at 128 samples
    assert a["equal_seconds"] == pytest.approx(0.45)  # its step-2 evals, at 3 s
    assert g["equal_samples"] == g["equal_seconds"] == pytest.approx(0.45)
    # to 0.45: GRPO once (seed 1, step 4, 4.5 s); Ada at step 4 (9 s) and at step 2 (3 s)
    assert (g["reached_target"], g["steps_to_target"], g["seconds_to_target"]) == (1, 4, 4.5)
    assert (a["reached_target"], a["steps_to_target"], a["seconds_to_target"]) == (2, 3, 6)
    assert a["samples"] == 256 and a["seconds"] == 9 and a["final_entropy"] == 6.0
    pooled = np.sqrt((0.05 ** 2 + 0.0 ** 2) / 2)
    assert s["ada_balance_minus_grpo"]["in_pooled_std"] == pytest.approx(0.15 / pooled)

    summary = {"start": "s", "command": "c", "date": "d", "mixes": {"hard": dict(s, grpo_matched_n=8)}}
    text = compare.table(summary)
    assert "| ada_balance | 2 | 0.600 ± 0.000 | 0.450 ± 0.050 |" in text and "(+4.2 pooled std" in text
    compare.plot(runs, ("grpo", "ada_balance"), compare.PANELS, str(tmp_path / "c.png"), "test")
    assert os.path.getsize(tmp_path / "c.png") > 10_000


def test_unknown_mix_or_variant_is_refused(capsys):
    assert compare.main(["--workdir", "/tmp/unused", "--mixes", "medium"]) == 2
    assert "medium" in capsys.readouterr().err
    assert compare.main(["--workdir", "/tmp/unused", "--variants", "ppo"]) == 2
    assert "ppo" in capsys.readouterr().err
