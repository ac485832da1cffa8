"""Train-step throughput: tokens/s and model FLOPs utilisation (MFU) per model preset.

MFU is measured against the machine's own matmul rate, timed in the same run with a large
`jnp.dot` (so it is the share of what this backend actually delivers, not of a datasheet).
Model FLOPs count forward + backward of every matmul and of attention (`train_flops_per_token`),
not remat's recomputation and not the old-logp pass.

  python benchmarks/train_step.py [--presets tiny,small] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from ada.models import init_params, positions_from_mask, preset
from ada.models.transformer import param_shapes
from ada.rl.train import TrainConfig, make_train_fns, train_flops_per_token

DEFAULT_SHAPES = {"tiny": (16, 128), "small": (8, 256)}  # rows, tokens per row


def matmul_gflops(n: int = 2048, dtype=jnp.float32, reps: int = 5) -> float:
    """Best-of-`reps` rate of an n x n x n matmul, in GFLOP/s."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    return 2 * n ** 3 / best_seconds(jax.jit(jnp.dot), (a, b), reps) / 1e9


def best_seconds(f, args: tuple, reps: int) -> float:
    """Fastest of `reps` calls of f(*args) after a warm-up (compile) call."""
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def weight_matmul_shapes(model_cfg) -> list[tuple[int, int]]:
    """[in, out] of every weight matmul of one forward pass: each layer's projections and
    the vocabulary projection (lm_head, or the tied embedding)."""
    shapes = param_shapes(model_cfg)
    out = [s[1:] for s in shapes["layers"].values() if len(s) == 3 for _ in range(s[0])]
    out.append(shapes["lm_head"] if "lm_head" in shapes else shapes["embed"][::-1])
    return out


def matmul_floor(model_cfg, tokens: int, reps: int = 5) -> tuple[float, float]:
    """(seconds, GFLOP) of a train step's weight matmuls run bare in one jit: per weight
    [i, o] the forward x @ W and the backward's dY @ W.T and x.T @ dY, at `tokens` rows,
    fp32, best of `reps`. An update of these shapes cannot beat it on this backend; the
    attention scores, norms, softmax, optimizer and layout copies come on top."""
    shapes = weight_matmul_shapes(model_cfg)
    args = [tuple(jnp.full(shape, 0.01, jnp.float32) for shape in ((tokens, i), (i, o), (tokens, o)))
            for i, o in shapes]
    f = jax.jit(lambda args: [(x @ w, dy @ w.T, x.T @ dy) for x, w, dy in args])
    return best_seconds(f, (args,), reps), sum(6 * tokens * i * o for i, o in shapes) / 1e9


def make_batch(cfg, B: int, T: int, seed: int = 0) -> dict:
    """Half prompt (left-padded a little), half response."""
    rng = np.random.default_rng(seed)
    mask = np.ones((B, T), bool)
    mask[:, : T // 16] = False
    resp = np.zeros((B, T), np.float32)
    resp[:, T // 2:] = 1
    return dict(tokens=rng.integers(0, cfg.vocab_size, (B, T)), mask=mask,
                positions=np.asarray(positions_from_mask(mask)), response_mask=resp,
                advantages=rng.normal(size=B))


def bench_preset(name: str, B: int, T: int, steps: int, remat: bool, dtype: str,
                 family: str) -> dict:
    cfg = preset(name, family=family, dtype=dtype)
    tc = TrainConfig(remat=remat)
    fns = make_train_fns(cfg, tc)
    state = fns.init_state(init_params(cfg, jax.random.key(0)))
    batch = fns.shard_batch(make_batch(cfg, B, T))
    t0 = time.perf_counter()
    state, m = fns.train_step(state, batch)  # compile + first step
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, m = fns.train_step(state, batch)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    tokens = B * T
    flops = train_flops_per_token(cfg, T) * tokens
    return {"batch": B, "seq": T, "step_s": step_s, "tokens_per_s": tokens / step_s,
            "model_tflops_per_step": flops / 1e12, "achieved_gflops": flops / step_s / 1e9,
            "compile_s": compile_s, "loss": float(m["loss"])}


def main(argv=None):
    from ada.distributed import cpu_only_without_accelerators

    cpu_only_without_accelerators()  # no libtpu start-up noise on a CPU
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--family", default="qwen2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=None, help="rows (default per preset)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per row (default per preset)")
    ap.add_argument("--remat", action="store_true")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--matmul-n", type=int, default=2048)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    mm_dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    peak = matmul_gflops(args.matmul_n, mm_dtype)
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}); "
          f"matmul {args.matmul_n}^3 {args.dtype}: {peak:.1f} GFLOP/s")
    print(f"{'preset':8s} {'B x T':>10s} {'step s':>8s} {'tokens/s':>10s} {'GFLOP/s':>9s} "
          f"{'MFU':>6s} {'compile s':>9s}")
    results = {"matmul_gflops": peak, "backend": jax.default_backend(), "dtype": args.dtype,
               "presets": {}}
    for name in args.presets.split(","):
        B, T = DEFAULT_SHAPES.get(name, (8, 256))
        B, T = args.batch or B, args.seq or T
        r = bench_preset(name, B, T, args.steps, args.remat, args.dtype, args.family)
        r["mfu"] = r["achieved_gflops"] / peak
        results["presets"][name] = r
        print(f"{name:8s} {f'{B} x {T}':>10s} {r['step_s']:8.3f} {r['tokens_per_s']:10.0f} "
              f"{r['achieved_gflops']:9.1f} {r['mfu']:6.1%} {r['compile_s']:9.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
