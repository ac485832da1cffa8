"""GRPO, compute-matched GRPO, DAPO, Ada-pos and Ada-balance (rounds and continuous) from the
same start, on an easy and a hard prompt set, several seeds, against steps, samples drawn and
wall-clock seconds; and a sampling-budget sweep of Ada-balance on the hard set (Figure 1 and
the ablations of the paper, in miniature).

    python experiments/compare_methods.py --workdir runs/compare --out docs/compare
        [--seeds 0,1,2] [--mixes easy,hard] [--sweep hard] [--target 0.7]
        [--config configs/default.py] [--config.train.steps=200 ...]

The prompt sets are the paper's kind (section 4.1): training prompts chosen by the pass
rate of the policy that starts training (MIXES; `data.pass_rate_range`, 16 draws each).
Every run of a mix starts from the same cached warm start and the same prompt set; only
the variant and the RL seed change. `grpo_matched` is GRPO with a group as large as
Ada-balance's measured mean draws per prompt on that mix (all kept), so it runs after
Ada-balance. Runs go one at a time; each records the load average around it, since its
seconds are only comparable under equal load. Finished runs are reused.

Writes <workdir>/<mix>/<variant>/seed<k>/ (each run's metrics, checkpoints, plots) and to
--out:
  summary.json   {"start", "command", "date", "mixes": {mix: per variant: held-out
                 accuracy at equal steps / samples / seconds, steps and seconds to
                 --target, samples, seconds, dynamics}, "runs": [per run: its curve]}
  table.md       the same, as tables; the Ada-balance vs GRPO gap in pooled std
  compare_<mix>.png   accuracy vs steps, samples and seconds; the dynamics
  sweep_<mix>.png     the budget sweep: accuracy vs samples and vs steps, draws per prompt
Every number is computed here from the runs; nothing picks seeds or tunes one variant.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ada import config as cfglib  # noqa: E402
from ada.metrics import read_jsonl, series  # noqa: E402

# variant -> (method of ada/methods.py, config overrides); grpo_matched's n is set per mix
VARIANTS = {
    "grpo": ("grpo", []),
    "grpo_matched": ("grpo", []),
    "dapo": ("dapo", []),
    "ada_pos": ("ada_pos", []),
    "ada_balance": ("ada_balance", []),
    "ada_balance_continuous": ("ada_balance", [("adaptive.scheduler", "continuous")]),
}
# The budget sweep (--sweep mixes): Ada-balance at N rounds x M per round beside the
# default 4 x 8 (ada_balance) and the continuous scheduler.
SWEEP = {
    "ada_balance_8x8": ("ada_balance", [("adaptive.max_rounds", "8")]),
    "ada_balance_4x16": ("ada_balance", [("adaptive.samples_per_round", "16")]),
}
COMPARED = tuple(VARIANTS)
SWEPT = ("ada_balance", "ada_balance_8x8", "ada_balance_4x16", "ada_balance_continuous")
# Prompt sets by the starting policy's pass rate over 16 draws. hard: the paper's HARD_FILTER
# (solved 1 or 2 times in 16; most GRPO groups of 4 are all wrong); easy: solved at least 6
# times in 16. From the default's start (5,000 exact warm-start steps): 395 hard and 1,673
# easy of 4,000 training prompts (684 and 1,215 from the earlier 2,500-step start).
MIXES = {
    "all": (0.0, 1.0),
    "easy": (0.375, 1.0),
    "hard": (0.0625, 0.125),
}


def run_one(args, overrides, mix: str, variant: str, method: str, extra: list, seed: int):
    """One run (reused when finished): (metrics rows with the clock, its record)."""
    from ada.loop import train

    wd = os.path.join(args.workdir, mix, variant, f"seed{seed}")
    cfg = cfglib.build_config(args.config, [
        ("method", method), ("seed", str(seed)), ("data.pass_rate_range", repr(MIXES[mix])),
        *extra, *overrides])
    cfglib.validate(cfg, wd)
    done, load_file = os.path.join(wd, "summary.json"), os.path.join(wd, "load.json")
    if not os.path.exists(done):
        print(f"== {mix} {variant} seed {seed} -> {wd}", flush=True)
        before = os.getloadavg()
        train(cfg, wd)
        with open(load_file, "w") as f:
            json.dump({"loadavg_before": before, "loadavg_after": os.getloadavg()}, f)
    rows = with_clock(read_jsonl(os.path.join(wd, "metrics.jsonl")))
    load = json.load(open(load_file)) if os.path.exists(load_file) else {}
    return rows, record(rows, mix=mix, method=variant, seed=seed, config_method=method,
                        overrides=[f"{k}={v}" for k, v in extra], **load)


def record(rows: list[dict], **about) -> dict:
    """A run's entry of summary.json: `about` and its held-out curve from clocked rows."""
    curve = [{"step": r["step"], "samples": r["samples_total"], "seconds": round(r["wall_s"], 2),
              "eval_accuracy": r["eval_accuracy"]} for r in rows if "eval_accuracy" in r]
    return {**about, "final_eval_accuracy": curve[-1]["eval_accuracy"],
            "samples": curve[-1]["samples"], "wall_clock_s": curve[-1]["seconds"], "curve": curve}


def matched_n(runs) -> int:
    """GRPO's compute-matched group: Ada-balance's mean draws per prompt, rounded."""
    draws = [r["samples_per_prompt"] for rows, _ in runs for r in rows if "samples_per_prompt" in r]
    return max(1, int(round(float(np.mean(draws)))))


def run_all(args, overrides):
    """{mix: {variant: [(rows, record) per seed]}} and the compute-matched n per mix."""
    out, matched = {}, {}
    for mix in args.mixes:
        names = [v for v in COMPARED if v != "grpo_matched"] + ["grpo_matched"]
        variants = dict(VARIANTS, **SWEEP) if mix in args.sweep else dict(VARIANTS)
        names += [v for v in SWEEP if mix in args.sweep]
        out[mix] = {}
        for name in names:
            if args.variants and name not in args.variants:
                continue
            method, extra = variants[name]
            if name == "grpo_matched":
                matched[mix] = matched_n(out[mix].get("ada_balance") or [
                    run_one(args, overrides, mix, "ada_balance", "ada_balance", [], seed)
                    for seed in args.seeds])
                extra = [("adaptive.n", str(matched[mix]))]
            seeds = args.sweep_seeds if name in SWEEP else args.seeds
            out[mix][name] = [run_one(args, overrides, mix, name, method, extra, seed)
                              for seed in seeds]
        if {"grpo", "ada_balance"} <= set(out[mix]) and abs(gap(out[mix])["in_pooled_std"]) < 2:
            for name in ("grpo", "ada_balance"):  # within 2 std: more seeds for the two
                out[mix][name] += [run_one(args, overrides, mix, name, name, [], seed)
                                   for seed in args.more_seeds]
    return out, matched


def gap(runs) -> dict:
    """Ada-balance minus GRPO in held-out accuracy at equal steps (their last evals), in
    units of the pooled std over seeds."""
    a, g = ([rec["final_eval_accuracy"] for _, rec in runs[v]] for v in ("ada_balance", "grpo"))
    pooled = float(np.sqrt((np.var(a) + np.var(g)) / 2))
    diff = float(np.mean(a) - np.mean(g))
    return {"equal_steps": diff, "pooled_std": pooled, "seeds": [len(a), len(g)],
            "in_pooled_std": diff / pooled if pooled else float("inf")}


def with_clock(rows: list[dict]) -> list[dict]:
    """Rows with `wall_s`, seconds spent collecting and updating up to the end of the step
    (evals excluded, so variants compare by their training cost; the first step, which
    compiles or loads the compiled programs from the persistent cache, is not counted), and
    `samples_total` on every row (0 on the step-0 eval), so the curves against either start
    at the start."""
    t, drawn, out = 0.0, 0, []
    for r in rows:
        if r.get("step", 0) > 1:
            t += r.get("time_collect_s", 0.0) + r.get("time_update_s", 0.0)
        drawn = r.get("samples_total", drawn)
        out.append(dict(r, wall_s=t, samples_total=drawn))
    return out


def acc_at(curve: list[dict], key: str, budget: float) -> float:
    """Held-out accuracy of the last eval at or under `budget` of `key` (samples, seconds)."""
    pts = [p["eval_accuracy"] for p in curve if p[key] <= budget + 1e-9]
    return pts[-1] if pts else float("nan")


def first_reach(curve: list[dict], target: float) -> dict | None:
    return next((p for p in curve if p["eval_accuracy"] >= target), None)


def _mean_std(xs) -> tuple[float, float]:
    xs = [x for x in xs if x == x]
    return (float(np.mean(xs)), float(np.std(xs))) if xs else (float("nan"), float("nan"))


def _dynamic(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(vals)) if vals else float("nan")


def summarize(runs: dict, target: float) -> dict:
    """One mix: per variant, mean and std over seeds at equal steps, at the smallest mean
    samples and seconds any compared variant spent, and to reach `target`."""
    curves = {v: [rec["curve"] for _, rec in rs] for v, rs in runs.items()}
    compared = [v for v in COMPARED if v in runs]  # the sweep's runs set no budget
    budget_samples = min(np.mean([c[-1]["samples"] for c in curves[v]]) for v in compared)
    budget_seconds = min(np.mean([c[-1]["seconds"] for c in curves[v]]) for v in compared)
    out = {"equal_samples": float(budget_samples), "equal_seconds": float(budget_seconds),
           "target": target, "variants": {}}
    for v, rs in runs.items():
        cs, rows = curves[v], [r for r, _ in rs]
        reached = [first_reach(c, target) for c in cs]
        s = {"seeds": len(cs), "samples": _mean_std([c[-1]["samples"] for c in cs])[0],
             "seconds": _mean_std([c[-1]["seconds"] for c in cs])[0],
             "reached_target": sum(p is not None for p in reached)}
        for name, xs in (
            ("initial", [c[0]["eval_accuracy"] for c in cs]),
            ("equal_steps", [c[-1]["eval_accuracy"] for c in cs]),
            ("equal_samples", [acc_at(c, "samples", budget_samples) for c in cs]),
            ("equal_seconds", [acc_at(c, "seconds", budget_seconds) for c in cs]),
            ("steps_to_target", [p["step"] if p else float("nan") for p in reached]),
            ("seconds_to_target", [p["seconds"] if p else float("nan") for p in reached]),
        ):
            s[name], s[name + "_std"] = _mean_std(xs)
        for key in ("zero_variance_share", "samples_per_prompt", "entropy",
                    "lacking_pos_share_round0", "lacking_neg_share_round0"):
            s[key] = float(np.mean([_dynamic(r, key) for r in rows]))
        s["final_entropy"] = float(np.mean([[r["entropy"] for r in rr if "entropy" in r][-1]
                                            for rr in rows]))
        out["variants"][v] = s
    out["ada_balance_minus_grpo"] = gap(runs)
    return out


def table(summary: dict) -> str:
    lines = [f"Start: {summary['start']}. Command: `{summary['command']}` ({summary['date']}).", ""]
    for mix, s in summary["mixes"].items():
        t = s["target"]
        lines += [
            f"**{mix}** (pass-rate range {MIXES[mix]}; grpo_matched: n = "
            f"{s['grpo_matched_n']})", "",
            f"| variant | seeds | held-out acc, equal steps | at {s['equal_samples']:.0f} samples | at "
            f"{s['equal_seconds']:.0f} s | steps to {t} | seconds to {t} | samples drawn | "
            "seconds | draws/prompt | zero-variance share | final entropy |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for v, r in s["variants"].items():
            def pm(k, fmt=".3f", r=r):
                return f"{r[k]:{fmt}} ± {r[k + '_std']:{fmt}}" if r[k] == r[k] else "-"
            reach = f"({r['reached_target']}/{r['seeds']})"
            lines.append(
                f"| {v} | {r['seeds']} | {pm('equal_steps')} | {pm('equal_samples')} | {pm('equal_seconds')} "
                f"| {pm('steps_to_target', '.0f')} {reach} | {pm('seconds_to_target', '.0f')} "
                f"| {r['samples']:.0f} | {r['seconds']:.0f} | {r['samples_per_prompt']:.2f} "
                f"| {r['zero_variance_share']:.3f} | {r['final_entropy']:.3f} |")
        g = s["ada_balance_minus_grpo"]
        lines += ["", f"Ada-balance minus GRPO at equal steps: {g['equal_steps']:+.3f} "
                  f"({g['in_pooled_std']:+.1f} pooled std of {g['pooled_std']:.3f}; seeds "
                  f"{g['seeds'][0]} and {g['seeds'][1]}).", ""]
    return "\n".join(lines)


PANELS = (  # (metric, x axis, title)
    ("eval_accuracy", "step", "held-out accuracy vs step"),
    ("eval_accuracy", "samples_total", "held-out accuracy vs samples drawn"),
    ("eval_accuracy", "wall_s", "held-out accuracy vs training seconds"),
    ("reward_round0_mean", "step", "policy accuracy on its batch (first round)"),
    ("entropy", "step", "entropy per response token"),
    ("zero_variance_share", "step", "share of kept groups with no signal"),
    ("lacking_pos_share_round0", "step", "share short of n/2 correct after round 1"),
    ("lacking_neg_share_round0", "step", "share short of n/2 wrong after round 1"),
    ("samples_per_prompt", "step", "responses drawn per prompt"),
)
SWEEP_PANELS = (PANELS[1], PANELS[0], PANELS[5], PANELS[8])
X_LABELS = {"step": "step", "samples_total": "samples drawn", "wall_s": "seconds (collect + update)"}


def plot(runs: dict, variants, panels, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3 if len(panels) == 9 else 2
    fig, axes = plt.subplots(-(-len(panels) // cols), cols, figsize=(6 * cols, 3.6 * len(panels) / cols))
    for ax, (key, x, name) in zip(axes.flat, panels, strict=True):
        for v in variants:
            curves = [series(rows, key, x=x) for rows, _ in runs[v]]
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
            ax.plot(xs, ys.mean(0), label=v)
            ax.fill_between(xs, ys.mean(0) - ys.std(0), ys.mean(0) + ys.std(0), alpha=0.15)
        ax.set_xlabel(X_LABELS[x])
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def start_of(config_path: str, overrides) -> str:
    c = cfglib.build_config(config_path, list(overrides)).warmstart
    if not c.enabled:
        return "the config's model, no warm start"
    return (f"the cached warm start of {config_path}: {c.steps} exact-answer steps then "
            f"{c.noise_steps} noisy-teacher steps (teacher_noise {c.teacher_noise})")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides, rest = cfglib.parse_override_args(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--out", help="where summary.json, table.md and the plots go (default: "
                   "--workdir)")
    p.add_argument("--config", default="configs/default.py")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--mixes", default="easy,hard", help=f"comma-separated, of {sorted(MIXES)}")
    p.add_argument("--sweep", default="hard", help="mixes that get the budget sweep ('' none)")
    p.add_argument("--sweep-seeds", help="seeds of the sweep's own runs (default: --seeds)")
    p.add_argument("--more-seeds", default="3,4", help="seeds added to GRPO and Ada-balance on "
                   "a mix where their gap at --seeds is within 2 pooled std")
    p.add_argument("--variants", default="", help="run only these (comma-separated; to split "
                   "the runs over processes: finished runs are reused, so a last call without "
                   "it writes the summary)")
    p.add_argument("--target", type=float, default=0.7, help="held-out accuracy for the "
                   "steps/seconds-to-target columns")
    args = p.parse_args(rest)
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.mixes = [m for m in args.mixes.split(",") if m]
    args.sweep = [m for m in args.sweep.split(",") if m]
    args.sweep_seeds = ([int(s) for s in args.sweep_seeds.split(",") if s]
                        if args.sweep_seeds else args.seeds)
    args.variants = [v for v in args.variants.split(",") if v]
    args.more_seeds = [int(s) for s in args.more_seeds.split(",") if s]
    unknown = [v for v in args.variants if v not in VARIANTS and v not in SWEEP]
    if unknown:
        print(f"error: --variants {unknown} not in {[*VARIANTS, *SWEEP]}", file=sys.stderr)
        return 2
    unknown = [m for m in args.mixes + args.sweep if m not in MIXES]
    if unknown:
        print(f"error: --mixes/--sweep {unknown} not in {sorted(MIXES)}", file=sys.stderr)
        return 2
    from ada import distributed

    distributed.cpu_only_without_accelerators()  # no libtpu start-up noise on a CPU
    try:
        runs, matched = run_all(args, overrides)
    except cfglib.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.variants:
        return 0  # a share of the runs: the call without --variants summarises
    summary = {"start": start_of(args.config, overrides),
               "command": " ".join(["python experiments/compare_methods.py", *argv]),
               "date": datetime.date.today().isoformat(), "mixes": {},
               "runs": [rec for r in runs.values() for rs in r.values() for _, rec in rs]}
    for mix, r in runs.items():
        summary["mixes"][mix] = dict(summarize(r, args.target), grpo_matched_n=matched[mix])
    out = args.out or args.workdir
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    text = table(summary)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    for mix, r in runs.items():
        label = f"{mix} prompts (pass rate {MIXES[mix]}), mean ± std over seeds (table.md)"
        plot(r, COMPARED, PANELS, os.path.join(out, f"compare_{mix}.png"), label)
        if mix in args.sweep:
            plot(r, SWEPT, SWEEP_PANELS, os.path.join(out, f"sweep_{mix}.png"),
                 f"budget sweep (N rounds x M per round), {label}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
