"""LoRA's hand-off to the sampler: the adapters' bytes beside the full weights', and the time
of the merge the engine's hand-off runs (ada/models/lora.py, docs/design.md: LoRA).

For each model and rank (abstract shapes: nothing allocated):

  adapter_bytes   the trained leaves of one update (A and B of every target, param_dtype)
  full_bytes      the sampler's weights, what a full hand-off moves (`sampling_params`:
                  decode form, compute dtype)

Then for the presets given with --time (allocated on this machine's default device): the
engine's jitted `sampling_params` (cast + decode form) with the merge W + scale * A @ B in
it, against the same call on the base alone; the median of --repeats calls after a warm-up.

  python benchmarks/lora_handoff.py [--models tiny,small,qwen2.5-math-1.5b,qwen2.5-math-7b]
        [--ranks 1,8,16,32] [--time tiny,small] [--repeats 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp

from ada.models import init_params, lora, preset
from ada.models.known import KNOWN, known
from ada.models.lora import LoraConfig
from ada.models.transformer import param_shapes
from ada.sampling.engine import sampling_params


def model(name: str):
    return known(name) if name in KNOWN else preset(name)


def adapted(cfg, rank: int, params=None):
    """The train state's params (abstract unless `params` are given) at `rank`."""
    if params is None:
        params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.dtype(cfg.param_dtype)),
                              param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
        return jax.eval_shape(lambda p: lora.attach(p, LoraConfig(rank=rank), cfg.compute_dtype),
                              params)
    return lora.attach(params, LoraConfig(rank=rank), cfg.compute_dtype)


def nbytes(tree) -> int:
    return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def median_ms(fn, params, repeats: int) -> float:
    jax.block_until_ready(fn(params))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(params))
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,small,qwen2.5-math-1.5b,qwen2.5-math-7b")
    ap.add_argument("--ranks", default="1,8,16,32")
    ap.add_argument("--time", default="tiny,small")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    rows = []
    for name in args.models.split(","):
        cfg = model(name)
        full = nbytes(jax.eval_shape(functools.partial(sampling_params, config=cfg),
                                     adapted(cfg, 0)))
        for r in ranks:
            ad = nbytes(lora.split(adapted(cfg, r))[0])
            rows.append(dict(model=name, rank=r, adapter_bytes=ad, full_bytes=full))
            print(f"{name:20s} rank {r:3d}: adapter_bytes {ad / 2**20:10.2f} MiB  full_bytes "
                  f"{full / 2**20:10.2f} MiB ({cfg.dtype})  {full / ad:7.0f}x")
    for name in filter(None, args.time.split(",")):
        cfg = model(name)
        params = adapted(cfg, max(ranks), init_params(cfg, jax.random.key(0)))
        fn = jax.jit(functools.partial(sampling_params, config=cfg))
        merged, plain = (median_ms(fn, p, args.repeats) for p in (params, lora.base(params)))
        rows.append(dict(model=name, rank=max(ranks), handoff_merge_ms=merged,
                         handoff_plain_ms=plain, platform=jax.devices()[0].platform))
        print(f"{name:20s} rank {max(ranks):3d}: hand-off with merge {merged:8.3f} ms, "
              f"without adapters {plain:8.3f} ms ({jax.devices()[0].platform})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
