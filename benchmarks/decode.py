"""Decode throughput of ada's engine vs transformers `generate`, slot occupancy, compiles.

  python benchmarks/decode.py [--presets tiny,small] [--batches 8,32,64] [--json out.json]

Throughput: generated tokens per second for B prompts of 32 tokens, 64 new tokens each,
sampling at temperature 1 with no early stop (no EOS; transformers with min_new_tokens =
max_new_tokens, top_k=0), on the same weights (ada's random params written with save_hf
and loaded by transformers), torch on CPU. After a warm-up, the two run in turn for
--repeats rounds; each one's median tok/s is reported, and the ratio is the median of the
per-round ratios (a paired estimate: both sides of a round see the same machine load) with
its range. Every round is in the JSON. ada's time includes prefill and the host-side driver.

Occupancy: useful token-steps / computed token-steps of the driver on a mixed-length
workload (many requests, max new tokens uniform in [4, 128], more requests than slots).

Reproducibility across buckets: the same requests run in a full pool and one at a time
(slot bucket 1 and a 1-row prefill); the fraction of identical responses is reported.
Within one bucket equality is exact (tests/test_engine.py).

The paged cache (page 16, full reservation) runs in the same rounds as the dense one: its
tok/s and the paired paged / dense ratio (median and range over the rounds).

Targets (printed, not asserted): ratio >= 1.5 at batch 32 on the small preset, paged / dense
>= 0.95 there (paging costs the CPU no decode speed), occupancy >= 0.9, compiles <= buckets.

On an accelerator, one command measures what the sampler does at a preset's shapes:

  python benchmarks/decode.py --device qwen2.5-math-1.5b [--json out.json]

Random bfloat16 weights of the known model's shapes (no checkpoint needed), the dense cache
and the paged one, each at the slots that fit the device's memory (the dense worst case:
every slot reserving prompt + new tokens; paged: at a mean response of half the new tokens),
one request per slot plus as many queued, response lengths uniform in [1, new] (no EOS, the
same requests for both). Printed per cache: measured decode tokens/s (after a compiling
warm-up; prefill and the host driver included) beside the HBM roofline of that device at
that batch: the weights, each slot's keys and values at the mean fill and the logits read
once per step, at the vendor's published bandwidth (HBM_BANDWIDTH). `--hbm-gib` stands in
for a device without memory stats (the CPU: a smoke run with `--device tiny`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from ada.models import init_params, preset  # noqa: E402
from ada.models.hf import save_hf  # noqa: E402
from ada.sampling.driver import Driver, Request  # noqa: E402
from ada.sampling.engine import Engine  # noqa: E402
from ada.sampling.paged import PagedEngine  # noqa: E402
from ada.sampling.samplers import SamplingConfig  # noqa: E402

PROMPT, NEW = 32, 64


def ada_runner(config, params, batch, chunk, kv_cache="dense"):
    """A zero-argument function that generates B x NEW tokens and returns tok/s, with the
    dense cache or the paged one (page 16, every slot's worst case reserved)."""
    common = dict(num_slots=batch, max_prompt_len=PROMPT, max_new_tokens=NEW, chunk_size=chunk,
                  sampling=SamplingConfig(temperature=1.0), max_prefill_rows=batch)
    engine = (Engine(config, slot_bucketing=False, **common) if kv_cache == "dense" else
              PagedEngine(config, page_size=16, **common))
    rng = np.random.default_rng(0)
    seeds = iter(range(1, 1 << 30))

    def run():
        seed = next(seeds)
        reqs = [Request(rng.integers(0, config.vocab_size, PROMPT).tolist(), seed * 1000 + i, 0, NEW)
                for i in range(batch)]
        driver = Driver(engine, params, step_key=seed)
        t = time.perf_counter()
        out = driver.generate_all(reqs)
        dt = time.perf_counter() - t
        assert all(c.length == NEW for c in out)
        return batch * NEW / dt

    run()  # compile
    return run, engine


def hf_runner(model, vocab, batch):
    """Like ada_runner for transformers `generate`. Torch runs with the thread count that
    was faster in a warm-up (all cores or one: one is often faster for small ops on a
    shared machine; taking the faster keeps the comparison conservative)."""
    import torch

    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(0, vocab, (batch, PROMPT)))
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
              top_p=1.0, max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None,
              pad_token_id=0)

    def run_with(threads):
        torch.set_num_threads(threads)
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, **kw)
        dt = time.perf_counter() - t
        assert out.shape[1] == PROMPT + NEW
        return batch * NEW / dt

    options = sorted({os.cpu_count() or 1, 1}, reverse=True)
    for threads in options:
        run_with(threads)  # warm up
    best = max(options, key=run_with)
    return lambda: run_with(best)


def interleaved(runners: dict, repeats: int) -> dict:
    """Run the contenders in turn, `repeats` rounds; each one's tok/s per round. On a
    shared machine the load drifts: interleaving exposes both to the same drift, and the
    median ignores the rounds a neighbour hit."""
    out = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            out[name].append(run())
    return out


def occupancy(config, params, num_slots=32, n_requests=256, chunk=8):
    engine = Engine(config, num_slots=num_slots, max_prompt_len=PROMPT, max_new_tokens=128,
                    chunk_size=chunk, sampling=SamplingConfig(temperature=1.0),
                    max_prefill_rows=8)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, config.vocab_size, rng.integers(4, PROMPT + 1)).tolist()
               for _ in range(n_requests // 4)]
    reqs = [Request(prompts[i // 4], i // 4, i % 4, int(rng.integers(4, 129)))
            for i in range(n_requests)]
    driver = Driver(engine, params, step_key=0)
    out = driver.generate_all(reqs)
    assert [c.length for c in out] == [r.max_new_tokens for r in reqs]
    stats = driver.stats()
    return stats, engine.num_buckets(), engine, reqs[:32], out[:32]


def cross_bucket_agreement(engine, params, reqs, crowd_out):
    same = 0
    for r, c in zip(reqs, crowd_out, strict=False):
        (alone,) = Driver(engine, params, step_key=0).generate_all([r])
        same += alone.token_ids == c.token_ids
    return same / len(reqs)


# Published peak HBM bandwidth per chip (bytes/s) by the start of jax's device_kind (the
# longest match wins: "TPU v5 lite" is v5e, "TPU v5" v5p): vendor figures, the roofline's
# ceiling, not measured here.
HBM_BANDWIDTH = {"NVIDIA H100 PCIe": 2.0e12, "NVIDIA H100": 3.35e12, "NVIDIA H200": 4.8e12,
                 "TPU v5 lite": 8.19e11, "TPU v5": 2.765e12, "TPU v6 lite": 1.64e12,
                 "TPU v4": 1.2e12}


def hbm_bandwidth(device_kind: str) -> float | None:
    names = sorted((k for k in HBM_BANDWIDTH if device_kind.startswith(k)), key=len)
    return HBM_BANDWIDTH[names[-1]] if names else None


def on_device(model: str, prompt: int, new: int, chunk: int, page_size: int,
              hbm_gib: float | None, max_slots: int) -> dict:
    """--device: dense and paged decode at the slots that fit this device (module docstring)."""
    from ada.models.known import known
    from ada.models.paged_attention import page_bytes
    from ada.sampling.pages import slots_that_fit

    device = jax.devices()[0]
    c = (preset("tiny") if model == "tiny" else known(model)).replace(
        dtype="bfloat16", param_dtype="bfloat16")
    params = init_params(c, jax.random.PRNGKey(0), std=0.02)
    weights = sum(x.nbytes for x in jax.tree.leaves(params))
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit") or (hbm_gib or 0) * 2**30
    if not limit:
        raise SystemExit(f"error: {device.device_kind} reports no memory limit; pass --hbm-gib")
    # the params and their sampling copy, 10% of the device for the compiler's temporaries
    budget = 0.9 * limit - 2 * weights
    token = page_bytes(c, 1)  # every layer's key and value of one token, bf16
    mean_new = new / 2
    fit = slots_that_fit(c, budget, page_size, mean_new, prompt, max_response_len=new,
                         max_prompt_len=prompt, chunk_size=chunk)
    if fit["worst_case_slots"] < 1:
        raise SystemExit(f"error: {model} leaves no room for one slot in "
                         f"{limit / 2**30:.1f} GiB; pass a smaller --new or a larger --hbm-gib")
    bw = hbm_bandwidth(device.device_kind)
    rng = np.random.default_rng(0)
    out = dict(model=model, device=device.device_kind, memory_bytes=int(limit),
               weights_bytes=int(weights), hbm_bandwidth=bw, prompt=prompt, new=new,
               runs={})
    for kind, slots in (("dense", fit["worst_case_slots"]), ("paged", fit["mean_fill_slots"])):
        B = max(1, min(slots, max_slots))
        common = dict(num_slots=B, max_prompt_len=prompt, max_new_tokens=new, chunk_size=chunk,
                      sampling=SamplingConfig(temperature=1.0), max_prefill_rows=8)
        engine = (Engine(c, **common) if kind == "dense" else
                  PagedEngine(c, page_size=page_size,
                              num_pages=int(budget // (token * page_size)), **common))
        lengths = rng.integers(1, new + 1, 2 * B)
        reqs = [Request(rng.integers(1, c.vocab_size, prompt).tolist(), i, 0, int(n))
                for i, n in enumerate(lengths)]
        Driver(engine, params, step_key=0).generate_all(reqs[:B])  # compiles
        t = time.perf_counter()
        done = Driver(engine, params, step_key=1).generate_all(reqs)
        dt = time.perf_counter() - t
        generated = sum(d.length for d in done)
        # one step's HBM floor at this batch: weights, every slot's KV at the mean fill, logits
        step_bytes = weights + B * (prompt + mean_new) * token + B * c.vocab_size * 4
        bound = bw and B * bw / step_bytes
        out["runs"][kind] = dict(slots=B, slots_that_fit=int(slots), tokens=int(generated),
                                 seconds=dt, tokens_per_s=generated / dt,
                                 roofline_tokens_per_s=bound,
                                 share_of_roofline=bound and generated / dt / bound)
        print(f"{kind:6s} {B:6d} slots  {generated / dt:12,.0f} tok/s measured   "
              + (f"{bound:12,.0f} roofline ({generated / dt / bound:.0%})" if bw else
                 f"roofline: no published bandwidth for {device.device_kind!r}"), flush=True)
    return out


def main(argv=None):
    from ada.distributed import cpu_only_without_accelerators

    cpu_only_without_accelerators()  # no libtpu start-up noise on a CPU
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--batches", default="8,32,64")
    ap.add_argument("--chunk", type=int, default=16, help="decode steps per jitted chunk")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--skip-hf", action="store_true", help="ada only (no transformers run)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="interleaved timed rounds per contender (the median is reported)")
    ap.add_argument("--device", metavar="MODEL", default=None,
                    help="accelerator mode: dense and paged decode of this known model's "
                    "shapes at the slots that fit (module docstring)")
    ap.add_argument("--prompt", type=int, default=1024, help="--device: prompt tokens")
    ap.add_argument("--new", type=int, default=2048, help="--device: most new tokens")
    ap.add_argument("--page-size", type=int, default=16, help="--device: paged cache's page")
    ap.add_argument("--hbm-gib", type=float, default=None,
                    help="--device: memory to plan for where the device reports none")
    ap.add_argument("--max-slots", type=int, default=1024, help="--device: cap on slots")
    args = ap.parse_args(argv)
    if args.device:
        out = on_device(args.device, args.prompt, args.new, args.chunk, args.page_size,
                        args.hbm_gib, args.max_slots)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return out
    presets = [p for p in args.presets.split(",") if p]
    batches = [int(b) for b in args.batches.split(",") if b]

    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    jax.config.update("jax_default_matmul_precision", "highest")
    ada_tps, hf_tps, compiles, rounds_log, ratios = {}, {}, {}, {}, {}
    paged_tps, paged_ratios = {}, {}
    print(f"devices: {jax.devices()}; torch threads {torch.get_num_threads()}")
    print(f"{'preset':8s} {'batch':>5s} {'ada tok/s':>11s} {'hf tok/s':>10s} {'ratio':>6s} "
          f"{'range':>9s} {'paged tok/s':>12s} {'paged/dense':>11s} {'range':>9s}")
    for name in presets:
        config = preset(name)
        params = init_params(config, jax.random.PRNGKey(0), std=0.1)
        model = None
        if not args.skip_hf:
            with tempfile.TemporaryDirectory() as d:
                save_hf(params, config, d)
                model = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
        ada_tps[name], hf_tps[name], compiles[name], ratios[name] = {}, {}, {}, {}
        paged_tps[name], paged_ratios[name] = {}, {}
        for b in batches:
            run_ada, engine = ada_runner(config, params, b, args.chunk)
            runners = {"ada": run_ada, "paged": ada_runner(config, params, b, args.chunk,
                                                           "paged")[0]}
            if model is not None:
                runners["hf"] = hf_runner(model, config.vocab_size, b)
            rounds = interleaved(runners, args.repeats)
            ada_rounds = np.asarray(rounds["ada"])
            hf_rounds = np.asarray(rounds.get("hf", [np.nan] * args.repeats))
            paired = ada_rounds / hf_rounds
            tps, hf = float(np.median(ada_rounds)), float(np.median(hf_rounds))
            ratios[name][str(b)] = float(np.median(paired))
            ada_tps[name][str(b)], hf_tps[name][str(b)] = tps, hf
            paged = np.asarray(rounds["paged"]) / ada_rounds  # paired, as against transformers
            paged_tps[name][str(b)] = float(np.median(rounds["paged"]))
            paged_ratios[name][str(b)] = float(np.median(paged))
            compiles[name][str(b)] = engine.compiles()
            rounds_log[f"{name}/{b}"] = rounds
            print(f"{name:8s} {b:5d} {tps:11.0f} {hf:10.0f} {ratios[name][str(b)]:6.2f} "
                  f"{paired.min():5.2f}-{paired.max():.2f} {paged_tps[name][str(b)]:12.0f} "
                  f"{paged_ratios[name][str(b)]:11.2f} {paged.min():5.2f}-{paged.max():.2f}",
                  flush=True)

    config = preset("tiny")
    params = init_params(config, jax.random.PRNGKey(0), std=0.1)
    stats, buckets, engine, reqs, out = occupancy(config, params)
    agreement = cross_bucket_agreement(engine, params, reqs, out)
    print(f"mixed-length workload (tiny, 32 slots, 256 requests, 4..128 new tokens): "
          f"occupancy {stats['slot_occupancy']:.3f}, "
          f"compiles {stats['compiles']} (buckets {buckets}), "
          f"{stats['prefilled_prompts']} prompts prefilled for 64 prompts x 4 samples "
          f"in {stats['prefill_calls']} calls, mean attention window "
          f"{stats['attention_window']:.2f} of the cache")
    print(f"cross-bucket agreement (crowd vs alone, 32 responses): {agreement:.3f}")
    ratio = ratios.get("small", {}).get("32")
    paged_ratio = paged_ratios.get("small", {}).get("32")
    print("targets: ratio_b32_small >= 1.5 ->", None if ratio is None else round(ratio, 2),
          "| paged_vs_dense_b32_small >= 0.95 ->",
          None if paged_ratio is None else round(paged_ratio, 2),
          "| occupancy >= 0.9 ->", round(stats["slot_occupancy"], 3),
          "| compiles <= buckets ->",
          all(stats["compiles"][k] <= buckets[k] for k in buckets))
    figures = {
        "tokens_per_s": ada_tps,
        "transformers_tokens_per_s": hf_tps,
        "ratio": ratios,
        "ratio_b32_small": ratio,
        "paged_tokens_per_s": paged_tps,
        "paged_vs_dense": paged_ratios,
        "paged_vs_dense_b32_small": paged_ratio,
        "slot_occupancy": stats["slot_occupancy"],
        "attention_window": stats["attention_window"],
        "compiles": {"throughput": compiles, "mixed_workload": stats["compiles"],
                     "mixed_workload_buckets": buckets},
        "cross_bucket_agreement": agreement,
        "chunk_size": args.chunk,
        "rounds_tokens_per_s": rounds_log,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2, default=float)
    return figures


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
