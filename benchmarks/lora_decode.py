"""LoRA's sampler: decode on merged weights (what ada does) or with the adapters applied in
the decode step (issue 45 item 2: "measure both and pick one"; docs/results.md, "LoRA: merged
weights or the adapter in the decode step").

Three forms of the sampler's weights, all in the compute dtype:

  merged     W + scale * A @ B folded in by the engine's hand-off (`sampling_params`,
             `lora.merge`), in decode form (one buffer per layer): today's path.
  adapters   the base in decode form with each layer's A, B and scale beside it: the decode
             step runs x @ W + ((x @ A) * scale) @ B (`layers.linear`). The base can stay on
             the sampler's chips from the start; an update swaps only the adapters.
  in_place   the stacked train params themselves (base + adapters, not in decode form): a
             colocated sampler could read the train state where it lies, with no copy.

TPU (--tpu, the real compiler for abstract chips, libtpu; nothing runs): for each preset
(the plan of docs/results.md "LoRA: the hand-off to the sampler and the plan", the slots it
plans) and each form, the engine's generate compiled for one decode step (flops, HBM bytes
op by op, `ada.hlo_bytes`, and the compiler's bytes over all memory spaces) and for its
chunk (the compiler's peak per chip); the hand-off each needs per update (the merge:
`planner.plan_reshard`, train mesh -> sampler; the adapters: their cast and split only);
the weights each holds per chip on the sampler's chips. Then the roofline time of a step
and of the merge at the chip's peak FLOP/s and HBM bandwidth, the break-even number of
decode steps per update (below it the adapters' form is cheaper in total) and the steps an
RL step of the preset runs per update.

CPU (--cpu, XLA:CPU wall clock): the engine's Driver generating the same requests on the
merged and the adapters' form in turn, --repeats rounds; each one's median tok/s and the
median of the per-round ratios with its range (a paired estimate on a shared machine); and
the hand-off's median ms with and without the merge.

  python benchmarks/lora_decode.py [--tpu 1.5b,7b] [--cpu tiny,small] [--rank 16]
        [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the TPU programs are compiled, never run

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ada import config as cfglib  # noqa: E402
from ada import methods  # noqa: E402
from ada import sharding as shd  # noqa: E402
from ada.config import train_config  # noqa: E402
from ada.models import init_params, lora, preset  # noqa: E402
from ada.models.lora import LoraConfig  # noqa: E402
from ada.models.transformer import decode_params, per_layer  # noqa: E402
from ada.rl import train as rl  # noqa: E402
from ada.roofline import device_bytes, with_shardings  # noqa: E402
from ada.sampling.driver import Driver, Request  # noqa: E402
from ada.sampling.engine import Engine  # noqa: E402
from ada.sampling.samplers import SamplingConfig  # noqa: E402

GIB = 2 ** 30
# The presets as docs/results.md planned them at r = 16 (the fitting plans): config,
# known model, topology, overrides.
PRESETS = {
    "1.5b": ("configs/qwen25_math_1p5b.py", "qwen2.5-math-1.5b", "v5e:1x1",
             {"mesh.fsdp": "1", "sampling.mesh": "(1,1)", "train.micro_batches": "128",
              "sampling.num_slots": "64"}),
    "7b": ("configs/qwen25_math_7b.py", "qwen2.5-math-7b", "v5e:2x2",
           {"mesh.fsdp": "4", "train.micro_batches": "64"}),
}


def with_adapters(params, *, config, unembed_copy: bool):
    """The `adapters` form: the base as `sampling_params` gives it (cast, decode form) and
    each layer's adapter leaves (cast) beside its weights, unmerged."""
    cast = jax.tree.map(lambda x: x.astype(config.compute_dtype), params)
    out = decode_params(lora.base(cast), config, unembed_copy=unembed_copy)
    ad = {k: v for k, v in cast["layers"].items() if lora.is_adapter(k) or k == lora.SCALE}
    return dict(out, layers=[dict(w, **a) for w, a in zip(
        out["layers"], per_layer(ad, config.num_layers), strict=True)])


def adapter_handoff(params, *, config):
    """What an update hands the `adapters` form: only the adapters, cast and split per layer
    (the base in decode form stays where it is)."""
    ad = {k: v.astype(config.compute_dtype) for k, v in params["layers"].items()
          if lora.is_adapter(k) or k == lora.SCALE}
    return per_layer(ad, config.num_layers)


# ----------------------------------------------------------------------------- TPU compiles


def steps_per_update(config) -> dict:
    """Decode steps one RL step of `config` runs on its sampler per update: the tokens
    sampled (the budget M x N per prompt, grpo's n, at the planned mean response, as
    `planner.make_plan` counts them) over one host's slots (the presets here are one host),
    and its floor, rounds x max_new_tokens (each round's longest response)."""
    a, s = config.adaptive, config.sampling
    adaptive = methods.get(config.method).adaptive_rounds
    rounds = a.max_rounds if adaptive else 1
    per_prompt = a.samples_per_round * a.max_rounds if adaptive else a.n
    mean = s.mean_response_len or s.max_new_tokens // 2
    tokens = config.data.prompts_per_step * per_prompt * mean
    return dict(tokens=tokens, mean_response_len=mean, rounds=rounds,
                at_full_slots=math.ceil(tokens / s.num_slots), floor=rounds * s.max_new_tokens)


def tpu_case(name: str, rank: int, log) -> dict:
    from ada.planner import compile_phase, mesh_sizes, plan_generate, plan_reshard, resolve_model
    from ada.sampling.backends import make_engine, plan_variant
    from ada.tpu import CHIPS, parse_topology, tpu_devices

    path, model, topology, over = PRESETS[name]
    config = cfglib.build_config(path, [*over.items(), ("model.lora.rank", str(rank))])
    config = plan_variant(config, "dense")
    model_cfg = resolve_model(config, model)
    devices, host = tpu_devices(topology)
    m = config.mesh
    train_mesh = shd.make_mesh(mesh_sizes((m.data, m.fsdp, m.tensor), len(devices), "mesh",
                                          topology, exact=True), devices)
    data, tensor = mesh_sizes(config.sampling.mesh, len(host), "sampling.mesh", topology, False)
    mesh = shd.make_mesh((data, 1, tensor), sorted(host, key=lambda d: d.id)[:data * tensor])
    engine = make_engine(config, model_cfg, None, mesh)
    stacked = rl.abstract_state(model_cfg, train_config(config)).params
    unembed = engine.choices.unembed_copy
    forms = {"merged": jax.eval_shape(engine._sampling_fn, stacked),
             "adapters": jax.eval_shape(functools.partial(
                 with_adapters, config=model_cfg, unembed_copy=unembed), stacked),
             "in_place": stacked}
    forms = {k: with_shardings(p, shd.param_shardings(p, mesh)) for k, p in forms.items()}
    chip = parse_topology(topology)
    peak_flops, _, bandwidth = CHIPS[chip]
    base_bytes = device_bytes(forms["in_place"]) - device_bytes(lora.split(forms["in_place"])[0])
    row = dict(preset=name, model=model, topology=topology, rank=rank, slots=engine.num_slots,
               chunk=engine.chunk_size, cache_len=engine.cache_len,
               sampling_mesh=dict(data=data, tensor=tensor), train_mesh=dict(train_mesh.shape),
               steps_per_update=steps_per_update(config), forms={})
    for form, params in forms.items():
        log(f"{name} {form}: generate, one step")
        step = plan_generate(engine, params, 1, ops=True)
        log(f"{name} {form}: generate, a chunk of {engine.chunk_size}")
        chunk = plan_generate(engine, params)
        hbm = step["hbm_bytes_per_step"]
        row["forms"][form] = dict(
            weights_bytes=device_bytes(params), step_flops=step["flops"], step_hbm_bytes=hbm,
            step_bytes_accessed=step["bytes_accessed"], step_floor_bytes=step["floor"]["total"],
            chunk_peak_bytes=chunk["peak_bytes"],
            chunk_flops=chunk["flops"], chunk_bytes_accessed=chunk["bytes_accessed"],
            step_s=max(step["flops"] / peak_flops, hbm / bandwidth))
    log(f"{name}: the merging hand-off and the adapters' hand-off")
    merge = plan_reshard(engine, stacked, train_mesh, ops=True)
    plain = plan_reshard(engine, lora.base(stacked), train_mesh, ops=True)
    ad_in = with_shardings(stacked, shd.param_shardings(stacked, mesh))
    swap = compile_phase(jax.jit(functools.partial(adapter_handoff, config=model_cfg)).lower(
        ad_in), device_bytes(ad_in), ops=True)
    hand = {k: dict(flops=f["flops"], hbm_bytes=f["hbm_bytes"], bytes_accessed=f[
        "bytes_accessed"], peak_bytes=f["peak_bytes"], s=max(f["flops"] / peak_flops, f[
            "hbm_bytes"] / bandwidth))
        for k, f in (("merge", merge), ("base_only", plain), ("adapters_only", swap))}
    row["handoff"] = hand
    # What the sampler's chips hold of weights, per option (ada/stream.py: a split sampler
    # keeps the frozen base for its merges; colocated, the train params are already there,
    # and can be read in place only where the train mesh lays them out as the sampler's).
    f = row["forms"]
    in_place = shd.param_shardings(stacked, train_mesh) == shd.param_shardings(stacked, mesh)
    row["held_weights_bytes"] = dict(
        merged_split=base_bytes + f["merged"]["weights_bytes"],
        adapters_split=f["adapters"]["weights_bytes"],
        merged_colocated_extra=f["merged"]["weights_bytes"],
        adapters_colocated_extra=0 if in_place else f["adapters"]["weights_bytes"])
    row["break_even_steps"] = {
        form: (hand["merge"]["s"] - hand["adapters_only"]["s"]) / extra
        if (extra := f[form]["step_s"] - f["merged"]["step_s"]) > 0 else math.inf
        for form in ("adapters", "in_place")}
    return row


def print_tpu(row: dict) -> None:
    print(f"{row['model']} r = {row['rank']} on {row['topology']}, sampling mesh "
          f"{row['sampling_mesh']}, {row['slots']} slots, chunk {row['chunk']}, cache "
          f"{row['cache_len']} (compiled for TPU; estimates, nothing ran)")
    for form, f in row["forms"].items():
        print(f"  {form:9s} weights {f['weights_bytes'] / GIB:6.2f} GiB/chip; a step: "
              f"{f['step_flops'] / 1e9:8.1f} GFLOP, {f['step_hbm_bytes'] / 1e9:6.2f} GB HBM "
              f"({f['step_bytes_accessed'] / 1e9:6.2f} all spaces), {1e3 * f['step_s']:6.2f} ms"
              f" bound; chunk peak {f['chunk_peak_bytes'] / GIB:6.2f} GiB")
    for k, h in row["handoff"].items():
        print(f"  hand-off {k:13s} {h['flops'] / 1e9:8.1f} GFLOP, {h['hbm_bytes'] / 1e9:6.2f} GB "
              f"HBM ({h['bytes_accessed'] / 1e9:6.2f} all spaces), peak "
              f"{h['peak_bytes'] / GIB:6.2f} GiB, {1e3 * h['s']:7.2f} ms bound")
    print("  weights held on the sampler's chips (GiB/chip): " + ", ".join(
        f"{k} {v / GIB:.2f}" for k, v in row["held_weights_bytes"].items()))
    s = row["steps_per_update"]
    print("  break-even decode steps per update: " + ", ".join(
        f"{k} {v:,.0f}" for k, v in row["break_even_steps"].items())
          + f"; an RL step runs {s['at_full_slots']:,} at full slots (floor {s['floor']:,})")


# ----------------------------------------------------------------------------- CPU wall clock


PROMPT, NEW = 32, 64


def cpu_case(name: str, rank: int, slots: int, repeats: int) -> dict:
    """The Driver on the merged and the adapters' form, interleaved rounds (see doc)."""
    cfg = preset(name)
    params = lora.attach(init_params(cfg, jax.random.key(0)), LoraConfig(rank=rank),
                         cfg.compute_dtype)
    keys = iter(jax.random.split(jax.random.key(1), 64))
    params = dict(params, layers={k: (0.02 * jax.random.normal(next(keys), v.shape)).astype(
        v.dtype) if k.endswith("_lora_b") else v for k, v in params["layers"].items()})
    engine = Engine(cfg, num_slots=slots, max_prompt_len=PROMPT, max_new_tokens=NEW,
                    chunk_size=8, sampling=SamplingConfig(temperature=1.0),
                    max_prefill_rows=slots, slot_bucketing=False)
    unembed = engine.choices.unembed_copy
    to_adapters = jax.jit(functools.partial(with_adapters, config=cfg, unembed_copy=unembed))
    forms = {"merged": engine.prepare_params(params), "adapters": to_adapters(params)}
    rng = np.random.default_rng(0)
    reqs = [Request(rng.integers(0, cfg.vocab_size, PROMPT).tolist(), i, 0, NEW)
            for i in range(slots)]

    def run(p):
        t = time.perf_counter()
        out = Driver(engine, p, step_key=0).generate_all(reqs)
        dt = time.perf_counter() - t
        assert all(c.length == NEW for c in out)
        return slots * NEW / dt

    for p in forms.values():
        run(p)  # compile
    tok = {k: [] for k in forms}
    for _ in range(repeats):
        for k, p in forms.items():
            tok[k].append(run(p))
    ratios = [a / m for a, m in zip(tok["adapters"], tok["merged"], strict=True)]

    def ms(fn):
        jax.block_until_ready(fn(params))
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready(fn(params))
            times.append(1e3 * (time.perf_counter() - t))
        return statistics.median(times), min(times), max(times)

    merge = ms(engine._sampling_params)
    swap = ms(jax.jit(functools.partial(adapter_handoff, config=cfg)))
    row = dict(model=name, rank=rank, slots=slots, prompt=PROMPT, new=NEW, repeats=repeats,
               tok_s={k: statistics.median(v) for k, v in tok.items()}, rounds=tok,
               ratio_adapters_over_merged=statistics.median(ratios),
               ratio_range=[min(ratios), max(ratios)], merge_ms=merge, adapters_handoff_ms=swap,
               loadavg=os.getloadavg(), platform=jax.devices()[0].platform)
    ratio, tok = row["ratio_adapters_over_merged"], row["tok_s"]
    print(f"{name} r = {rank}, {slots} slots x {NEW} new tokens (XLA:CPU wall clock, load "
          f"{row['loadavg'][0]:.1f}): merged {tok['merged']:.0f} tok/s, adapters "
          f"{tok['adapters']:.0f} tok/s; adapters / merged {ratio:.3f} (range "
          f"{min(ratios):.3f}-{max(ratios):.3f}); "
          f"hand-off with the merge {merge[0]:.1f} ms, adapters only {swap[0]:.2f} ms (median)")
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tpu", default="1.5b", help=f"presets to compile: {', '.join(PRESETS)}")
    ap.add_argument("--cpu", default="tiny,small", help="presets to time on this machine")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--slots", type=int, default=16, help="slots of the CPU timing")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    log = lambda s: print(f"[{time.strftime('%H:%M:%S')}] compiling {s}", flush=True)
    rows = []
    for name in filter(None, args.cpu.split(",")):
        rows.append(cpu_case(name, args.rank, args.slots, args.repeats))
    for name in filter(None, args.tpu.split(",")):
        rows.append(tpu_case(name, args.rank, log))
        print_tpu(rows[-1])
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
