"""A step's budget across prompts, in the simulator: signal bought per sample.

Pass-rate distributions come from the repo's real runs, as Beta fits (the repo keeps no
per-prompt pass rates, only per-step and per-run statistics of the collection):
  default@0/100/200  the default run (docs/compare/staleness.json, k0: Ada-balance, 3 seeds),
                     per 10-step window: the share of prompts with < 2 correct in the first
                     round of 8 and draws per prompt; at 0 and 200 also the first round's
                     accuracy that docs/results.md reports for the default run
  hard, easy, hard_persistent  the comparison's mixes (docs/compare/summary.json, Ada-balance,
                     run means): that share, the share with < 2 wrong, draws per prompt and
                     the zero-variance share; GRPO's zero-variance share (n = 4) and Ada-pos's
                     draws per prompt are held out as checks
  default 0->200     the three default fits as a trajectory (`Trajectory`): the knob sweep runs
                     on it, since forgetting only matters when pass rates move

For each distribution and method: rounds of M within each prompt's cap (`rounds_counts`, the
collector's rounds), per-prompt caps from the success memory (`ada.adaptive.success`) and the
allocation (`ada.adaptive.allocation`). Signal: kept groups with both kinds (non-zero
variance) and the expected gradient weight, the sum of p (1 - p) over those groups; both per
sample drawn. Seeds vary the prompts' pass rates, the data order and every draw.

  python experiments/allocation_sim.py --out docs/allocation [--seeds 0,1,2,3,4]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import time

import numpy as np

from ada.adaptive.allocation import AllocConfig
from ada.adaptive.simulate import Arm, Trajectory, run_arm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M, N, n, P = 8, 4, 4, 128  # the default run's collection
SIZES = {"default": 4000, "hard": 386, "easy": 1752, "hard_persistent": 3186}
# docs/results.md, the default run: "the batch accuracy of the first round 0.36 -> 0.91"
# (first 10 -> last 10 steps, mean of three seeds); staleness.json does not keep it per step
FIRST_ROUND_ACCURACY = {"0": 0.36, "200": 0.91}
Z = np.linspace(-14.0, 14.0, 2049)
X = 1.0 / (1.0 + np.exp(-Z))


def binom(k, j, p):
    return math.comb(k, j) * p**j * (1 - p) ** (k - j)


def not_done(p, draws):  # Ada-balance after `draws`: fewer than 2 correct or 2 wrong
    return sum(binom(draws, j, p) for j in (0, 1, draws - 1, draws))


STATS = {  # per-prompt expectations given p, on the grid X
    "mean": X,
    "lacking_pos": binom(8, 0, X) + binom(8, 1, X),
    "lacking_neg": binom(8, 8, X) + binom(8, 7, X),
    "draws": 8 * (1 + sum(not_done(X, 8 * r) for r in range(1, N))),
    "zero_variance": X**32 + (1 - X) ** 32,
    "grpo_zero_variance": X**4 + (1 - X) ** 4,
    "pos_draws": 8 * (1 + sum((1 - X) ** (8 * r) for r in range(1, N))),
}


def beta_stats(la, lb):
    """Every STATS entry under Beta(e^la, e^lb), for arrays of (la, lb)."""
    logw = np.exp(la)[:, None] * np.log(X) + np.exp(lb)[:, None] * np.log1p(-X)
    w = np.exp(logw - logw.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    return {k: w @ v for k, v in STATS.items()}


def fit(obs: dict) -> tuple[float, float]:
    """(a, b) minimising the squared errors of `obs` (scaled: draws / 32), coarse to fine."""
    scale = {k: 32.0 if "draws" in k else 1.0 for k in obs}
    lo, hi, best = np.array([-3.0, -3.0]), np.array([4.0, 4.0]), None
    for _ in range(4):
        g = np.stack(np.meshgrid(np.linspace(lo[0], hi[0], 61), np.linspace(lo[1], hi[1], 61)), -1)
        g = g.reshape(-1, 2)
        s = beta_stats(g[:, 0], g[:, 1])
        err = sum(((s[k] - v) / scale[k]) ** 2 for k, v in obs.items())
        best = g[np.argmin(err)]
        half = (hi - lo) / 10
        lo, hi = best - half, best + half
    return float(np.exp(best[0])), float(np.exp(best[1]))


def real_fits() -> dict:
    """name -> dict(ab, observed, fitted, checks); module doc."""
    out = {}
    runs = json.load(open(os.path.join(ROOT, "docs/compare/staleness.json")))["runs"]["k0"]
    for at, (a, b) in (("0", (1, 11)), ("100", (96, 106)), ("200", (191, 201))):
        lp, dr = [], []
        for r in runs:
            c = {x["step"]: x for x in r["curve"]}
            lp += [c[s]["lacking_pos_share_round0"] for s in range(a, b)]
            dr += [(c[s]["samples"] - c[s - 1]["samples"]) / P for s in range(a, b)]
        obs = {"lacking_pos": float(np.mean(lp)), "draws": float(np.mean(dr))}
        if at in FIRST_ROUND_ACCURACY:
            obs["mean"] = FIRST_ROUND_ACCURACY[at]
        out[f"default@{at}"] = dict(obs=obs, checks={})
    mixes = json.load(open(os.path.join(ROOT, "docs/compare/summary.json")))["mixes"]
    for mix in ("hard", "easy", "hard_persistent"):
        v = mixes[mix]["variants"]
        bal = v["ada_balance"]
        obs = {"lacking_pos": bal["lacking_pos_share_round0"],
               "lacking_neg": bal["lacking_neg_share_round0"],
               "draws": bal["samples_per_prompt"], "zero_variance": bal["zero_variance_share"]}
        checks = {"grpo_zero_variance": v["grpo"]["zero_variance_share"],
                  "pos_draws": v["ada_pos"]["samples_per_prompt"]}
        out[mix] = dict(obs=obs, checks=checks)
    for f in out.values():
        f["ab"] = fit(f["obs"])
        s = beta_stats(*np.log([[f["ab"][0]], [f["ab"][1]]]))
        f["fitted"] = {k: float(s[k][0]) for k in list(f["obs"]) + list(f["checks"])}
        f["mean"] = f["ab"][0] / sum(f["ab"])
    return out


def trajectories(fits) -> dict:
    """name -> (Trajectory, dataset size, steps, measure_from)."""
    t = {k: (Trajectory((0,), (v["ab"],)), SIZES[k.split("@")[0]], 100, 25)
         for k, v in fits.items()}
    t["default 0->200"] = (Trajectory((0, 100, 200), tuple(fits[f"default@{s}"]["ab"]
                                                            for s in (0, 100, 200))),
                           SIZES["default"], 200, 0)
    return t


def arms(alloc_defaults: AllocConfig) -> list[tuple[str, int, Arm]]:
    """(method, budget per prompt or cap, arm): the budget curves."""
    out = [("grpo", b, Arm("grpo", "none", b, 1)) for b in (2, 4, 8, 16, 32)]
    for rule in ("pos", "balance"):
        out += [(f"ada_{rule}", c, Arm(f"ada_{rule}", rule, M, c // M)) for c in (8, 16, 32)]
    for name, rule, Mr, alloc in (("grpo_knapsack", "none", 32, "knapsack"),
                                  ("grpo_variance", "none", 32, "variance"),
                                  ("ada_knapsack", "balance", M, "knapsack")):
        for b in (2, 4, 8, 16):
            cfg = dataclasses.replace(alloc_defaults, allocation=alloc, budget=b * P)
            out.append((name, b, Arm(name, rule, Mr, 1, alloc=cfg)))
    return out


def measure(arm, traj, seeds) -> dict:
    traj_, size, steps, frm = traj
    rs = [run_arm(arm, traj_, size, P, steps, s, measure_from=frm) for s in seeds]
    per = {k: np.array([r[a] / r[d] for r in rs]) for k, (a, d) in {
        "samples_per_prompt": ("samples", "prompts"), "mixed_share": ("mixed", "prompts"),
        "mixed_per_100": ("mixed", "samples"), "signal_per_100": ("signal", "samples"),
        "predicted_share": ("predicted", "prompts"), "skipped_per_prompt": ("skipped", "prompts"),
    }.items()}
    per["mixed_per_100"] *= 100
    per["signal_per_100"] *= 100
    return {k: dict(mean=float(v.mean()), std=float(v.std(ddof=1)) if v.size > 1 else 0.0,
                    seeds=v.tolist()) for k, v in per.items()}


SWEEP = {"half_life": (2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 1e9),
         "prior_strength": (0.5, 2.0, 8.0),
         "floor": (1, 2, 3),
         "explore": (0.0, 0.1, 0.25, 0.5),
         "skip_above": (1.0, 0.5, 0.3, 0.1)}


def sweep(trajs, alloc_defaults: AllocConfig, seeds) -> list[dict]:
    """One knob at a time around the defaults, grpo_knapsack at 4 samples per prompt; every
    knob but skip_above with skipping off, so that the allocation's own effect shows (more
    evidence per prompt also means more skips); the signal per sample over GRPO's (n = 4)
    on the same seed."""
    rows = []
    base = dataclasses.replace(alloc_defaults, allocation="knapsack", budget=4 * P)
    for tname in ("default 0->200", "hard"):
        tr = trajs[tname]
        grpo = measure(Arm("grpo", "none", 4, 1), tr, seeds)["signal_per_100"]["seeds"]
        for knob, values in SWEEP.items():
            for v in values:
                cfg = base if knob == "skip_above" else dataclasses.replace(base, skip_above=1.0)
                arm = Arm("grpo_knapsack", "none", 32, 1, alloc=cfg)
                if knob in ("half_life", "prior_strength"):
                    arm = dataclasses.replace(arm, **{knob: v})
                else:
                    arm = dataclasses.replace(arm, alloc=dataclasses.replace(cfg, **{knob: v}))
                got = measure(arm, tr, seeds)
                ratio = np.array(got["signal_per_100"]["seeds"]) / np.array(grpo)
                rows.append(dict(trajectory=tname, knob=knob, value=v,
                                 ratio_mean=float(ratio.mean()), ratio_std=float(ratio.std(ddof=1)),
                                 mixed_share=got["mixed_share"]["mean"],
                                 predicted_share=got["predicted_share"]["mean"],
                                 skipped_per_prompt=got["skipped_per_prompt"]["mean"]))
    return rows


def vs_grpo(per: dict, d: dict, key: str) -> float:
    """d's `key` over GRPO's at the same samples per prompt (log-log interpolation between
    GRPO's group sizes)."""
    g = sorted((v["samples_per_prompt"]["mean"], v[key]["mean"]) for (m, _), v in per.items()
               if m == "grpo")
    x = np.log([a for a, _ in g])
    y = np.log([max(b, 1e-12) for _, b in g])
    return d[key]["mean"] / float(np.exp(np.interp(np.log(d["samples_per_prompt"]["mean"]), x, y)))


def fmt(d, k, digits=2):
    return f"{d[k]['mean']:.{digits}f} ± {d[k]['std']:.{digits}f}"


SUMMARY = (("grpo_knapsack", 4), ("grpo_variance", 4), ("ada_knapsack", 4), ("ada_knapsack", 8),
           ("ada_knapsack", 16), ("ada_pos", 32), ("ada_balance", 32))


def tables(fits, curves, rows, seeds, secs) -> str:
    out = ["# A step's budget across prompts, in the simulator", "",
           f"`python experiments/allocation_sim.py --out docs/allocation --seeds "
           f"{','.join(map(str, seeds))}` ({datetime.date.today()}, {secs:.0f} s). "
           "Mean ± std over seeds.", "",
           "## Pass-rate distributions (Beta fits to the real runs' statistics)", "",
           "| distribution | Beta(a, b) | mean p | statistic: observed / fitted |", "|---|---|---|---|"]
    for k, f in fits.items():
        st = "; ".join(f"{s} {f['obs'].get(s, f['checks'].get(s)):.3f} / {f['fitted'][s]:.3f}"
                       + (" (check)" if s in f["checks"] else "") for s in f["fitted"])
        out.append(f"| {k} | ({f['ab'][0]:.2f}, {f['ab'][1]:.2f}) | {f['mean']:.3f} | {st} |")
    out += ["", "## Summary: signal per sample over GRPO's at equal samples per prompt", "",
            "Each cell: the ratio (samples per prompt drawn). grpo: its signal per 100 "
            "samples at n = 4.", "",
            "| distribution | grpo, n = 4 | " + " | ".join(f"{m} {b}" for m, b in SUMMARY) + " |",
            "|---|---|" + "---|" * len(SUMMARY)]
    for t, per in curves.items():
        cells = [f"{per[m, b]['signal_per_100']['mean']:.3f}" if m == "grpo" else
                 f"{vs_grpo(per, per[m, b], 'signal_per_100'):.3f} "
                 f"({per[m, b]['samples_per_prompt']['mean']:.1f})"
                 for m, b in (("grpo", 4), *SUMMARY)]
        out.append(f"| {t} | " + " | ".join(cells) + " |")
    out += ["", "## Signal per sample against budget", "",
            "budget: samples per prompt per step (grpo: its group; ada_*: the cap M x N; "
            "*_knapsack / *_variance: the step's budget / prompts). signal: sum of p (1 - p) "
            "over kept groups with both kinds, per 100 samples drawn.", ""]
    for t, per in curves.items():
        out += [f"**{t}**", "", "| method | budget | samples/prompt | mixed share | "
                "mixed per 100 samples | signal per 100 samples | signal / GRPO's at equal "
                "samples |", "|---|---|---|---|---|---|---|"]
        for (m, b), d in per.items():
            out.append(f"| {m} | {b} | {fmt(d, 'samples_per_prompt')} | "
                       f"{fmt(d, 'mixed_share', 3)} | {fmt(d, 'mixed_per_100')} | "
                       f"{fmt(d, 'signal_per_100', 3)} | {vs_grpo(per, d, 'signal_per_100'):.3f} |")
        out.append("")
    out += ["## Knob sweep (grpo_knapsack, 4 samples per prompt; one knob at a time)", "",
            "ratio: signal per sample over GRPO's (n = 4) on the same seed. Every knob but "
            "skip_above with skipping off. predicted share: the allocation's predicted share of "
            "prompts with signal; mixed share: the realised one.", "",
            "| distribution | knob | value | ratio | mixed share | predicted share | "
            "skipped per prompt |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['trajectory']} | {r['knob']} | {r['value']:g} | "
                   f"{r['ratio_mean']:.3f} ± {r['ratio_std']:.3f} | {r['mixed_share']:.3f} | "
                   f"{r['predicted_share']:.3f} | {r['skipped_per_prompt']:.3f} |")
    return "\n".join(out) + "\n"


def plot(curves, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(curves)
    fig, ax = plt.subplots(2, len(names), figsize=(3.2 * len(names), 6.4), squeeze=False)
    fig.suptitle("per sample, over GRPO's at the same samples per prompt (std over seeds)",
                 fontsize=10)
    for j, t in enumerate(names):
        methods = sorted({m for m, _ in curves[t]})
        for m in methods:
            pts = [(d["samples_per_prompt"]["mean"], d) for (mm, _), d in curves[t].items()
                   if mm == m]
            x = [p for p, _ in pts]
            for i, key in enumerate(("signal_per_100", "mixed_per_100")):
                y = [vs_grpo(curves[t], d, key) for _, d in pts]
                e = [d[key]["std"] / d[key]["mean"] * v for (_, d), v in zip(pts, y, strict=True)]
                ax[i, j].errorbar(x, y, yerr=e, marker="o", ms=3, label=m)
                ax[i, j].set_xscale("log", base=2)
        ax[0, j].set_title(t, fontsize=9)
        ax[1, j].set_xlabel("samples per prompt")
    ax[0, 0].set_ylabel("signal p(1-p) per sample / GRPO's")
    ax[1, 0].set_ylabel("mixed groups per sample / GRPO's")
    ax[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/allocation"))
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.time()
    fits = real_fits()
    trajs = trajectories(fits)
    alloc = AllocConfig(allocation="knapsack", max_cap=M * N)
    curves = {t: {(m, b): measure(arm, tr, seeds) for m, b, arm in arms(alloc)}
              for t, tr in trajs.items()}
    rows = [] if args.no_sweep else sweep(trajs, alloc, seeds)
    secs = time.time() - t0
    os.makedirs(args.out, exist_ok=True)
    result = dict(fits=fits, curves={t: [dict(method=m, budget=b, **d) for (m, b), d in per.items()]
                                     for t, per in curves.items()},
                  sweep=rows, seeds=seeds, seconds=secs, defaults=dataclasses.asdict(alloc))
    with open(os.path.join(args.out, "allocation_sim.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(tables(fits, curves, rows, seeds, secs))
    plot(curves, os.path.join(args.out, "signal_per_sample.png"))
    print(f"wrote {args.out} in {secs:.0f} s")
    return result


if __name__ == "__main__":
    main()
