"""The whole RL step (`ada.step.rl_step`: collection, batch, advantages, old log-probs when
off-policy, update, metrics), timed per phase against the same run's large-matmul rate.

Default setup: tunix's GRPO example on a random 3.0M-parameter Qwen2 (vocab 512, hidden
256, 4 layers), 8 prompts x 4 responses, 32 prompt tokens, 32 new tokens with no early stop
(no EOS id), so every update sees 32 x 64 = 2,048 tokens. Rewards are a fixed function of
(prompt, response text) with a per-prompt pass rate from a mix of ada.adaptive.simulate, so
Ada-balance draws as many rounds as it would on prompts of that difficulty.

Phases, as medians over the steps after the first (which compiles):
  collect_s  rollout.collect: generation and rewards
  update_s   add_logps + train_step, from dispatch until the new state is ready
  host_s     the rest of the step: advantages, batch building, transfers, metrics
update_gflop = 6 x params x tokens; update_efficiency = update_gflop / update_s / matmul_gflops.
matmul_floor_s: the update's own weight matmuls (forward and both backward products, same
shapes) run bare in one jit, in the same run (train_step.matmul_floor); update_vs_floor =
update_s / matmul_floor_s is how far the update is from what these shapes allow here.

  python benchmarks/rl_step.py [--methods grpo,ada_balance] [--steps 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import zlib

import jax
import numpy as np
from train_step import matmul_floor, matmul_gflops  # benchmarks/ is on the path

from ada.adaptive.simulate import pass_rate_mix
from ada.config import collect_config, train_config
from ada.models import init_params, preset
from ada.rl.batch import BatchLayout
from ada.rl.train import TrainConfig, make_train_fns
from ada.rollout import Rollout
from ada.sampling.backends import make_engine
from ada.step import rl_step
from configs.common import base, set_method


class IdTokenizer:
    """Decodes ids as their decimal text; no EOS, so every response runs to full length."""

    eos_ids: tuple = ()
    pad_id = 0

    def decode(self, ids, skip_special: bool = True) -> str:
        return " ".join(map(str, ids))


def reward(record: dict, text: str) -> float:
    """Correct with the prompt's pass rate, as a fixed function of the response text."""
    u = np.random.default_rng([record["uid"], zlib.crc32(text.encode())]).random()
    return float(u < record["pass_rate"])


def config_for(args, method: str):
    c = set_method(base(), method)
    c.data.prompts_per_step = args.prompts
    c.data.max_prompt_len = args.prompt_len
    c.adaptive.n = args.n
    c.sampling.max_new_tokens = args.new_tokens
    c.sampling.num_slots = args.slots
    c.train.mini_batches = args.mini_batches
    c.train.epochs = args.epochs
    c.loss.kl_coef = args.kl_coef
    c.model.dtype = c.model.param_dtype = args.dtype
    c.model.remat = args.remat
    return c


def model_config(args):
    return preset("tiny", family="qwen2", vocab_size=args.vocab, hidden_size=args.hidden,
                  num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
                  head_dim=args.hidden // args.heads, intermediate_size=args.intermediate,
                  dtype=args.dtype, param_dtype=args.dtype)


def prompt_batches(args, vocab: int, steps: int) -> list[list[dict]]:
    rng = np.random.default_rng(args.seed)
    rates = pass_rate_mix(args.mix, rng, steps * args.prompts)
    recs = [dict(uid=i, pass_rate=float(p),
                 prompt_tokens=rng.integers(1, vocab, args.prompt_len).tolist())
            for i, p in enumerate(rates)]
    return [recs[s * args.prompts:(s + 1) * args.prompts] for s in range(steps)]


class Timed:
    """Wraps a function so each call blocks until its outputs are ready and adds its time."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *a, **kw):
        t0 = time.perf_counter()
        out = jax.block_until_ready(self.fn(*a, **kw))
        self.seconds += time.perf_counter() - t0
        return out


def bench_method(args, method: str, params, model_cfg, batches) -> dict:
    c = config_for(args, method)
    tokenizer = IdTokenizer()
    engine = make_engine(c, model_cfg, tokenizer, temperature=c.sampling.temperature,
                               max_new_tokens=c.sampling.max_new_tokens)
    rollout = Rollout(engine, tokenizer, collect_config(c), reward)
    tc = dataclasses.replace(train_config(c), unroll_layers=args.unroll_layers)
    fns = make_train_fns(model_cfg, tc, None)
    collect, logps, train = Timed(rollout.collect), Timed(fns.logps), Timed(fns.train_step)
    rollout.collect = collect
    fns = dataclasses.replace(fns, train_step=train, logps=logps)
    layout = BatchLayout(prompt_len=engine.max_prompt_len, response_len=args.new_tokens,
                         pad_id=tokenizer.pad_id, mini_batches=c.train.mini_batches)
    state = fns.init_state(jax.tree.map(jax.numpy.copy, params))
    ref = params if c.loss.kl_coef > 0 else None
    rows, key = [], jax.random.key(args.seed)
    for s, prompts in enumerate(batches):
        for t in (collect, logps, train):
            t.seconds = 0.0
        t0 = time.perf_counter()
        state, m, col = rl_step(state, prompts, jax.random.fold_in(key, s), rollout=rollout,
                                fns=fns, method=method, layout=layout, ref_params=ref)
        step_s = time.perf_counter() - t0
        update = logps.seconds + train.seconds
        tokens = int(sum(len(c.token_ids) for row in col.completions for c in row if c))
        rows.append(dict(step_s=step_s, collect_s=collect.seconds, update_s=update,
                         host_s=step_s - collect.seconds - update, samples=m["samples"],
                         response_tokens=tokens, loss=m["loss"]))
    rest = rows[1:]  # the first step compiles
    out = {k: float(np.median([r[k] for r in rest]))
           for k in ("step_s", "collect_s", "update_s", "host_s", "samples")}
    out["compile_step_s"] = rows[0]["step_s"]
    B, T = args.prompts * args.n, engine.max_prompt_len + args.new_tokens
    out["train_tokens"] = B * T
    out["tokens_per_s"] = B * T / out["step_s"]
    out["sampled_tokens_per_s"] = float(np.median([r["response_tokens"] for r in rest])) / out["collect_s"]
    out["steps"] = rows
    return out


def main(argv=None):
    from ada.distributed import cpu_only_without_accelerators

    cpu_only_without_accelerators()  # no libtpu start-up noise on a CPU
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", "--method", default="grpo,ada_balance",
                    help="comma-separated ada.methods names")
    ap.add_argument("--steps", type=int, default=8, help="timed steps after the compile step")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="responses kept per prompt")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--slots", type=int, default=64, help="engine decode slots")
    ap.add_argument("--mix", default="uniform", choices=("uniform", "skewed"),
                    help="per-prompt pass rates (ada.adaptive.simulate.pass_rate_mix)")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--remat", action="store_true")
    ap.add_argument("--unroll-layers", type=int, default=TrainConfig.unroll_layers,
                    help="TrainConfig.unroll_layers (0: blocks under lax.scan)")
    ap.add_argument("--mini-batches", type=int, default=1, help="> 1: off-policy (old logp)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--matmul-n", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    model_cfg = model_config(args)
    params = init_params(model_cfg, jax.random.key(args.seed))
    n_params = sum(int(x.size) for x in jax.tree.leaves(params))
    batches = prompt_batches(args, model_cfg.vocab_size, args.steps + 1)
    peak = matmul_gflops(args.matmul_n)
    methods = args.methods.split(",")
    results = {"settings": vars(args), "params": n_params, "matmul_gflops": peak,
               "backend": jax.default_backend(), "methods": {}}
    for method in methods:
        r = bench_method(args, method, params, model_cfg, batches)
        r["update_gflop"] = 6 * n_params * r["train_tokens"] / 1e9
        results["methods"][method] = r
    peak_after = matmul_gflops(args.matmul_n)
    results["matmul_gflops_before"], results["matmul_gflops_after"] = peak, peak_after
    results["matmul_gflops"] = peak = max(peak, peak_after)  # the ceiling: the better of two
    tokens = next(iter(results["methods"].values()))["train_tokens"]  # the same for every method
    floor_s, floor_gflop = matmul_floor(model_cfg, tokens)
    results["matmul_floor_s"], results["matmul_floor_gflop"] = floor_s, floor_gflop
    for r in results["methods"].values():
        r["update_efficiency"] = r["update_gflop"] / r["update_s"] / peak
        r["update_vs_floor"] = r["update_s"] / floor_s

    print(f"{n_params / 1e6:.2f}M params, {args.prompts} prompts x {args.n}, prompt "
          f"{args.prompt_len} + {args.new_tokens} new; backend {jax.default_backend()}; matmul "
          f"{args.matmul_n}^3 fp32 {peak:.1f} GFLOP/s (best of before {results['matmul_gflops_before']:.1f}, "
          f"after {peak_after:.1f}); the update's weight matmuls alone "
          f"({floor_gflop:.1f} GFLOP at {tokens} tokens): {floor_s:.3f} s")
    print(f"{'method':12s} {'step s':>7s} {'collect':>8s} {'update':>7s} {'host':>6s} "
          f"{'samples':>8s} {'tok/s':>7s} {'GFLOP':>6s} {'upd eff':>8s} {'/floor':>7s}")
    for method, r in results["methods"].items():
        print(f"{method:12s} {r['step_s']:7.3f} {r['collect_s']:8.3f} {r['update_s']:7.3f} "
              f"{r['host_s']:6.3f} {r['samples']:8.0f} {r['tokens_per_s']:7.0f} "
              f"{r['update_gflop']:6.1f} {r['update_efficiency']:8.1%} "
              f"{r['update_vs_floor']:6.2f}x")
    top = results["methods"]
    if "grpo" in top and len(top) > 1:
        g = top["grpo"]
        for method, r in top.items():
            if method == "grpo":
                continue
            extra_gen = r["collect_s"] - g["collect_s"]
            rest = r["step_s"] - r["collect_s"] - (g["step_s"] - g["collect_s"])
            ratio = {"step_ratio": r["step_s"] / g["step_s"],
                     "extra_collect_s": extra_gen, "extra_other_s": rest,
                     "samples_ratio": r["samples"] / g["samples"]}
            results.setdefault("vs_grpo", {})[method] = ratio
            print(f"{method} / grpo: step x{ratio['step_ratio']:.2f} (samples "
                  f"x{ratio['samples_ratio']:.2f}): +{extra_gen:.3f} s generation, "
                  f"{rest:+.3f} s everything else")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
