"""Will this run fit this TPU slice, and how fast could it go at best? Asked before paying.

    python -m ada.plan --config configs/qwen25_math_7b.py:ada_balance --topology v5e:4x4 \
        [--model qwen2.5-math-7b] [--config.sampling.num_slots=64] [--json plan.json]
    python -m ada.plan --devices 8 --config.mesh.data=-1 [--hbm_gib 16]   # configs/default.py

The config is read as the runner reads it, the model's shapes from `model.path`'s config.json,
`--model NAME` (ada/models/known.py) or the preset. Four programs, each as the run builds it,
are compiled on abstract shapes (nothing is allocated): the train step on the `mesh.*` mesh;
the reshard (the engine's hand-off of trained params); prefill and a generate chunk on one
host's `sampling.mesh`. `--topology` compiles with the real TPU compiler (libtpu: pip install
'ada[tpu]') for abstract chips, `--devices N` with XLA:CPU (its `temp` only guesses a TPU's).

Reported per device: each phase's arguments, outputs, temp and the compiler's peak (a TPU
compile past HBM fails and its error names the peak); `held`, the train state that stays on
the chip beside the reshard, prefill and generate (a phase fits when peak + held does);
max_num_slots, the most slots whose sampler (weights + KV cache + generate temp) fits a chip
beside that state (`max_slots`); and an ESTIMATE, the roofline lower bound on time from the
compiler's flops and bytes over the chip's peak FLOP/s and HBM bandwidth (XLA counts a loop
body once, so from loop-free probes: `train_probe`, and one decode step x chunk_size).

Decode and prefill bytes are put beside their analytic floor (`decode_floor`,
`prefill_floor`: the weights read once, the KV cache read at the planned fill or written, the
logits): the program's HBM bytes, op by op through XLA's cost model with each operand in
the memory space its layout names (`ada.hlo_bytes`; the compiler's own `bytes accessed` also
counts the TPU's on-chip staging, two or three times per staged byte), their ratio to the
floor, and the estimate charges the larger of floor and HBM bytes. `--explain N` lists the
N heaviest op groups of both programs, so a regression shows where its bytes go.

Exit status: 0 every phase fits (or no HBM to compare with), 1 some phase does not (the JSON
is written), 2 a user error, one `error: ...` line and nothing written: before anything
compiles, a bad config, topology or mesh, prompt + response past the model's context, or a
KV cache past HBM by itself (`check_slots`); after the report, num_slots above max_num_slots.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import os
import re
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ada import config as cfglib
from ada import memory, methods
from ada import sharding as shd
from ada.config import ConfigError, train_config
from ada.hlo_bytes import EXPLAIN_GROUPS, collectives, costings, group_ops, hlo_op_bytes
from ada.models.hf_config import CheckpointError, read_config
from ada.models.known import KNOWN, known
from ada.models.paged_attention import page_bytes
from ada.rl import train as rl
from ada.roofline import (
    decode_floor,
    device_bytes,
    disaggregated,
    estimate,
    paged_estimate,
    prefill_floor,
    with_shardings,
)
from ada.run.policy import check_context_window, model_config_for
from ada.sampling.backends import BACKENDS, make_engine, plan_variant
from ada.sampling.bucket_moves import cache_sized_moves
from ada.sampling.pages import slots_that_fit
from ada.tokenizer import load_tokenizer

GIB = 2 ** 30
_OOM = re.compile(r"required for HLO temporaries \(([\d.]+)(\w?)\w*\) exceeds available HBM "
                  r"\(([\d.]+)(\w?)\w*\)|Used ([\d.]+)(\w?)\w* of ([\d.]+)(\w?)\w* hbm")


def resolve_model(config, model_name: str | None):
    """--model's known shapes, model.path's config.json, or the preset (sized to the
    tokenizer's vocabulary), in the config's dtypes."""
    m = config.model
    if model_name:
        if model_name.lower() not in KNOWN:
            raise ConfigError(f"--model {model_name!r} is not a known model; choose one of "
                              f"{', '.join(KNOWN)}")
        return known(model_name).replace(dtype=m.dtype, param_dtype=m.param_dtype)
    if m.path and not os.path.isdir(m.path):
        guess = difflib.get_close_matches(os.path.basename(m.path.rstrip("/")).lower(),
                                          list(KNOWN), n=1, cutoff=0.5)
        raise ConfigError(f"model path {m.path!r} does not exist; pass --config.model.path=DIR "
                          "(only its config.json is read) or plan known shapes with --model "
                          f"{guess[0] if guess else 'NAME'} (one of {', '.join(KNOWN)})")
    try:
        if m.path:
            return read_config(m.path)[1].replace(dtype=m.dtype, param_dtype=m.param_dtype)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    vocab = config.tokenizer.vocab_size
    if config.tokenizer.path:
        vocab = load_tokenizer(config.tokenizer.path).vocab_size
    return model_config_for(config, types.SimpleNamespace(vocab_size=vocab))


def check_config(config, model_name: str | None):
    """The runner's checks but for the data files (never read here), then the model's."""
    c = copy.deepcopy(config)
    with c.unlocked():
        c.data.train_path = c.data.eval_path = c.model.path = ""
    cfglib.validate(c)
    model = resolve_model(config, model_name)
    check_context_window(config, model)
    return model


def mesh_sizes(sizes, n: int, knob: str, where: str, exact: bool) -> tuple[int, ...]:
    """Sizes, a leading -1 resolved; their product must be n (or, not `exact`, divide it)."""
    sizes = tuple(int(s) for s in sizes)
    rest = math.prod(sizes[1:])
    if sizes[0] == -1 and rest >= 1 and n % rest == 0:
        sizes = (n // rest,) + sizes[1:]
    if min(sizes) < 1 or (n != math.prod(sizes) if exact else n % math.prod(sizes)):
        raise ConfigError(f"{knob}={sizes} does not {'match' if exact else 'divide'} the {n} "
                          f"devices of {where}; choose sizes whose product "
                          f"{'is' if exact else 'divides'} {n} (-1 first: all the rest)")
    return sizes


def compile_phase(lowered, arguments: int, ops: bool = False) -> dict:
    """One device's buffers and costs. The peak is the TPU compiler's own (XLA:CPU's leaves
    temp out: there, arguments + outputs + temp - aliased). A TPU compile past HBM raises:
    its error gives the peak and the compiler's HBM limit, the shardings the arguments.
    `ops`: also the optimized program's bytes op by op (`hlo_op_bytes`): `hbm_bytes`, their
    sum outside on-chip memory, `costings` (ops per costing: "shapes" where XLA's cost model
    was not reached) and `ops`, the heaviest op groups."""
    t0 = time.perf_counter()
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if not (hit := _OOM.search(str(e))):
            raise
        n, u, m, v = [x for x in hit.groups() if x is not None]
        size = lambda num, unit: int(float(num) * 1024 ** "BKMGT".index(unit.upper() or "B"))
        return dict(arguments_bytes=arguments, peak_bytes=size(n, u), hbm_limit_bytes=size(m, v),
                    over_hbm=True, compile_s=round(time.perf_counter() - t0, 1))
    ma, ca = compiled.memory_analysis(), compiled.cost_analysis() or {}
    a, o, t, al = (ma.argument_size_in_bytes, ma.output_size_in_bytes, ma.temp_size_in_bytes,
                   ma.alias_size_in_bytes)
    fig = dict(arguments_bytes=a, outputs_bytes=o, temp_bytes=t, aliased_bytes=al,
               peak_bytes=ma.peak_memory_in_bytes if next(iter(jax.tree.leaves(
                   compiled.input_shardings)[0].device_set)).platform == "tpu" else a + o + t - al,
               flops=float(ca.get("flops", 0)), bytes_accessed=float(ca.get("bytes accessed", 0)))
    if ops:
        text = compiled.as_text()
        table = hlo_op_bytes(text)
        fig["collectives"] = collectives(text, len(jax.tree.leaves(
            compiled.input_shardings)[0].device_set))
        fig.update(hbm_bytes=float(sum(r["hbm_bytes"] for r in table)),
                   hbm_loop_bytes=float(sum(r["hbm_bytes"] for r in table if r["loop"])),
                   costings=costings(table), ops=group_ops(table)[:EXPLAIN_GROUPS])
    return dict(fig, compile_s=round(time.perf_counter() - t0, 1))


def abstract_batch(rows: int, seq_len: int, train_cfg, lead: tuple = (), sharding=None) -> dict:
    """The train batch as abstract arrays (old_logp / ref_logp when the update reads them;
    behav_logp and lag always: the loop passes each token's version at every k)."""
    keys = (rl.REQUIRED_KEYS + ("old_logp",) * (not train_cfg.on_policy)
            + ("ref_logp",) * (train_cfg.loss.kl_coef > 0) + ("behav_logp", "lag"))
    return {k: jax.ShapeDtypeStruct(lead + ((rows,) if k == "advantages" else (rows, seq_len)),
                                    rl.BATCH_DTYPES[k], sharding=sharding) for k in keys}


def lower_train_step(model_cfg, train_cfg, mesh, rows: int, seq_len: int):
    """The sharded train step lowered on abstract inputs: (lowered, fns, state, batch)."""
    try:
        shd.check_batch_size(rows, mesh, train_cfg.mini_batches * train_cfg.micro_batches,
                             what="train batch (data.prompts_per_step x adaptive.n)")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    fns = rl.make_train_fns(model_cfg, train_cfg, mesh)
    state = rl.abstract_state(model_cfg, train_cfg)
    batch = abstract_batch(rows, seq_len, train_cfg)
    return fns.train_step.lower(state, batch), fns, state, batch


def plan_train(model_cfg, train_cfg, mesh, rows: int, seq_len: int, probe: bool) -> dict:
    lowered, fns, state, batch = lower_train_step(model_cfg, train_cfg, mesh, rows, seq_len)
    split = dict(params_bytes=device_bytes(state.params, fns.state_sharding.params),
                 opt_state_bytes=device_bytes(state.opt_state, fns.state_sharding.opt_state),
                 batch_bytes=device_bytes(batch, shd.batch_shardings(batch, mesh)))
    fig = compile_phase(lowered, device_bytes(state, fns.state_sharding) + split["batch_bytes"])
    fig.update(split, rows=rows, seq_len=seq_len, remat=train_cfg.remat,
               mini_batches=train_cfg.mini_batches, micro_batches=train_cfg.micro_batches,
               shape=f"{rows} x {seq_len}, {train_cfg.mini_batches} mini x "
                     f"{train_cfg.micro_batches} micro, remat {'on' if train_cfg.remat else 'off'}")
    if probe:
        fig["probe"] = train_probe(model_cfg, train_cfg, mesh, rows, seq_len)
    return fig


def train_probe(model_cfg, train_cfg, mesh, rows: int, seq_len: int) -> dict:
    """Flops and bytes of one micro-batch's loss and gradient (the step: x micro x mini-batches
    x epochs) from small loop-free compiles: 1 or 2 layers unrolled (a list of per-layer
    weights) leave only the loop over N logit chunks of C positions, its body counted once.
    Costs are linear in [1, r, r c, L, L r] (r rows per device, c positions per chunk body,
    L layers): fitted at small (r, c, L), read at the micro-batch's (r, N C, L). The compiler
    drops remat recompute from such code and the optimizer update is left out, so with remat
    the bound is looser (by up to a third)."""
    shards = shd.batch_shards(mesh)
    r = rows // (train_cfg.mini_batches * train_cfg.micro_batches * shards)
    C = min(train_cfg.logit_chunk, seq_len - 1)
    N = -(-(seq_len - 1) // C)
    half = C // 2 if N > 1 else C

    def cost(per_device, chunk, layers):
        model = model_cfg.replace(num_layers=layers)
        cfg = dataclasses.replace(train_cfg, logit_chunk=chunk)
        unrolled = jax.eval_shape(lambda p: dict(p, layers=[
            jax.tree.map(lambda x, i=i: x[i], p["layers"]) for i in range(layers)]),
            rl.abstract_state(model, cfg).params)
        fn = jax.jit(functools.partial(rl.minibatch_grads, model_cfg=model, config=cfg,
                                       mesh=mesh))
        return compile_phase(fn.lower(
            with_shardings(unrolled, shd.param_shardings(unrolled, mesh)),
            abstract_batch(per_device * shards, seq_len, cfg, (1,),
                           NamedSharding(mesh, P(None, shd.BATCH_AXES)))), 0)

    points = [(1, half, 1), (1, half, 2)] + [(2, half, 1), (2, half, 2)] * (r > 1) \
        + [(1, C, 1)] * (N > 1)
    figs = [cost(*pt) for pt in points]
    if missing := [f for f in figs if "flops" not in f]:
        return missing[0]
    features = lambda rr, c, L: [1, rr, rr * c, L, L * rr]
    coef = np.linalg.lstsq(np.array([features(*pt) for pt in points], float),
                           np.array([[f["flops"], f["bytes_accessed"]] for f in figs]),
                           rcond=None)[0]
    flops, nbytes = np.array(features(r, N * C, model_cfg.num_layers), float) @ coef
    return {"flops": float(flops), "bytes_accessed": float(nbytes), "rows_per_device": r,
            "logit_chunks": N, "compiles": len(points)}


def plan_reshard(engine, stacked, train_mesh, ops: bool = False) -> dict:
    """Engine.prepare_params' hand-off: train mesh -> the engine's mesh on every host.
    `ops`: with the program's HBM bytes op by op (`compile_phase`)."""
    in_sh = shd.param_shardings(stacked, train_mesh)
    view = shd.replica_mesh(engine.mesh, train_mesh.devices.flat)
    fn = jax.jit(engine._sampling_fn, in_shardings=(in_sh,),
                 out_shardings=view and engine.param_shardings(stacked, view))
    return dict(compile_phase(fn.lower(stacked), device_bytes(stacked, in_sh), ops),
                shape="params -> sampler weights")


def plan_prefill(engine, params, ops: bool = False) -> dict:
    """The engine's jitted prefill (its host arrays arrive replicated). `ops`: with the
    program's bytes op by op and the floor (for the estimate)."""
    shape = (engine.row_buckets[-1], engine.max_prompt_len)
    tokens, mask = (jax.ShapeDtypeStruct(shape, t, sharding=NamedSharding(engine.mesh, P()))
                    for t in (jnp.int32, bool))
    fig = compile_phase(engine._prefill.lower(params, tokens, mask), device_bytes(params), ops)
    if ops:
        fig["floor"] = prefill_floor(engine, params, *shape)
    return dict(fig, rows=shape[0], prompt_len=shape[1],
                shape=f"{shape[0]} x {shape[1]} prompt tokens")


def plan_generate(engine, params, num_steps: int | None = None, ops: bool = False) -> dict:
    """The engine's jitted generate, every slot attending to the whole cache. `ops`: with the
    program's bytes op by op, its HBM bytes per step (the loop's ops once per step, the
    rest once per chunk: what the chunk does at its boundary counts too) and one step's
    floor (for the estimate)."""
    state = engine.abstract_state()
    K = num_steps or engine.chunk_size
    lowered = engine._generate.lower(params, state, num_steps=K, num_slots=engine.num_slots,
                                     window=engine.cache_len)
    fig = compile_phase(lowered, device_bytes((params, state)), ops)
    if ops and "hbm_bytes" in fig:
        loop = fig["hbm_loop_bytes"] if K > 1 else 0.0  # one step: no loop left
        fig.update(floor=decode_floor(engine, params, engine.cache_len),
                   hbm_bytes_per_step=loop + (fig["hbm_bytes"] - loop) / K)
    return dict(fig, num_slots=engine.num_slots, steps=K, cache_len=engine.cache_len,
                shape=f"{engine.num_slots} slots x {K} steps, cache {engine.cache_len}")


fits = lambda f, hbm: not f.get("over_hbm") and f["peak_bytes"] + f.get("held_bytes", 0) <= hbm


def check_slots(engine, params, held: int, hbm: float) -> None:
    """Before any compile: num_slots whose KV cache alone is past HBM, beside the sampler's
    weights and the train state (`held`), says how many could fit (compiling tells)."""
    cache = device_bytes(engine.abstract_state())
    n, d, room = engine.num_slots, engine.mesh.shape["data"], hbm - held - device_bytes(params)
    if cache > room:
        most = max(int(room * n / cache) // d * d, 0)
        raise ConfigError(
            f"sampling.num_slots={n} cannot fit {hbm / GIB:g} GiB per chip: its KV cache takes "
            f"{cache / GIB:.2f} GiB beside {(hbm - room) / GIB:.2f} GiB of train state, sampler "
            f"weights and prefix caches; at most {most} could: pass "
            f"--config.sampling.num_slots={most}"
            + " and raise sampling.mesh tensor or mesh.fsdp" * (not most))


def max_slots(generate_at, first: dict, step: int, hbm: float) -> tuple[int, str, dict | None,
                                                                        tuple[float, float]]:
    """The most slots (a multiple of `step`) whose generate peak fits `hbm`: a line through
    the peaks at two slot counts, checked by compiling at its answer (a miss redraws it).
    Also the line: (fixed bytes, bytes per slot of the host) per device."""
    b1, p1 = first["num_slots"], first["peak_bytes"]
    b2 = b1 // 2 if b1 // 2 >= step and (b1 // 2) % step == 0 else 2 * b1
    second = generate_at(b2)
    per_slot = max((second["peak_bytes"] - p1) / (b2 - b1), 1.0)  # bytes; 0 would never end
    fixed = p1 - per_slot * b1
    limit = min([hbm] + [f["hbm_limit_bytes"] for f in (first, second) if "hbm_limit_bytes" in f])
    best = int((limit - fixed) / per_slot) // step * step
    how = (f"line through generate's peak at {b1} and {b2} slots: {fixed / GIB:.2f} GiB + "
           f"{per_slot / 2**20:.2f} MiB/slot per device, checked by a compile")
    for _ in range(4):
        if best <= 0:
            return 0, how, None, (fixed, per_slot)
        fig = generate_at(best)
        if fits(fig, hbm):
            return best, how, fig, (fixed, per_slot)
        limit = min(limit, fig.get("hbm_limit_bytes", limit))  # the compiler's own
        per_slot = max((fig["peak_bytes"] - p1) / (best - b1), per_slot) if best != b1 else per_slot
        fixed = p1 - per_slot * b1
        best = min(best - step, int((limit - fixed) / per_slot) // step * step)
    return best, how + " (the last check did not fit)", None, (fixed, per_slot)


def plan_paged(config, engine, line: tuple[float, float], hbm: float, mesh: tuple[int, int]) -> dict:
    """Slots per host with the paged cache (sampling.kv_cache=paged, docs/paged.md) at the
    planned mean response length (`sampling.mean_response_len`), beside the dense cache's
    worst case, from generate's peak line (`max_slots`): its fixed bytes stay, and a slot's
    bytes other than its KV cache stay per slot. Prompts count at their longest, their full
    pages shared by a round's samples (adaptive.samples_per_round, grpo's n)."""
    c, (data, tensor) = engine.config, mesh
    fixed, per_slot = line
    kv_token = page_bytes(c, 1, kv_head_shards=tensor)
    mean = config.sampling.mean_response_len or config.sampling.max_new_tokens // 2
    fit = slots_that_fit(
        c, hbm - fixed, config.sampling.page_size, mean, engine.max_prompt_len,
        max_response_len=config.sampling.max_new_tokens, max_prompt_len=engine.max_prompt_len,
        samples_per_prompt=(config.adaptive.samples_per_round if methods.get(
            config.method).adaptive_rounds else config.adaptive.n),
        kv_head_shards=tensor, slot_shards=data, chunk_size=engine.chunk_size,
        pool_shards=data,  # each data shard holds its own slots' pages (docs/paged.md)
        per_slot_bytes=max(per_slot * data - kv_token * engine.cache_len, 0.0))
    return dict(fit, page_size=config.sampling.page_size, mean_response_len=mean, fixed_bytes=fixed,
                mean_from="sampling.mean_response_len" if config.sampling.mean_response_len
                else "half of sampling.max_new_tokens (sampling.mean_response_len=0)")


def compiled_paged(config, model_cfg, mesh, params, planned: dict, held: int, hbm: float,
                   log) -> dict:
    """The paged engine make_engine builds for this sampler, its generate compiled twice.
    At the config's slots with the default pool (every slot's worst case reserved): the
    attention it runs (the kernel on TPU) and its decode state's bytes per chip from the
    compiled program's memory (arguments less the weights and the page table). At the
    planned mean fill (`plan_paged`): its slots with the pool it plans for them (each slot's
    pages at the mean fill, `headroom` more kept free, a null page per data shard), checked
    to fit beside the held train state by the compiler's peak; a miss redraws the count on
    the line through the sampler's fixed bytes and that peak (at most four tries)."""
    paged = plan_variant(config, "paged")
    engine = make_engine(paged, model_cfg, None, mesh)
    log(f"the paged generate at {engine.num_slots} slots ({engine.attention})")
    table = engine.num_slots * engine.pages_per_slot * 4  # the page table, int32, replicated
    args = engine.lower_generate(params).compile().memory_analysis().argument_size_in_bytes
    out = dict(attention=engine.attention, num_pages=engine.num_pages,
               pool_bytes_per_chip_full_reservation=int(args - device_bytes(params) - table))
    data, page = engine.pool_shards, config.sampling.page_size
    slots = planned["mean_fill_slots"] // data * data
    per_slot = planned["mean_fill_tokens_per_slot"] / page / (1 - planned["headroom"])
    for _ in range(4):
        if slots < data:
            break
        paged.sampling.num_pages = data * (1 + math.ceil(slots // data * per_slot))
        engine = make_engine(paged, model_cfg, None, mesh, num_slots=slots)
        log(f"the paged generate at {slots} slots, {engine.num_pages} pages (the mean fill)")
        state = engine.abstract_state()
        fig = compile_phase(engine.lower_generate(params), device_bytes((params, state)))
        if fits(dict(fig, held_bytes=held), hbm):
            return dict(out, max_slots_at_mean_fill=slots, mean_fill_num_pages=engine.num_pages,
                        mean_fill_peak_bytes=fig["peak_bytes"])
        per_slot_bytes = max(fig["peak_bytes"] - planned["fixed_bytes"], 1) / slots
        slots = min(int((hbm - held - planned["fixed_bytes"]) / per_slot_bytes),
                    int(slots * 0.98)) // data * data
    return dict(out, max_slots_at_mean_fill=None)


def make_plan(config, model_cfg, devices, host, where: str, chip: str | None,
              hbm: float | None, log, train_estimate: bool, buckets: bool = False) -> dict:
    """`host`: one host's devices (on CPU `devices` themselves, on TPU a one-host slice).
    The programs compiled are the dense cache's (the paged generate's attention is a kernel
    whose reads the compiler cannot count); the paged cache's slots are planned beside them
    (`plan_paged`). `log(program)` is called as each program starts compiling (ada.cli.plan's
    progress line). `buckets`: also compile every bucket of the dense and the paged engine and
    count the cache-sized moves between chips in them (ada.sampling.bucket_moves)."""
    run_config, config = config, plan_variant(config, "dense")
    n, first = len(devices), [d for d in devices if d.process_index == 0]
    split = config.rl.sampler_devices
    if split:  # as ada.meshes.role_devices: the host's last N chips sample, the others train
        if len(first) != n or not 0 < split < n:
            raise ConfigError(f"rl.sampler_devices={split}: a disaggregated stream runs in one "
                              f"process on 1..{len(first) - 1} of its chips; plan one host")
        devices, host = devices[:-split], host[-split:]
    m = config.mesh
    train_mesh = shd.make_mesh(mesh_sizes((m.data, m.fsdp, m.tensor), len(devices), "mesh "
                                          "(data, fsdp, tensor)", where, exact=True), devices)
    data, tensor = mesh_sizes(config.sampling.mesh, len(host), "sampling.mesh",
                              f"one host of {where}", exact=False)
    mesh_on = lambda devs: shd.make_mesh((data, 1, tensor), sorted(devs, key=lambda d: d.id)
                                         [:data * tensor])  # as ada.sharding.local_mesh
    sampling_mesh, tc = mesh_on(host), train_config(config)
    engine = make_engine(config, model_cfg, None, sampling_mesh)
    stacked = rl.abstract_state(model_cfg, tc).params  # under LoRA: base + adapters, merged
    params = with_shardings(jax.eval_shape(engine._sampling_fn, stacked),
                            engine.param_shardings(stacked))
    sampler = memory.run_resident(run_config, model_cfg, train_mesh, sampling_mesh)
    resident = sampler["resident"]
    # on the chip through the rollout: the train state (a KL reference beside it; not on a
    # split run's sampler chips) and the prompts' prefills the sampler keeps (ada/memory.py)
    held = resident["prefix_caches"] + resident["frozen_base"] + (0 if split else (
        resident["train_params"] + resident["optimizer_state"] + resident["reference_params"]))
    if hbm:
        check_slots(engine, params, held, hbm)
    rows, seq = (config.data.prompts_per_step * config.adaptive.n,
                 engine.max_prompt_len + config.sampling.max_new_tokens)
    p = dict(devices=n, hosts=n // len(first), chips_per_host=len(first), epochs=tc.epochs,
             train_mesh=dict(train_mesh.shape), sampling_mesh=dict(data=data, tensor=tensor),
             num_slots=engine.num_slots, max_num_slots=None, max_num_slots_method=None,
             fits=None, phases={}, **({"lora": memory.lora_figures(model_cfg, tc, engine)}
                                      if tc.lora.rank else {}))
    ph = p["phases"]
    log(f"the train step ({rows} x {seq} tokens)")
    ph["train"] = plan_train(model_cfg, tc, train_mesh, rows, seq, probe=bool(chip and train_estimate))
    log("the reshard and prefill")
    ph["reshard"] = plan_reshard(make_engine(config, model_cfg, None,
                                             mesh_on(host if split else first),
                                                   num_slots=engine.num_slots),
                                 stacked, train_mesh)
    ph["prefill"] = plan_prefill(engine, params, ops=bool(chip))

    def generate_at(slots, steps=None, ops=False):
        log(f"generate at {slots} slots{' (one step: the cost probe)' if steps else ''}")
        return plan_generate(make_engine(config, model_cfg, None, sampling_mesh,
                                               num_slots=slots), params, steps, ops=ops)

    ph["generate"] = generate_at(engine.num_slots, ops=bool(chip))
    ph["prefill"]["held_bytes"] = ph["generate"]["held_bytes"] = held
    ph["reshard"]["held_bytes"] = (resident["train_params"] + resident["optimizer_state"]
                                   + resident["reference_params"]
                                   - ph["train"]["params_bytes"])  # it reads the params
    if hbm:
        p["max_num_slots"], p["max_num_slots_method"], checked, line = max_slots(
            generate_at, ph["generate"], data, hbm - held)
        p["paged"] = plan_paged(config, engine, line, hbm - held, (data, tensor))
        p["paged"].update(compiled_paged(config, model_cfg, sampling_mesh, params, p["paged"],
                                         held, hbm, log))
        p["dense"] = dict(max_slots=p["max_num_slots"], cache_bytes_per_chip=int(
            ph["generate"]["arguments_bytes"] - device_bytes(params)))
        p["max_num_slots_peak_bytes"] = checked and checked["peak_bytes"]
        # cohorts in flight hold the sampler's cache through the update, which caps the
        # slots where its bytes follow them (the row's slot_bound: dense, not a paged pool)
        if (run_config.rl.max_staleness > 0 and not split and BACKENDS[run_config.sampling.kv_cache].slot_bound
                and p["max_num_slots"]):
            p["max_num_slots"] = min(p["max_num_slots"], memory.update_slots(
                p["max_num_slots"], data, ph, resident, engine, hbm))
    p["memory"] = memory.plan_memory(run_config, sampler, ph, engine, hbm)
    if hbm:
        ledgers = p["memory"]["meshes"].values() if split else [p["memory"]]
        p["fits"] = (all(fits(f, hbm) for f in ph.values())
                     and all(f["fits"] for lg in ledgers for f in lg["phases"].values()))
    if buckets:
        paged = make_engine(plan_variant(config, "paged"), model_cfg, None, sampling_mesh)
        p["buckets"] = cache_sized_moves([engine, paged], params, lambda name: log(
            f"the bucket {name}"))
    slots = engine.num_slots if fits(ph["generate"], hbm or math.inf) else p["max_num_slots"]
    if chip and slots:
        probe = generate_at(slots, 1, ops=True)
        if slots == engine.num_slots and "hbm_bytes_per_step" in ph["generate"]:
            probe["chunk_hbm_bytes_per_step"] = ph["generate"]["hbm_bytes_per_step"]
        p["estimate"] = estimate(p, model_cfg, chip, probe)
        if p.get("paged"):
            p["estimate"]["paged"] = paged_estimate(p["paged"], engine, params, probe, chip)
        a = config.adaptive  # a step's tokens: the budget M x N per prompt (grpo: n)
        per_prompt = a.samples_per_round * a.max_rounds if methods.get(
            config.method).adaptive_rounds else a.n
        mean = config.sampling.mean_response_len or config.sampling.max_new_tokens // 2
        p["disaggregated"] = disaggregated(p, config.data.prompts_per_step * per_prompt * mean,
                                           hbm)
    return p
