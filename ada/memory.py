"""What a run holds on each chip, phase by phase: the memory ledger `ada.plan` reports
(`memory` in its JSON) and tests/test_memory.py holds to the live arrays of a real run.

A part is *resident* (an array that lives across a phase boundary: the train state, the
sampler's weights, its decode state) or *transient* (only while a program runs: a
program's temporaries, the train batch). Resident parts are exact, from the abstract
shapes and shardings the run uses (`roofline.device_bytes`); transient parts come from
the compiled programs (the planner's figures) and are 0 when not compiled. Two parts are
bounds: the prefix caches (the dense driver's LRU holds at most `PREFIX_CACHE_SIZE`
prefill rows at the longest prompt bucket; the paged driver keeps prompts in its pool, so
only their next-token logits) and a save's staging copy (orbax copies the slices a chip
writes on the chip first; it lives until the write to the host ends, on a pod well within
the next collection, and is counted in the save phase).

The run's policy (ada/stream.py, `Driver.release`), colocated sampler:
  - a driver's decode state is born at its first fill (sharded, `init_decode_state`); when
    a batch is handed out with no cohort left sampling (always at rl.max_staleness = 0)
    the driver frees it, its prefix caches and its weights until the update's hand-off
    brings new ones, and after an eval with nothing in flight it frees the decode state;
  - with cohorts in flight (k >= 1, while later steps sample) the sampler keeps its
    weights, decode state and prefix caches through the update; the hand-off swaps the
    weights and drops the prefills the old ones made (both transient in that phase);
  - eval samples through the stream's driver (the same engine) or, with another
    temperature or length, through a driver of its own engine that shares the stream's
    weights: a second decode state, never a second copy of the weights;
  - the KL reference (loss.kl_coef > 0) is a second copy of the train params (none under
    LoRA: the reference is the frozen base the train params hold).
A phase's resident parts are what the chips hold through it: the prefill, generate and eval
phases' are what the sampler holds before it frees them (tests/test_memory.py measures them
there), the other phases' what `loop.train`'s boundary after the phase finds.

With rl.sampler_devices = N (`split_ledger`) the trainer's chips hold the train state (a
save's staging copy, the update's and the hand-off cast's temporaries) and the sampler's its
weights, decode state and prefix caches through every phase (under LoRA also the frozen
base its merges start from); a hand-off's new weights wait there beside the old until the
sampler takes them between two chunks (taking them empties its prefix LRU, the old weights'
prefills, which the next cohort fills again; after the last hand-off nothing does), and eval
samples on a driver of its own: a second copy of the weights, a decode state and prefix
caches while it runs.
"""

from __future__ import annotations

import jax

from ada import sharding as shd
from ada.config import train_config
from ada.models import lora
from ada.models.paged_attention import page_bytes
from ada.rl import train as rl
from ada.roofline import device_bytes
from ada.sampling.backends import eval_sampling, make_engine
from ada.stream import nbytes

PREFIX_CACHE_SIZE = 64  # the Driver's prefix_cache_size: prefill rows (dense) kept between rounds
PHASES = ("init", "prefill", "generate", "update", "handoff", "eval", "save")
# Which resident parts each phase holds, by whether cohorts stay in flight through the
# update (k >= 1); `None`: every phase holds the train state (and reference).
_SAMPLER = ("sampler_weights", "decode_state", "prefix_caches")
_HOLDS = {
    "init": ("sampler_weights",),
    "prefill": _SAMPLER,
    "generate": _SAMPLER,
    "handoff": ("sampler_weights",),
    "eval": ("sampler_weights", "decode_state", "eval_decode_state", "prefix_caches"),
    "save": ("sampler_weights", "checkpoint_staging"),
}
_TRANSIENT = {"prefill": ("prefill_temporaries",),
              "generate": ("generate_temporaries", "gather_windows"),
              "update": ("train_batch", "update_temporaries"),
              "handoff": ("handoff_temporaries", "old_sampler_weights", "old_prefix_caches"),
              "eval": ("eval_generate_temporaries", "gather_windows")}
# Split runs (rl.sampler_devices = N): what each role's chips hold in every phase (the
# sampler's decode state is born at its first fill).
_TRAINER = ("train_params", "optimizer_state", "reference_params")
_SPLIT_HOLDS = {
    "trainer": dict({n: _TRAINER for n in PHASES}, save=_TRAINER + ("checkpoint_staging",)),
    "sampler": dict({n: _SAMPLER + ("frozen_base",) for n in PHASES},
                    init=("sampler_weights", "frozen_base"),
                    eval=_SAMPLER + ("frozen_base", "eval_sampler_weights", "eval_decode_state",
                                     "eval_prefix_caches"))}
_SPLIT_TRANSIENT = {
    "trainer": {"update": _TRANSIENT["update"], "handoff": ("handoff_temporaries",)},
    "sampler": {"prefill": _TRANSIENT["prefill"], "generate": _TRANSIENT["generate"],
                "handoff": ("old_sampler_weights",), "eval": _TRANSIENT["eval"]}}


def temporaries(fig: dict | None, arguments: int) -> int:
    """A compiled program's bytes beyond its resident `arguments` (its peak less them)."""
    if not fig or "peak_bytes" not in fig:
        return 0
    return max(int(fig["peak_bytes"]) - int(arguments), 0)


def prefix_bound(engine, kept: int = 0) -> int:
    """Bytes per chip the driver's prompt LRU can hold: `PREFIX_CACHE_SIZE` prefill rows at
    the longest prompt bucket (dense_host: the LRU is bounded in rows; a prefill call larger
    than that is kept whole), or, paged, only their next-token logits (prompts live in the
    pool), for the LRU's prompts and the `kept` prompts of the cohorts still sampling."""
    c = engine.config
    shards, tensor = ((engine.mesh.shape["data"], engine.mesh.shape["tensor"])
                      if engine.mesh is not None else (1, 1))
    rows = max(PREFIX_CACHE_SIZE, engine.row_buckets[-1])
    if getattr(engine, "page_size", None):  # rows on their data shard (PagedEngine.prefill)
        return (rows + kept) * c.vocab_size * 4 // shards
    # the dense prefill's rows are on every data shard, its KV heads split over tensor
    kv = page_bytes(c, rows * engine.max_prompt_len,
                    kv_head_shards=tensor if c.num_kv_heads % tensor == 0 else 1)
    return kv + rows * c.vocab_size * 4


def resident_parts(model_cfg, train_cfg, fns, engine, eval_engine=None, kl: bool = False,
                   kept_prompts: int = 0, split: bool = False) -> dict[str, int]:
    """Bytes per chip of each resident part (module doc), from abstract shapes. `split`:
    the sampler on chips of its own (under LoRA it holds the frozen base there)."""
    state = rl.abstract_state(model_cfg, train_cfg)
    params = device_bytes(state.params, fns.state_sharding.params)
    stacked = state.params
    sampler = jax.eval_shape(engine._sampling_fn, stacked)
    frozen = lora.split(stacked)[1] if split and train_cfg.lora.rank else {}
    return {
        "frozen_base": device_bytes(frozen, shd.param_shardings(frozen, engine.mesh)) if frozen
        else 0,
        "train_params": params,
        "optimizer_state": device_bytes(state, fns.state_sharding) - params,
        "reference_params": params if kl else 0,
        "sampler_weights": device_bytes(sampler, engine.param_shardings(stacked)),
        "decode_state": device_bytes(engine.abstract_state()),
        "prefix_caches": prefix_bound(engine, kept_prompts),
        "checkpoint_staging": checkpoint_staging(state, fns.state_sharding),
        "eval_decode_state": (device_bytes(eval_engine.abstract_state())
                              if eval_engine is not None and eval_engine is not engine else 0),
    }


def _phases(resident: dict, transient: dict, holds: dict, transients: dict,
            hbm: float | None) -> dict:
    """Per phase: the parts it holds (bytes per chip), their resident sum, its peak
    (`bytes_per_chip`: resident + transient) and the peak phase."""
    phases = {}
    for name in PHASES:
        parts = {p: resident.get(p, 0) for p in holds.get(name, ())}
        parts.update({p: transient.get(p, 0) for p in transients.get(name, ())})
        parts = {p: int(b) for p, b in parts.items() if b}
        total = sum(parts.values())
        phases[name] = dict(bytes_per_chip=total, parts=parts, resident_bytes=total - sum(
            parts.get(p, 0) for p in transients.get(name, ())))
        if hbm:
            phases[name]["fits"] = total <= hbm
    peak = max(phases, key=lambda n: phases[n]["bytes_per_chip"])
    return dict(phases=phases, peak_phase=peak, peak_bytes=phases[peak]["bytes_per_chip"])


def ledger(resident: dict[str, int], transient: dict[str, int], in_flight: bool,
           hbm: float | None = None) -> dict:
    """The colocated ledger (`_phases`). `in_flight`: cohorts stay in flight through the
    update (rl.max_staleness >= 1, module doc)."""
    own_eval = resident.get("eval_decode_state", 0) > 0
    holds = dict(_HOLDS, update=_SAMPLER if in_flight else ())
    if in_flight:
        holds["handoff"] += ("decode_state",)  # the cohorts in flight keep their slots
        holds["save"] += ("decode_state", "prefix_caches")
        transient = dict(transient, old_sampler_weights=resident["sampler_weights"],
                         old_prefix_caches=resident["prefix_caches"])
    elif own_eval:
        # the stream's decode state was freed
        holds["eval"] = ("sampler_weights", "eval_decode_state", "prefix_caches")
    holds = {name: _TRAINER + holds.get(name, ()) for name in PHASES}
    out = _phases(resident, transient, holds, _TRANSIENT, hbm)
    # if a save's copy to the host outlasted the save into the next collection
    overlap = resident.get("checkpoint_staging", 0) + max(
        out["phases"][n]["bytes_per_chip"] for n in ("prefill", "generate"))
    return dict(out, staging_beside_collection_bytes=overlap,
                policy="cohorts in flight keep the sampler through the update" if in_flight
                else "the sampler frees its decode state and weights before the update")


def split_ledger(resident: dict[str, int], transient: dict[str, int],
                 hbm: float | None = None) -> dict:
    """rl.sampler_devices = N (module doc): a ledger per role, each on its own chips
    (`meshes`: trainer, sampler), and the larger peak."""
    resident = dict(resident, eval_sampler_weights=resident["sampler_weights"],
                    eval_decode_state=resident["eval_decode_state"] or resident["decode_state"],
                    eval_prefix_caches=resident["prefix_caches"])
    transient = dict(transient, old_sampler_weights=resident["sampler_weights"])
    meshes = {role: _phases(resident, transient, _SPLIT_HOLDS[role], _SPLIT_TRANSIENT[role], hbm)
              for role in ("trainer", "sampler")}
    peak = max(meshes, key=lambda r: meshes[r]["peak_bytes"])
    return dict(meshes=meshes, peak_mesh=peak, peak_phase=meshes[peak]["peak_phase"],
                peak_bytes=meshes[peak]["peak_bytes"],
                policy="the sampler on chips of its own keeps its weights and decode state "
                       "through every phase")


def run_resident(config, model_cfg, train_mesh, sampling_mesh) -> dict:
    """The resident parts of `config` on these meshes (real or abstract chips), its engines
    built as the run builds them (ada.run.build: eval gets its own engine only for another
    temperature or length), with the cache and attention its sampler runs. Computed once
    per plan and passed down (`run_memory`, `plan_memory`, planner.make_plan's `held`)."""
    c = config
    engine = make_engine(c, model_cfg, None, sampling_mesh)
    own = eval_sampling(c)
    eval_engine = engine if own is None else make_engine(c, model_cfg, None, sampling_mesh, **own)
    tc = train_config(c)
    fns = rl.make_train_fns(model_cfg, tc, train_mesh)
    kept = (c.rl.max_staleness + 1) * c.data.prompts_per_step // jax.process_count()
    resident = resident_parts(model_cfg, tc, fns, engine, eval_engine, kl=tc.reference_copy,
                              kept_prompts=kept, split=c.rl.sampler_devices > 0)
    return dict(resident=resident, kv_cache=c.sampling.kv_cache,
                attention=getattr(engine, "attention", "dense"))


def run_memory(config, sampler: dict, transient: dict | None = None,
               hbm: float | None = None) -> dict:
    """The ledger of `config` whose resident parts are `sampler` (`run_resident`'s): per
    phase (`phases`), or with rl.sampler_devices = N per role (`meshes`, `split_ledger`)."""
    if config.rl.sampler_devices:
        return dict(split_ledger(sampler["resident"], transient or {}, hbm), **sampler)
    return dict(ledger(sampler["resident"], transient or {},
                       in_flight=config.rl.max_staleness > 0, hbm=hbm), **sampler)


def checkpoint_staging(tree, shardings) -> int:
    """Bytes per chip an async orbax save copies on the chip before writing to the host: the
    slices this chip writes. A leaf held by r replicas is split among them along its first
    axis that r divides (orbax's replica-parallel save), else one replica writes it whole
    (the fullest chip counts)."""
    def leaf(x, sh) -> int:
        shape = sh.shard_shape(x.shape)
        size = x.dtype.itemsize
        for d in shape:
            size *= d
        r = sh.num_devices // max(1, len({tuple((s.start, s.stop) for s in idx) for idx in
                                           sh.devices_indices_map(x.shape).values()}))
        return size // r if r > 1 and any(d % r == 0 for d in shape) else size
    return int(sum(jax.tree.leaves(jax.tree.map(leaf, tree, shardings))))


def plan_memory(config, sampler: dict, ph: dict, dense, hbm) -> dict:
    """The run's memory ledger (`run_memory` of `run_resident`'s `sampler`) with the compiled
    programs' temporaries: the train step's, the hand-off's, prefill's and generate's (the
    dense programs'; a paged gather engine's generate also carries a dense window per layer,
    the `dense` engine's keys and values: `gather_windows`)."""
    tr, rs, pf, gen = (ph[k] for k in ("train", "reshard", "prefill", "generate"))
    transient = dict(
        update_temporaries=temporaries(tr, tr["arguments_bytes"]),
        train_batch=tr["batch_bytes"],
        handoff_temporaries=temporaries(rs, rs["arguments_bytes"] + rs.get(
            "outputs_bytes", 0)),
        prefill_temporaries=temporaries(pf, pf["arguments_bytes"]),  # the new prefix too
        generate_temporaries=temporaries(gen, gen["arguments_bytes"]))
    transient["eval_generate_temporaries"] = transient["generate_temporaries"]
    if sampler["attention"] != "gather":
        return run_memory(config, sampler, transient, hbm)
    windows = device_bytes(dense.abstract_state().cache)
    return dict(run_memory(config, sampler, dict(transient, gather_windows=windows), hbm),
                gather_windows_bytes=windows)


def update_slots(slots: int, data: int, ph: dict, resident: dict, engine, hbm: float) -> int:
    """With cohorts in flight through the update (rl.max_staleness >= 1) the sampler's
    weights, decode state and prefix caches sit beside the train step's peak: the most
    slots (a multiple of `data`) whose decode state still fits then."""
    per_slot = resident["decode_state"] / engine.num_slots
    beside = (ph["train"]["peak_bytes"] + resident["reference_params"]
              + resident["sampler_weights"] + resident["prefix_caches"])
    return max(int((hbm - beside) / per_slot) // data * data, 0)


def lora_figures(model_cfg, train_cfg, engine) -> dict:
    """A LoRA run's figures (`lora` in ada.plan's JSON), whole-model bytes: the adapters (the
    trained leaves, what a hand-off to a sampler on devices of its own moves per update:
    ada/stream.py), the frozen base the train state holds, and the sampler's merged weights
    (what a full run's hand-off moves). A colocated hand-off merges in place."""
    params = rl.abstract_state(model_cfg, train_cfg).params
    adapters, rest = lora.split(params)
    c = train_cfg.lora
    return dict(rank=c.rank, alpha=c.alpha, targets=list(c.targets),
                adapter_bytes=nbytes(adapters), handoff_bytes_per_update=nbytes(adapters),
                base_bytes=nbytes(rest),
                full_handoff_bytes=nbytes(jax.eval_shape(engine._sampling_fn, params)))
