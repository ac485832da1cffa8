"""The embedded tool task (configs/tools.py): the tool run against the same model and task
without tools, over RL seeds, from one warm start each (cached, shared by the seeds).

    python experiments/tools_study.py --workdir runs/tools_study --out docs/tools --seeds 0,1,2

Runs `configs/tools.py` and `configs/tools.py:notools` once per seed into
WORKDIR/{tools,notools}_s{seed} (a finished run is read, not rerun; `--no_run` only reads),
then writes OUT/tools.md (held-out accuracy at the first and last eval, the tool-call rate at
steps 1 and last, per seed, with means), OUT/tools.json and OUT/tools.png (held-out
accuracy and the tool-call rate over steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"tools": "configs/tools.py", "notools": "configs/tools.py:notools"}


def rows_of(wd: str) -> list[dict]:
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(variant: str, seed: int, wd: str) -> None:
    summary = os.path.join(wd, "summary.json")
    if os.path.exists(summary):
        return
    cmd = [sys.executable, "-m", "ada.runner", "--config", os.path.join(ROOT, VARIANTS[variant]),
           "--workdir", wd, f"--config.seed={seed}", "--config.log.progress=false"]
    subprocess.run(cmd, check=True, cwd=ROOT)


def record(rows: list[dict]) -> dict:
    evals = [r for r in rows if "eval_accuracy" in r]
    steps = [r for r in rows if r["step"] >= 1]
    return {"eval_first": evals[0]["eval_accuracy"], "eval_last": evals[-1]["eval_accuracy"],
            "call_rate_first": steps[0].get("tool_call_rate", 0.0),
            "call_rate_last": steps[-1].get("tool_call_rate", 0.0),
            "steps": steps[-1]["step"],
            "curve": [(r["step"], r["eval_accuracy"]) for r in evals],
            "calls": [(r["step"], r.get("tool_call_rate", 0.0)) for r in steps]}


def table(recs: dict) -> str:
    lines = ["| variant | seed | held-out avg@4, first eval | last eval | tool-call rate, "
             "step 1 | last step |", "|---|---|---|---|---|---|"]
    for variant, per in recs.items():
        for seed, r in per.items():
            lines.append(f"| {variant} | {seed} | {r['eval_first']:.3f} | {r['eval_last']:.3f} "
                         f"| {r['call_rate_first']:.2f} | {r['call_rate_last']:.2f} |")
        last = np.array([r["eval_last"] for r in per.values()])
        lines.append(f"| {variant} | mean ± std | | {last.mean():.3f} ± {last.std(ddof=1):.3f} "
                     "| | |")
    return "\n".join(lines) + "\n"


def plot(recs: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, calls) = plt.subplots(1, 2, figsize=(10, 3.8))
    for variant, color in (("tools", "tab:blue"), ("notools", "tab:gray")):
        for seed, r in recs.get(variant, {}).items():
            label = f"{variant}" if seed == min(recs[variant]) else None
            acc.plot(*zip(*r["curve"]), color=color, marker="o", label=label)
            if variant == "tools":
                calls.plot(*zip(*r["calls"]), color=color, alpha=0.7, label=label)
    acc.set(xlabel="RL step", ylabel="held-out avg@4", ylim=(-0.02, 1.02),
            title="held-out accuracy (each line a seed)")
    calls.set(xlabel="RL step", ylabel="share of trajectories", ylim=(-0.02, 1.02),
              title="tool-call rate (tool run)")
    acc.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="where the runs go (or are read from)")
    p.add_argument("--out", required=True, help="folder for tools.md, tools.json, tools.png")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated RL seeds")
    p.add_argument("--no_run", action="store_true", help="only read finished runs")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    recs = {}
    for variant in VARIANTS:
        for seed in seeds:
            wd = os.path.join(args.workdir, f"{variant}_s{seed}")
            if not args.no_run:
                run(variant, seed, wd)
            recs.setdefault(variant, {})[seed] = record(rows_of(wd))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tools.md"), "w") as f:
        f.write(table(recs))
    with open(os.path.join(args.out, "tools.json"), "w") as f:
        json.dump(recs, f, indent=1)
    plot(recs, os.path.join(args.out, "tools.png"))
    print(table(recs))
    return recs


if __name__ == "__main__":
    main()
