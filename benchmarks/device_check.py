"""One prepared check of ada on an accelerator: decode speed, an RL step, memory vs the ledger.

  python benchmarks/device_check.py --json out.json [--preset small] [--tiny]

(a script, as the other benchmarks: `python -m benchmarks...` would find the `benchmarks`
package that google-jetstream, the jetstream extra, installs)

A short RL run (ada.loop.train, grpo, the synthetic arithmetic task, random weights of the
preset's shapes sized to the task's tokenizer) on this process's first device, then that
run planned by ada.planner on that device (`make_plan`: its memory ledger, and on a device
that reports its memory, the slots that fit), then decode of the same model. In the JSON:
  decode_tok_s     dense and paged decode (benchmarks/decode.py's `ada_runner`: prompts of 32
                   tokens, 64 new each, no early stop) at `decode_slots`: the planner's
                   max_num_slots on a device with a memory limit, else sampling.num_slots
                   (`slots_from` says which). Paged runs at the same slots with every slot's
                   worst case reserved: here every response reaches 64 tokens, so the
                   planner's mean-fill count (`paged_slots_at_mean_fill`) would preempt.
  rl_step_s, mfu   the last step's time (collection + update, metrics.jsonl); mfu: the
                   update's model FLOPs (rl.train_flops_per_token) over that step at the
                   best large-matmul rate measured in this run (benchmarks/train_step.py),
                   update_mfu the same over the update alone.
  peak_vs_ledger   per phase boundary of the run's last step (loop.train's `observe`), the
                   measured bytes over the ledger's (`source`): with memory_stats(), the
                   allocator's peak since the run began over the largest ledger phase so far
                   (the peak cannot be reset, so both sides are running maxima); without
                   (the CPU), the live arrays at the boundary over the ledger's resident
                   bytes of what the chip then holds (at rl.max_staleness 0 the driver frees
                   its decode state as it hands out the batch: collect's is the update's).
--tiny: the tiny preset at CPU sizes (tests/test_device_check.py); the default preset is
small on an accelerator, tiny on the CPU. Sized for under 8 minutes on one GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from ada import loop, planner
from ada.metrics import METRICS_FILE, read_jsonl
from ada.models import init_params
from ada.rl.train import train_flops_per_token
from configs import common
from decode import NEW, PROMPT, ada_runner, interleaved  # benchmarks/ is on the path
from train_step import matmul_gflops

# run sizes: the CPU's (--tiny) and an accelerator's
SIZES = {"tiny": dict(prompts=4, n=4, slots=16, steps=2, matmul_n=512, repeats=2),
         "device": dict(prompts=32, n=8, slots=256, steps=3, matmul_n=4096, repeats=3)}
# the ledger phases (ada/memory.py) each boundary of loop.train's observe closes
PHASES = {"init": ("init",), "collect": ("prefill", "generate"), "update": ("update",),
          "handoff": ("handoff",), "save": ("save",)}
# what the chip holds at each boundary, as a ledger phase (module docstring)
HOLDS_AFTER = {"init": "init", "collect": "update", "update": "update", "handoff": "handoff",
               "save": "save"}


def run_config(preset: str, size: dict, on_cpu: bool):
    c = common.set_method(common.base(), "grpo")
    c.model.preset = preset
    c.model.dtype = "float32" if on_cpu else "bfloat16"
    c.data.num_train, c.data.num_eval = 512, 16
    c.data.prompts_per_step, c.adaptive.n = size["prompts"], size["n"]
    c.data.max_prompt_len, c.sampling.max_new_tokens = PROMPT, NEW  # decode.py's shapes
    c.sampling.num_slots = size["slots"]
    c.mesh.data, c.sampling.mesh = 1, (1, 1)  # this process's first device
    c.train.steps = c.checkpoint.every = size["steps"]
    c.eval.every = 0
    c.log.progress, c.log.every, c.log.tensorboard, c.log.plots = False, 0, False, False
    return c


def live_bytes() -> int:
    """Bytes of the live device arrays, each buffer once (a view shares its source's)."""
    seen = {}
    for a in jax.live_arrays():
        for sh in a.addressable_shards:
            seen[(sh.device.id, sh.data.unsafe_buffer_pointer())] = sh.data.nbytes
    return sum(seen.values())


def phase_memory(config, workdir: str, device) -> tuple[list, str, object]:
    """Train `config` in `workdir` (loop.train): each phase boundary's (phase, bytes) in run
    order, where the bytes come from (module docstring) and the model the run built."""
    if device.memory_stats() is not None:
        now = lambda: device.memory_stats()["peak_bytes_in_use"]
        source = "memory_stats: peak_bytes_in_use less bytes_in_use before the run"
        before = device.memory_stats()["bytes_in_use"]
    else:
        now, before = live_bytes, live_bytes()
        source = "jax.live_arrays at the phase boundary, less those before the run"
    seen, model = [], []

    def observe(phase, step, stream):
        seen.append((phase, now() - before))
        model[:] = [stream.rollout.engine.config]

    loop.train(config, workdir, observe=observe)
    return seen, source, model[0]


def vs_ledger(seen: list, ledger: dict, peaks: bool) -> tuple[dict, dict]:
    """Each phase's bytes at its last boundary and the ledger's beside them: with `peaks`
    (running maxima) the largest ledger phase so far, else what the chip holds then."""
    so_far, measured, expected = 0, {}, {}
    for phase, nbytes in seen:
        so_far = max([so_far] + [ledger[p]["bytes_per_chip"] for p in PHASES[phase]])
        measured[phase] = nbytes
        expected[phase] = so_far if peaks else ledger[HOLDS_AFTER[phase]]["resident_bytes"]
    return measured, expected


def main(argv=None) -> dict:
    from ada.distributed import cpu_only_without_accelerators

    cpu_only_without_accelerators()  # no libtpu start-up noise on a CPU
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=None, help="model preset (default: small on an "
                    "accelerator, tiny on the CPU)")
    ap.add_argument("--tiny", action="store_true", help="the tiny preset at CPU sizes")
    ap.add_argument("--max-slots", type=int, default=1024, help="cap on the decode slots")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    device = jax.local_devices()[0]
    on_cpu = device.platform == "cpu"
    size = SIZES["tiny" if args.tiny else "device"]
    preset = args.preset or ("tiny" if args.tiny or on_cpu else "small")
    stats = device.memory_stats()
    hbm = stats and stats.get("bytes_limit")

    with tempfile.TemporaryDirectory() as workdir:
        config = run_config(preset, size, on_cpu)
        seen, source, model_cfg = phase_memory(config, workdir, device)
        last = read_jsonl(os.path.join(workdir, METRICS_FILE))[-1]
    # planned after the run: a compile's scratch would count in the run's peak
    plan = planner.make_plan(config, model_cfg, [device], [device], "this device", None, hbm,
                             lambda program: None, train_estimate=False)
    measured, expected = vs_ledger(seen, plan["memory"]["phases"], stats is not None)

    train = plan["phases"]["train"]
    step_s = last["time_collect_s"] + last["time_update_s"]
    flops = train_flops_per_token(model_cfg, train["seq_len"]) * train["rows"] * train["seq_len"]
    dtype = jnp.dtype(model_cfg.compute_dtype)
    peak = matmul_gflops(size["matmul_n"], dtype) * 1e9

    if hbm:
        slots = min(plan["max_num_slots"], args.max_slots)
        slots_from = (f"ada.planner's max_num_slots on this device, at most --max-slots "
                      f"{args.max_slots}")
    else:
        slots = config.sampling.num_slots
        slots_from = "sampling.num_slots: the device reports no memory limit to plan slots for"
    params = init_params(model_cfg, jax.random.PRNGKey(0), std=0.02)
    chunk = config.sampling.chunk_size
    rounds = interleaved({kind: ada_runner(model_cfg, params, slots, chunk, kind)[0]
                          for kind in ("dense", "paged")}, size["repeats"])

    out = dict(
        device=device.device_kind, platform=device.platform, preset=preset,
        shapes=dict(hidden=model_cfg.hidden_size, layers=model_cfg.num_layers,
                    heads=model_cfg.num_heads, kv_heads=model_cfg.num_kv_heads,
                    head_dim=model_cfg.head_dim, vocab=model_cfg.vocab_size, dtype=dtype.name,
                    prompt=PROMPT, new=NEW, chunk=chunk, train_rows=train["rows"],
                    train_seq_len=train["seq_len"], rl_slots=config.sampling.num_slots),
        decode_tok_s={kind: float(np.median(r)) for kind, r in rounds.items()},
        decode_slots=slots, slots_from=slots_from,
        paged_slots_at_mean_fill=(plan.get("paged") or {}).get("max_slots_at_mean_fill"),
        rl_step_s=step_s, collect_s=last["time_collect_s"], update_s=last["time_update_s"],
        mfu=flops / step_s / peak, update_mfu=flops / last["time_update_s"] / peak,
        peak_flops=peak, peak_flops_from=f"best jnp.dot of {size['matmul_n']}^3 {dtype} here",
        peak_vs_ledger={p: measured[p] / expected[p] for p in measured},
        memory_bytes=measured, ledger_bytes=expected, source=source, hbm_bytes=hbm or None)
    print(json.dumps({k: v for k, v in out.items() if k != "shapes"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
