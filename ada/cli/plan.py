"""`python -m ada.plan` (`ada-plan`): will this run fit this TPU slice, and how fast could it
go at best? The planning itself is ada/planner.py (its docstring says what is compiled and
reported); this is its command line.

    python -m ada.plan --config configs/qwen25_math_7b.py:ada_balance --topology v5e:4x4 \
        [--model qwen2.5-math-7b] [--config.sampling.num_slots=64] [--json plan.json]
    python -m ada.plan --devices 8 --config.mesh.data=-1 [--hbm_gib 16]   # configs/default.py

Exit status: 0 every phase fits (or no HBM to compare with), 1 some phase does not (the JSON
is written), 2 a user error, one `error: ...` line and nothing written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import threading
import time

import jax

from ada import config as cfglib
from ada import paths, planner
from ada.cli import args as cli_args
from ada.config import DEFAULT_CONFIG, ConfigError
from ada.hlo_bytes import explain
from ada.planner import GIB, check_config, fits, make_plan
from ada.tpu import CHIPS, SliceError, parse_topology, tpu_devices


def local_devices() -> tuple[list, float | None]:
    """This process's devices (a GPU's, a TPU VM's, or the CPU) and each one's memory as its
    runtime reports it (None where it reports none: the CPU)."""
    devices = jax.local_devices()
    return devices, (devices[0].memory_stats() or {}).get("bytes_limit")


def cpu_devices(n: int) -> list:
    if n < 1:
        raise ConfigError(f"--devices {n}: give 1 or more fake CPU devices")
    with contextlib.suppress(RuntimeError):  # the backend already started: use what exists
        jax.config.update("jax_num_cpu_devices", n)
    if n > len(jax.devices()):
        raise ConfigError(f"--devices {n}: give 1 to {len(jax.devices())} (jax already runs "
                          "with that many CPU devices; a fresh process can have more)")
    return jax.devices()[:n]


def observed_response_len(workdir: str, last: int = 20) -> int:
    """A run's mean response length in tokens: `response_tokens_mean` over its last `last`
    steps (metrics.jsonl), for planning the paged cache at what the run really draws."""
    path = paths.path(workdir) / "metrics.jsonl"
    try:
        rows = [json.loads(line) for line in paths.read_bytes(path).decode().splitlines()
                if line.strip()]
    except (OSError, ValueError) as e:
        raise ConfigError(f"--run {workdir}: cannot read {path} ({e}); pass a run's workdir "
                          "or set --config.sampling.mean_response_len") from None
    means = [r["response_tokens_mean"] for r in rows if "response_tokens_mean" in r][-last:]
    if not means:
        raise ConfigError(f"--run {workdir}: {path} has no step with response_tokens_mean yet; "
                          "set --config.sampling.mean_response_len")
    return max(1, round(sum(means) / len(means)))


class Progress:
    """What `ada.plan` is compiling, for how long, and how long the last compile of its kind
    took: one line redrawn each second on a terminal, plain lines in a log (a start line, a
    line a minute while it runs, a done line), so a slow compile is not taken for a hang.
    Call it with each program's name as it starts; `close()` after the last."""

    def __init__(self, stream=None, every_s: float | None = None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.every_s = every_s or (1.0 if self.tty else 60.0)
        self.t0 = time.monotonic()
        self.taken: dict[str, float] = {}  # kind -> seconds its last compile took
        self.program = self.kind = None
        self.started = 0.0
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread = None

    @staticmethod
    def kind_of(program: str) -> str:
        return program.split(" at ")[0].split(" (")[0]

    def __call__(self, program: str) -> None:
        self._finish()
        with self.lock:
            self.program, self.kind, self.started = program, self.kind_of(program), time.monotonic()
        self._write(self._line(), final=not self.tty)
        if self.thread is None:
            self.thread = threading.Thread(target=self._tick, daemon=True)
            self.thread.start()

    def close(self) -> None:
        self._finish()
        self.wake.set()

    def _line(self, done: bool = False) -> str:
        now = time.monotonic()
        spent, total = now - self.started, now - self.t0
        expected = self.taken.get(self.kind)
        hint = f", the last one took {_mmss(expected)}" if expected is not None and not done else ""
        if done:
            return f"[ada.plan {_mmss(total)}] compiled {self.program} in {_mmss(spent)}"
        return f"[ada.plan {_mmss(total)}] compiling {self.program}: {_mmss(spent)} so far{hint}"

    def _finish(self) -> None:
        with self.lock:
            if self.program is None:
                return
            self._write(self._line(done=True), final=True)
            self.taken[self.kind] = time.monotonic() - self.started
            self.program = None

    def _tick(self) -> None:
        while not self.wake.wait(self.every_s):
            with self.lock:
                if self.program is not None:
                    self._write(self._line(), final=not self.tty)

    def _write(self, line: str, final: bool) -> None:
        if self.tty:  # redraw in place; a finished line stays
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        elif final:
            self.stream.write(line + "\n")
        self.stream.flush()


def _mmss(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


def bytes_line(b: dict | None, what: str) -> str:
    """One phase's bytes beside its floor, as a report line."""
    if not b:
        return f"             {what}: -"
    fl, chunk = b["floor"], b.get("chunk_hbm_bytes_per_step")
    how = (f" (one step alone {b['probe_hbm_bytes'] / 1e9:.2f}, in the chunk "
           f"{chunk / 1e9:.2f} per step)" if chunk else "")
    return (f"             {what}: {b['hbm_bytes'] / 1e9:.2f} GB in HBM{how} vs a floor of "
            f"{b['floor_bytes'] / 1e9:.2f} (weights {fl['weights'] / 1e9:.2f} + KV "
            f"{fl['kv'] / 1e9:.2f} + logits {fl['logits'] / 1e9:.2f}): {b['hbm_vs_floor']:.2f}x;"
            f" the compiler's count over all memory spaces {b['compiler_bytes'] / 1e9:.2f} GB "
            f"({b['compiler_vs_floor']:.2f}x); {b['bound']} bind")


def memory_lines(mem: dict, hbm: float | None) -> list[str]:
    """The memory ledger (ada/memory.py): per phase, GiB per chip and what holds it (a split
    run's per role, each on its own chips)."""
    gib = lambda b: f"{b / GIB:.2f}"
    out = [f"memory per chip, phase by phase ({mem['kv_cache']} cache, {mem['attention']} "
           f"attention; {mem['policy']}):"]
    for role, ledger in mem.get("meshes", {"": mem}).items():
        if role:
            out.append(f"  the {role}'s chips:")
        for name, ph in ledger["phases"].items():
            parts = ", ".join(f"{k.replace('_', ' ')} {gib(v)}" for k, v in sorted(
                ph["parts"].items(), key=lambda kv: -kv[1]))
            verdict = "" if hbm is None else "  fits" if ph["fits"] else "  DOES NOT FIT"
            out.append(f"  {name:8s} {gib(ph['bytes_per_chip']):>7s}  {parts}{verdict}")
    if hbm and mem.get("staging_beside_collection_bytes", 0) > hbm:
        out.append(f"  note: a save's staging copy still on the chip when the next collection "
                   f"starts would take it to {gib(mem['staging_beside_collection_bytes'])} GiB; "
                   "the plan assumes the copy to the host ends before it")
    out.append(f"  peak: {mem['peak_phase']}"
               + (f" on the {mem['peak_mesh']}'s chips" if mem.get("peak_mesh") else "")
               + f" ({gib(mem['peak_bytes'])} GiB per chip)"
               + (f"; paged gather attention carries a dense window per layer "
                  f"({gib(mem['gather_windows_bytes'])} GiB) through generate"
                  if mem.get("gather_windows_bytes") else ""))
    return out


def report(p: dict, hbm: float | None, explain_top: int = 0) -> str:
    """The plan as text; `explain_top`: and the heaviest op groups of the decode step and the
    prefill (`--explain`)."""
    gib = lambda b: "-" if b is None else f"{b / GIB:.2f}"
    out = [f"{p['model']} on {p['where']}: {p['devices']} devices, {p['hosts']} host(s)"
           f" of {p['chips_per_host']}; train mesh {p['train_mesh']}, sampling mesh per "
           f"host {p['sampling_mesh']}",
           f"{'GiB/device':47s} {'args':>7s} {'out':>7s} {'temp':>7s} {'peak':>7s} {'+ held':>7s}"]
    if lo := p.get("lora"):
        out.append(f"LoRA rank {lo['rank']}: {lo['handoff_bytes_per_update'] / 2**20:.1f} MiB of "
                   f"adapters per update to a sampler on its own devices, against "
                   f"{gib(lo['full_handoff_bytes'])} GiB of merged weights a full hand-off "
                   f"moves; frozen base {gib(lo['base_bytes'])} GiB (whole model)")
    for name, f in p["phases"].items():
        out.append(f"{name:8s} {f['shape']:38s} {gib(f['arguments_bytes']):>7s} "
                   f"{gib(f.get('outputs_bytes')):>7s} {gib(f.get('temp_bytes')):>7s} "
                   f"{gib(f['peak_bytes']):>7s} {gib(f.get('held_bytes')):>7s}"
                   + ("" if hbm is None else "  fits" if fits(f, hbm) else "  DOES NOT FIT"))
    if mem := p.get("memory"):
        out += memory_lines(mem, hbm)
    if p["max_num_slots"] is not None:
        out.append(f"max num_slots: {p['max_num_slots']} ({p['max_num_slots_method']})")
    if pg := p.get("paged"):
        out.append(f"paged KV cache (sampling.kv_cache=paged, page {pg['page_size']}), "
                   f"counting pages only: {pg['mean_fill_slots']} slots per host fit at a mean response of "
                   f"{pg['mean_response_len']:g} tokens ({pg['mean_from']}), "
                   f"{pg['ratio']:.1f}x the {pg['worst_case_slots']} of the worst case "
                   "(every slot reserving the whole window; pages split over data with the "
                   "slots)")
        if "pool_bytes_per_chip_full_reservation" in pg:
            dense = p["dense"]["cache_bytes_per_chip"]
            out.append(f"  compiled ({pg['attention']} attention): the paged decode state at "
                       f"{p['num_slots']} slots, every slot's worst case reserved, takes "
                       f"{gib(pg['pool_bytes_per_chip_full_reservation'])} GiB per chip "
                       f"against the dense cache's {gib(dense)} "
                       f"({pg['pool_bytes_per_chip_full_reservation'] / dense:.2f}x)")
            windows = (" (with gather attention each slot also carries a dense window per "
                       "layer, which counting pages leaves out)" if pg["attention"] == "gather"
                       else "")
            out.append(f"  compiled at the mean fill, the count that holds{windows}: " + (
                f"{pg['max_slots_at_mean_fill']} slots per host with {pg['mean_fill_num_pages']:,} "
                f"pages fit (peak {gib(pg['mean_fill_peak_bytes'])} GiB + held), "
                f"{pg['max_slots_at_mean_fill'] / p['dense']['max_slots']:.1f}x the dense "
                f"cache's {p['dense']['max_slots']}" if pg["max_slots_at_mean_fill"] else
                "no count near the planned one fit (four compiles)"))
    if b := p.get("buckets"):
        out.append(f"buckets: {b['collectives']} collectives between chips and {b['copies']} "
                   f"copies on a chip of a cache-sized buffer over the {b['programs']} "
                   "programs of every bucket, dense and paged"
                   + "".join(f"\n  {m}" for m in b["found"]))
    if e := p.get("estimate"):
        f = lambda key, spec, scale=1: "-" if e[key] is None else format(e[key] * scale, spec)
        out += ["ESTIMATE (roofline bound from the compiler's costs, not measured; '-': no fit):",
                f"  train step >= {f('train_step_s', '.2f')} s, MFU <= {f('train_mfu', '.0%')}",
                f"  decode     <= {f('decode_tokens_per_s_per_chip', ',.0f')} tokens/s/chip at "
                f"{e['decode_num_slots']} slots (attending to the whole cache)",
                bytes_line(e.get("decode_bytes"), "bytes/step/chip"),
                *([f"             ICI: {e['decode_ici']['count']} collectives/step "
                   f"({', '.join(f'{n} {op}' for op, n in e['decode_ici']['by_op'].items())}), "
                   f"{e['decode_ici']['ici_bytes'] / 1e6:,.1f} MB/chip over ICI, "
                   f"{e['decode_ici']['seconds'] * 1e6:,.0f} us at "
                   f"{e['decode_ici']['bytes_per_s'] / 1e9:,.0f} GB/s; with it added: <= "
                   f"{e['decode_tokens_per_s_per_chip_with_ici']:,.0f} tokens/s/chip"]
                  if e.get("decode_tokens_per_s_per_chip_with_ici") else []),
                *([f"  paged      <= {e['paged']['tokens_per_s_per_chip']:,.0f} tokens/s/chip at "
                   f"{e['paged']['num_slots']} slots per host at the mean fill (analytic: the "
                   f"weights, {e['paged']['kv_bytes'] / 1e9:.2f} GB of pages read and the "
                   f"logits, {e['paged']['bytes'] / 1e9:.2f} GB/step/chip; "
                   f"{e['paged']['bound']} bind)"] if e.get("paged") else []),
                f"  prefill    <= {f('prefill_tokens_per_s_per_chip', ',.0f')} tokens/s/chip",
                bytes_line(e.get("prefill_bytes"), "bytes/call/chip"),
                f"  reshard    >= {f('reshard_s', '.1f', 1e3)} ms (HBM traffic only)"]
        if d := p.get("disaggregated"):
            b = d["best"]
            out += [f"  stream, disaggregated (ada/stream.py), a step of {d['tokens_per_step']:,.0f}"
                    " sampled tokens (the budget M x N per prompt at the planned mean response;"
                    " --run for a run's):",
                    f"    colocated, synchronous: >= {d['colocated_step_s']:.2f} s/step "
                    f"(sampling {d['sample_chip_s']:,.0f} + training {d['train_chip_s']:,.0f} "
                    f"chip-seconds over {p['devices']} chips, training from {d['train_from']}; "
                    f"balanced at {d['balanced_sampler_share']:.0%} of the chips sampling)"]
            for sp in d["splits"]:
                what = (f"{sp['n']} of {p['chips_per_host']} chips per host sample "
                        "(rl.sampler_devices)" if sp["kind"] == "chips per host" else
                        f"{sp['n']} of {p['hosts']} hosts sample (planned only)")
                out.append(
                    f"    {what}: >= {sp['step_s']:.2f} s/step (sampler {sp['sample_s']:.2f} s "
                    f"on {sp['sampler_chips']} chips, trainer {sp['train_s']:.2f} s on "
                    f"{sp['trainer_chips']}); GiB/chip trainer {gib(sp['trainer_peak_bytes'])}"
                    f" (scaled), sampler {gib(sp['sampler_peak_bytes'])}"
                    + ("" if sp["fits"] else "  DOES NOT FIT") + ("  <- best" if sp is b else ""))
            if b:
                out.append(f"    best: {b['step_s'] / d['colocated_step_s']:.2f}x the colocated "
                           "bound (a roofline cannot see the drain the stream removes)")
            else:
                out.append("    no split of this slice fits" + (
                    f": the trainer alone needs >= {d['trainer_chips_needed']} chips (its "
                    "train step's peak, scaled); plan a larger slice" if d["trainer_chips_needed"]
                    else ""))
        if explain_top:
            for what, fig in (("decode step", dict(ops=e.get("decode_ops") or [])),
                              ("prefill", p["phases"]["prefill"])):
                out += [f"{what}: the heaviest ops by HBM bytes per chip (XLA's cost model op "
                        "by op; 'all' adds on-chip memory)"] + explain(fig, explain_top)
    if hbm is not None:
        out.append(f"verdict: {'FITS' if p['fits'] else 'DOES NOT FIT'} {hbm / GIB:g} GiB/chip")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = cli_args.Parser(prog="python -m ada.plan", description=planner.__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="configs/FILE.py[:arg]")
    on = ap.add_mutually_exclusive_group()  # neither: this machine's own devices
    on.add_argument("--topology", help="a TPU slice, e.g. v5e:4x4: the real TPU compiler "
                    "(no TPU needed)")
    on.add_argument("--devices", type=int, help="N fake CPU devices: XLA:CPU (default: this "
                    "machine's devices, a GPU's or a TPU VM's, with their compiler and memory)")
    ap.add_argument("--model", help="a known model's shapes (ada/models/known.py) instead")
    ap.add_argument("--hbm_gib", type=float, help="HBM to compare with (default: the chip's)")
    ap.add_argument("--json", help="write the plan to this file")
    ap.add_argument("--run", metavar="WORKDIR", help="plan the paged cache's slots at this run's "
                    "observed mean response length (its metrics.jsonl) when "
                    "sampling.mean_response_len is 0")
    ap.add_argument("--no_train_estimate", action="store_true", help="skip the train step's "
                    "roofline (its probe compiles take most of a plan's time)")
    ap.add_argument("--explain", type=int, nargs="?", const=15, default=0, metavar="N",
                    help="also list the decode step's and the prefill's N heaviest op groups "
                         "by HBM bytes (default 15), from the optimized programs")
    ap.add_argument("--buckets", action="store_true", help="also compile every bucket of the "
                    "dense and the paged sampler (generate at each slot and window bucket, "
                    "prefill, insert / attach) and count the cache-sized moves between chips")
    try:
        overrides, rest = cfglib.parse_override_args(sys.argv[1:] if argv is None else argv)
        args = ap.parse_args(rest)
        config = cfglib.build_config(args.config, overrides)
        model_cfg = check_config(config, args.model)
        if args.run and not config.sampling.mean_response_len:
            config.sampling.mean_response_len = observed_response_len(args.run)
        chip = args.topology and parse_topology(args.topology)
        if args.hbm_gib is not None and args.hbm_gib <= 0:
            raise ConfigError(f"--hbm_gib {args.hbm_gib:g}: give the GiB per chip, above 0")
        hbm = (args.hbm_gib or (CHIPS[chip][1] if chip else 0)) * GIB or None
        if chip or args.devices is not None:
            with contextlib.suppress(RuntimeError):  # the host's backend: the TPUs only compile
                jax.config.update("jax_platforms", "cpu")
        if chip:
            (devices, host), where = tpu_devices(args.topology), args.topology
        elif args.devices is not None:
            devices = host = cpu_devices(args.devices)
            where = f"{args.devices} CPU devices"
        else:
            devices, limit = local_devices()
            host, hbm = devices, hbm or limit
            where = f"{len(devices)} local {devices[0].device_kind} device(s)"
        progress = Progress()
        try:
            p = make_plan(config, model_cfg, devices, host, where, chip, hbm, progress,
                          not args.no_train_estimate, args.buckets)
        finally:
            progress.close()
    except (ConfigError, SliceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.run and p.get("paged") and p["paged"]["mean_from"] == "sampling.mean_response_len":
        p["paged"]["mean_from"] = f"observed over the last steps of {args.run}"
    p.update(model=args.model or os.path.basename(config.model.path.rstrip("/"))
             or f"{config.model.preset} {model_cfg.family}", topology=args.topology, where=where,
             config=args.config, overrides=dict(overrides), hbm_bytes=hbm, chip=chip and dict(
                 zip(("name", "peak_flops", "hbm_gib", "bytes_per_s"), (chip, *CHIPS[chip]),
                     strict=True)))
    print(report(p, hbm, args.explain))
    if hbm and p["num_slots"] > p["max_num_slots"]:
        print(f"error: sampling.num_slots={p['num_slots']} does not fit {hbm / GIB:g} GiB per "
              f"chip beside the train state, at most {p['max_num_slots']} do: pass --config."
              f"sampling.num_slots={p['max_num_slots']}" + " (and raise sampling.mesh tensor or "
              "mesh.fsdp: no slot fits)" * (not p["max_num_slots"]), file=sys.stderr)
        return 2
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(p, indent=2))
    return 1 if p["fits"] is False else 0
