"""The memory ledger (ada/memory.py, `memory` in ada.plan's JSON) held to a real run: the
tiny preset on a (4, 2) CPU mesh (data, tensor), dense and paged cache, at rl.max_staleness 0 and 1,
through init, stream steps, an eval and a save. At each phase boundary (`loop.train`'s
`observe`) the live device bytes per chip (`jax.live_arrays`, shared buffers once) must be
what the ledger says the run holds there: the exact parts to within a few KiB of keys and
scalars (and so within 10%), the bounded ones (the prefix caches at their LRU's bound of
64 prompts at the longest prompt bucket, a save's staging copy while it is in flight)
between nothing and their bound.

What failing looks like: a decode state kept through a k = 0 update (Driver.release
removed from ada/stream.py), a second weight copy for eval, or a part the ledger forgets.
"""

import collections
import gc

import jax
import pytest

from ada import config as cfglib
from ada import loop, memory, meshes
from configs import default

SLACK = 8 * 1024  # PRNG keys, counters and scalars the ledger does not list


def live_bytes() -> collections.Counter:
    """Each chip's live device bytes, each buffer once (a replica view and its source
    share buffers)."""
    per, seen = collections.Counter(), set()
    for a in jax.live_arrays():
        try:
            shards = [((sh.device.id, sh.data.unsafe_buffer_pointer()), sh.data.nbytes)
                      for sh in a.addressable_shards]
        except jax.errors.JaxRuntimeError:  # deleted while we read (an async save's thread
            continue                       # frees its staging copies): it holds no bytes now
        for key, nbytes in shards:
            if key not in seen:
                seen.add(key)
                per[key[0]] += nbytes
    return per


def boundary(phase: str, resident: dict, in_flight: bool) -> tuple[int, int]:
    """(exact bytes, bounded bytes) the chips hold at the end of `phase` (ada/memory.py's
    policy): the train state always; the sampler's weights but while a k = 0 update runs;
    its decode state and prefix caches only with cohorts in flight; the staging copy of an
    async save until its write to the host ends (on a CPU that may be the next step's
    collection)."""
    r = resident
    exact = r["train_params"] + r["optimizer_state"] + r["reference_params"]
    if in_flight or phase not in ("collect", "update"):
        exact += r["sampler_weights"]
    bounded = r["checkpoint_staging"] if phase != "init" else 0  # a save still in flight
    if in_flight:
        exact += r["decode_state"]
        bounded += 0 if phase == "handoff" else r["prefix_caches"]
    return exact, bounded


@pytest.mark.parametrize("cache,k", [("dense", 0), ("dense", 1), ("paged", 0), ("paged", 1)])
def test_live_bytes_are_the_ledgers(tmp_path, cache, k):
    c = default.get_config()
    with c.unlocked():
        c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 4, 1, 2  # conftest's 8 CPU devices
        c.sampling.mesh = (4, 2)
        c.sampling.kv_cache = cache
        c.sampling.num_slots = 32
        c.data.prompts_per_step = 16
        c.rl.max_staleness = k
        c.train.steps, c.eval.every, c.eval.samples, c.checkpoint.every = 3, 2, 2, 2
        c.eval.pass_k = (1, 2)
        c.log.progress = False
    cfglib.validate(c)
    seen, ledger = [], {}
    gc.collect()  # what earlier tests left (a run's driver and backend are a cycle)
    before = live_bytes()

    def observe(phase, step, stream):
        if not ledger:
            ledger.update(memory.run_resident(c, stream.rollout.engine.config,
                                              meshes.train_mesh(c), stream.rollout.engine.mesh))
        exact, bounded = boundary(phase, ledger["resident"], stream.in_flight())
        now = live_bytes()
        live = max(now[d] - before[d] for d in now)  # the fullest chip's, this run's
        seen.append((phase, step, stream.in_flight(), live, exact, bounded))
        assert exact - SLACK <= live <= exact + bounded + SLACK, seen[-1]
        if not bounded:
            assert exact <= 1.10 * live, seen[-1]

    loop.train(c, str(tmp_path), observe=observe)
    phases = {s[0] for s in seen}
    assert phases == {"init", "collect", "update", "handoff", "eval", "save"}, seen
    if k:  # a k >= 1 run keeps cohorts in flight through some update
        assert any(f for p, _, f, *_ in seen if p == "update"), seen
    else:  # at k = 0 the update has the chips to itself: the train state alone
        update = [s for s in seen if s[0] == "update"]
        r = ledger["resident"]
        assert all(abs(s[3] - r["train_params"] - r["optimizer_state"]) <= SLACK for s in update)


def test_the_ledger_names_the_peak_phase_and_counts_the_sampler_in_flight():
    """A k >= 1 update holds the sampler beside the train step; at k = 0 it does not."""
    resident = dict(train_params=100, optimizer_state=200, reference_params=0,
                    sampler_weights=50, decode_state=400, prefix_caches=30,
                    checkpoint_staging=150, eval_decode_state=0)
    transient = dict(update_temporaries=300, train_batch=10, generate_temporaries=20)
    k0 = memory.ledger(resident, transient, in_flight=False)
    k1 = memory.ledger(resident, transient, in_flight=True)
    assert k0["phases"]["update"]["bytes_per_chip"] == 100 + 200 + 300 + 10
    assert k1["phases"]["update"]["bytes_per_chip"] == 100 + 200 + 300 + 10 + 50 + 400 + 30
    assert k0["peak_phase"] == "generate" and k0["peak_bytes"] == 100 + 200 + 50 + 400 + 30 + 20
    assert k1["peak_phase"] == "update"
    assert set(k0["phases"]) == set(memory.PHASES)


def test_slots_are_sized_so_an_update_with_cohorts_in_flight_fits():
    """k >= 1: the decode state's slots fit beside the train step's peak, the sampler's
    weights and its prefix caches (ada.plan's max_num_slots takes the smaller count)."""
    import types

    resident = dict(reference_params=0, sampler_weights=100, prefix_caches=50,
                    decode_state=64 * 10)  # 10 bytes a slot at 64 slots
    ph = {"train": {"peak_bytes": 600}}
    engine = types.SimpleNamespace(num_slots=64)
    assert memory.update_slots(64, 4, ph, resident, engine, hbm=1000) == 24  # 250 / 10, by 4
    assert memory.update_slots(64, 4, ph, resident, engine, hbm=700) == 0
