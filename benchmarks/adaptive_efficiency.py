"""Sample efficiency of the collection methods, simulated; and rounds vs continuous wall-clock
on the real engine with a tiny model.

Simulated part: prompts with known pass rates (mixes "skewed": most prompts all-correct or
all-wrong at n=4, and "uniform"), the real Collector / DispatchPolicy / selection, and a
simulated slot engine (ada/adaptive/simulate.py) whose response lengths vary, so responses
still in flight when a prompt retires are drawn and counted. Per mix and method:

  samples_per_prompt        responses drawn / prompts in the batch (DAPO: / P, all draws)
  mixed_share               share of the batch's groups whose kept rewards are not all equal
  samples_per_mixed_prompt  responses drawn / mixed groups
  sim_decode_steps          simulated wall-clock (decode steps of the slot engine)

Engine part: the same Collector over ada.sampling's Driver (tiny random model, CPU unless a
GPU is visible); rewards and per-request max_new_tokens come from the simulated policy of
(prompt, sample_idx), so the workload has known pass rates and variable lengths while the
engine does the real decoding. wallclock_rounds_s / wallclock_continuous_s: mean seconds per
collected batch (after a warm-up batch that pays the compiles).

  python benchmarks/adaptive_efficiency.py --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import jax
import numpy as np

from ada.adaptive.collect import Collector
from ada.adaptive.simulate import (
    SimPrompt,
    SimulatedDriver,
    SimulatedPolicy,
    prompt_stream,
    sim_reward,
    uniform_group_share,
)
from ada.methods import collect_config as method_config

# ada/methods.py names, plus GRPO at n = 4 and n = M x N and Ada-balance's continuous scheduler
VARIANTS = ("grpo_n4", "grpo_n32", "dapo", "ada_pos", "ada_balance", "ada_balance_continuous",
            "exhaustive")
MIXES = ("skewed", "uniform")


def config_of(method: str, n: int, M: int, N: int, dapo_max_batches: int = 8):
    if method == "dapo":
        return method_config("dapo", n=n, dapo_max_batches=dapo_max_batches)
    if method == "grpo_n4":
        return method_config("grpo", n=n)
    if method == "grpo_n32":
        return method_config("grpo", n=M * N)
    if method == "ada_balance_continuous":
        return method_config("ada_balance", n=n, samples_per_round=M, max_rounds=N,
                             scheduler="continuous")
    return method_config(method, n=n, samples_per_round=M, max_rounds=N)


def run_simulated(args) -> dict:
    out = {}
    for mix in MIXES:
        out[mix] = {}
        first = list(itertools.islice(prompt_stream(mix, args.seed), args.prompts * args.batches))
        out[mix]["_uniform_group_share_n4"] = uniform_group_share(
            [p.pass_rate for p in first], args.n)
        for method in VARIANTS:
            cfg = config_of(method, args.n, args.M, args.N, args.dapo_max_batches)
            drv = SimulatedDriver(SimulatedPolicy(seed=args.seed), args.slots)
            col = Collector(cfg, sim_reward, driver=drv)
            more = prompt_stream(mix, args.seed + 1, start_uid=10**7)  # DAPO's extra prompts
            samples = mixed = prompts = 0
            for b in range(args.batches):
                batch = first[b * args.prompts:(b + 1) * args.prompts]
                res = col.collect(batch, jax.random.key(b), more_prompts=more)
                samples += res.metrics["samples"]
                mixed += int(res.mixed.sum())
                prompts += len(batch)
            out[mix][method] = dict(
                samples_per_prompt=samples / prompts, mixed_share=mixed / prompts,
                samples_per_mixed_prompt=samples / mixed if mixed else float("inf"),
                sim_decode_steps=drv.clock / args.batches,
                sim_slot_utilisation=drv.busy_slot_steps / max(drv.clock * args.slots, 1))
    return out


def targets(sim: dict, budget: int) -> dict:
    t = {}
    for mix in MIXES:
        s = sim[mix]
        ab, ex, ac = s["ada_balance"], s["exhaustive"], s["ada_balance_continuous"]
        t[mix] = dict(
            balance_mixed_gap_points=100 * (ex["mixed_share"] - ab["mixed_share"]),
            balance_sample_fraction_of_exhaustive=ab["samples_per_prompt"] / ex["samples_per_prompt"],
            continuous_sample_saving_vs_rounds=1 - ac["samples_per_prompt"] / ab["samples_per_prompt"],
            continuous_mixed_gap_points=100 * (ab["mixed_share"] - ac["mixed_share"]),
        )
        t[mix]["met_balance_vs_exhaustive"] = bool(
            abs(t[mix]["balance_mixed_gap_points"]) <= 1
            and t[mix]["balance_sample_fraction_of_exhaustive"] < 0.75)
        t[mix]["met_continuous_saving"] = bool(
            t[mix]["continuous_sample_saving_vs_rounds"] >= 0.08
            and abs(t[mix]["continuous_mixed_gap_points"]) <= 1)
    return t


def run_engine(args) -> dict:
    """Rounds vs continuous on ada.sampling's Driver with a tiny random model."""
    from ada.models.presets import preset
    from ada.models.transformer import init_params
    from ada.sampling.driver import Driver, Request
    from ada.sampling.engine import Engine

    config = preset("tiny", family="qwen2")
    params = init_params(config, jax.random.key(0))
    max_new = args.engine_max_new
    engine = Engine(config, num_slots=args.engine_slots, max_prompt_len=16,
                    max_new_tokens=max_new, chunk_size=args.engine_chunk, eos_ids=())
    policy = SimulatedPolicy(seed=args.seed, mean_len=max_new / 4, len_sigma=0.7,
                             max_len=max_new)
    rng = np.random.default_rng(args.seed)
    tokens = {}

    def prompt_tokens(p: SimPrompt):
        if p.uid not in tokens:
            tokens[p.uid] = rng.integers(1, config.vocab_size, int(rng.integers(4, 16))).tolist()
        return tokens[p.uid]

    def make_request(r):
        _, length = policy.outcome(r.prompt, r.sample_idx)
        return Request(prompt_tokens(r.prompt), r.prompt_id, r.sample_idx, length)

    def reward(prompt, completion):  # known pass rate, independent of the random model's text
        if completion.finish_reason == "error":
            raise RuntimeError(completion.error)
        return float(policy.outcome(prompt, completion.sample_idx)[0])

    stream = prompt_stream("skewed", args.seed + 2)
    batches = [list(itertools.islice(stream, args.engine_prompts))
               for _ in range(args.engine_batches + 1)]
    res = {}
    for method in ("ada_balance", "ada_balance_continuous"):
        cfg = config_of(method, args.n, args.M, args.N)
        driver = Driver(engine, params, step_key=args.seed)
        col = Collector(cfg, reward, driver=driver, make_request=make_request,
                        reward_input="completion")
        col.collect(batches[-1], jax.random.key(0))  # warm-up: compiles every bucket used
        times, samples, fails = [], 0, 0
        for b, batch in enumerate(batches[:-1]):
            t0 = time.perf_counter()
            out = col.collect(batch, jax.random.key(b))
            times.append(time.perf_counter() - t0)
            samples += out.metrics["samples"]
            fails += out.metrics["reward_failures"]
        key = "rounds" if method == "ada_balance" else "continuous"
        res[f"wallclock_{key}_s"] = float(np.mean(times))
        res[f"samples_per_prompt_{key}"] = samples / (args.engine_batches * args.engine_prompts)
        res[f"reward_failures_{key}"] = fails
        res[f"slot_occupancy_{key}"] = driver.stats()["slot_occupancy"]
    res["device"] = str(jax.devices()[0].platform)
    return res


def _fields(d: dict) -> str:
    return ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())


def main(argv=None):
    from ada.distributed import cpu_only_without_accelerators

    cpu_only_without_accelerators()  # no libtpu start-up noise on a CPU
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=256, help="P prompts per batch")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--slots", type=int, default=128, help="simulated engine slots")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--M", type=int, default=8)
    ap.add_argument("--N", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dapo-max-batches", type=int, default=8,
                    help="DAPO's prompt batches per collection at most (docs/results.md: 8; "
                         "a run's adaptive.dapo_max_batches defaults to 4)")
    ap.add_argument("--no-engine", action="store_true", help="skip the real-engine part")
    ap.add_argument("--engine-prompts", type=int, default=32)
    ap.add_argument("--engine-batches", type=int, default=2)
    ap.add_argument("--engine-slots", type=int, default=32)
    ap.add_argument("--engine-chunk", type=int, default=8)
    ap.add_argument("--engine-max-new", type=int, default=128)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    sim = run_simulated(args)
    result = {"settings": vars(args), "simulated": sim, "targets": targets(sim, args.M * args.N)}
    print(f"P={args.prompts} x {args.batches} batches, n={args.n}, M={args.M}, N={args.N}, "
          f"{args.slots} simulated slots")
    print(f"{'mix':8s} {'method':24s} {'samples/prompt':>15s} {'mixed share':>12s} "
          f"{'samples/mixed':>14s} {'sim steps':>10s}")
    for mix in MIXES:
        for m in VARIANTS:
            r = sim[mix][m]
            print(f"{mix:8s} {m:24s} {r['samples_per_prompt']:15.2f} {r['mixed_share']:12.3f} "
                  f"{r['samples_per_mixed_prompt']:14.2f} {r['sim_decode_steps']:10.0f}")
    for mix, t in result["targets"].items():
        print(f"targets[{mix}]: {_fields(t)}")
    if not args.no_engine:
        eng = run_engine(args)
        result["engine"] = eng
        result.update({k: eng[k] for k in ("wallclock_rounds_s", "wallclock_continuous_s")})
        print(f"engine: {_fields(eng)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
