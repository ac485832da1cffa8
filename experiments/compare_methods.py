"""GRPO, compute-matched GRPO, DAPO, Ada-pos and Ada-balance from the same start, on an
easy, a hard and a persistently hard prompt set, 5 seeds each, against steps, samples
drawn and wall-clock seconds; and optionally a sampling-budget sweep of Ada-balance (N x M,
the continuous scheduler): Figure 1 and the ablations of the paper, in miniature.

    python experiments/compare_methods.py --workdir runs/compare --out docs/compare
        [--seeds 0,1,2,3,4] [--mixes easy,hard,hard_persistent] [--sweep hard]
        [--config configs/default.py] [--config.train.steps=200 ...]
    python experiments/compare_methods.py --retest docs/compare/summary.json --out DIR

The prompt sets are the paper's kind (section 4.1): training prompts chosen by the pass
rate of the policy that starts training (MIXES; `data.pass_rate_range`, 16 draws each).
Every run of a mix starts from the same cached warm start and the same prompt set; only
the variant and the RL seed change. `grpo_matched` is GRPO with a group as large as
Ada-balance's measured mean draws per prompt on that mix (all kept), so it runs after
Ada-balance. Seeds are fixed before any run, the same for every variant. Runs go one at a
time (or split over processes with --variants); each records the load average around it,
since its seconds are only comparable under equal load. Finished runs are reused.

Writes <workdir>/<mix>/<variant>/seed<k>/ (each run's metrics, checkpoints, plots) and to
--out:
  summary.json   {"start", "command", "date", "mixes": {mix: per variant: held-out
                 accuracy at equal steps / samples / seconds (mean, sample std), steps and
                 seconds to --target, samples, seconds, dynamics}, "tests": [{mix, a, b,
                 axis, diff, ci95, p_welch, p_holm, seeds_a, seeds_b} for each PAIRS claim on each
                 axis], "runs": [per run: its dynamics and a curve point per step]}
  table.md       the same, as tables
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from seed_stats import BOOTSTRAP_REPS, bootstrap_ci, holm, mean_std, welch  # noqa: E402

from ada import config as cfglib  # noqa: E402
from ada.metrics import read_jsonl, series  # noqa: E402

# variant -> (method of ada/methods.py, config overrides); grpo_matched's n is set per mix
VARIANTS = {
    "grpo": ("grpo", []),
    "grpo_matched": ("grpo", []),
    "dapo": ("dapo", []),
    "ada_pos": ("ada_pos", []),
    "ada_balance": ("ada_balance", []),
    # issue 44: the step's budget (n x prompts: GRPO's samples) split by Knapsack RL's value
    "ada_knapsack": ("ada_knapsack", []),
    "grpo_knapsack": ("grpo_knapsack", []),
}
# The budget sweep (--sweep mixes): Ada-balance at N rounds x M per round beside the
# default 4 x 8 (ada_balance), and with the continuous scheduler.
SWEEP = {
    "ada_balance_continuous": ("ada_balance", [("adaptive.scheduler", "continuous")]),
    "ada_balance_8x8": ("ada_balance", [("adaptive.max_rounds", "8")]),
    "ada_balance_4x16": ("ada_balance", [("adaptive.samples_per_round", "16")]),
}
COMPARED = tuple(VARIANTS)
# The claims every mix's table tests: Ada-balance and Ada-pos against each baseline, and
# against each other; on each axis a variant is compared at.
PAIRS = (("ada_balance", "grpo"), ("ada_balance", "grpo_matched"), ("ada_balance", "dapo"),
         ("ada_balance", "ada_pos"), ("ada_pos", "grpo"), ("ada_pos", "grpo_matched"),
         ("ada_pos", "dapo"), ("ada_balance_continuous", "ada_balance"),
         ("ada_knapsack", "grpo"), ("ada_knapsack", "grpo_matched"),
         ("ada_knapsack", "ada_balance"), ("grpo_knapsack", "grpo"))
AXES = ("equal_steps", "equal_samples", "equal_seconds")
SWEPT = ("ada_balance", "ada_balance_8x8", "ada_balance_4x16", "ada_balance_continuous")
# Prompt sets: (pass-rate range of the starting policy over 16 draws, config overrides).
# hard: the paper's HARD_FILTER (solved 1 or 2 times in 16; most GRPO groups of 4 are all
# wrong); easy: solved at least 6 times in 16. Both on the default's two-digit +/- task,
# where the hard prompts stop being hard (the policy knows the answers and RL sharpens it).
# hard_persistent: half the task three operands with products (level 3), which the warm
# start memorises on its training prompts but cannot compute: held-out level-3 accuracy
# stays ~0.02, and prompts short of n/2 positives stay above 0.2 (docs/results.md).
HARD_PERSISTENT = ((0.0625, 0.5), (("data.level_mix", "2:1,3:1"),))
MIXES = {
    "all": ((0.0, 1.0), ()),
    "easy": ((0.375, 1.0), ()),
    "hard": ((0.0625, 0.125), ()),
    "hard_persistent": HARD_PERSISTENT,
}


def run_one(args, overrides, mix: str, variant: str, method: str, extra: list, seed: int):
    """One run (reused when finished): (metrics rows with the clock, its record); None for
    an unfinished one under --no_run."""
    wd = os.path.join(args.workdir, mix, variant, f"seed{seed}")
    if args.no_run and not os.path.exists(os.path.join(wd, "summary.json")):
        return None
    cfg = cfglib.build_config(args.config, [
        ("method", method), ("seed", str(seed)), ("data.pass_rate_range", repr(MIXES[mix][0])),
        *MIXES[mix][1], *extra, *overrides])
    rows, load = train_once(cfg, wd, f"{mix} {variant} seed {seed}")
    return rows, record(rows, mix=mix, method=variant, seed=seed, config_method=method,
                        overrides=[f"{k}={v}" for k, v in extra],
                        warmstart_sha256=rows[0].get("warmstart_sha256"), **load)


def train_once(cfg, wd: str, label: str) -> tuple[list[dict], dict]:
    """Train `cfg` in `wd` unless it finished before: its clocked metrics rows, and the load
    average around the run (its seconds are only comparable under equal load)."""
    from ada.loop import train

    cfglib.validate(cfg, wd)
    done, load_file = os.path.join(wd, "summary.json"), os.path.join(wd, "load.json")
    if not os.path.exists(done):
        print(f"== {label} -> {wd}", flush=True)
        before = os.getloadavg()
        train(cfg, wd)
        with open(load_file, "w") as f:
            json.dump({"loadavg_before": before, "loadavg_after": os.getloadavg()}, f)
    load = json.load(open(load_file)) if os.path.exists(load_file) else {}
    return with_clock(read_jsonl(os.path.join(wd, "metrics.jsonl"))), load


DYNAMICS = ("zero_variance_share", "samples_per_prompt", "entropy", "lacking_pos_share_round0",
            "lacking_neg_share_round0")


def record(rows: list[dict], **about) -> dict:
    """A run's entry of summary.json: `about`, its means of DYNAMICS, and its curve from
    clocked rows: a point per step (and the step-0 eval) with samples, seconds,
    lacking_pos_share_round0 where the step sampled, and eval_accuracy where it evaluated."""
    curve = []
    for r in rows:
        p = {"step": r["step"], "samples": r["samples_total"], "seconds": round(r["wall_s"], 2)}
        for key in ("lacking_pos_share_round0", "eval_accuracy"):
            if r.get(key) is not None:
                p[key] = r[key]
        curve.append(p)
    last = evals(curve)[-1]
    entropy = [r["entropy"] for r in rows if "entropy" in r]
    return {**about, "final_eval_accuracy": last["eval_accuracy"], "samples": last["samples"],
            "wall_clock_s": last["seconds"], **{k: _dynamic(rows, k) for k in DYNAMICS},
            "final_entropy": entropy[-1] if entropy else float("nan"), "curve": curve}


def evals(curve: list[dict]) -> list[dict]:
    """The curve's points that carry a held-out accuracy."""
    return [p for p in curve if "eval_accuracy" in p]


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
                balance = out[mix].get("ada_balance") or [
                    run_one(args, overrides, mix, "ada_balance", "ada_balance", [], seed)
                    for seed in args.seeds]
                if not all(balance):  # --no_run, Ada-balance unfinished: no n to match
                    continue
                n = matched_n(balance)
                extra = [("adaptive.n", str(n))]
            seeds = args.sweep_seeds if name in SWEEP else args.seeds
            done = [r for r in (run_one(args, overrides, mix, name, method, extra, seed)
                                for seed in seeds) if r is not None]  # None: --no_run, unfinished
            if done:
                out[mix][name] = done
                if name == "grpo_matched":
                    matched[mix] = n
        matched.setdefault(mix, "-")
    return out, matched


def pairwise_tests(mix: str, per_seed: dict) -> list[dict]:
    """Every claim the tables make: each PAIRS difference on each AXES, from the per-seed
    values `per_seed[variant][axis]` (NaN seeds dropped)."""
    out = []
    for a, b in PAIRS:
        if a not in per_seed or b not in per_seed:
            continue
        for axis in AXES:
            xa, xb = ([x for x in per_seed[v][axis] if x == x] for v in (a, b))
            if not xa or not xb:
                continue
            out.append({"mix": mix, "a": a, "b": b, "axis": axis,
                        "diff": float(np.mean(xa) - np.mean(xb)), "ci95": bootstrap_ci(xa, xb),
                        "p_welch": welch(xa, xb)[2], "seeds_a": len(xa), "seeds_b": len(xb)})
    for t, p in zip(out, holm([t["p_welch"] for t in out]), strict=True):
        t["p_holm"] = p
    return out


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
    """Held-out accuracy of the last eval (`curve`: its eval points) at or under `budget` of
    `key` (samples, seconds)."""
    pts = [p["eval_accuracy"] for p in curve if p[key] <= budget + 1e-9]
    return pts[-1] if pts else float("nan")


def first_reach(curve: list[dict], target: float) -> dict | None:
    return next((p for p in curve if p["eval_accuracy"] >= target), None)


def _dynamic(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(vals)) if vals else float("nan")


def summarize(mix: str, records: dict, target: float) -> dict:
    """One mix from its run records ({variant: [record per seed]}): per variant, mean and
    sample std over seeds at equal steps, at the smallest mean samples and seconds any
    compared variant spent, and to reach `target`; and the PAIRS tests on each axis."""
    curves = {v: [evals(rec["curve"]) for rec in rs] for v, rs in records.items()}
    compared = [v for v in COMPARED if v in records]  # the sweep's runs set no budget
    budget_samples = min(np.mean([c[-1]["samples"] for c in curves[v]]) for v in compared)
    budget_seconds = min(np.mean([c[-1]["seconds"] for c in curves[v]]) for v in compared)
    out = {"equal_samples": float(budget_samples), "equal_seconds": float(budget_seconds),
           "target": target, "variants": {}}
    per_seed = {}
    for v, rs in records.items():
        cs = curves[v]
        reached = [first_reach(c, target) for c in cs]
        s = {"seeds": len(cs), "samples": mean_std([c[-1]["samples"] for c in cs])[0],
             "seconds": mean_std([c[-1]["seconds"] for c in cs])[0],
             "reached_target": sum(p is not None for p in reached)}
        per_seed[v] = {
            "initial": [c[0]["eval_accuracy"] for c in cs],
            "equal_steps": [c[-1]["eval_accuracy"] for c in cs],
            "equal_samples": [acc_at(c, "samples", budget_samples) for c in cs],
            "equal_seconds": [acc_at(c, "seconds", budget_seconds) for c in cs],
            "steps_to_target": [p["step"] if p else float("nan") for p in reached],
            "seconds_to_target": [p["seconds"] if p else float("nan") for p in reached]}
        for name, xs in per_seed[v].items():
            s[name], s[name + "_std"] = mean_std(xs)
        for key in (*DYNAMICS, "final_entropy"):
            s[key] = mean_std([rec.get(key, float("nan")) for rec in rs])[0]
        out["variants"][v] = s
    out["tests"] = pairwise_tests(mix, per_seed)
    out["warmstart_sha256"] = sorted({rec["warmstart_sha256"] for rs in records.values()
                                      for rec in rs if rec.get("warmstart_sha256")})
    out["start_mismatch"] = start_mismatch(records)
    return out


def start_mismatch(records: dict) -> str:
    """Why the mix's runs may not share their start ('' if nothing says so): a mix compares
    variants from one start, so per seed every run's step-0 held-out accuracy (the eval keys
    are the seed's) and its warm start's content hash, where recorded, must agree. A start
    retrained under the same cache key on another CPU gives other params, and runs made
    before and after would be mixed silently."""
    seen: dict[int, dict] = {}
    for v, rs in records.items():
        for rec in rs:
            s = seen.setdefault(rec["seed"], {"eval": {}, "hash": {}})
            s["eval"].setdefault(rec["curve"][0].get("eval_accuracy"), []).append(v)
            if rec.get("warmstart_sha256"):
                s["hash"].setdefault(rec["warmstart_sha256"], []).append(v)
    for seed, s in sorted(seen.items()):
        for what, groups in (("step-0 held-out accuracy", s["eval"]),
                             ("warm-start sha256", s["hash"])):
            if len(groups) > 1:
                return f"seed {seed}'s runs differ in {what}: " + "; ".join(
                    f"{k} ({', '.join(vs)})" for k, vs in groups.items())
    return ""


def mix_label(mix: str) -> str:
    rng, extra = MIXES[mix]
    return ", ".join([f"pass-rate range {rng}", *(f"{k}={v}" for k, v in extra)])


def num(x: float, fmt: str = ".3f") -> str:
    """A table cell: `x` formatted, or '-' where the runs did not record it (NaN)."""
    return f"{x:{fmt}}" if x == x else "-"


def table(summary: dict) -> str:
    lines = [f"Written by `{summary['command']}` ({summary['date']}).", ""]
    for mix, s in summary["mixes"].items():
        t = s["target"]
        lines += [
            f"**{mix}** ({mix_label(mix)}; grpo_matched: n = "
            f"{s['grpo_matched_n']})", "",
            f"Runs: `{s['command']}` ({s['date']}), from {s['start']}"
            + (f" (warm-start sha256 {', '.join(s['warmstart_sha256'])})"
               if s.get("warmstart_sha256") else "") + ".", "",
            *([f"**Not one start: {s['start_mismatch']}.**", ""] if s.get("start_mismatch")
              else []),
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
                f"| {r['samples']:.0f} | {r['seconds']:.0f} | {num(r['samples_per_prompt'], '.2f')} "
                f"| {num(r['zero_variance_share'])} | {num(r['final_entropy'])} |")
        lines += ["", f"Differences in held-out accuracy (a minus b, {mix}): mean over seeds "
                  f"[95% percentile bootstrap interval over seeds, {BOOTSTRAP_REPS:,} resamples] "
                  "Welch's two-sided p (seeds a/b). With 3 or 5 seeds a side the bootstrap "
                  "interval is too narrow (it covers ~80% or ~90% of the time, simulated on "
                  "normal seeds): read verdicts from p. **Bold**: p under 0.05 after Holm's "
                  "correction over the mix's tests (`p_holm`).", "",
                  "| a − b | equal steps | at equal samples | at equal seconds |",
                  "|---|---|---|---|"]
        cells = {}
        for t in (t for t in summary["tests"] if t["mix"] == mix):
            cell = (f"{t['diff']:+.3f} [{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}] p = "
                    f"{t['p_welch']:.2g} ({t['seeds_a']}/{t['seeds_b']})")
            cells.setdefault((t["a"], t["b"]), {})[t["axis"]] = (
                f"**{cell}**" if t.get("p_holm", 1) < 0.05 else cell)
        for (a, b), c in cells.items():
            lines.append(f"| {a} − {b} | " + " | ".join(c.get(x, "-") for x in AXES) + " |")
        lines.append("")
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
            curves = [series(rows, key, x=x) for rows, _ in runs.get(v, [])]
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
            sd = ys.std(0, ddof=1) if len(ys) > 1 else np.zeros_like(xs)
            ax.fill_between(xs, ys.mean(0) - sd, ys.mean(0) + sd, alpha=0.15)
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
    return (f"the cached warm start of {config_path} on each mix's task: {c.steps} exact-answer "
            f"steps then {c.noise_steps} noisy-teacher steps (teacher_noise {c.teacher_noise})")


ORIGIN = ("start", "command", "date")


def write_summary(summary: dict, records: dict, matched: dict, target: float, out: str,
                  origin: dict | None = None) -> str:
    """Fill `summary`'s mixes and tests from {mix: {variant: records}}, write summary.json
    and table.md to `out`; returns the table. Each mix names the start, command and date
    of its runs (`origin[mix]`, by default the summary's own)."""
    summary["mixes"], summary["tests"] = {}, []
    for mix, r in records.items():
        s = summarize(mix, r, target)
        summary["tests"] += s.pop("tests")
        where = (origin or {}).get(mix) or {k: summary[k] for k in ORIGIN}
        summary["mixes"][mix] = dict(s, grpo_matched_n=matched[mix], **where)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    text = table(summary)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    return text


def retest(paths: list[str], out: str, target: float) -> int:
    """--retest: the statistics of earlier summary.json files' runs, recomputed together.
    A mix's runs all come from one file: the last one given that holds the mix (a rerun of
    a mix replaces its earlier runs; its other mixes are kept)."""
    old = [json.load(open(p)) for p in paths]
    source = {rec["mix"]: i for i, summary in enumerate(old) for rec in summary["runs"]}
    records, matched, origin, runs = {}, {}, {}, []
    for i, summary in enumerate(old):
        for rec in summary["runs"]:
            if source[rec["mix"]] != i:
                continue
            runs.append(rec)
            known = summary.get("mixes", {}).get(rec["mix"], {}).get("variants", {}).get(
                rec["method"], {})  # runs recorded before their own dynamics: the variant's
            for key in (*DYNAMICS, "final_entropy"):
                rec.setdefault(key, known.get(key, float("nan")))
            records.setdefault(rec["mix"], {}).setdefault(rec["method"], []).append(rec)
            mix = summary.get("mixes", {}).get(rec["mix"], {})
            origin[rec["mix"]] = {k: mix.get(k, summary[k]) for k in ORIGIN}
            n = [o.split("=")[1] for o in rec.get("overrides", []) if o.startswith("adaptive.n=")]
            if rec["method"] == "grpo_matched" and n:
                matched[rec["mix"]] = int(n[0])
    summary = {"start": " / ".join(dict.fromkeys(s["start"] for s in old)),
               "command": f"python experiments/compare_methods.py --retest {' '.join(paths)}",
               "date": datetime.date.today().isoformat(),
               "runs": runs}
    print(write_summary(summary, records, {m: matched.get(m, "-") for m in records}, target,
                        out, origin))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides, rest = cfglib.parse_override_args(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", help="where the runs go (required unless --retest)")
    p.add_argument("--out", help="where summary.json, table.md and the plots go (default: "
                   "--workdir)")
    p.add_argument("--config", default="configs/default.py")
    p.add_argument("--seeds", default="0,1,2,3,4", help="every variant's seeds, fixed before "
                   "any run (no seeds are added after looking at a gap)")
    p.add_argument("--mixes", default="easy,hard,hard_persistent", help=f"comma-separated, of {sorted(MIXES)}")
    p.add_argument("--sweep", default="", help="mixes that get the budget sweep and the "
                   "continuous scheduler (default none)")
    p.add_argument("--sweep-seeds", help="seeds of the sweep's own runs (default: --seeds)")
    p.add_argument("--retest", metavar="SUMMARY", nargs="+", help="run nothing: recompute the "
                   "statistics and table.md from the run records of earlier summary.json files "
                   "into --out")
    p.add_argument("--variants", default="", help="run only these (comma-separated; to split "
                   "the runs over processes: finished runs are reused, so a last call without "
                   "it writes the summary)")
    p.add_argument("--no_run", action="store_true", help="run nothing: summarise the finished "
                   "runs in --workdir (of --variants, if given) into --out")
    p.add_argument("--target", type=float, default=0.7, help="held-out accuracy for the "
                   "steps/seconds-to-target columns")
    args = p.parse_args(rest)
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.mixes = [m for m in args.mixes.split(",") if m]
    args.sweep = [m for m in args.sweep.split(",") if m]
    args.sweep_seeds = ([int(s) for s in args.sweep_seeds.split(",") if s]
                        if args.sweep_seeds else args.seeds)
    args.variants = [v for v in args.variants.split(",") if v]
    if args.retest:
        bad = [f for f in args.retest if not os.path.isfile(f)]
        if bad:
            print(f"error: --retest {bad} not found; pass summary.json files that "
                  "compare_methods.py wrote", file=sys.stderr)
            return 2
        return retest(args.retest, args.out or os.path.dirname(args.retest[0]), args.target)
    if not args.workdir:
        print("error: --workdir is required (where the runs go), unless --retest", file=sys.stderr)
        return 2
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
    if args.variants and not args.no_run:
        return 0  # a share of the runs: a call without --variants (or with --no_run) summarises
    summary = {"start": start_of(args.config, overrides),
               "command": " ".join(["python experiments/compare_methods.py", *argv]),
               "date": datetime.date.today().isoformat(), "mixes": {},
               "runs": [rec for r in runs.values() for rs in r.values() for _, rec in rs]}
    records = {mix: {v: [rec for _, rec in rs] for v, rs in r.items()} for mix, r in runs.items()}
    out = args.out or args.workdir
    text = write_summary(summary, records, matched, args.target, out)
    for mix, r in runs.items():
        label = f"{mix} prompts ({mix_label(mix)}), mean ± std over seeds (table.md)"
        plot(r, COMPARED, PANELS, os.path.join(out, f"compare_{mix}.png"), label)
        if mix in args.sweep:
            plot(r, SWEPT, SWEEP_PANELS, os.path.join(out, f"sweep_{mix}.png"),
                 f"budget sweep (N rounds x M per round), {label}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
