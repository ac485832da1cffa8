"""LoRA against full fine-tuning on the default run (issue 45, item 5): model.lora.rank R
at a learning rate of its own beside the full run at the config's, seeds fixed in advance,
each run its own process (`python -m ada.runner`, under `nice`), --parallel at a time.

    python experiments/lora_study.py --workdir /tmp/lora_study --out docs/lora \
        --ranks 0,1,8,32 --lr 3e-3 [--seeds 0,1,2] [--parallel 2] [--config.train.steps=200 ...]
    python experiments/lora_study.py --lr_sweep --rank 8 --lrs 3e-4,3e-3,9e-3 --seeds 0 ...

Rank 0 is full fine-tuning at --full_lr (default: the config's optim.lr); the other ranks
run at --lr. A run's folder is <workdir>/r<rank>/lr<lr>/seed<seed>, so a sweep's run is the
main study's when its (rank, lr, seed) match. Finished runs (summary.json) are skipped; an
unfinished one resumes from its checkpoint (--no_run: none is started). Writes to --out,
over every finished run in --workdir (the sweep's too):
  summary.json  per (rank, lr): held-out accuracy at the last step (mean, sample std, per
                seed) and at each eval (mean), steps to --target (the first eval at or
                above it), seconds per step (training only: evals and the compiling
                first step excluded), samples drawn (the seconds follow them: Ada-balance
                draws per prompt) and each run's load average; `tests`: each rank of --ranks against full fine-tuning
                at its lr (difference, Welch p, Holm over the ranks); every run's record
  table.md      the same, as tables
Seconds per step are only comparable between runs under the same load (recorded).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)


def run_dir(workdir: str, rank: int, lr: float, seed: int) -> str:
    return os.path.join(workdir, f"r{rank}", f"lr{lr:g}", f"seed{seed}")


def run_one(args, rank: int, lr: float, seed: int) -> None:
    """One run in its own process, unless finished; the load average around it."""
    wd = run_dir(args.workdir, rank, lr, seed)
    if os.path.exists(os.path.join(wd, "summary.json")):
        return
    cmd = ["nice", sys.executable, "-m", "ada.runner", "--config", args.config, "--workdir", wd,
           f"--config.seed={seed}", f"--config.optim.lr={lr:g}",
           f"--config.model.lora.rank={rank}", "--config.log.progress=false", *args.overrides]
    os.makedirs(os.path.dirname(wd), exist_ok=True)
    print(f"== r{rank} lr {lr:g} seed {seed} -> {wd}", flush=True)
    before = os.getloadavg()
    with open(wd + ".log", "a") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    print(f"   r{rank} lr {lr:g} seed {seed}: exit {rc}", flush=True)
    if rc == 0:
        with open(os.path.join(wd, "load.json"), "w") as f:
            json.dump({"loadavg_before": before, "loadavg_after": os.getloadavg()}, f)


def finished(workdir: str) -> dict:
    """{(rank, lr): [record per finished seed]} of every run folder under `workdir`."""
    import compare_methods as cm

    from ada.metrics import read_jsonl

    out = {}
    for done in sorted(glob.glob(os.path.join(workdir, "r*", "lr*", "seed*", "summary.json"))):
        wd = os.path.dirname(done)
        rank, lr, seed = re.fullmatch(r"r(\d+)/lr([^/]+)/seed(\d+)",
                                      os.path.relpath(wd, workdir)).groups()
        load_file = os.path.join(wd, "load.json")
        load = json.load(open(load_file)) if os.path.exists(load_file) else {}
        rows = cm.with_clock(read_jsonl(os.path.join(wd, "metrics.jsonl")))
        key = (int(rank), float(lr))
        out.setdefault(key, []).append(cm.record(rows, rank=key[0], lr=key[1], seed=int(seed),
                                                 **load))
    return out


def summarize(records: dict, target: float, full: tuple | None, ranks) -> dict:
    """Per (rank, lr) group; each rank of the study (`ranks`: {rank: its lr}) against `full`,
    the (0, lr) group of full fine-tuning."""
    import compare_methods as cm
    from seed_stats import holm, mean_std, welch

    groups, finals = [], {}
    for (rank, lr), rs in sorted(records.items()):
        curves = [cm.evals(r["curve"]) for r in rs]
        reached = [cm.first_reach(c, target) for c in curves]
        finals[rank, lr] = [c[-1]["eval_accuracy"] for c in curves]
        g = {"rank": rank, "lr": lr, "seeds": [r["seed"] for r in rs],
             "final": finals[rank, lr], "steps": [c[-1]["step"] for c in curves],
             "reached_target": sum(p is not None for p in reached),
             "curve_mean": {p["step"]: mean_std([c[i]["eval_accuracy"] for c in curves])[0]
                            for i, p in enumerate(curves[0]) if all(len(c) > i for c in curves)},
             "load": [[r.get(k, [None])[0] for k in ("loadavg_before", "loadavg_after")]
                      for r in rs]}
        for name, xs in (("final", finals[rank, lr]),
                         ("steps_to_target", [p["step"] if p else float("nan") for p in reached]),
                         ("s_per_step", [c[-1]["seconds"] / max(c[-1]["step"] - 1, 1)
                                         for c in curves]),
                         ("samples", [c[-1]["samples"] for c in curves])):
            g[name + "_mean"], g[name + "_std"] = mean_std(xs)
        groups.append(g)
    tests = []
    for key in records:
        if full in records and key[0] != 0 and ranks.get(key[0]) == key[1]:
            a, b = finals[key], finals[full]
            tests.append({"rank": key[0], "lr": key[1], "full_lr": full[1],
                          "seeds": [len(a), len(b)], "diff": mean_std(a)[0] - mean_std(b)[0],
                          "p_welch": welch(a, b)[2]})
    for t, p in zip(tests, holm([t["p_welch"] for t in tests]), strict=True):
        t["p_holm"] = p
    return {"target": target, "groups": groups, "tests": tests}


def table(summary: dict) -> str:
    from compare_methods import num

    t = summary["target"]
    lines = [f"| rank | lr | seeds | held-out acc. at the last step (mean ± std) | per seed | "
             f"steps to {t:g} (reached) | s / step (mean ± std) | samples drawn (mean) | "
             "load avg (1 min) |", "|---|---|---|---|---|---|---|---|---|"]
    for g in summary["groups"]:
        load = [x for pair in g["load"] for x in pair if x is not None]
        lines.append(
            f"| {'full' if g['rank'] == 0 else g['rank']} | {g['lr']:g} | "
            f"{','.join(map(str, g['seeds']))} | {num(g['final_mean'])} ± {num(g['final_std'])} | "
            f"{' '.join(f'{x:.3f}' for x in g['final'])} | "
            f"{num(g['steps_to_target_mean'], '.0f')} ± {num(g['steps_to_target_std'], '.0f')} "
            f"({g['reached_target']}/{len(g['seeds'])}) | {num(g['s_per_step_mean'], '.2f')} ± "
            f"{num(g['s_per_step_std'], '.2f')} | {num(g['samples_mean'], ',.0f')} | "
            f"{f'{min(load):.1f}-{max(load):.1f}' if load else '-'} |")
    evals = list(summary["groups"][0]["curve_mean"]) if summary["groups"] else []
    lines += ["", "| rank | lr | " + " | ".join(f"step {n}" for n in evals) + " |",
              "|---" * (2 + len(evals)) + "|"]
    for g in summary["groups"]:
        lines.append(f"| {'full' if g['rank'] == 0 else g['rank']} | {g['lr']:g} | "
                     + " | ".join(num(g["curve_mean"].get(n, float("nan"))) for n in evals) + " |")
    if summary["tests"]:
        lines += ["", "| rank (lr) vs full (lr) | seeds | acc. diff | p (Welch) | p (Holm) |",
                  "|---|---|---|---|---|"]
        for x in summary["tests"]:
            lines.append(f"| {x['rank']} ({x['lr']:g}) vs full ({x['full_lr']:g}) | "
                         f"{x['seeds'][0]} vs {x['seeds'][1]} | {x['diff']:+.3f} | "
                         f"{num(x['p_welch'])} | {num(x['p_holm'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from ada import config as cfglib

    argv = list(sys.argv[1:] if argv is None else argv)
    overrides, rest = cfglib.parse_override_args(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/lora_study")
    ap.add_argument("--out", default="docs/lora")
    ap.add_argument("--config", default="configs/default.py")
    ap.add_argument("--seeds", default="0,1,2", help="fixed before any run, the same for all")
    ap.add_argument("--ranks", default="0,1,8,32", help="0: full fine-tuning")
    ap.add_argument("--lr", type=float, default=3e-3, help="the LoRA ranks' optim.lr")
    ap.add_argument("--full_lr", type=float, help="full fine-tuning's (default: the config's)")
    ap.add_argument("--lr_sweep", action="store_true", help="--rank at each of --lrs instead")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lrs", default="3e-4,3e-3,9e-3")
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time (one per core)")
    ap.add_argument("--target", type=float, default=0.7)
    ap.add_argument("--no_run", action="store_true", help="summarize the finished runs only")
    args = ap.parse_args(rest)
    args.overrides = [f"--config.{k}={v}" for k, v in overrides]
    full_lr = args.full_lr or float(cfglib.build_config(args.config, overrides).optim.lr)
    seeds = [int(s) for s in args.seeds.split(",")]
    ranks = {int(r): (full_lr if int(r) == 0 else args.lr) for r in args.ranks.split(",")}
    jobs = ([(args.rank, float(lr), s) for lr in args.lrs.split(",") for s in seeds]
            if args.lr_sweep else [(r, lr, s) for r, lr in ranks.items() for s in seeds])
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(lambda job: run_one(args, *job), [] if args.no_run else jobs))
    records = finished(args.workdir)
    summary = summarize(records, args.target, (0, full_lr), {} if args.lr_sweep else ranks)
    summary.update(date=datetime.date.today().isoformat(), command=" ".join(sys.argv),
                   runs={f"r{k[0]}_lr{k[1]:g}": v for k, v in records.items()})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=float)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table(summary))
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
