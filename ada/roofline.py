"""How fast a compiled program could go at best, and how far its bytes are from the least it
must move: the roofline of ada.plan's phases on a TPU chip (peak FLOP/s and HBM bandwidth,
ada.tpu.CHIPS), and the analytic floors of decode and prefill (weights read once, the KV
cache read at the planned fill or written once, the logits) that the compiled programs' HBM
bytes (ada.hlo_bytes) are put beside. Nothing here compiles: ada.planner does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from ada import sharding as shd
from ada.models.paged_attention import kernel_read_bytes, page_bytes, tuned_blocks
from ada.rl import train as rl
from ada.tpu import CHIPS, ICI_BYTES_PER_S

# the kernel table's device names (ragged_paged_attention's tuned block sizes)
DEVICE_KINDS = {"v4": "TPU v4", "v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite"}


def device_bytes(tree, shardings=None) -> int:
    """Bytes of one device's shards of an abstract tree (by default under its own shardings)."""
    shardings = jax.tree.map(lambda x: x.sharding, tree) if shardings is None else shardings
    sizes = jax.tree.map(lambda x, sh: math.prod(sh.shard_shape(x.shape)) * x.dtype.itemsize,
                         tree, shardings)
    return int(sum(jax.tree.leaves(sizes)))


def with_shardings(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)

def weights_read(params) -> int:
    """Bytes per device one forward reads of the weights: all of them, but an embedding
    beside an `lm_head` only for the rows it gathers (left out: a few rows)."""
    return device_bytes({k: v for k, v in params.items() if k != "embed" or "lm_head" not in params})


def decode_floor(engine, params, window: int) -> dict:
    """The least HBM traffic of one decode step per device (bytes): the weights read once,
    every slot's keys and values read once up to `window` (the planned fill), and the
    [slots, V] float32 logits written once and read once by the sampler."""
    state = engine.abstract_state()
    floor = dict(weights=weights_read(params),
                 kv=device_bytes((state.cache.k, state.cache.v)) * window // engine.cache_len,
                 logits=2 * device_bytes(state.logits))
    return dict(floor, total=sum(floor.values()), window=window)


def prefill_floor(engine, params, rows: int, prompt_len: int) -> dict:
    """The least HBM traffic of one prefill call per device (bytes): the weights read once,
    the [rows, prompt_len] keys and values written once (split like the decode cache), and
    the last position's logits written once."""
    c, mesh = engine.config, engine.mesh
    kv_shape = (rows, c.num_kv_heads, prompt_len, c.head_dim)
    kv = jax.ShapeDtypeStruct(kv_shape, c.compute_dtype, sharding=NamedSharding(
        mesh, shd.spec_for(("batch", "kv_heads", "seq", "head_dim"), kv_shape, mesh)))
    logits = jax.ShapeDtypeStruct((rows, c.vocab_size), jnp.float32, sharding=NamedSharding(
        mesh, shd.spec_for(("batch", "vocab"), (rows, c.vocab_size), mesh)))
    floor = dict(weights=weights_read(params), kv=2 * c.num_layers * device_bytes(kv),
                 logits=device_bytes(logits))
    return dict(floor, total=sum(floor.values()))

def paged_estimate(paged: dict, engine, params, probe: dict, chip: str) -> dict:
    """The decode roofline at the paged slot count (the compiled mean-fill count where the
    plan has one), analytic (the kernel hides its reads from the compiler's count): the weights once, the pages the kernel reads at the mean fill
    (whole page blocks, `kernel_read_bytes`) and the logits; the flops of the dense probe
    (every slot attending to the whole cache) scaled to these slots, an upper bound."""
    c, mesh = engine.config, engine.mesh.shape
    host = paged.get("max_slots_at_mean_fill") or paged["mean_fill_slots"]  # compiled, or planned
    slots = host // mesh["data"]  # each chip's share of the KV reads
    page = paged["page_size"]
    blocks, _ = tuned_blocks(c, page, slots, -(-engine.cache_len // page),
                             device_kind=DEVICE_KINDS[chip], kv_head_shards=mesh["tensor"])
    kv = kernel_read_bytes([engine.max_prompt_len + paged["mean_response_len"]] * slots, page,
                           blocks, page_bytes(c, page, kv_head_shards=mesh["tensor"]))
    total = weights_read(params) + kv + 2 * 4 * slots * -(-c.vocab_size // mesh["tensor"])
    flops = probe["flops"] * slots / (probe["num_slots"] // mesh["data"])
    peak, _, bandwidth = CHIPS[chip]
    chips = mesh["data"] * mesh["tensor"]  # a step makes a token per slot of the host
    return dict(num_slots=host, bytes=total, kv_bytes=kv,
                tokens_per_s_per_chip=host / chips
                / max(flops / peak, total / bandwidth),
                bound="flops" if flops / peak > total / bandwidth else "bytes")


def step_bytes(fig: dict) -> float:
    """The bytes a phase's roofline charges to HBM bandwidth: with a floor (decode and prefill),
    the larger of the floor and the program's HBM bytes (`hlo_op_bytes`); else the compiler's
    `bytes accessed` (every memory space)."""
    if "floor" in fig:
        return max(fig["floor"]["total"], hbm_per_step(fig))
    return fig["bytes_accessed"]


def hbm_per_step(fig: dict) -> float:
    """A phase's HBM bytes per call (decode: per step, the larger of the one-step probe and
    the chunk's own per-step figure, `chunk_hbm_bytes_per_step`)."""
    return max(fig.get("hbm_bytes_per_step", fig.get("hbm_bytes", fig["bytes_accessed"])),
               fig.get("chunk_hbm_bytes_per_step", 0.0))


def roofline_s(fig: dict, chip: str) -> float | None:
    """Seconds at the chip's peak FLOP/s or HBM bandwidth, whichever binds (None: no compile)."""
    peak, _, bandwidth = CHIPS[chip]
    return max(fig["flops"] / peak, step_bytes(fig) / bandwidth) if "flops" in fig else None


def bytes_vs_floor(fig: dict, chip: str) -> dict:
    """A phase's bytes beside its floor: the program's HBM bytes, the compiler's count over
    every memory space, their ratios to the floor, and which of flops and bytes binds."""
    floor, hbm = fig["floor"]["total"], hbm_per_step(fig)
    peak, _, bandwidth = CHIPS[chip]
    return dict(floor_bytes=floor, floor=fig["floor"], hbm_bytes=hbm,
                probe_hbm_bytes=fig.get("hbm_bytes_per_step", fig.get("hbm_bytes")),
                chunk_hbm_bytes_per_step=fig.get("chunk_hbm_bytes_per_step"),
                compiler_bytes=fig["bytes_accessed"], hbm_vs_floor=hbm / floor,
                compiler_vs_floor=fig["bytes_accessed"] / floor,
                bound="flops" if fig["flops"] / peak > step_bytes(fig) / bandwidth else "bytes")


def ici(fig: dict, chip: str) -> dict | None:
    """A phase's collectives between chips (ada.hlo_bytes.collectives: one call; decode's
    probe is one step) and their time at the chip's ICI bandwidth, latency left out."""
    if "collectives" not in fig:
        return None
    c = fig["collectives"]
    return dict(c, seconds=c["ici_bytes"] / ICI_BYTES_PER_S[chip],
                bytes_per_s=ICI_BYTES_PER_S[chip])


def estimate(p: dict, model_cfg, chip: str, decode: dict) -> dict:
    """The roofline bounds of the plan's phases. Decode's is given twice: at the larger of
    its flops and HBM times, and with its ICI collectives' time added (no overlap assumed)."""
    t, prefill, host = p["phases"]["train"], p["phases"]["prefill"], p["chips_per_host"]
    rate = lambda tokens, s: s and tokens / host / s
    decode_ici = ici(decode, chip)
    decode_s = roofline_s(decode, chip)
    train_s = (s := roofline_s(t.get("probe", {}), chip)) and s * p["epochs"] * t["mini_batches"] \
        * t["micro_batches"]
    model_flops = (rl.train_flops_per_token(model_cfg, t["seq_len"]) * t["rows"] * t["seq_len"]
                   * p["epochs"] / p["devices"])
    return {"decode_tokens_per_s_per_chip": rate(decode["num_slots"], decode_s),
            "decode_num_slots": decode["num_slots"],
            "decode_ici": decode_ici,
            "decode_tokens_per_s_per_chip_with_ici": decode_ici and decode_s and rate(
                decode["num_slots"], decode_s + decode_ici["seconds"]),
            "decode_bytes": "floor" in decode and bytes_vs_floor(decode, chip) or None,
            "decode_ops": decode.get("ops"),
            "prefill_tokens_per_s_per_chip": rate(prefill["rows"] * prefill["prompt_len"],
                                                  roofline_s(prefill, chip)),
            "prefill_bytes": "floor" in prefill and bytes_vs_floor(prefill, chip) or None,
            "train_step_s": train_s,
            "train_mfu": train_s and model_flops / (train_s * CHIPS[chip][0]),
            # the model's own flops at the chip's peak: a looser bound, with no compile
            "train_step_flops_s": model_flops / CHIPS[chip][0],
            "reshard_s": roofline_s(p["phases"]["reshard"], chip)}


def disaggregated(p: dict, tokens_per_step: float, hbm: float | None) -> dict | None:
    """The stream's disaggregated layout (ada/stream.py): some chips sample, the others
    train, each role on its own. Two kinds of split: N chips of every host sample
    (rl.sampler_devices = N, what ada runs today, in one process), or whole hosts sample and
    the others train (planned only: a multi-process split is not built). From the plan's
    estimate, in chip-seconds per step: sampling `tokens_per_step` at the decode bound, and
    the train step's bound (compiled, else the model's flops at the chip's peak) times the
    chips it ran on; both scale as 1 / chips (data parallel). The synchronous colocated step
    takes their sum over every chip; a split one the slower role's, so the best split
    balances them: the bound is then never below the colocated one (the stream's gain is
    the drain a real synchronous step pays, which no roofline sees), and the split costs its
    rounding to whole chips or hosts. Memory per role is scaled from the compiled figures,
    not compiled: the train step's peak over the trainer chips (its state and batch split
    over fewer), generate's peak without the train state beside it. None without the
    estimate's train and decode bounds."""
    e = p.get("estimate") or {}
    rate = e.get("decode_tokens_per_s_per_chip")
    train_s = e.get("train_step_s") or e.get("train_step_flops_s")
    if not rate or not train_s:
        return None
    chips, hosts, per_host = p["devices"], p["hosts"], p["chips_per_host"]
    sample_cs, train_cs = tokens_per_step / rate, train_s * chips  # chip-seconds
    reshard = e.get("reshard_s") or 0.0
    tensor = p["sampling_mesh"]["tensor"]
    ph = p["phases"]
    train_peak = ph["train"]["peak_bytes"] * chips
    candidates = [("chips per host", n, n * hosts) for n in range(tensor, per_host, tensor)]
    candidates += [("hosts", h, h * per_host) for h in range(1, hosts)]
    splits = []
    for kind, n, samplers in candidates:
        trainers = chips - samplers
        s, t = sample_cs / samplers, train_cs / trainers
        splits.append(dict(kind=kind, n=n, sampler_chips=samplers, trainer_chips=trainers,
                           sample_s=s, train_s=t, step_s=max(s, t) + reshard,
                           trainer_peak_bytes=train_peak / trainers,
                           sampler_peak_bytes=ph["generate"]["peak_bytes"],
                           fits=hbm is None or (train_peak / trainers <= hbm
                                                and ph["generate"]["peak_bytes"] <= hbm)))
    fitting = [sp for sp in splits if sp["fits"]]
    return dict(tokens_per_step=tokens_per_step, sample_chip_s=sample_cs, train_chip_s=train_cs,
                train_from="the compiled train step" if e.get("train_step_s") else
                "the model's flops at peak (--no_train_estimate)",
                colocated_step_s=(sample_cs + train_cs) / chips + reshard,
                best=min(fitting, key=lambda sp: sp["step_s"], default=None), splits=splits,
                balanced_sampler_share=sample_cs / (sample_cs + train_cs),
                trainer_chips_needed=hbm and math.ceil(train_peak / hbm))
