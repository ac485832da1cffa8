"""The stream's staleness bound on the default run: rl.max_staleness k = 0, 1, 2, 4 with the
decoupled objective, k = 2 with the naive one (the sampler's log-probs as PPO's old), and the
disaggregated sampler (rl.sampler_devices=1 of 2 CPU devices) at k = 0 and 2, from the same
cached warm start, 3 seeds each.

    python experiments/staleness.py --workdir runs/staleness --out docs/compare
        [--seeds 0,1,2] [--variants k0,k1,...] [--config.train.steps=200 ...]
    python experiments/staleness.py --devices 2 --variants k0_split,k2_split ...

The split variants need a process of 2 CPU devices (--devices 2: set before JAX starts);
the others run in a process of one, as the default run does. Runs go one at a time and
are reused when finished, so the two invocations can run side by side. Writes to --out:
  staleness.json  per variant: held-out accuracy at the last step (mean, sample std, per
                  seed), seconds and steps to --target, samples, the stream's per-step
                  means (staleness, idle shares, importance weights, slot occupancy), and
                  each variant against k0 (difference, bootstrap CI, Welch p, Holm over
                  the comparisons); `speedup`: each variant's training seconds to the same
                  steps (--at) against its baseline's (k0, or k0_split for the split
                  runs), seed by seed, with each run's load average; every run's record
  staleness.md    the same, as tables
  staleness.png   held-out accuracy against steps and seconds

Speed is read at matched steps, not as seconds to --target: evals come every 25 steps, so
"seconds to 0.7" jumps by 25 steps' time when one seed's eval lands at 0.693 instead of
0.701. `--from-json docs/compare/staleness.json` re-summarizes the runs recorded there
without their run folders.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

VARIANTS = {
    "k0": [("rl.max_staleness", "0")],
    "k1": [("rl.max_staleness", "1")],
    "k2": [("rl.max_staleness", "2")],
    "k4": [("rl.max_staleness", "4")],
    "k2_naive": [("rl.max_staleness", "2"), ("loss.stale_objective", "naive")],
    "k0_split": [("rl.max_staleness", "0"), ("rl.sampler_devices", "1")],
    "k2_split": [("rl.max_staleness", "2"), ("rl.sampler_devices", "1")],
}
SPLIT = ("k0_split", "k2_split")
AT = (50, 100, 150, 200)  # the steps speed is compared at
STREAM = ("staleness_mean", "staleness_max", "sampler_idle_share", "trainer_idle_share",
          "queue_depth", "is_weight_mean", "is_weight_truncated_share", "slot_occupancy")


def run_one(args, overrides, variant: str, seed: int):
    """One run (reused when finished): its record (compare_methods.record + stream means)."""
    import compare_methods as cm

    from ada import config as cfglib

    wd = os.path.join(args.workdir, variant, f"seed{seed}")
    cfg = cfglib.build_config(args.config, [("seed", str(seed)), *VARIANTS[variant], *overrides])
    rows, load = cm.train_once(cfg, wd, f"{variant} seed {seed}")
    rec = cm.record(rows, method=variant, seed=seed, **load)
    trained = [r for r in rows if r.get("step", 0) > 1 and "staleness_mean" in r]
    rec.update({k: float(sum(r[k] for r in trained) / max(len(trained), 1)) for k in STREAM})
    rec["staleness_max"] = max((r["staleness_max"] for r in trained), default=0)
    return rec


def seconds_at(rec: dict, step: int) -> float:
    """A run's training seconds to the end of `step` (NaN if it stopped before)."""
    return next((p["seconds"] for p in rec["curve"] if p["step"] == step), float("nan"))


def speedup(records: dict, at) -> list[dict]:
    """Per variant against its baseline (the split runs: k0_split, the rest: k0): seconds to
    each step of `at`, mean and sample std over seeds, and the baseline's seconds over the
    variant's seed by seed (> 1: the variant is faster); the 1-minute load averages at each
    run's start and end, since runs under other loads are not comparable."""
    from seed_stats import mean_std

    def load(rs):
        xs = [x for r in rs for x in (r.get("loadavg_before", [None])[0],
                                      r.get("loadavg_after", [None])[0]) if x is not None]
        return [min(xs), max(xs)] if xs else None

    out = []
    for v, rs in records.items():
        base = "k0_split" if v in SPLIT else "k0"
        if v == base or base not in records:
            continue
        by_seed = {r["seed"]: r for r in records[base]}
        pairs = [(r, by_seed[r["seed"]]) for r in rs if r["seed"] in by_seed]
        row = {"a": v, "b": base, "seeds": [r["seed"] for r, _ in pairs],
               "load_a": load([r for r, _ in pairs]), "load_b": load([b for _, b in pairs]),
               "steps": {}}
        for step in at:
            sa = [seconds_at(r, step) for r, _ in pairs]
            sb = [seconds_at(b, step) for _, b in pairs]
            ratio = [y / x for x, y in zip(sa, sb, strict=True)]
            row["steps"][str(step)] = {
                "seconds_a": sa, "seconds_b": sb, "ratio": ratio,
                **dict(zip(("seconds_a_mean", "seconds_a_std"), mean_std(sa), strict=True)),
                **dict(zip(("seconds_b_mean", "seconds_b_std"), mean_std(sb), strict=True)),
                **dict(zip(("ratio_mean", "ratio_std"), mean_std(ratio), strict=True))}
        out.append(row)
    return out


def summarize(records: dict, target: float, at=AT) -> dict:
    import compare_methods as cm
    from seed_stats import bootstrap_ci, holm, mean_std, welch

    out, per_seed = {}, {}
    for v, rs in records.items():
        curves = [cm.evals(r["curve"]) for r in rs]
        reached = [cm.first_reach(c, target) for c in curves]
        finals = [c[-1]["eval_accuracy"] for c in curves]
        per_seed[v] = finals
        s = {"seeds": len(rs), "final": finals, "reached_target": sum(p is not None for p in reached)}
        s["final_mean"], s["final_std"] = mean_std(finals)
        for name, xs in (("seconds_to_target", [p["seconds"] if p else float("nan") for p in reached]),
                         ("steps_to_target", [p["step"] if p else float("nan") for p in reached]),
                         ("samples", [c[-1]["samples"] for c in curves]),
                         ("seconds", [c[-1]["seconds"] for c in curves]),
                         *((k, [r[k] for r in rs]) for k in STREAM)):
            s[name], s[name + "_std"] = mean_std(xs)
        out[v] = s
    tests = []
    for v in records:
        if v != "k0" and "k0" in records:
            a, b = per_seed[v], per_seed["k0"]
            pooled = ((out[v]["final_std"] ** 2 + out["k0"]["final_std"] ** 2) / 2) ** 0.5
            tests.append({"a": v, "b": "k0", "diff": out[v]["final_mean"] - out["k0"]["final_mean"],
                          "pooled_std": pooled, "ci95": bootstrap_ci(a, b), "p_welch": welch(a, b)[2]})
    for t, p in zip(tests, holm([t["p_welch"] for t in tests]), strict=True):
        t["p_holm"] = p
    return {"variants": out, "tests": tests, "target": target,
            "speedup": speedup(records, at), "at": list(at)}


def table(summary: dict) -> str:
    import compare_methods as cm

    num = cm.num
    lines = ["| variant | seeds | final held-out acc. (mean ± std) | training seconds "
             f"(mean ± std) | steps to {summary['target']:g} (reached) | samples | "
             "staleness mean / max | "
             "sampler idle | trainer idle | IS weight mean / truncated | slot occupancy |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for v, s in summary["variants"].items():
        lines.append(
            f"| {v} | {s['seeds']} | {num(s['final_mean'])} ± {num(s['final_std'])} | "
            f"{num(s['seconds'], '.0f')} ± {num(s['seconds_std'], '.0f')} | "
            f"{num(s['steps_to_target'], '.0f')} ({s['reached_target']}/{s['seeds']}) | "
            f"{num(s['samples'], ',.0f')} | {num(s['staleness_mean'], '.2f')} / "
            f"{num(s['staleness_max'], '.0f')} | {num(s['sampler_idle_share'], '.2f')} | "
            f"{num(s['trainer_idle_share'], '.2f')} | {num(s['is_weight_mean'], '.4f')} / "
            f"{num(s['is_weight_truncated_share'], '.4f')} | {num(s['slot_occupancy'], '.3f')} |")
    lines += ["", "| a vs k0 | final acc. diff | pooled std | 95% CI | p (Welch) | p (Holm) |",
              "|---|---|---|---|---|---|"]
    for t in summary["tests"]:
        lines.append(f"| {t['a']} | {t['diff']:+.3f} | {t['pooled_std']:.3f} | "
                     f"[{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}] | {t['p_welch']:.3f} | "
                     f"{t['p_holm']:.3f} |")
    at = summary.get("at", [])
    lines += ["", "| a vs b (seeds) | " + " | ".join(f"b / a seconds to step {n}" for n in at)
              + " | a: seconds to step " + str(at[-1] if at else "") + " | b: same | "
              "load a | load b |", "|---" * (5 + len(at)) + "|"]
    for r in summary.get("speedup", []):
        st = r["steps"]
        last = st[str(at[-1])]

        def rng(x):
            return f"{x[0]:.1f}-{x[1]:.1f}" if x else "?"
        lines.append(
            f"| {r['a']} vs {r['b']} ({len(r['seeds'])}) | "
            + " | ".join(f"{num(st[str(n)]['ratio_mean'], '.2f')} ± "
                         f"{num(st[str(n)]['ratio_std'], '.2f')}" for n in at)
            + f" | {num(last['seconds_a_mean'], '.0f')} ± {num(last['seconds_a_std'], '.0f')} | "
            f"{num(last['seconds_b_mean'], '.0f')} ± {num(last['seconds_b_std'], '.0f')} | "
            f"{rng(r['load_a'])} | {rng(r['load_b'])} |")
    return "\n".join(lines) + "\n"


def plot(records: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import compare_methods as cm
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (v, rs) in enumerate(records.items()):
        for j, rec in enumerate(rs):
            c = cm.evals(rec["curve"])
            kw = dict(color=f"C{i}", alpha=0.7, label=v if j == 0 else None)
            axes[0].plot([p["step"] for p in c], [p["eval_accuracy"] for p in c], **kw)
            axes[1].plot([p["seconds"] for p in c], [p["eval_accuracy"] for p in c], **kw)
    for ax, x in zip(axes, ("RL step", "training seconds (sampling + update; evals excluded)"),
                     strict=True):
        ax.set_xlabel(x)
        ax.set_ylabel("held-out accuracy (avg@8)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("The default run under rl.max_staleness k (one line per seed; the colocated "
                 "runs ran two at a time, the _split ones alone)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="runs/staleness")
    ap.add_argument("--out", default="docs/compare")
    ap.add_argument("--config", default="configs/default.py")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--variants", default="", help="comma-separated (default: all that fit "
                    "this process's devices)")
    ap.add_argument("--devices", type=int, default=0, help="CPU devices of this process")
    ap.add_argument("--target", type=float, default=0.7)
    ap.add_argument("--from-json", help="re-summarize the runs recorded in this staleness.json "
                    "(no run folders needed, nothing trained)")
    args, rest = ap.parse_known_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            old = json.load(f)
        summary = summarize(old["runs"], args.target)
        summary.update(date=old["date"], command=old["command"], runs=old["runs"],
                       resummarized={"date": datetime.date.today().isoformat(),
                                     "command": " ".join(sys.argv)})
        return write(summary, args.out, old["runs"])
    if args.devices:
        os.environ["XLA_FLAGS"] = " ".join(
            [*os.environ.get("XLA_FLAGS", "").split(),
             f"--xla_force_host_platform_device_count={args.devices}"])
    overrides = [tuple(a[len("--config."):].split("=", 1)) for a in rest]
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.variants.split(",") if args.variants else [
        v for v in VARIANTS if (v in SPLIT) == (args.devices > 1)]
    for v in names:
        for seed in seeds:
            run_one(args, overrides, v, seed)
    # the summary covers every finished run of every variant
    records = {}
    for v in VARIANTS:
        rs = [run_one(args, overrides, v, s) for s in seeds
              if os.path.exists(os.path.join(args.workdir, v, f"seed{s}", "summary.json"))]
        if rs:
            records[v] = rs
    summary = summarize(records, args.target)
    summary.update(date=datetime.date.today().isoformat(), command=" ".join(sys.argv),
                   runs=records)
    return write(summary, args.out, records)


def write(summary: dict, out: str, records: dict) -> int:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "staleness.json"), "w") as f:
        json.dump(summary, f, indent=1, default=float)
    with open(os.path.join(out, "staleness.md"), "w") as f:
        f.write(table(summary))
    plot(records, os.path.join(out, "staleness.png"))
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
