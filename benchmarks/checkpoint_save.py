"""Step time with and without a checkpoint save, on the default run (the real training loop).

Runs `ada.loop.train` on configs/default.py with a save every `--every` steps and times, per
step, the RL step (until its new state is ready) and the save call that follows it. With
orbax's async saves the call returns once the state is copied off the device; the write then
runs beside the next step, so the table also gives the step after a save. `--sync` waits for
each write inside the call (what ada did before: a synchronous orbax Checkpointer).

  step_s          median RL step with no save at its end and none in flight
  save_step_s     median RL step + save call, on the steps that save
  after_save_s    median RL step that runs while the previous step's write finishes
  ratio           save_step_s / step_s (the issue's bar: at most 1.3)

  python benchmarks/checkpoint_save.py [--steps 20] [--every 3] [--sync] [--workdir DIR]
        [--json out.json] [--config.KEY=VALUE ...]

`--layout CONFIG --model NAME --topology SLICE` instead gives, for a preset laid out on a TPU
slice as ada.plan lays it out (abstract chips, nothing allocated; libtpu), the bytes of the
train state each host writes per checkpoint: orbax writes each distinct shard once, from
the first device that holds it (replica 0).

  python benchmarks/checkpoint_save.py --layout configs/qwen25_math_7b.py \
        --model qwen2.5-math-7b --topology v5e:4x4
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import jax
import numpy as np

from ada import checkpoint, loop
from ada import config as cfglib


def measure(overrides, steps: int, every: int, sync: bool, workdir: str) -> dict:
    timed: list[tuple[str, int, float]] = []
    rl_step, save = loop.rl_step, checkpoint.Checkpointer.save

    def timed_step(state, *args, **kw):
        t = time.perf_counter()
        out = rl_step(state, *args, **kw)
        jax.block_until_ready(out[0])
        timed.append(("step", int(out[0].step), time.perf_counter() - t))
        return out

    def timed_save(self, at, *args, **kw):
        t = time.perf_counter()
        out = save(self, at, *args, **kw)
        if sync:
            self.wait_until_finished()
        timed.append(("save", at, time.perf_counter() - t))
        return out

    loop.rl_step, checkpoint.Checkpointer.save = timed_step, timed_save
    try:
        config = cfglib.build_config(cfglib.DEFAULT_CONFIG, [
            ("train.steps", str(steps)), ("checkpoint.every", str(every)),
            ("eval.every", "0"), ("log.progress", "false"), ("log.plots", "false"),
            *overrides])
        loop.train(config, workdir)
    finally:
        loop.rl_step, checkpoint.Checkpointer.save = rl_step, save
    step_s = {i: s for kind, i, s in timed if kind == "step"}
    save_s = {i: s for kind, i, s in timed if kind == "save"}
    first = min(step_s)  # compiles
    plain = [s for i, s in step_s.items() if i > first + 1 and i not in save_s
             and i - 1 not in save_s]
    saving = [s + save_s[i] for i, s in step_s.items() if i > first and i in save_s]
    after = [s for i, s in step_s.items() if i > first + 1 and i - 1 in save_s]
    med = statistics.median
    out = {"step_s": med(plain), "save_step_s": med(saving),
           "save_call_s": med(save_s[i] for i in save_s if i > first),
           "after_save_s": med(after) if after else None, "sync": sync,
           "steps": steps, "every": every, "device": jax.devices()[0].device_kind}
    out["ratio"] = out["save_step_s"] / out["step_s"]
    return out


def host_bytes(spec: str, model: str, topology: str) -> dict:
    """{process index: bytes of the train state it writes} on `topology`'s train mesh."""
    from ada import planner, setup, tpu
    from ada import sharding as shd
    from ada.rl import train as rl

    devices, _ = tpu.tpu_devices(topology)
    config = cfglib.build_config(spec)
    model_cfg = planner.resolve_model(config, model)
    m, tc = config.mesh, setup.train_config(config)
    mesh = shd.make_mesh(planner.mesh_sizes((m.data, m.fsdp, m.tensor), len(devices), "mesh",
                                            topology, exact=True), devices)
    state = rl.abstract_state(model_cfg, tc)
    shardings = rl.make_train_fns(model_cfg, tc, mesh).state_sharding
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--sync", action="store_true")
    p.add_argument("--workdir", default=None, help="default: a fresh temporary folder")
    p.add_argument("--json", default=None)
    p.add_argument("--layout", default=None, help="a config: bytes per host on --topology")
    p.add_argument("--model", default=None)
    p.add_argument("--topology", default="v5e:4x4")
    overrides, rest = cfglib.parse_override_args(__import__("sys").argv[1:])
    args = p.parse_args(rest)
    if args.layout:
        out = host_bytes(args.layout, args.model, args.topology)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = measure(overrides, args.steps, args.every, args.sync,
                          args.workdir or f"{tmp}/run")
    for k, v in out.items():
        print(f"{k:14s} {v:.3f}" if isinstance(v, float) else f"{k:14s} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
