"""The memory ledger (ada/memory.py: `memory.run_memory(...)`, the `memory` ada.plan --json
prints) held to a real run: the tiny preset on a CPU mesh, dense and paged cache, at
rl.max_staleness 0 and 1, colocated on (4, 2) and split 4 + 4 (rl.sampler_devices = 4),
through init, stream steps, evals and saves. Each phase's resident total (`resident_bytes`)
must be within 10% of the live device bytes per chip (`jax.live_arrays`, shared buffers once)
where the run is in that phase: `loop.train`'s boundaries (`observe`: init, update (at the
collection's end and the update's), handoff; eval with nothing in flight has freed the
sampler, so holds what init holds), a save as orbax's thread holds its staging copy (it may
be gone by the save's boundary), and the moment the sampler frees its chips
(`Driver.release`: the end of generate or of an eval). A step with no cohort left in flight
is the k = 0 ledger's, as the run's policy. 64 prompts a step and 64 held-out prompts fill
the dense prefix LRU to its bound (64 rows at the longest prompt bucket, 16 tokens here), so
the bounded parts are held from below as well as above.

Split (k = 0), each role's chips against its own ledger (`run_memory(...)["meshes"]`): the
trainer's at the boundaries above; the sampler's, whose thread samples beside the trainer,
at moments that thread defines: before its first fill (init), as a cohort completes
(generate), as it takes new weights (handoff: the new copy waits beside the old, its
`bytes_per_chip`), and at a trainer boundary or an eval's end once its cohort is complete
(it then waits for the next weights: update, eval, save). The hand-off empties the sampler's
prefix LRU (prefills of the old weights) and the next cohort fills it again; after the last
hand-off none does, so readings there are held to the ledger less its prefix caches.

Checked by hand to fail it (each applied, run, seen failing, reverted): `prefix_bound` x 10;
`checkpoint_staging` x 10; the save phase without its staging copy; a second copy of the
sampler's weights at eval (eval through `rollout.sample` on a driver of its own); split,
the eval's second copy of the weights left out of the sampler's ledger. Also a
decode state kept through a k = 0 update, or any part the ledger forgets.
"""

import collections
import copy
import gc
import threading
import time

import jax
import numpy as np
import pytest
from orbax.checkpoint._src.serialization import replica_slices

from ada import config as cfglib
from ada import loop, memory, meshes, stream
from ada.run import trainer
from ada.sampling import driver
from configs import default

TOLERANCE = 0.10


def live_bytes() -> collections.Counter:
    """Each chip's live device bytes, each buffer once (a replica view and its source
    share buffers)."""
    per, seen = collections.Counter(), set()
    for a in jax.live_arrays():
        try:
            shards = [((sh.device.id, sh.data.unsafe_buffer_pointer()), sh.data.nbytes)
                      for sh in a.addressable_shards]
        # deleted while we read (an async save's thread frees its staging copies; at k >= 1
        # the sampler's thread donates its decode state): it holds no bytes now
        except (jax.errors.JaxRuntimeError, RuntimeError):
            continue
        for key, nbytes in shards:
            if key not in seen:
                seen.add(key)
                per[key[0]] += nbytes
    return per


def _config(tmp_path, cache: str, k: int, split: int):
    c = default.get_config()
    with c.unlocked():
        if split:  # conftest's 8 CPU devices: the first 4 train, the last 4 sample
            c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 1, 2
            c.sampling.mesh, c.rl.sampler_devices = (2, 2), split
        else:
            c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 4, 1, 2
            c.sampling.mesh = (4, 2)
        c.sampling.kv_cache = cache
        c.sampling.num_slots = 32
        c.data.prompts_per_step, c.data.num_train, c.data.num_eval = 64, 400, 64
        c.data.max_prompt_len = 16  # the synthetic prompts' bucket: the LRU's bound is reached
        c.adaptive.samples_per_round, c.adaptive.max_rounds = 2, 2
        c.rl.max_staleness = k
        c.train.steps, c.eval.every, c.eval.samples, c.checkpoint.every = 3, 2, 2, 2
        c.eval.pass_k = (1, 2)
        c.log.progress = False
        c.warmstart.enabled, c.warmstart.cache_dir = False, str(tmp_path / "cache")
    cfglib.validate(c)
    return c


def _boundary(phase: str, in_flight: bool, split: bool) -> str:
    """The ledger phase a `loop.train` boundary is in: the collection's end is the update's
    start; after an eval the chips hold what they held before it (colocated with nothing in
    flight: init's parts; split: the sampler's own driver is freed, the update's parts)."""
    after_eval = "update" if split else "eval" if in_flight else "init"
    return {"collect": "update", "eval": after_eval}.get(phase, phase)


def _wait(until, what: str, timeout: float = 300.0) -> None:
    t = time.monotonic()
    while not until():
        assert time.monotonic() - t < timeout, f"waited {timeout} s for {what}"
        time.sleep(0.005)


def held_to_the_ledger(tmp_path, monkeypatch, c) -> list:
    """Run `c`; at every boundary the live bytes per chip against `memory.run_memory`'s
    totals (per role on a split run). Returns what was seen: (phase, step, in flight, role,
    live, ledger)."""
    seen, ledgers, where = [], {}, {"in": None, "sampler_init": None, "saving": None}
    split = c.rl.sampler_devices > 0
    trainer_chips, sampler_chips = meshes.role_devices(c)
    lock = threading.Lock()
    gc.collect()  # what earlier tests left (a run's driver and backend are a cycle)
    before = live_bytes()

    def ledger_of(engine, in_flight: bool) -> dict:
        with lock:
            if not ledgers:
                sampler = memory.run_resident(c, engine.config, meshes.train_mesh(c), engine.mesh)
                c0 = copy.deepcopy(c)
                with c0.unlocked():
                    c0.rl.max_staleness = 0
                ledgers.update({False: memory.run_memory(c0, sampler),
                                True: memory.run_memory(c, sampler)})
            return ledgers[in_flight]

    def check(phase: str, step: int, engine, in_flight: bool, role: str | None = None,
              total: str = "resident_bytes", less: tuple = ()) -> None:
        """The fullest chip of `role` (None: colocated, every chip) against the ledger's
        `total` of `phase`, less the parts `less` (absent at that moment, said where)."""
        lg, now = ledger_of(engine, in_flight), live_bytes()
        ph = (lg["meshes"][role] if role else lg)["phases"][phase]
        want = ph[total] - sum(ph["parts"].get(p, 0) for p in less)
        devices = sampler_chips if role == "sampler" else trainer_chips
        live = max(now[d.id] - before[d.id] for d in devices)
        seen.append((phase, step, in_flight, role, live, want))

    def idle(s) -> None:
        """Split, k = 0: wait until the sampler's cohort is complete. It then waits for new
        weights and its chips hold a defined set: weights, decode state, a full prefix LRU."""
        _wait(lambda: not s.in_flight(), "the sampler's cohort")

    def sampler_side(s, phase: str, step: int) -> None:
        """Split: the sampler's chips at a trainer boundary where the sampler is idle. After
        the last hand-off no cohort refills the prefix LRU the hand-off emptied."""
        idle(s)
        last = s.version >= s.last_step
        check(phase, step, s.rollout.engine, False, "sampler",
              less=("prefix_caches",) if last else ())

    def observe(phase, step, s):
        in_flight = s.in_flight()
        phase = _boundary(phase, in_flight, split)
        if phase != "save":  # read as the staging copy is made (staged)
            check(phase, step, s.rollout.engine, in_flight, "trainer" if split else None)
        if not split:
            return
        if phase == "init":  # the sampler's own reading, before its first fill (sampler_step)
            _wait(lambda: where["sampler_init"] is not None, "the sampler's first fill")
        elif phase == "handoff":  # read by the sampler as it takes the weights (sampler_set)
            _wait(lambda: s.driver.version == s.version, "the sampler to take the weights")
        elif s.k == 0:  # at k >= 1 the sampler never idles: read at its own moments only
            sampler_side(s, phase, step)

    def save(self):  # the ledger assumes a save's copy to the host ends before the next
        where["saving"] = self   # collection (a CPU cannot time it): wait for it
        try:
            return saved(self)
        finally:
            self.ckpt.wait_until_finished()
            where["saving"] = None

    # A save's staging copy lives while orbax's thread copies it to the host, which may end
    # before `loop.train`'s save boundary: the chips are read as it exists, once every
    # slice a chip writes is on the chip and its copy to the host started (the first
    # np.asarray of orbax's `transfer_arrays_to_host`, which waits for those copies).
    to_host, pending = replica_slices.transfer_arrays_to_host, threading.local()

    class Numpy:
        def __getattr__(self, name):
            return getattr(np, name)

        def asarray(self, x, *a, **kw):
            if getattr(pending, "save", False) and isinstance(x, jax.Array):
                pending.save = False
                t = where["saving"]
                if t is not None:
                    s = t.stream
                    check("save", t.state.step, s.rollout.engine, s.in_flight(),
                          "trainer" if split else None)
            return np.asarray(x, *a, **kw)

    def staged(*a, **kw):
        pending.save = True
        try:
            return to_host(*a, **kw)
        finally:
            pending.save = False

    next_batch, sample = stream.Stream.next_batch, stream.Stream.sample
    release = driver.Driver.release
    saved, resume = trainer.Trainer.save, stream.Stream._resume
    step_, set_params = driver.Driver.step, driver.Driver.set_params

    def during(phase, fn):
        def wrapped(self, *a, **kw):
            where["in"] = (phase, self)
            try:
                return fn(self, *a, **kw)
            finally:
                where["in"] = None
        return wrapped

    def spy_release(self, weights=True):  # the sampler about to free its chips
        if where["in"] is not None:
            phase, s = where["in"]
            in_flight = s.in_flight()
            if split and s.k == 0:  # an eval's own driver beside the stream's, its cohort
                idle(s)                 # complete
                check(phase, s.version, s.rollout.engine, False, "sampler",
                      less=("prefix_caches",) if s.version >= s.last_step else ())
            check(phase, s.version, s.rollout.engine, in_flight, "trainer" if split else None)
        return release(self, weights)

    sampling = lambda: threading.current_thread().name == "ada-sampler"

    def sampler_step(self):  # split: the sampler's chips before its first fill
        if sampling() and where["sampler_init"] is None:
            check("init", self.version, self.engine, False, "sampler")
            where["sampler_init"] = self.version
        return step_(self)

    def sampler_set(self, params, version):  # split: the new weights wait beside the old
        if sampling():  # at k >= 1 the last cohorts may all have started before the previous
            # hand-off emptied the dense prefix LRU: then nothing refilled it
            empty = hasattr(self.backend, "_prefixes") and not self.backend._prefixes
            check("handoff", version, self.engine, False, "sampler", total="bytes_per_chip",
                  less=("prefix_caches",) if empty else ())
        return set_params(self, params, version)

    def sampler_done(self, cohort, got):  # split: a cohort complete (an eval runs beside
        resume(self, cohort, got)          # it: read once the eval has freed its driver)
        if sampling() and cohort.result is not None:
            _wait(lambda: where["in"] is None or where["in"][0] != "eval", "the eval")
            check("generate", cohort.step, self.rollout.engine, False, "sampler")

    monkeypatch.setattr(stream.Stream, "next_batch", during("generate", next_batch))
    monkeypatch.setattr(stream.Stream, "sample", during("eval", sample))
    monkeypatch.setattr(driver.Driver, "release", spy_release)
    monkeypatch.setattr(trainer.Trainer, "save", save)
    monkeypatch.setattr(replica_slices, "transfer_arrays_to_host", staged)
    monkeypatch.setattr(replica_slices, "np", Numpy())
    if split:
        monkeypatch.setattr(driver.Driver, "step", sampler_step)
        monkeypatch.setattr(driver.Driver, "set_params", sampler_set)
        monkeypatch.setattr(stream.Stream, "_resume", sampler_done)
    loop.train(c, str(tmp_path / "run"), observe=observe)
    for line in seen:
        print(*line)
    bad = [s for s in seen if abs(s[5] - s[4]) > TOLERANCE * s[4]]
    assert not bad, (bad, seen)
    return seen


@pytest.mark.parametrize("cache,k", [
    ("dense", 1), pytest.param("dense", 0, marks=pytest.mark.slow),
    pytest.param("paged", 0, marks=pytest.mark.slow),
    pytest.param("paged", 1, marks=pytest.mark.slow)])
def test_live_bytes_are_the_ledgers(tmp_path, monkeypatch, cache, k):
    seen = held_to_the_ledger(tmp_path, monkeypatch, _config(tmp_path, cache, k, 0))
    phases = {s[0] for s in seen}
    assert phases == {"init", "generate", "update", "handoff", "eval", "save"}, seen
    assert any(f for _, _, f, *_ in seen) == bool(k), seen  # k >= 1: cohorts in flight


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


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["dense", "paged"])
@pytest.mark.parametrize("k", [0, 1])
def test_a_split_run_holds_each_meshs_ledger(tmp_path, monkeypatch, k, cache):
    """rl.sampler_devices = 4: each role's 4 chips hold its phases of
    `run_memory(...)["meshes"]` within 10%. The trainer's at `loop.train`'s boundaries; the
    sampler's at moments its thread defines: before its first fill (init), as a cohort
    completes (generate), as it takes new weights, beside the old ones (handoff:
    `bytes_per_chip`, the old copy its transient), and at k = 0 at a trainer boundary or an
    eval's end once its cohort is complete (it then waits for weights; update, eval, save).
    At k = 1 the sampler never waits (a cohort is always in flight), so it is read at its
    own moments only."""
    seen = held_to_the_ledger(tmp_path, monkeypatch, _config(tmp_path, cache, k, 4))
    idle = ("update", "eval", "save") if k == 0 else ()
    assert {(s[0], s[3]) for s in seen} == {(p, "trainer") for p in (
        "init", "update", "handoff", "eval", "save")} | {(p, "sampler") for p in (
        "init", "generate", "handoff", *idle)}, seen
