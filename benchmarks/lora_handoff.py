"""LoRA's hand-off to the sampler: the adapters' bytes beside the full weights', and the time
of the merge the engine's hand-off runs (ada/models/lora.py, docs/design.md: LoRA).

For each model and rank (abstract shapes: nothing allocated):

  adapter_bytes   the trained leaves of one update (A and B of every target, param_dtype)
  full_bytes      the sampler's weights, what a full hand-off moves (`sampling_params`:
                  decode form, compute dtype)

Then for the presets given with --time (allocated on this machine's default device): the
engine's jitted `sampling_params` (cast + decode form) with the merge W + scale * A @ B in
it, against the same call on the base alone; the median of --repeats calls after a warm-up.

And the hand-off to a sampler on a device of its own (rl.sampler_devices, ada/stream.py; a
second fake CPU device here), per update, bytes crossing and the median time until the
sampler holds its weights: `full` (a full run: the weights cast on the trainer's device,
then moved), `lora_merged` (LoRA merged on the trainer's device, the merged weights moved:
the path before adapters-only) and `lora_adapters` (what a run does now: the adapters moved,
merged into the base the sampler's device holds since the start, `stream.handoff`).

  python benchmarks/lora_handoff.py [--models tiny,small,qwen2.5-math-1.5b,qwen2.5-math-7b]
        [--ranks 1,8,16,32] [--time tiny,small] [--repeats 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

_FLAG = "--xla_force_host_platform_device_count=2"  # a device for the split sampler
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import jax  # noqa: E402 - after the flag
import jax.numpy as jnp  # noqa: E402

from ada import sharding as shd  # noqa: E402
from ada import stream  # noqa: E402
from ada.stream import nbytes  # noqa: E402
from ada.models import init_params, lora, preset  # noqa: E402
from ada.models.known import KNOWN, known  # noqa: E402
from ada.models.lora import LoraConfig  # noqa: E402
from ada.models.transformer import param_shapes  # noqa: E402
from ada.sampling.engine import Engine  # noqa: E402
from ada.sampling.engine_base import sampling_params  # noqa: E402


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


def median_ms(fn, params, repeats: int) -> float:
    jax.block_until_ready(fn(params))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(params))
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def split_handoff(cfg, name: str, rank: int, repeats: int) -> dict:
    """Bytes and median ms of one update's hand-off to a sampler on a device of its own."""
    trainer, sampler = jax.devices()[:2]
    engine = Engine(cfg, num_slots=1, max_prompt_len=16, max_new_tokens=1,
                    mesh=shd.local_mesh(1, 1, [sampler]))
    base = jax.device_put(init_params(cfg, jax.random.key(0)), trainer)
    params = adapted(cfg, rank, base)
    frozen = stream.place(lora.split(params)[1], engine.mesh, None)  # once, at the start
    paths = {"full": (base, engine.prepare_params),
             "lora_merged": (params, engine.prepare_params),
             "lora_adapters": (params, lambda p: engine.prepare_params(
                 stream.handoff(p, frozen, engine.mesh, None)[0]))}
    merged = nbytes(jax.eval_shape(engine._sampling_fn, params))
    crossing = {"full": merged, "lora_merged": merged,
                "lora_adapters": stream.handoff(params, frozen, engine.mesh, None)[1]}
    row = dict(model=name, rank=rank, split=True, platform=trainer.platform)
    for path, (p, fn) in paths.items():
        row[path + "_bytes"], row[path + "_ms"] = crossing[path], median_ms(fn, p, repeats)
    print(f"{name:20s} rank {rank:3d}, sampler on its own device: " + ", ".join(
        f"{k} {row[k + '_bytes'] / 2**20:.2f} MiB in {row[k + '_ms']:.2f} ms" for k in paths))
    return row


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
    for name in filter(None, args.time.split(",")):
        rows.append(split_handoff(model(name), name, max(ranks), args.repeats))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
