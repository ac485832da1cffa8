"""A checkpoint save against the step it follows, on the default run, through the Trainer.

Builds the run of configs/default.py, unchanged, and drives it with `ada.run.trainer.Trainer`
(the seam the loop uses: nothing is patched), timing each `Trainer.step` (sampling + update)
and saving every `--every` steps with `Trainer.save`. Then it saves the run's last state
(`RunState.save`, its arrays where the run holds them) `--saves` times to a scratch folder:
the call alone (orbax's async save returns once the state is copied off the device; the
write runs beside the next step) and the call plus `wait_until_finished` (a synchronous
save, what ada did before). Every figure is a ratio against the step time measured in the
same process.

  step_s          median step (sampling + update) with no write in flight
  after_save_s    median step that ran while the previous step's write finished
  save_call_s     median save call (async)
  save_sync_s     median save call + wait for the write (sync)
  ratio           (step_s + save_call_s) / step_s: a step that saves (the bar: at most 1.3)
  ratio_sync      (step_s + save_sync_s) / step_s
  after_ratio     after_save_s / step_s

  python benchmarks/checkpoint_save.py [--steps 16] [--every 3] [--saves 5] [--workdir DIR]
        [--json out.json] [--config.KEY=VALUE ...]

`--layout CONFIG --model NAME --topology SLICE` instead gives, for a preset laid out on a TPU
slice as ada.plan lays it out (abstract chips, nothing allocated; libtpu), the bytes of the
train state each host writes per checkpoint: orbax writes each distinct shard once, from
the first device that holds it (replica 0).

  python benchmarks/checkpoint_save.py --layout configs/qwen25_math_7b.py \
        --model qwen2.5-math-7b --topology v5e:4x4 [--config.model.lora.rank=16]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

from ada import config as cfglib
from ada.checkpoint import Checkpointer
from ada.run.build import build
from ada.run.trainer import Trainer


def run_steps(trainer: Trainer, steps: int, every: int) -> tuple[list[float], list[float]]:
    """Seconds of each `Trainer.step` after the first (it compiles), saving every `every`
    steps and at the last: those with no write in flight, and those that ran beside the
    previous step's write."""
    plain, after = [], []
    for step in range(1, steps + 1):
        t = time.perf_counter()
        trainer.step()
        if step > 1:
            (after if (step - 1) % every == 0 else plain).append(time.perf_counter() - t)
        if step % every == 0 or step == steps:
            trainer.save()
    return plain, after


def time_saves(trainer: Trainer, saves: int) -> tuple[list[float], list[float]]:
    """(save call, save call + write) seconds of the run's current state, saved `saves`
    times to a fresh directory, the first save (orbax's set-up) left out."""
    calls, writes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Checkpointer(os.path.join(tmp, "saves"), keep=2)
        try:
            for i in range(saves + 1):
                ckpt.wait_until_finished()
                state = dataclasses.replace(trainer.state, step=i)
                t = time.perf_counter()
                state.save(ckpt, trainer.config.method)
                call = time.perf_counter() - t
                ckpt.wait_until_finished()
                if i:
                    calls.append(call)
                    writes.append(time.perf_counter() - t)
        finally:
            ckpt.close()
    return calls, writes


def measure(overrides, steps: int, every: int, saves: int, workdir: str) -> dict:
    config = cfglib.build_config(cfglib.DEFAULT_CONFIG, [
        ("train.steps", str(steps)), ("checkpoint.every", str(every)),
        ("eval.every", "0"), ("log.progress", "false"), ("log.plots", "false"),
        *overrides])
    cfglib.validate(config, workdir)
    trainer = Trainer(config, workdir, build(config))
    try:
        trainer.restore()
        plain, after = run_steps(trainer, steps, every)
        if not plain:
            raise SystemExit(f"--steps {steps} --every {every}: no step after the first ran "
                             "with no write in flight; raise --steps or --every")
        calls, writes = time_saves(trainer, saves)
    except BaseException:
        trainer.close(failed=True)
        raise
    trainer.close()
    med = statistics.median
    out = {"step_s": med(plain), "after_save_s": med(after) if after else None,
           "save_call_s": med(calls), "save_sync_s": med(writes), "steps": steps,
           "every": every, "saves": saves, "device": jax.devices()[0].device_kind}
    out["ratio"] = (out["step_s"] + out["save_call_s"]) / out["step_s"]
    out["ratio_sync"] = (out["step_s"] + out["save_sync_s"]) / out["step_s"]
    out["after_ratio"] = out["after_save_s"] / out["step_s"] if after else None
    return out


def host_bytes(spec: str, model: str, topology: str, overrides=()) -> dict:
    """{process index: bytes of the train state it writes} on `topology`'s train mesh: what
    `state_tree` checkpoints (under LoRA the adapters and their moments, not the base)."""
    from ada import planner, tpu
    from ada import sharding as shd
    from ada.models import lora
    from ada.rl import train as rl

    devices, _ = tpu.tpu_devices(topology)
    config = cfglib.build_config(spec, overrides)
    model_cfg = planner.resolve_model(config, model)
    m, tc = config.mesh, cfglib.train_config(config)
    mesh = shd.make_mesh(planner.mesh_sizes((m.data, m.fsdp, m.tensor), len(devices), "mesh",
                                            topology, exact=True), devices)
    saved = lambda t: t.replace(params=lora.split(t.params)[0])  # noqa: E731 - state_tree's
    state = saved(rl.abstract_state(model_cfg, tc))
    shardings = saved(rl.make_train_fns(model_cfg, tc, mesh).state_sharding)
    per: dict[int, int] = {}
    for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(shardings), strict=True):
        seen = set()
        for device, index in sorted(sharding.devices_indices_map(leaf.shape).items(),
                                    key=lambda kv: kv[0].id):
            key = tuple((s.start, s.stop) for s in index)
            if key not in seen:
                seen.add(key)
                n = np.prod([len(range(*s.indices(d))) for s, d in zip(index, leaf.shape,
                                                                       strict=True)])
                per[device.process_index] = per.get(device.process_index, 0) + \
                    int(n) * leaf.dtype.itemsize
    return {"per_host_bytes": per, "total_bytes": sum(per.values()), "hosts": len(per),
            "topology": topology, "model": model}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--saves", type=int, default=5, help="saves of the run's state timed")
    p.add_argument("--workdir", default=None, help="default: a fresh temporary folder")
    p.add_argument("--json", default=None)
    p.add_argument("--layout", default=None, help="a config: bytes per host on --topology")
    p.add_argument("--model", default=None)
    p.add_argument("--topology", default="v5e:4x4")
    overrides, rest = cfglib.parse_override_args(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(rest)
    if args.layout:
        out = host_bytes(args.layout, args.model, args.topology, overrides)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = measure(overrides, args.steps, args.every, args.saves,
                          args.workdir or f"{tmp}/run")
    for k, v in out.items():
        print(f"{k:14s} {v:.3f}" if isinstance(v, float) else f"{k:14s} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
