"""Where rl.max_staleness k > 1 pays: ada/stream.py's Stream over the simulated driver.

The default run's responses fit in one decode chunk, so colocated k = 1, 2 and 4 are one
run there (docs/results.md). The simulator's responses have long tails (log-normal lengths,
wrong answers longer: ada/adaptive/simulate.py), so a step's last rounds wait for a few long
responses while most slots sit empty: the drain that admitting the next cohorts fills.

The stream is the real one: `ada.stream.Stream`'s admission (cohort t once the driver holds
version >= t - 1 - k), delivery (the cohorts resumed oldest first), hand-out and per-token
lag (`Stream.staleness`), with the real Collector (Ada-balance rounds by default). Only its
Driver is replaced, by `SharedSimDriver` (free slots to the oldest cohort first, the same
order; plus the head-of-line measure). Time is in decode steps, and so is the trainer's
update: `--update` steps per train step plus `--update-per-token` per trained token.

  colocated  sampler and trainer take turns (`Stream.next_batch`, then the update with
             nothing decoding, then `set_params`)
  split      the sampler decodes on its own devices, waiting for the trainer only by the
             bound; the trainer takes the oldest batch once it is complete and its previous
             update is done; new weights reach the driver when the update ends (the loop of
             `Stream._sample`, with simulated time instead of a thread)
  head_first younger cohorts yield slots to the head (their running requests pause while
             its requests wait): the policy this measures, not what ada/stream.py does

Per run: steps per 1,000 decode steps (throughput), the sampler's idle share (colocated: the
updates' share of the time; split: its waits for the bound), the trainer's idle share, slot
occupancy while decoding, the lag of every trained token (histogram, mean, max), the share
of responses an update caught midway, and the head-of-line wait: the share of the time the
oldest cohort had requests waiting for slots that younger cohorts held (and of slot-steps).

  python experiments/stream_sim.py --out docs/compare [--steps 40 --seeds 0,1,2 ...]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys

import jax
import numpy as np

from ada.adaptive.collect import CollectConfig, Collector
from ada.adaptive.simulate import SharedSimDriver, SimulatedPolicy, prompt_stream, sim_reward
from ada.stream import Stream

MODES = ("colocated", "split")
POLICIES = ("oldest", "head_first")


class SimRollout:
    """What Stream needs of an ada.rollout.Rollout: a collector over its view of the driver."""

    engine, tokenizer = None, None

    def __init__(self, collect_cfg: CollectConfig):
        self.collect_cfg = collect_cfg

    def collector(self, driver, step_key=None) -> Collector:
        return Collector(self.collect_cfg, sim_reward, driver=driver)


class SimPrompts:
    """Batches of simulated prompts, with the iterator state Stream records."""

    def __init__(self, mix: str, seed: int, size: int):
        self._prompts, self.size, self.drawn = prompt_stream(mix, seed), size, 0

    def __iter__(self):
        return self

    def __next__(self) -> list:
        self.drawn += 1
        return list(itertools.islice(self._prompts, self.size))

    def get_state(self) -> dict:
        return {"batches": self.drawn}


class SimStream(Stream):
    """ada.stream.Stream, colocated, over `driver`: ranks the driver's requests by cohort."""

    def __init__(self, driver, collect_cfg, prompts, *, max_staleness: int, last_step: int,
                 seed: int):
        super().__init__(SimRollout(collect_cfg), None, prompts, jax.random.key(seed),
                         max_staleness=max_staleness, version=0, last_step=last_step,
                         driver=driver)
        driver.rank = self.owner.__getitem__


def run(args, *, k: int, mode: str, policy: str, seed: int) -> dict:
    """One simulated run of `args.steps` train steps; its record."""
    cfg = CollectConfig(rule=args.rule, n=args.n, samples_per_round=args.M, max_rounds=args.N,
                        overlap_scoring=False)  # the same batch (tests/test_overlap.py), no thread
    drv = SharedSimDriver(SimulatedPolicy(seed=seed, mean_len=args.mean_len,
                                          len_sigma=args.len_sigma,
                                          wrong_len_factor=args.wrong_len_factor,
                                          max_len=args.max_len),
                          args.slots, head_first=policy == "head_first")
    stream = SimStream(drv, cfg, SimPrompts(args.mix, seed, args.prompts), max_staleness=k,
                       last_step=args.steps, seed=seed)
    hist, spanning = np.zeros(k + 1, np.int64), []
    acc = {"update": 0, "sampler_wait": 0, "trainer_wait": 0}

    def hand_out() -> int:
        """The oldest batch to the trainer; its update's duration in decode steps."""
        batch, m = stream.next_batch()
        lag = np.asarray(m["staleness_hist"], np.int64)
        if lag.size > hist.size:
            raise AssertionError(f"a trained token lags {lag.size - 1} > k = {k}")
        hist[:lag.size] += lag
        spanning.append(m["spanning_share"])
        tokens = sum(c.num_tokens for row in batch.completions for c in row if c is not None)
        u = int(round(args.update + args.update_per_token * tokens))
        acc["update"] += u
        return u

    if mode == "colocated":
        for t in range(1, args.steps + 1):
            t0 = drv.clock
            u = hand_out()
            acc["trainer_wait"] += drv.clock - t0
            drv.wait(u)  # the trainer holds the devices
            stream.set_params(None, t)
        acc["sampler_wait"] = acc["update"]
    else:
        version, busy_until, free_since = 0, None, 0
        while version < args.steps:
            head = stream.cohorts[0] if stream.cohorts else None
            if busy_until is None and head is not None and head.result is not None:
                acc["trainer_wait"] += drv.clock - free_since
                busy_until = drv.clock + hand_out()
            if busy_until is not None and drv.clock >= busy_until:
                version += 1
                stream.set_params(None, version)
                busy_until, free_since = None, drv.clock
                continue
            stream._admit()  # noqa: SLF001 - the sampler thread's loop, in simulated time
            if not drv.live():  # the bound (or the last step) holds the sampler
                if busy_until is None:
                    raise RuntimeError("nothing to sample and nothing training")
                acc["sampler_wait"] += busy_until - drv.clock
                drv.wait(busy_until - drv.clock)
                continue
            got = drv.step(None if busy_until is None else busy_until - drv.clock)
            stream._deliver(got)  # noqa: SLF001
    decode = max(drv.clock - drv.idle_steps, 1)
    tokens = int(hist.sum())
    return {
        "k": k, "mode": mode, "policy": policy, "seed": seed, "steps": args.steps,
        "decode_steps": drv.clock, "steps_per_kstep": 1000 * args.steps / drv.clock,
        "sampler_idle_share": acc["sampler_wait"] / drv.clock,
        "trainer_idle_share": acc["trainer_wait"] / drv.clock,
        "update_share": acc["update"] / drv.clock,
        "slot_occupancy": drv.busy_slot_steps / (decode * args.slots),
        "lag_hist": hist.tolist(), "lag_share": (hist / max(tokens, 1)).tolist(),
        "lag_mean": float(np.arange(k + 1) @ hist / max(tokens, 1)),
        "lag_max": int(np.flatnonzero(hist).max()) if tokens else 0,
        "trained_tokens": tokens, "spanning_share": float(np.mean(spanning)),
        "carried_tokens": drv.carried_tokens, "paused_requests": drv.paused,
        "hol_share": drv.hol_steps / drv.clock,
        "hol_slot_share": drv.hol_slot_steps / (decode * args.slots),
    }


SHOWN = ("steps_per_kstep", "sampler_idle_share", "trainer_idle_share", "slot_occupancy",
         "lag_mean", "hol_share", "hol_slot_share", "spanning_share")


def summarize(runs: list[dict]) -> list[dict]:
    """Mean and std over seeds per (mode, policy, k), and throughput against k = 0 of the
    same mode and policy, seed by seed."""
    rows = []
    key = lambda r: (r["mode"], r["policy"], r["k"])  # noqa: E731
    base = {(r["mode"], r["policy"], r["seed"]): r["steps_per_kstep"] for r in runs if r["k"] == 0}
    order = lambda r: (MODES.index(r["mode"]), POLICIES.index(r["policy"]), r["k"])  # noqa: E731
    for (mode, policy, k), group in itertools.groupby(sorted(runs, key=order), key=key):
        g = list(group)
        row = {"mode": mode, "policy": policy, "k": k, "seeds": len(g)}
        for f in SHOWN:
            xs = np.array([r[f] for r in g], float)
            row[f] = float(xs.mean())
            row[f + "_std"] = float(xs.std(ddof=1)) if len(xs) > 1 else 0.0
        speed = [r["steps_per_kstep"] / base[(mode, policy, r["seed"])] for r in g
                 if (mode, policy, r["seed"]) in base]
        row["speedup_vs_k0"] = float(np.mean(speed)) if speed else None
        hist = np.sum([r["lag_hist"] for r in g], axis=0)
        row["lag_share"] = (hist / max(hist.sum(), 1)).tolist()
        row["lag_max"] = max(r["lag_max"] for r in g)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| mode | slots to | k | steps / 1k decode steps | vs k=0 | sampler idle | "
             "trainer idle | slot occupancy | trained tokens' lag: mean; share at 0 / 1 / ... "
             "(max) | head-of-line wait: time / slot-steps | spanning responses |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lag = " / ".join(f"{x:.2f}" for x in r["lag_share"])
        lines.append(
            f"| {r['mode']} | {r['policy']} | {r['k']} | {r['steps_per_kstep']:.3f} ± "
            f"{r['steps_per_kstep_std']:.3f} | {r['speedup_vs_k0']:.2f}x | "
            f"{r['sampler_idle_share']:.2f} | {r['trainer_idle_share']:.2f} | "
            f"{r['slot_occupancy']:.2f} | {r['lag_mean']:.2f}; {lag} ({r['lag_max']}) | "
            f"{r['hol_share']:.3f} / {r['hol_slot_share']:.3f} | {r['spanning_share']:.2f} |")
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--ks", default="0,1,2,4", help="rl.max_staleness values")
    ap.add_argument("--modes", default=",".join(MODES), help="colocated and / or split")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="oldest (ada/stream.py's) and head_first (younger cohorts yield)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=40, help="train steps per run")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per step (a cohort)")
    ap.add_argument("--slots", type=int, default=256, help="the driver's decode slots")
    ap.add_argument("--rule", default="balance")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--M", type=int, default=8, help="responses per prompt per round")
    ap.add_argument("--N", type=int, default=4, help="rounds at most")
    ap.add_argument("--mix", default="skewed", help="pass-rate mix (simulate.pass_rate_mix)")
    ap.add_argument("--mean-len", type=float, default=256.0)
    ap.add_argument("--len-sigma", type=float, default=0.6)
    ap.add_argument("--wrong-len-factor", type=float, default=1.5)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--update", type=float, default=1000.0,
                    help="the trainer's update, decode steps per train step")
    ap.add_argument("--update-per-token", type=float, default=0.0,
                    help="... plus this many decode steps per trained token")
    ap.add_argument("--out", default="", help="write NAME.json and NAME.md to this folder")
    ap.add_argument("--name", default="stream_sim", help="the output files' name")
    return ap


def main(argv=None) -> dict:
    from ada.distributed import cpu_only_without_accelerators

    cpu_only_without_accelerators()  # no libtpu start-up noise on a CPU
    args = parser().parse_args(argv)
    runs = [run(args, k=k, mode=mode, policy=policy, seed=seed)
            for mode in args.modes.split(",") for policy in args.policies.split(",")
            for k in (int(x) for x in args.ks.split(","))
            for seed in (int(x) for x in args.seeds.split(","))]
    rows = summarize(runs)
    out = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
           "settings": vars(args), "summary": rows, "runs": runs}
    md = table(rows)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, args.name + ".json"), "w") as f:
            json.dump(out, f, indent=1)
        with open(os.path.join(args.out, args.name + ".md"), "w") as f:
            f.write(md)
    return out


if __name__ == "__main__":
    main()
