"""Memory planner: will this model's train step fit this mesh? Answer before paying for it.

Lowers and compiles the real, sharded train step ahead of time on abstract shapes
(`jax.ShapeDtypeStruct`, nothing allocated) for a mesh of fake CPU devices, and reads XLA's
buffer assignment (`compiled.memory_analysis()`) for one device:

  arguments  the device's shards of params, optimizer state and batch
  outputs    the new state and metrics (the state is donated, so it aliases the arguments)
  temp       activations, gradients, all-gathered weights, collectives' buffers
  peak       arguments + outputs + temp - aliased: what must be resident at once

The SPMD partitioning (what each device holds) is exactly the TPU's; `temp` comes from the
CPU compiler's fusion and scheduling decisions and is an estimate of the TPU's (which also
pads arrays to its (8, 128) tiles). Leave ~10-20% headroom.

  python -m ada.memory_plan --model qwen2.5-math-7b --mesh 1,4,2 --mesh 1,8,1 \
      --batch 64 --seq 2048 --micro-batches 8 --remat --hbm-gib 95 --json plan.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time


def abstract_batch(batch_size: int, seq_len: int, *, old_logp: bool = True,
                   ref_logp: bool = False) -> dict:
    import jax

    from ada.rl.train import BATCH_DTYPES, REQUIRED_KEYS

    keys = REQUIRED_KEYS + ("old_logp",) * old_logp + ("ref_logp",) * ref_logp
    return {k: jax.ShapeDtypeStruct((batch_size,) if k == "advantages"
                                    else (batch_size, seq_len), BATCH_DTYPES[k]) for k in keys}


def _device_bytes(tree, shardings) -> int:
    """Bytes of one device's shards of an abstract tree under the given shardings."""
    import jax

    sizes = jax.tree.map(lambda x, sh: math.prod(sh.shard_shape(x.shape)) * x.dtype.itemsize,
                         tree, shardings)
    return int(sum(jax.tree.leaves(sizes)))


def compile_train_step(model_cfg, train_cfg, mesh_shape, batch_size: int, seq_len: int,
                       devices=None):
    """AOT-compile the sharded train step on abstract inputs.

    Returns (compiled, fns, abstract state, abstract batch); `compiled` can also be called on
    real arrays with the same shapes and shardings.
    """
    import jax

    from ada import sharding as shd
    from ada.rl.train import abstract_state, make_train_fns

    devices = list(jax.devices() if devices is None else devices)
    n = math.prod(mesh_shape)
    if n > len(devices):
        raise ValueError(
            f"mesh {tuple(mesh_shape)} needs {n} devices but only {len(devices)} exist; run the "
            f"CLI (it creates fake CPU devices) or set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={n} before jax starts")
    mesh = shd.make_mesh(mesh_shape, devices[:n])
    shd.check_batch_size(batch_size, mesh, train_cfg.mini_batches * train_cfg.micro_batches,
                         what="train batch")
    fns = make_train_fns(model_cfg, train_cfg, mesh)
    state = abstract_state(model_cfg, train_cfg)
    batch = abstract_batch(batch_size, seq_len, old_logp=not train_cfg.on_policy,
                           ref_logp=train_cfg.loss.kl_coef > 0)
    return fns.train_step.lower(state, batch).compile(), fns, state, batch


def plan(model_cfg, train_cfg, mesh_shape, batch_size: int, seq_len: int,
         devices=None) -> dict:
    """Compile the train step for `mesh_shape` and return one device's memory figures."""
    from ada import sharding as shd

    t0 = time.perf_counter()
    compiled, fns, state, batch = compile_train_step(model_cfg, train_cfg, mesh_shape,
                                                     batch_size, seq_len, devices)
    compile_s = time.perf_counter() - t0
    mesh = fns.mesh
    ma = compiled.memory_analysis()
    peak = (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
            - ma.alias_size_in_bytes)
    return {
        "model": model_cfg.family,
        "mesh": dict(zip(shd.MESH_AXES, (int(s) for s in mesh_shape), strict=True)),
        "batch_size": batch_size,
        "seq_len": seq_len,
        "micro_batch_per_device": batch_size // (train_cfg.mini_batches
                                                 * train_cfg.micro_batches
                                                 * shd.batch_shards(mesh)),
        "remat": train_cfg.remat,
        "param_dtype": model_cfg.param_dtype,
        "dtype": model_cfg.dtype,
        "per_device": {
            "arguments": ma.argument_size_in_bytes,
            "outputs": ma.output_size_in_bytes,
            "aliased": ma.alias_size_in_bytes,
            "temp": ma.temp_size_in_bytes,
            "peak": peak,
            # the argument split, from the shardings alone
            "params": _device_bytes(state.params, fns.state_sharding.params),
            "opt_state": _device_bytes(state.opt_state, fns.state_sharding.opt_state),
            "batch": _device_bytes(batch, shd.batch_shardings(batch, mesh)),
        },
        "compile_s": round(compile_s, 2),
    }


def format_plan(p: dict, hbm_gib: float | None = None) -> str:
    gib = 2 ** 30
    d = p["per_device"]
    mesh = "x".join(f"{k}={v}" for k, v in p["mesh"].items())
    line = (f"mesh {mesh:24s} peak {d['peak'] / gib:8.2f} GiB/device  (params "
            f"{d['params'] / gib:.2f}, opt {d['opt_state'] / gib:.2f}, batch "
            f"{d['batch'] / gib:.3f}, temp {d['temp'] / gib:.2f}; micro-batch "
            f"{p['micro_batch_per_device']} rows/device, compiled in {p['compile_s']} s)")
    if hbm_gib:
        line += "  FITS" if d["peak"] <= hbm_gib * gib else "  DOES NOT FIT"
        line += f" {hbm_gib} GiB"
    return line


def _parse_mesh(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"--mesh {text!r}: give data,fsdp,tensor sizes as three integers, e.g. 1,4,2")
    return tuple(int(p) for p in parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ada.memory_plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-math-7b",
                    help="a full-size model (ada/models/known.py) or a preset: tiny, small")
    ap.add_argument("--mesh", type=_parse_mesh, action="append",
                    help="data,fsdp,tensor; repeat for several (default 1,4,2 and 1,8,1)")
    ap.add_argument("--batch", type=int, default=64, help="rows (responses) per train step")
    ap.add_argument("--seq", type=int, default=2048, help="tokens per row (prompt + response)")
    ap.add_argument("--mini-batches", type=int, default=1)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--remat", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--logit-chunk", type=int, default=512)
    ap.add_argument("--param-dtype", choices=("float32", "bfloat16"), default=None)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    ap.add_argument("--hbm-gib", type=float, default=None,
                    help="per-chip memory to compare against (v4 32, v5e 16, v5p 95, v6e 32)")
    ap.add_argument("--json", default=None, help="write the figures to this file")
    args = ap.parse_args(argv)
    meshes = args.mesh or [(1, 4, 2), (1, 8, 1)]

    import jax

    try:  # fake CPU devices, as many as the largest mesh needs; must precede backend start
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", max(math.prod(m) for m in meshes))
    except RuntimeError as e:
        print(f"note: jax already started ({e}); using its {len(jax.devices())} devices",
              file=sys.stderr)

    from ada.models import preset
    from ada.models.known import KNOWN, known
    from ada.rl.train import TrainConfig

    model = preset(args.model) if args.model in ("tiny", "small") else known(args.model)
    overrides = {k: v for k, v in (("param_dtype", args.param_dtype), ("dtype", args.dtype)) if v}
    model = model.replace(**overrides)
    train_cfg = TrainConfig(ppo_epochs=args.epochs, mini_batches=args.mini_batches,
                            micro_batches=args.micro_batches, remat=args.remat,
                            logit_chunk=args.logit_chunk)
    name = args.model if args.model in KNOWN or args.model in ("tiny", "small") else model.family
    print(f"{name}: batch {args.batch} x {args.seq} tokens, {args.mini_batches} mini x "
          f"{args.micro_batches} micro-batches, remat={args.remat}, params {model.param_dtype}, "
          f"compute {model.dtype}")
    results = []
    for m in meshes:
        p = plan(model, train_cfg, m, args.batch, args.seq)
        p["model"] = name
        results.append(p)
        print(format_plan(p, args.hbm_gib), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
