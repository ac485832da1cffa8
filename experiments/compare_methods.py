"""GRPO vs Ada-pos vs Ada-balance from the same warm start, several seeds (Figure 1 in miniature).

    python experiments/compare_methods.py --workdir runs/compare [--seeds 0,1,2]
        [--config configs/default.py] [--config.train.steps=60 ...]

Every run starts from the same cached warm start (warmstart.seed is fixed; only the RL
seed changes). Writes to --workdir:
  <method>/seed<k>/...      each run's metrics.jsonl, checkpoints, plots
  table.md                  held-out accuracy (mean ± std over seeds) at equal steps and at
                            equal samples drawn, zero-variance share, samples per prompt
  compare.png               reward and held-out accuracy vs steps and vs samples drawn,
                            zero-variance share and samples per prompt per step
  summary.json              per method: final_eval_accuracy, final_eval_accuracy_std,
                            samples_drawn, eval_accuracy_at_equal_samples, ...
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

COMPARED = ("grpo", "ada_pos", "ada_balance")  # names from ada/methods.py


def run_all(args, overrides) -> dict[str, list[list[dict]]]:
    from ada.loop import train

    out = {}
    for method in COMPARED:
        out[method] = []
        for seed in args.seeds:
            wd = os.path.join(args.workdir, method, f"seed{seed}")
            cfg = cfglib.build_config(args.config, [("method", method), ("seed", str(seed)),
                                                    *overrides])
            cfglib.validate(cfg, wd)
            done = os.path.exists(os.path.join(wd, "summary.json"))
            if not done:
                print(f"== {method} seed {seed} -> {wd}", flush=True)
                train(cfg, wd)
            out[method].append(read_jsonl(os.path.join(wd, "metrics.jsonl")))
    return out


def _cumulative_samples(rows):
    return {r["step"]: r.get("samples_total", 0) for r in rows}


def eval_points(rows):
    """[(step, samples_drawn_so_far, eval_accuracy)] of one run."""
    cum = _cumulative_samples(rows)
    return [(r["step"], cum.get(r["step"], 0), r["eval_accuracy"])
            for r in rows if r.get("eval_accuracy") is not None]


def acc_at_samples(rows, budget: float) -> float:
    """Held-out accuracy of the last eval whose samples drawn so far are <= budget."""
    pts = [p for p in eval_points(rows) if p[1] <= budget]
    return pts[-1][2] if pts else float("nan")


def summarize(runs: dict[str, list[list[dict]]]) -> dict:
    finals = {m: [eval_points(r)[-1][2] for r in rs] for m, rs in runs.items()}
    drawn = {m: [eval_points(r)[-1][1] for r in rs] for m, rs in runs.items()}
    budget = min(np.mean(v) for v in drawn.values())  # the smallest total any method drew
    out = {"equal_samples_budget": float(budget)}
    for m, rs in runs.items():
        at_budget = [acc_at_samples(r, budget) for r in rs]
        zv = [np.mean([x["zero_variance_share"] for x in r if "zero_variance_share" in x]) for r in rs]
        spp = [np.mean([x["samples_per_prompt"] for x in r if "samples_per_prompt" in x]) for r in rs]
        first = [eval_points(r)[0][2] for r in rs]
        out[m] = {
            "final_eval_accuracy": float(np.mean(finals[m])),
            "final_eval_accuracy_std": float(np.std(finals[m])),
            "initial_eval_accuracy": float(np.mean(first)),
            "samples_drawn": float(np.mean(drawn[m])),
            "eval_accuracy_at_equal_samples": float(np.nanmean(at_budget)),
            "eval_accuracy_at_equal_samples_std": float(np.nanstd(at_budget)),
            "zero_variance_share_mean": float(np.mean(zv)),
            "samples_per_prompt_mean": float(np.mean(spp)),
            "seeds": len(rs),
        }
    return out


def table(summary: dict) -> str:
    lines = [
        f"| method | eval acc (final, equal steps) | eval acc at {summary['equal_samples_budget']:.0f} samples "
        "| samples drawn | zero-variance share | samples/prompt |",
        "|---|---|---|---|---|---|",
    ]
    for m in COMPARED:
        s = summary[m]
        lines.append(
            f"| {m} | {s['final_eval_accuracy']:.3f} ± {s['final_eval_accuracy_std']:.3f} "
            f"| {s['eval_accuracy_at_equal_samples']:.3f} ± {s['eval_accuracy_at_equal_samples_std']:.3f} "
            f"| {s['samples_drawn']:.0f} | {s['zero_variance_share_mean']:.3f} "
            f"| {s['samples_per_prompt_mean']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, list[list[dict]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # pool_reward_mean (share positive over everything drawn) compares methods; reward_mean is
    # over the kept group, which balanced down-sampling pins near 0.5 for Ada-balance.
    panels = [("pool_reward_mean", "step"), ("eval_accuracy", "step"), ("eval_accuracy", "samples_total"),
              ("zero_variance_share", "step"), ("samples_per_prompt", "step")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, (key, x) in zip(axes, panels, strict=True):
        for m, rs in runs.items():
            curves = [series(r, key, x=x) for r in rs]
            curves = [c for c in curves if len(c[0])]
            if not curves:
                continue
            n = min(len(c[0]) for c in curves)
            xs = np.mean([c[0][:n] for c in curves], axis=0)
            ys = np.array([c[1][:n] for c in curves])
            ax.plot(xs, ys.mean(0), label=m)
            ax.fill_between(xs, ys.mean(0) - ys.std(0), ys.mean(0) + ys.std(0), alpha=0.2)
        ax.set_xlabel("samples drawn" if x == "samples_total" else "step")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides, rest = cfglib.parse_override_args(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--config", default="configs/default.py")
    p.add_argument("--seeds", default="0,1,2")
    args = p.parse_args(rest)
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    try:
        runs = run_all(args, overrides)
    except cfglib.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = summarize(runs)
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    text = table(summary)
    with open(os.path.join(args.workdir, "table.md"), "w") as f:
        f.write(text)
    plot(runs, os.path.join(args.workdir, "compare.png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
