"""GRPO vs DAPO vs Ada-pos vs Ada-balance from the same start, on an easy and a hard prompt
set, several seeds (Figure 1 and the difficulty ablation of the paper, in miniature).

    python experiments/compare_methods.py --workdir runs/compare [--seeds 0,1,2]
        [--mixes easy,hard] [--config configs/default.py] [--config.train.steps=60 ...]

The prompt sets are the paper's kind (section 4.1): training prompts chosen by the pass
rate of the policy that starts training (MIXES; `data.pass_rate_range`, 16 draws each).
Every run of a mix starts from the same cached warm start and the same prompt set; only
the method and the RL seed change. Writes to --workdir:
  <mix>/<method>/seed<k>/   each run's metrics.jsonl, checkpoints, plots
  table.md                  per mix and method: held-out accuracy (mean ± std over seeds)
                            at equal steps and at equal samples drawn, samples drawn,
                            zero-variance share, final entropy, wall clock
  summary.json              the same numbers: {mix: {method: {...}}}
  compare_<mix>.png         held-out accuracy vs steps, samples drawn and wall clock; the
                            policy's accuracy on its batches (first round); entropy; the
                            share of prompts short of correct / of wrong responses after the
                            first round; samples per prompt
Numbers are reported as measured; nothing here picks seeds or tunes one method.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ada import config as cfglib  # noqa: E402
from ada.metrics import read_jsonl, series  # noqa: E402

COMPARED = ("grpo", "dapo", "ada_pos", "ada_balance")  # names from ada/methods.py
# Prompt sets by the starting policy's pass rate over 16 draws. hard: the paper's HARD_FILTER
# (solved 1 or 2 times in 16; most GRPO groups of 4 are all wrong); easy: solved at least 6
# times in 16. From the default's start (5,000 exact warm-start steps): 395 hard and 1,673
# easy of 4,000 training prompts (684 and 1,215 from the earlier 2,500-step start).
MIXES = {
    "all": (0.0, 1.0),
    "easy": (0.375, 1.0),
    "hard": (0.0625, 0.125),
}


def run_all(args, overrides) -> dict[str, dict[str, list[tuple[list[dict], dict]]]]:
    """{mix: {method: [(metrics rows, run summary) per seed]}}; finished runs are reused."""
    from ada.loop import train

    out = {}
    for mix in args.mixes:
        out[mix] = {}
        for method in COMPARED:
            out[mix][method] = []
            for seed in args.seeds:
                wd = os.path.join(args.workdir, mix, method, f"seed{seed}")
                cfg = cfglib.build_config(args.config, [
                    ("method", method), ("seed", str(seed)),
                    ("data.pass_rate_range", repr(MIXES[mix])), *overrides])
                cfglib.validate(cfg, wd)
                done = os.path.join(wd, "summary.json")
                if not os.path.exists(done):
                    print(f"== {mix} {method} seed {seed} -> {wd}", flush=True)
                    train(cfg, wd)
                with open(done) as f:
                    out[mix][method].append((read_jsonl(os.path.join(wd, "metrics.jsonl")),
                                             json.load(f)))
    return out


def with_clock(rows: list[dict]) -> list[dict]:
    """Rows with `wall_s`, seconds spent collecting and updating up to the end of the step
    (evals excluded, so methods compare by their training cost), and `samples_total` on
    every row (0 on the step-0 eval), so the curves against either start at the start."""
    t, drawn, out = 0.0, 0, []
    for r in rows:
        t += r.get("time_collect_s", 0.0) + r.get("time_update_s", 0.0)
        drawn = r.get("samples_total", drawn)
        out.append(dict(r, wall_s=t, samples_total=drawn))
    return out


def eval_points(rows):
    """[(step, samples_drawn_so_far, eval_accuracy)] of one run."""
    cum = {r["step"]: r.get("samples_total", 0) for r in rows}
    return [(r["step"], cum.get(r["step"], 0), r["eval_accuracy"])
            for r in rows if r.get("eval_accuracy") is not None]


def acc_at_samples(rows, budget: float) -> float:
    """Held-out accuracy of the last eval whose samples drawn so far are <= budget."""
    pts = [p for p in eval_points(rows) if p[1] <= budget]
    return pts[-1][2] if pts else float("nan")


def _last(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return vals[-1] if vals else float("nan")


def summarize(runs: dict[str, list[tuple[list[dict], dict]]]) -> dict:
    """One mix: per method, the numbers of the table (mean and std over seeds)."""
    drawn = {m: [eval_points(rows)[-1][1] for rows, _ in rs] for m, rs in runs.items()}
    budget = min(np.mean(v) for v in drawn.values())  # the smallest total any method drew
    out = {"equal_samples_budget": float(budget)}
    for m, rs in runs.items():
        finals = [eval_points(rows)[-1][2] for rows, _ in rs]
        at_budget = [acc_at_samples(rows, budget) for rows, _ in rs]
        out[m] = {
            "final_eval_accuracy": float(np.mean(finals)),
            "final_eval_accuracy_std": float(np.std(finals)),
            "initial_eval_accuracy": float(np.mean([eval_points(rows)[0][2] for rows, _ in rs])),
            "eval_accuracy_at_equal_samples": float(np.nanmean(at_budget)),
            "eval_accuracy_at_equal_samples_std": float(np.nanstd(at_budget)),
            "samples_drawn": float(np.mean(drawn[m])),
            "zero_variance_share": float(np.mean([np.mean([r["zero_variance_share"] for r in rows
                                                           if "zero_variance_share" in r])
                                                  for rows, _ in rs])),
            "final_entropy": float(np.mean([_last(rows, "entropy") for rows, _ in rs])),
            "wall_clock_s": float(np.mean([s["seconds"] for _, s in rs])),
            "seeds": len(rs),
        }
    return out


def table(summary: dict) -> str:
    lines = []
    for mix, s in summary.items():
        lines += [
            f"**{mix}** (pass-rate range {MIXES[mix]})\n",
            f"| method | eval acc (final, equal steps) | eval acc at {s['equal_samples_budget']:.0f} "
            "samples | samples drawn | zero-variance share | final entropy | wall clock (s) |",
            "|---|---|---|---|---|---|---|",
        ]
        for m in COMPARED:
            r = s[m]
            lines.append(
                f"| {m} | {r['final_eval_accuracy']:.3f} ± {r['final_eval_accuracy_std']:.3f} "
                f"| {r['eval_accuracy_at_equal_samples']:.3f} ± "
                f"{r['eval_accuracy_at_equal_samples_std']:.3f} | {r['samples_drawn']:.0f} "
                f"| {r['zero_variance_share']:.3f} | {r['final_entropy']:.3f} "
                f"| {r['wall_clock_s']:.0f} |")
        lines.append("")
    return "\n".join(lines)


PANELS = (  # (metric, x axis, title)
    ("eval_accuracy", "step", "held-out accuracy vs step"),
    ("eval_accuracy", "samples_total", "held-out accuracy vs samples drawn"),
    ("eval_accuracy", "wall_s", "held-out accuracy vs training seconds"),
    ("reward_round0_mean", "step", "policy accuracy on its batch (first round)"),
    ("entropy", "step", "entropy per response token"),
    ("lacking_pos_share_round0", "step", "share short of n/2 correct after round 1"),
    ("lacking_neg_share_round0", "step", "share short of n/2 wrong after round 1"),
    ("samples_per_prompt", "step", "responses drawn per prompt"),
)
X_LABELS = {"step": "step", "samples_total": "samples drawn", "wall_s": "seconds (collect + update)"}


def plot(runs: dict[str, list[tuple[list[dict], dict]]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 7.5))
    for ax, (key, x, name) in zip(axes.flat, PANELS, strict=True):
        for m, rs in runs.items():
            curves = [series(with_clock(rows), key, x=x) for rows, _ in rs]
            curves = [c for c in curves if len(c[0])]
            if not curves:
                continue
            n = min(len(c[0]) for c in curves)
            xs = np.mean([c[0][:n] for c in curves], axis=0)
            ys = np.array([c[1][:n] for c in curves])
            if key != "eval_accuracy" and n > 20:  # per-step series: a 10-step moving mean
                kernel = np.ones(10) / 10
                xs = np.convolve(xs, kernel, "valid")
                ys = np.array([np.convolve(y, kernel, "valid") for y in ys])
            ax.plot(xs, ys.mean(0), label=m)
            ax.fill_between(xs, ys.mean(0) - ys.std(0), ys.mean(0) + ys.std(0), alpha=0.2)
        ax.set_xlabel(X_LABELS[x])
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides, rest = cfglib.parse_override_args(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--config", default="configs/default.py")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--mixes", default="easy,hard", help=f"comma-separated, of {sorted(MIXES)}")
    args = p.parse_args(rest)
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.mixes = [m for m in args.mixes.split(",") if m]
    unknown = [m for m in args.mixes if m not in MIXES]
    if unknown:
        print(f"error: --mixes {unknown} not in {sorted(MIXES)}", file=sys.stderr)
        return 2
    try:
        runs = run_all(args, overrides)
    except cfglib.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = {mix: summarize(r) for mix, r in runs.items()}
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    text = table(summary)
    with open(os.path.join(args.workdir, "table.md"), "w") as f:
        f.write(text)
    for mix, r in runs.items():
        plot(r, os.path.join(args.workdir, f"compare_{mix}.png"),
             f"{mix} prompts (pass rate {MIXES[mix]}), seeds {args.seeds}, mean ± std")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
