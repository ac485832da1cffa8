"""The planner: XLA's per-device figures against live bytes, a plan on fake CPU devices and on
a TPU slice (the real TPU compiler, via libtpu), and its one-line errors."""

import io
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ada import config as cfglib
from ada import hlo_bytes, memory, roofline, tpu
from ada import planner as plan
from ada import sharding as shd
from ada.cli.plan import Progress
from ada.cli.plan import main as plan_main
from ada.models import init_params, param_shapes, positions_from_mask, preset
from ada.models.known import QWEN25_MATH_7B
from ada.rl.train import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = preset("tiny", family="qwen3")
TC = TrainConfig(mini_batches=2, micro_batches=2, logit_chunk=8)
B, T = 16, 12
TINY = ["--config.mesh.data=-1", "--config.sampling.mesh=(-1,1)", "--config.sampling.num_slots=32",
        "--config.data.prompts_per_step=8"]


def device_bytes(tree, device) -> int:
    """Bytes of the shards of every array of `tree` that live on `device`."""
    return sum(s.data.nbytes for x in jax.tree.leaves(tree)
               for s in x.addressable_shards if s.device == device)


@pytest.mark.slow
def test_planned_bytes_equal_live_bytes_on_cpu():
    """Tolerance: exact. Arguments and outputs are whole buffers whose sizes XLA knows from
    the shardings, so the figures must equal the live shard bytes to the byte (outputs plus
    the output tuple's pointer table), and so must the planner's split of the arguments."""
    mesh = shd.make_mesh((2, 2, 2))
    lowered, fns, abstract_state, abstract_batch = plan.lower_train_step(CFG, TC, mesh, B, T)
    compiled = lowered.compile()
    rng = np.random.default_rng(0)
    mask = np.ones((B, T), bool)
    batch = dict(tokens=rng.integers(0, CFG.vocab_size, (B, T)), mask=mask,
                 positions=np.asarray(positions_from_mask(mask)),
                 response_mask=(np.arange(T) >= 6)[None].repeat(B, 0),
                 advantages=rng.normal(size=B), old_logp=np.full((B, T), -6.2),
                 behav_logp=np.full((B, T), -6.2), lag=np.zeros((B, T), np.int32))  # the loop's
    state = fns.init_state(init_params(CFG, jax.random.key(0)))
    batch = fns.shard_batch(batch)
    dev = jax.devices()[0]
    ma = compiled.memory_analysis()
    assert ma.argument_size_in_bytes == device_bytes((state, batch), dev)
    for tree, live, shardings in [
            (abstract_state.params, state.params, fns.state_sharding.params),
            (abstract_state.opt_state, state.opt_state, fns.state_sharding.opt_state),
            (abstract_batch, batch, shd.batch_shardings(abstract_batch, mesh))]:
        assert roofline.device_bytes(tree, shardings) == device_bytes(live, dev)

    new_state, metrics = compiled(state, batch)
    n_out = len(jax.tree.leaves((new_state, metrics)))
    # XLA also counts the output tuple's table of 8-byte buffer pointers
    assert ma.output_size_in_bytes == device_bytes((new_state, metrics), dev) + 8 * n_out
    assert ma.alias_size_in_bytes >= device_bytes(new_state.params, dev)  # donated state


def test_seven_b_state_splits_over_the_mesh():
    """Per-device params and Adam moments of Qwen2.5-Math-7B: total / (fsdp x tensor)."""
    n_params = sum(math.prod(s) for s in jax.tree.leaves(
        param_shapes(QWEN25_MATH_7B), is_leaf=lambda x: isinstance(x, tuple)))
    assert abs(n_params - 7.6156e9) < 1e6
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, np.float32),
                            param_shapes(QWEN25_MATH_7B), is_leaf=lambda x: isinstance(x, tuple))
    for shape in [(1, 4, 2), (2, 4, 1)]:
        per_dev = roofline.device_bytes(abstract, shd.param_shardings(abstract, shd.make_mesh(shape)))
        ways = shape[1] * shape[2]
        # every matrix splits evenly; only the norms (and, without tensor, nothing else)
        # stay replicated: < 0.05% above total / ways
        assert 4 * n_params // ways <= per_dev < 1.0005 * 4 * n_params / ways


def run(capsys, tmp_path, *args):
    out = tmp_path / "plan.json"
    rc = plan_main([*args, "--json", str(out)])
    printed = capsys.readouterr()
    return rc, printed.out, printed.err, json.loads(out.read_text()) if out.exists() else None


def check_phases(p, exact: bool):
    assert set(p["phases"]) == {"train", "reshard", "prefill", "generate"}
    for name, f in p["phases"].items():  # the reshard only casts and moves: no flops
        for k in ("arguments_bytes", "peak_bytes", "bytes_accessed") + ("flops",) * (
                name != "reshard"):
            assert f[k] > 0, (name, k, f)
    t = p["phases"]["train"]
    split = t["params_bytes"] + t["opt_state_bytes"] + t["batch_bytes"] + 3 * 4  # + 3 counters
    assert split == t["arguments_bytes"] if exact else split <= t["arguments_bytes"]


@pytest.mark.slow
def test_cpu_plan(capsys, tmp_path):
    rc, out, _, p = run(capsys, tmp_path, "--devices", "8", "--hbm-gib", "0.005", *TINY,
                        "--buckets")
    assert rc == 0 and "verdict: FITS" in out
    # every bucket of both samplers compiled: nothing moves a cache between chips (the CPU's
    # gather path copies the window it gathers, on its chip)
    b = p["buckets"]
    assert b["programs"] > 20 and b["collectives"] == 0, b
    assert f"buckets: 0 collectives between chips and {b['copies']} copies" in out
    check_phases(p, exact=True)
    assert p["train_mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}
    assert p["sampling_mesh"] == {"data": 8, "tensor": 1}
    assert p["phases"]["train"]["rows"] == 8 * 4 and p["phases"]["generate"]["num_slots"] == 32
    # the most slots is a multiple of the sampling data axis, checked by a compile to fit
    assert p["max_num_slots"] >= 32 and p["max_num_slots"] % 8 == 0
    assert p["max_num_slots_peak_bytes"] <= 0.005 * 2**30
    assert p["fits"] is True and "estimate" not in p  # no chip, no roofline
    # progress in a log: each program's start and end, with how long it took
    for program in ("the train step (32 x 40 tokens)", "the reshard and prefill", "generate at 32 slots"):
        assert f"compiling {program}: 0:00 so far" in out and f"compiled {program} in " in out
    # the train state stays on the chip through the rollout: the sampling phases fit beside it
    t, ph = p["phases"]["train"], p["phases"]
    state = t["arguments_bytes"] - t["batch_bytes"]
    # ... and the sampler's prefix caches, at their bound (ada/memory.py)
    mem = p["memory"]
    prefixes = mem["resident"]["prefix_caches"]
    assert ph["prefill"]["held_bytes"] == ph["generate"]["held_bytes"] == state + prefixes
    assert ph["reshard"]["held_bytes"] == state - t["params_bytes"]  # it reads the params
    # the memory ledger: every phase by its parts, the peak phase named; at k = 0 the update
    # has the chips to itself (the sampler freed its decode state and weights)
    assert set(mem["phases"]) == {"init", "prefill", "generate", "update", "handoff", "eval",
                                  "save"}
    assert all(f["bytes_per_chip"] == sum(f["parts"].values()) for f in mem["phases"].values())
    assert mem["peak_bytes"] == max(f["bytes_per_chip"] for f in mem["phases"].values())
    update = mem["phases"]["update"]["parts"]
    assert set(update) == {"train_params", "optimizer_state", "train_batch", "update_temporaries"}
    assert f"peak: {mem['peak_phase']}" in out and "memory per chip, phase by phase" in out


@pytest.mark.slow
def test_cpu_plan_of_a_lora_run(capsys, tmp_path):
    """model.lora.rank > 0: the plan has a full run's phases and fit fields, plus `lora`: the
    adapters' bytes (what a hand-off to a sampler on its own devices moves per update) far
    below the merged weights a full hand-off moves; the train step holds the frozen base in
    the compute dtype and Adam moments for the adapters only, and the reshard reads base +
    adapters (it merges them). Breaks if the planner planned the full state or the full
    hand-off for a LoRA run."""
    rc, out, _, p = run(capsys, tmp_path, "--devices", "2", *TINY, "--config.model.lora.rank=4")
    assert rc == 0 and "LoRA rank 4" in out
    check_phases(p, exact=True)
    lo = p["lora"]
    assert lo["rank"] == 4 and lo["adapter_bytes"] == lo["handoff_bytes_per_update"] > 0
    assert lo["full_handoff_bytes"] > 5 * lo["adapter_bytes"]  # tiny: r = 4 of width 64
    t = p["phases"]["train"]
    # Adam's two moments of the adapters (replicated on data) and its step count
    assert t["opt_state_bytes"] == 2 * lo["adapter_bytes"] + 4
    assert t["params_bytes"] == lo["adapter_bytes"] + lo["base_bytes"]
    assert p["phases"]["reshard"]["arguments_bytes"] == t["params_bytes"]
    update = p["memory"]["phases"]["update"]["parts"]
    assert update["optimizer_state"] < update["train_params"]  # Adam for the adapters only


def test_without_a_topology_it_plans_this_machines_devices(capsys, tmp_path, monkeypatch):
    """Neither --topology nor --devices: the local devices (a GPU's on a GPU machine; here
    conftest's 8 CPU devices) with their compiler, and the memory their runtime reports as
    the HBM to fit (a stand-in bytes_limit here: XLA:CPU reports none). Breaks if the plan
    falls back to fake CPU devices or ignores the devices' memory."""
    from ada.cli import plan as plan_cli

    limit = 3 * 2**30
    monkeypatch.setattr(plan_cli, "local_devices", lambda: (jax.local_devices(), limit))
    rc, out, _, p = run(capsys, tmp_path, *TINY, "--no_train_estimate")
    assert rc == 0, out
    assert p["devices"] == len(jax.local_devices()) == 8 and p["hbm_bytes"] == limit
    assert p["where"] == "8 local cpu device(s)"
    assert f"\n{p['model']} on 8 local cpu device(s): 8 devices" in out
    assert p["fits"] is True and p["memory"]["peak_bytes"] < limit


def test_cpu_plan_of_a_split_run(capsys, tmp_path):
    """rl.sampler_devices = 4 of 8: the train mesh on the first 4 chips, the sampling mesh on
    the last 4, and the memory ledger per mesh (`memory.meshes`, ada/memory.py's
    split_ledger): the train state (and a save's staging copy) only on the trainer's chips;
    the sampler's weights, decode state and prefix caches only on the sampler's, through
    every phase, with a hand-off's new weights beside the old and eval's second copy of the
    weights, decode state and prefix caches there. Breaks if a split plan reported one
    colocated ledger, or put a part on the other mesh's chips."""
    rc, out, _, p = run(capsys, tmp_path, "--devices", "8", *TINY, "--config.rl.sampler_devices=4")
    assert rc == 0
    assert p["train_mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
    assert p["sampling_mesh"] == {"data": 4, "tensor": 1}
    mem, res = p["memory"], p["memory"]["resident"]
    assert set(mem["meshes"]) == {"trainer", "sampler"} and "phases" not in mem
    trainer, sampler = (mem["meshes"][r]["phases"] for r in ("trainer", "sampler"))
    assert set(trainer) == set(sampler) == set(memory.PHASES)
    state = {"train_params", "optimizer_state"}
    sampling = {"sampler_weights", "decode_state", "prefix_caches"}
    for name in memory.PHASES:
        t, s = set(trainer[name]["parts"]), set(sampler[name]["parts"])
        assert state <= t and not t & (sampling | {"old_sampler_weights"}), (name, t)
        assert not s & (state | {"checkpoint_staging"}), (name, s)
        assert s >= (sampling if name != "init" else {"sampler_weights"}), (name, s)
        for f in (trainer[name], sampler[name]):
            assert f["bytes_per_chip"] == sum(f["parts"].values())
    assert trainer["save"]["parts"]["checkpoint_staging"] == res["checkpoint_staging"] > 0
    assert sampler["handoff"]["parts"]["old_sampler_weights"] == res["sampler_weights"] > 0
    assert (sampler["handoff"]["resident_bytes"]
            == sampler["handoff"]["bytes_per_chip"] - res["sampler_weights"])
    ev = sampler["eval"]["parts"]
    assert ev["eval_sampler_weights"] == ev["sampler_weights"]
    assert ev["eval_prefix_caches"] == ev["prefix_caches"] == res["prefix_caches"]
    assert set(trainer["update"]["parts"]) == state | {"train_batch", "update_temporaries"}
    peaks = {r: max(f["bytes_per_chip"] for f in lg["phases"].values())
             for r, lg in mem["meshes"].items()}
    assert mem["peak_bytes"] == max(peaks.values()) == peaks[mem["peak_mesh"]]
    assert "the trainer's chips:" in out and "the sampler's chips:" in out
    assert f"peak: {mem['peak_phase']} on the {mem['peak_mesh']}'s chips" in out


def test_progress_redraws_on_a_terminal_and_prints_lines_in_a_log():
    """A line per second on a terminal (redrawn in place), plain lines in a log: the program,
    its time so far, and how long the last compile of its kind took."""
    class Log(io.StringIO):
        def __init__(self, tty):
            super().__init__()
            self.tty = tty

        def isatty(self):
            return self.tty

    for tty in (False, True):
        log = Log(tty)
        progress = Progress(log, every_s=0.05)
        progress("generate at 64 slots")
        time.sleep(0.2)
        progress("generate at 32 slots")
        time.sleep(0.2)
        progress.close()
        text = log.getvalue()
        assert text.count("compiled generate at 64 slots in 0:00") == 1
        assert "compiling generate at 32 slots: 0:00 so far, the last one took 0:00" in text
        assert text.count("compiling generate at 32 slots") >= 2  # the start, then per tick
        assert ("\r\033[K" in text) == tty and text.endswith("\n")


@pytest.mark.slow
def test_tpu_plan_compiles_every_phase(capsys, tmp_path):
    """The real TPU compiler on an abstract v5e:2x2 slice: every phase's figures, the slot
    search and the roofline estimate. Skipped only where libtpu cannot load."""
    try:
        tpu.tpu_devices("v5e:2x2")
    except tpu.LibtpuUnavailable as e:
        pytest.skip(str(e))
    rc, out, _, p = run(capsys, tmp_path, "--topology", "v5e:2x2", "--hbm-gib", "0.05", *TINY,
                        "--explain", "5")
    assert rc == 0, out
    check_phases(p, exact=False)  # the TPU pads arrays to its tiles
    assert p["topology"] == "v5e:2x2" and p["chip"]["name"] == "v5e" and p["hosts"] == 1
    assert p["max_num_slots"] >= 32 and p["fits"] is True
    e = p["estimate"]
    assert e["decode_tokens_per_s_per_chip"] > 0 and e["train_step_s"] > 0
    assert 0 < e["train_mfu"] <= 1.5 and "ESTIMATE" in out
    # bytes beside the floor: the program's HBM bytes are part of the compiler's count (which
    # adds on-chip memory), the estimate charges the larger of floor and HBM bytes, and
    # --explain lists the heaviest op groups of both programs
    assert e["decode_bytes"]["chunk_hbm_bytes_per_step"] > 0  # the 8-step chunk, per step
    for key in ("decode_bytes", "prefill_bytes"):
        b = e[key]
        assert 0 < b["hbm_bytes"] <= b["compiler_bytes"] and b["floor_bytes"] > 0
        assert b["floor_bytes"] == sum(b["floor"][k] for k in ("weights", "kv", "logits"))
        assert b["hbm_vs_floor"] == pytest.approx(b["hbm_bytes"] / b["floor_bytes"])
    assert "bytes/step/chip" in out and "in HBM vs a floor of" in out
    assert out.count("the heaviest ops by HBM bytes") == 2
    # the paged cache's slots at the planned mean fill, beside the dense worst case it must
    # agree with (the same generate peak line), and their decode roofline
    pg = p["paged"]
    assert abs(pg["worst_case_slots"] - p["max_num_slots"]) <= 2 * p["sampling_mesh"]["data"]
    assert pg["mean_fill_slots"] > 0 and "paged KV cache" in out  # (short windows: no gain)
    assert e["paged"]["num_slots"] == pg["max_slots_at_mean_fill"] and e["paged"]["kv_bytes"] > 0
    assert e["paged"]["tokens_per_s_per_chip"] > 0 and "  paged      <=" in out
    # what make_engine builds, compiled: the tiny model's head_dim 16 is no kernel's, so the
    # gather path; its decode state's bytes per chip beside the dense cache's
    assert pg["attention"] == "gather" and "compiled (gather" in out
    # at the planned mean fill, the slots and the pool planned for them compile and fit
    assert 0 < pg["max_slots_at_mean_fill"] <= pg["mean_fill_slots"]
    held = p["phases"]["generate"]["held_bytes"]
    assert pg["mean_fill_peak_bytes"] + held <= 0.05 * 2**30 and "compiled at the mean fill" in out
    assert pg["pool_bytes_per_chip_full_reservation"] > 0
    assert p["dense"]["cache_bytes_per_chip"] > 0 and p["dense"]["max_slots"] == p["max_num_slots"]
    ops = e["decode_ops"]
    assert ops and ops[0]["hbm_bytes"] >= ops[-1]["hbm_bytes"] and ops[0]["count"] >= 1
    # the decode step's collectives over ICI, their time added to the bound
    assert e["decode_ici"]["bytes_per_s"] == 400e9 and "ICI:" in out
    assert e["decode_tokens_per_s_per_chip_with_ici"] <= e["decode_tokens_per_s_per_chip"]


def test_a_one_chip_slice_samples_with_the_tpus_choices():
    """v5e:1x1: a sampler on one TPU chip gets the TPU's backend choices and an unsplit
    vocabulary. Broke with StopIteration (the CPU check used up the mesh's one device)."""
    from ada.sampling.engine import backend_choices, sampler_layout

    try:
        devices, _ = tpu.tpu_devices("v5e:1x1")
    except tpu.LibtpuUnavailable as e:
        pytest.skip(str(e))
    mesh = shd.make_mesh((1, 1, 1), devices)
    assert sampler_layout(CFG, 8, mesh) == (backend_choices("tpu"), 1)


def test_collectives_count_what_each_chip_sends():
    """Ring algorithms over a group of n: an all-reduce sends 2 (n-1)/n of its bytes, an
    all-gather (n-1)/n of its result (an asynchronous one counted once, at its start), a
    collective-permute all of it; a group left unnamed is every device."""
    from ada.hlo_bytes import collectives

    text = """ENTRY %m (p: bf16[8,128]) -> bf16[8,128] {
  %p = bf16[8,128]{1,0} parameter(0)
  %ar = bf16[8,128]{1,0} all-reduce(%p), channel_id=1, replica_groups={{0,1},{2,3}}, to_apply=%add
  %ag-start = (bf16[4,128]{1,0}, bf16[8,128]{1,0}) all-gather-start(%p), replica_groups=[2,2]<=[4], dimensions={0}
  %ag-done = bf16[8,128]{1,0} all-gather-done(%ag-start)
  %all = bf16[8,128]{1,0} all-reduce(%p), channel_id=2, replica_groups={}, to_apply=%add
  ROOT %cp = bf16[8,128]{1,0} collective-permute(%p), source_target_pairs={{0,1},{1,0}}
}"""
    got = collectives(text, num_devices=4)
    B = 8 * 128 * 2
    assert got["by_op"] == {"all-reduce": 2, "all-gather": 1, "collective-permute": 1}
    assert got["ici_bytes"] == B * (1 + 0.5 + 1.5 + 1) and got["result_bytes"] == 4 * B


def test_hlo_op_bytes_split_hbm_from_on_chip_memory():
    """Op by op through XLA's cost model, split by the memory space each operand's layout
    names: a prefetch into on-chip memory (S(1)) reads HBM once; its reader reads on-chip
    memory; a plain HBM op counts its operands and result."""
    hlo = """HloModule m

%fused_add (a: f32[256,128], b: f32[256,128]) -> f32[256,128] {
  %a = f32[256,128]{1,0:T(8,128)S(1)} parameter(0)
  %b = f32[256,128]{1,0:T(8,128)} parameter(1)
  ROOT %s = f32[256,128]{1,0:T(8,128)} add(%a, %b)
}

ENTRY %main (p: f32[256,128], q: f32[256,128]) -> f32[256,128] {
  %p = f32[256,128]{1,0:T(8,128)} parameter(0)
  %q = f32[256,128]{1,0:T(8,128)} parameter(1)
  %copy-start = (f32[256,128]{1,0:T(8,128)}, f32[256,128]{1,0:T(8,128)S(1)}, u32[]{:S(2)}) copy-start(%p)
  %copy-done = f32[256,128]{1,0:T(8,128)S(1)} copy-done(%copy-start)
  ROOT %add_fusion = f32[256,128]{1,0:T(8,128)} fusion(%copy-done, %q), kind=kLoop, calls=%fused_add, metadata={op_name="jit(f)/add"}
}
"""
    n = 256 * 128 * 4
    rows = {r["name"]: r for r in hlo_bytes.hlo_op_bytes(hlo)}
    assert set(rows) == {"copy-start", "add_fusion"}
    assert (rows["copy-start"]["bytes"], rows["copy-start"]["hbm_bytes"]) == (2 * n, n)
    assert (rows["add_fusion"]["bytes"], rows["add_fusion"]["hbm_bytes"]) == (3 * n, 2 * n)
    assert rows["add_fusion"]["op"] == "fusion(add)" and rows["add_fusion"]["source"] == "add"
    # the fusion was costed by XLA's cost model (a private jaxlib API): if that path is lost,
    # every op falls back to its shapes, and this says so instead of passing
    assert (rows["add_fusion"]["costing"], rows["copy-start"]["costing"]) == ("xla", "move")
    assert hlo_bytes.costings(list(rows.values())) == {"xla": 1, "move": 1}
    (group,) = [g for g in hlo_bytes.group_ops(list(rows.values())) if g["op"] == "fusion(add)"]
    assert group["count"] == 1 and group["hbm_bytes"] == 2 * n
    assert not any(r["loop"] for r in rows.values())
    # a loop's ops are told from the rest (a decode chunk's per-step bytes: plan_generate)
    x = jax.ShapeDtypeStruct((256, 128), np.float32)
    looped = jax.jit(lambda y: jax.lax.fori_loop(0, 3, lambda i, y: jnp.sin(y) * 2, y) + 1)
    table = hlo_bytes.hlo_op_bytes(looped.lower(x).compile().as_text())
    assert any(r["loop"] and r["hbm_bytes"] >= 2 * n for r in table)
    assert any(not r["loop"] and r["hbm_bytes"] >= 2 * n for r in table)


@pytest.mark.parametrize("args, says", [
    (["--topology", "v7:2x2"], "unknown topology 'v7:2x2'; known: v5e:1x1|2x2"),
    (["--devices", "8", "--config.mesh.fsdp=3"], "mesh (data, fsdp, tensor)=(-1, 3, 1) does not "
                                                 "match the 8 devices"),
    (["--devices", "8", "--config.sampling.mesh=(3,1)"], "sampling.mesh=(3, 1) does not divide"),
    (["--devices", "8", "--config.sampling.max_new_tokens=5000"], "1024 + 5000 = 6024"),
    (["--devices", "8", "--config.model.path=models/Qwen2.5-Math-7B"],
     "plan known shapes with --model qwen2.5-math-7b"),
    (["--devices", "8", "--model", "gpt-5"], "--model 'gpt-5' is not a known model"),
    (["--devices", "8", "--config.sampling.num_slots=12"], "num_slots=12 does not split"),
    (["--devices", "8", "--config.sampling.num_slots=0"], "sampling.num_slots=0"),
    (["--devices", "0"], "--devices 0: give 1 or more"),
    (["--devices", "8", "--hbm-gib", "-1"], "--hbm_gib -1: give the GiB per chip, above 0"),
    # a KV cache past HBM by itself is caught before compiling, with how many slots could fit
    (["--devices", "8", "--hbm-gib", "0.005", "--config.sampling.num_slots=4096"],
     "sampling.num_slots=4096 cannot fit 0.005 GiB per chip: its KV cache takes 0.25 GiB"),
])
def test_bad_input_is_one_line_before_any_compile(capsys, tmp_path, monkeypatch, args, says):
    monkeypatch.setattr(plan, "compile_phase", lambda *a: pytest.fail("compiled"))
    rc, out, err, p = run(capsys, tmp_path, *TINY, "--config.data.max_prompt_len=1024", *args)
    assert rc == 2 and p is None and out == ""  # no progress line: nothing compiled
    assert err.startswith("error: ") and err.count("\n") == 1 and says in err, err


@pytest.mark.slow
def test_too_many_slots_say_how_many_fit(capsys, tmp_path):
    """A KV cache that fits, but not with the generate's temporaries: only compiling tells."""
    rc, out, err, p = run(capsys, tmp_path, "--devices", "8", "--hbm-gib", "0.005", *TINY,
                          "--config.sampling.num_slots=1104")
    assert rc == 2 and p is None and "max num_slots" in out
    fit = out.split("max num_slots: ")[1].split()[0]
    assert 32 <= int(fit) < 1104
    assert err == (f"error: sampling.num_slots=1104 does not fit 0.005 GiB per chip beside the "
                   f"train state, at most {fit} do: pass --config.sampling.num_slots={fit}\n")


# preset -> (its model's known shapes, the TPU slice it is laid out for)
PRESETS = {"qwen25_math_1p5b": ("qwen2.5-math-1.5b", "v5e:2x2"),
           "qwen25_math_7b": ("qwen2.5-math-7b", "v5e:4x4"),
           "llama32_3b": ("llama-3.2-3b", "v5e:2x4"),
           "qwen3_4b": ("qwen3-4b-instruct-2507", "v5e:2x4")}


@pytest.mark.parametrize("name", PRESETS)
def test_presets_validate_on_their_slice(name):
    """Each paper preset validates (context window included), its meshes divide its slice
    (v5e: up to 8 chips are one host, else 4 per host), and its docstring and the README
    give the planner command that chose its layout (README: the table of plans)."""
    model, topology = PRESETS[name]
    cfg = cfglib.load_config(os.path.join(ROOT, "configs", f"{name}.py"))
    plan.check_config(cfg, model)
    chips = math.prod(int(d) for d in topology.split(":")[1].split("x"))
    m = cfg.mesh
    plan.mesh_sizes((m.data, m.fsdp, m.tensor), chips, "mesh", topology, exact=True)
    data, _ = plan.mesh_sizes(cfg.sampling.mesh, chips if chips <= 8 else 4,
                              "sampling.mesh", topology, exact=False)
    assert cfg.sampling.num_slots % data == 0
    command = f"python -m ada.plan --config configs/{name}.py --model {model} --topology {topology}"
    config_src = open(os.path.join(ROOT, "configs", f"{name}.py")).read()
    assert command in config_src and command in open(os.path.join(ROOT, "README.md")).read()


def test_disaggregated_split_balances_the_roles_by_brute_force():
    """The stream's splits (chips of every host, or whole hosts): each one's bound is the
    slower role's time (chip-seconds over its chips), the best is the least that fits, and
    none beats the colocated bound (sum of chip-seconds over every chip) by a roofline."""
    GiB = 2**30
    p = {"devices": 16, "hosts": 4, "chips_per_host": 4, "sampling_mesh": {"data": 2, "tensor": 1},
         "phases": {"train": {"peak_bytes": 6 * GiB}, "generate": {"peak_bytes": 9 * GiB}},
         "estimate": {"decode_tokens_per_s_per_chip": 2000.0, "train_step_s": 1.5,
                      "reshard_s": 0.01}}
    tokens = 2000.0 * 48  # 48 sampling chip-seconds; training 1.5 x 16 = 24
    d = roofline.disaggregated(p, tokens, hbm=16 * GiB)
    assert d["colocated_step_s"] == pytest.approx((48 + 24) / 16 + 0.01)
    assert d["balanced_sampler_share"] == pytest.approx(48 / 72)
    assert [(sp["kind"], sp["n"]) for sp in d["splits"]] == [
        ("chips per host", 1), ("chips per host", 2), ("chips per host", 3),
        ("hosts", 1), ("hosts", 2), ("hosts", 3)]
    for sp in d["splits"]:
        samplers = sp["n"] * 4  # 4 hosts, or 4 chips a host
        want = max(48 / samplers, 24 / (16 - samplers)) + 0.01
        assert sp["sampler_chips"] == samplers and sp["step_s"] == pytest.approx(want)
        assert sp["trainer_peak_bytes"] == pytest.approx(6 * GiB * 16 / (16 - samplers))
        assert sp["fits"] == (sp["trainer_peak_bytes"] <= 16 * GiB)
        assert sp["step_s"] >= d["colocated_step_s"] - 1e-9
    fitting = [sp for sp in d["splits"] if sp["fits"]]
    assert d["best"] is min(fitting, key=lambda sp: sp["step_s"])
    assert d["best"]["sampler_chips"] == 8  # 12 would leave the trainer 24 GiB a chip
    assert d["trainer_chips_needed"] == 6
    assert "compiled" in d["train_from"]
    tight = roofline.disaggregated(p, tokens, hbm=5 * GiB)  # the trainer needs 20 chips
    assert tight["best"] is None and tight["trainer_chips_needed"] == 20
    assert roofline.disaggregated(dict(p, estimate={}), tokens, None) is None
    loose = dict(p, estimate={"decode_tokens_per_s_per_chip": 2000.0, "train_step_flops_s": 1.5})
    assert "flops" in roofline.disaggregated(loose, tokens, None)["train_from"]
