"""The stream (ada/stream.py): at rl.max_staleness = 0 it is the synchronous loop bit for
bit; above 0 the next steps' prompts sample while a step drains, no trained token lags more
than k versions, and a killed run resumes with the bound kept, no prompt lost and none
trained twice."""

import hashlib
import os

import jax
import numpy as np
import pytest
import sync_loop

from ada import config as C
from ada.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")


def coin_reward(record, text):
    """1 or 0 by a hash of the prompt and the response: mixed groups, so prompts exit after
    different rounds and the last rounds of a step leave slots empty."""
    return float(hashlib.sha256((record["id"] + text).encode()).digest()[0] < 100)


def _config(tmp_path, cache, steps, k, **extra):
    ov = {"data.num_train": "200", "data.num_eval": "0", "data.prompts_per_step": "8",
          "data.reward": "test_stream:coin_reward", "adaptive.samples_per_round": "4",
          "adaptive.max_rounds": "3", "sampling.num_slots": "16", "sampling.max_new_tokens": "6",
          "train.steps": str(steps), "eval.every": "0", "checkpoint.every": "1",
          "warmstart.enabled": "false", "warmstart.cache_dir": cache,
          "log.progress": "false", "log.plots": "false", "log.tensorboard": "false",
          "optim.lr": "1e-2", "optim.warmup_steps": "1", "rl.max_staleness": str(k), **extra}
    cfg = C.build_config(DEFAULT, list(ov.items()))
    C.validate(cfg, str(tmp_path))
    return cfg


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def _train(cfg, workdir, trained=None, **kw):
    """Run the loop; `trained` collects the prompt ids of each batch the stream hands out."""
    from ada import stream
    from ada.loop import train

    if trained is None:
        return train(cfg, str(workdir), **kw)
    original = stream.Stream.next_batch

    def next_batch(self):
        collected, m = original(self)
        trained.append((self.version + 1, [p["id"] for p in collected.prompts]))
        return collected, m

    stream.Stream.next_batch = next_batch
    try:
        return train(cfg, str(workdir), **kw)
    finally:
        stream.Stream.next_batch = original


def _params(workdir):
    from ada.checkpoint import Checkpointer

    return jax.tree.leaves(Checkpointer(os.path.join(workdir, "checkpoints")).restore_params()[0]["params"])


@pytest.mark.parametrize("extra", [{"adaptive.allocation": "none", "adaptive.budget": "16"},
                                   {"adaptive.scheduler": "continuous"}])
def test_staleness_0_is_the_synchronous_loop_bit_for_bit(tmp_path, cache, extra):
    """k = 0: the stream's metrics and parameters are the synchronous loop's, bit for bit
    (with adaptive.allocation=none, whatever the budget: the loop as it was before the knob).
    Its batches carry behaviour log-probs and lags as at k > 0, so the importance weights
    are the loss's own (is_weights), not written in: every token lags 0 and weighs exactly
    1 (a lag off by one, or a weight for fresh tokens, gives a mean that is not 1)."""
    cfg = _config(tmp_path, cache, 4, 0, **extra)
    _train(cfg, tmp_path / "stream")
    rows = read_jsonl(str(tmp_path / "stream" / "metrics.jsonl"))[1:]
    ref_rows, ref_params = sync_loop.run(cfg, 4)
    assert len(rows) == len(ref_rows) == 4
    for row, ref in zip(rows, ref_rows, strict=True):
        ref = sync_loop.comparable(ref)
        assert {k: row[k] for k in ref} == ref
        assert row["staleness_max"] == 0 and row["staleness_hist"][0] > 0
        assert row["is_weight_mean"] == 1.0 and row["is_weight_truncated_share"] == 0.0
        assert row["is_weight_nonfinite_share"] == 0.0
    assert any(r["pg_loss"] != 0 for r in ref_rows)  # the steps trained on something
    assert any(len(r["active_prompts_per_round"]) > 1 for r in ref_rows) or "adaptive.scheduler" in extra
    got = _params(str(tmp_path / "stream"))
    want = jax.tree.leaves(ref_params)
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_staleness_bound_and_resume(tmp_path, cache):
    """k = 2: later steps' prompts sample during a step (tokens lag), never more than 2
    versions; killed after step 3 and resumed, the run trains every batch of the data
    order once, in order, and the first batch after the resume is sampled afresh."""
    k, steps = 2, 6
    cfg = _config(tmp_path, cache, steps, k)
    whole, trained = tmp_path / "whole", []
    _train(cfg, whole, trained)
    rows = read_jsonl(str(whole / "metrics.jsonl"))[1:]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(r["staleness_max"] <= k and len(r["staleness_hist"]) == k + 1 for r in rows)
    assert max(r["staleness_max"] for r in rows) >= 1  # the stream did overlap steps
    assert max(r["cohorts_in_flight"] for r in rows) >= 1
    for r in rows:
        assert np.isfinite(r["is_weight_mean"]) and 0 <= r["is_weight_truncated_share"] <= 1
        assert 0 <= r["sampler_idle_share"] <= 1 and 0 <= r["trainer_idle_share"] <= 1
        assert 0 <= r["spanning_share"] <= 1 and r["carried_tokens"] >= 0
    stale = [r for r in rows if r["staleness_max"] > 0]
    assert all(r["is_weight_mean"] != 1.0 for r in stale)  # the weights were applied

    resumed, trained_b = tmp_path / "resumed", []
    _train(cfg, resumed, trained_b, stop_after=3)
    _train(cfg, resumed, trained_b)
    rows_b = read_jsonl(str(resumed / "metrics.jsonl"))[1:]
    assert [r["step"] for r in rows_b] == list(range(1, steps + 1))
    assert trained_b == trained  # every batch once, in the data's order
    assert all(r["staleness_max"] <= k for r in rows_b)
    assert rows_b[3]["staleness_max"] == 0  # step 4: drawn again after the resume
    assert [r["samples_total"] for r in rows_b][:3] == [r["samples_total"] for r in rows][:3]


def test_dapo_cannot_stream(tmp_path, cache):
    with pytest.raises(C.ConfigError, match="rl.max_staleness=1 with method=dapo"):
        _config(tmp_path, cache, 2, 1, method="dapo")


def _two(cmds, env_of):
    """Run one command per process of a two-process job; their (returncode, stderr)."""
    import subprocess

    procs = [subprocess.Popen(cmd, env=env_of(i), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i, cmd in enumerate(cmds)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, err) for p, (_, err) in zip(procs, outs, strict=True)]


@pytest.mark.slow
def test_staleness_0_is_the_synchronous_loop_in_two_processes(tmp_path):
    """Two processes (4 CPU devices each, one SPMD update over 8): the runner's stream at
    k = 0 and the synchronous rl_step loop (tests/sync_loop.py) in the same two-process
    layout give the same metrics and parameters, bit for bit. Under LoRA (rank 4), so the
    hand-off merges adapters trained on the 8-device mesh into each process's sampler
    (full fine-tuning across processes: tests/test_multihost.py)."""
    import json

    from helpers import free_port
    from test_multihost import _cmd, _data, _env

    data, cache = _data(tmp_path), str(tmp_path / "cache")
    runner = _cmd(data, str(tmp_path / "stream"), cache,
                  **{"sampling.mesh": "(4,1)", "model.lora.rank": 4})
    overrides = runner[runner.index("--config") + 2:runner.index("--workdir")]
    out = str(tmp_path / "sync.json")
    sync = [runner[0], os.path.join(ROOT, "tests", "sync_loop.py"), out, DEFAULT, *overrides]
    for cmds in ([runner, runner], [sync, sync]):
        port = free_port()
        results = _two(cmds, lambda i, port=port: _env(
            4, ADA_COORDINATOR=f"localhost:{port}", ADA_NUM_PROCESSES="2", ADA_PROCESS_ID=str(i)))
        for code, err in results:
            assert code == 0, err[-3000:]
    rows = read_jsonl(str(tmp_path / "stream" / "metrics.jsonl"))[1:]
    ref = json.load(open(out))
    assert len(rows) == len(ref) == 2
    assert max(rows[0]["rounds_per_process"]) > min(rows[0]["rounds_per_process"])
    assert [r["lora_rank"] for r in rows] == [4, 4]  # and the checkpoints hold adapters only
    for row, want in zip(rows, ref, strict=True):
        assert {k: row[k] for k in want} == want
    got = _params(str(tmp_path / "stream"))
    want = list(np.load(out + ".npz").values())
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def _devices(tree) -> set:
    return {d for x in jax.tree.leaves(tree) for d in x.sharding.device_set}


@pytest.mark.slow
def test_a_sampler_on_devices_of_its_own(tmp_path, cache, monkeypatch):
    """rl.sampler_devices=1: the last device samples on its own thread, the first trains.
    At k = 0 that is still the synchronous loop, bit for bit. At k = 2 the sampler's weights
    and decode state live on its device only, the trainer's weights on none of it, and the
    sampler ran chunks while the trainer updated (the driver's chunk count grew between a
    batch's hand-out and the end of its update); the bound holds and every batch trains
    once, in order, however the threads interleave. Killed as step 4 starts (cohorts past
    the checkpoint in flight on the sampler's thread) and resumed, the run trains the same
    batches in the same order, none twice, step 4's afresh."""
    from ada import stream

    k0 = _config(tmp_path, cache, 3, 0, **{"rl.sampler_devices": "1"})
    _train(k0, tmp_path / "k0")
    ref_rows, ref_params = sync_loop.run(_config(tmp_path, cache, 3, 0), 3)
    rows = read_jsonl(str(tmp_path / "k0" / "metrics.jsonl"))[1:]
    for row, ref in zip(rows, ref_rows, strict=True):
        ref = sync_loop.comparable(ref)
        assert {k: row[k] for k in ref} == ref
    got, want = _params(str(tmp_path / "k0")), jax.tree.leaves(ref_params)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))

    seen = {"sampler": set(), "trainer": set(), "chunks_out": {}, "chunks_trained": {}}
    next_batch, set_params = stream.Stream.next_batch, stream.Stream.set_params

    def spy_next_batch(self):
        out = next_batch(self)
        seen["chunks_out"][self.version + 1] = self.driver.counts.chunks
        seen["sampler"] |= _devices(self.driver.params) | _devices(self.driver.state)
        return out

    def spy_set_params(self, params, version):
        seen["chunks_trained"][version] = self.driver.counts.chunks  # the update is complete
        seen["trainer"] |= _devices(params)
        return set_params(self, params, version)

    monkeypatch.setattr(stream.Stream, "next_batch", spy_next_batch)
    monkeypatch.setattr(stream.Stream, "set_params", spy_set_params)
    steps, cfg = 6, _config(tmp_path, cache, 6, 2, **{"rl.sampler_devices": "1"})
    trained = []
    _train(cfg, tmp_path / "k2", trained)
    rows = read_jsonl(str(tmp_path / "k2" / "metrics.jsonl"))[1:]
    assert [s for s, _ in trained] == list(range(1, steps + 1))
    assert all(r["staleness_max"] <= 2 and 0 <= r["sampler_idle_share"] <= 1 for r in rows)
    assert seen["sampler"] == {jax.local_devices()[-1]}
    assert seen["trainer"] and not seen["trainer"] & seen["sampler"]
    assert any(seen["chunks_trained"][t] > seen["chunks_out"][t] for t in range(1, steps + 1))

    monkeypatch.undo()
    killed, trained_b = tmp_path / "killed", []
    monkeypatch.setenv("ADA_FAULT", "loop.raise@4")
    with pytest.raises(RuntimeError, match="fault injected"):
        _train(cfg, killed, trained_b)
    monkeypatch.delenv("ADA_FAULT")
    _train(cfg, killed, trained_b)
    rows_b = read_jsonl(str(killed / "metrics.jsonl"))[1:]
    assert [r["step"] for r in rows_b] == list(range(1, steps + 1))
    assert trained_b == trained  # every batch once, in the data's order
    ids = [i for _, batch in trained_b for i in batch]
    assert len(ids) == len(set(ids)) == steps * 8
    assert all(r["staleness_max"] <= 2 for r in rows_b)
    assert rows_b[3]["staleness_max"] == 0  # step 4: drawn again after the resume


@pytest.mark.slow
def test_a_lora_sampler_on_devices_of_its_own_gets_only_the_adapters(tmp_path, cache,
                                                                    monkeypatch):
    """rl.sampler_devices=1 under LoRA: each update hands the sampler's device only the
    adapters (`handoff_bytes` = their bytes, logged with `lora_rank`), merged there into the
    base placed once; the sampler's weights equal the trainer's effective weights merged
    (`sampling_params` of its params) bit for bit, on the sampler's device only, and at
    k = 0 the run is the colocated synchronous loop's, rows and params. Breaks if the
    hand-off crossed the base (bytes), merged a stale or missing adapter, or left the
    merged weights on the trainer's device."""
    from ada import stream
    from ada.models import lora
    from ada.sampling.driver import Driver

    lora_kw = {"model.lora.rank": "4"}
    seen = {"want": {}, "got": {}, "adapters": 0}
    set_params, driver_set = stream.Stream.set_params, Driver.set_params

    def spy_set_params(self, params, version):
        fn = jax.jit(self.rollout.engine._sampling_fn)  # the colocated hand-off, on the trainer's
        seen["want"][version] = jax.tree.map(np.asarray, fn(params))
        seen["adapters"] = sum(x.nbytes for x in jax.tree.leaves(lora.split(params)[0]))
        return set_params(self, params, version)

    def spy_driver(self, params, version):
        driver_set(self, params, version)
        seen["got"][version] = (_devices(self.params), jax.tree.map(np.asarray, self.params))

    monkeypatch.setattr(stream.Stream, "set_params", spy_set_params)
    monkeypatch.setattr(Driver, "set_params", spy_driver)
    cfg = _config(tmp_path, cache, 2, 0, **{"rl.sampler_devices": "1"}, **lora_kw)
    _train(cfg, tmp_path / "split")
    monkeypatch.undo()
    assert sorted(seen["got"]) == sorted(seen["want"]) == [1, 2]
    for version, (devices, got) in seen["got"].items():
        assert devices == {jax.local_devices()[-1]}
        want = seen["want"][version]
        assert jax.tree.structure(got) == jax.tree.structure(want)
        assert all(np.array_equal(a, b) for a, b in
                   zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True))
    rows = read_jsonl(str(tmp_path / "split" / "metrics.jsonl"))[1:]
    assert [(r["lora_rank"], r["handoff_bytes"]) for r in rows] == [(4, seen["adapters"])] * 2
    ref_rows, ref_params = sync_loop.run(_config(tmp_path, cache, 2, 0, **lora_kw), 2)
    for row, ref in zip(rows, ref_rows, strict=True):
        ref = sync_loop.comparable(ref)
        assert {k: row[k] for k in ref} == ref
    got = _params(str(tmp_path / "split"))  # a LoRA checkpoint holds the adapters alone
    want = jax.tree.leaves(lora.split(ref_params)[0])
    assert len(got) == len(want)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_sampler_needs_a_device_to_spare(tmp_path, cache):
    from ada.loop import train

    cfg = _config(tmp_path, cache, 1, 0, **{"rl.sampler_devices": "8", "sampling.mesh": "(-1,1)"})
    with pytest.raises(C.ConfigError, match="rl.sampler_devices=8 leaves no device to train on"):
        train(cfg, str(tmp_path / "run"))


@pytest.mark.parametrize("sampler_mesh,spans", [("(1,1)", 1), ("(2,2)", 4), ("(-1,2)", 2)])
def test_a_sampler_mesh_must_use_the_sampler_devices(tmp_path, cache, sampler_mesh, spans):
    """rl.sampler_devices=3 with a sampling mesh over fewer (a device idle) or more devices
    than that is one line naming both knobs, before anything runs."""
    with pytest.raises(C.ConfigError, match=(
            rf"^rl.sampler_devices=3 with sampling.mesh=.*: the sampling mesh spans {spans} "
            r"devices, not the sampler's 3; make sampling.mesh's data x tensor = 3")):
        _config(tmp_path, cache, 1, 0, **{"rl.sampler_devices": "3",
                                          "sampling.mesh": sampler_mesh})
    _config(tmp_path, cache, 1, 0, **{"rl.sampler_devices": "3", "sampling.mesh": "(3,1)"})


@pytest.mark.parametrize("paged", [False, True])
def test_new_weights_between_chunks(paged):
    """Driver.set_params: a running request goes on, its tokens recording both versions and
    its carried tokens counted; no later request starts from a prompt prefilled by the old
    weights, on either cache (its tokens equal a fresh driver's under the new weights, drawn
    with the request's own step key).

    Each token is labelled with the version of the logits it was drawn from: the first token
    of the chunk after the swap (the 5th) comes from the old weights' last logits, so it is
    version 0, and its behaviour log-prob is the old model's, not the new one's (labelled 1,
    as the driver once did, it would get importance weight 1 and lag 0)."""
    from helpers import random_params
    from test_engine import model_logprobs

    from ada.models import preset
    from ada.sampling.driver import Driver, Request
    from ada.sampling.engine import Engine
    from ada.sampling.paged import PagedEngine

    c = preset("tiny", family="llama")
    old, new = random_params(c, seed=1), random_params(c, seed=2)
    kw = dict(num_slots=2, max_prompt_len=16, max_new_tokens=12, chunk_size=4, eos_ids=())
    engine = PagedEngine(c, page_size=4, **kw) if paged else Engine(c, **kw)
    prompt = list(range(3, 12))
    key = jax.random.key_data(jax.random.PRNGKey(7))
    drv = Driver(engine, old, step_key=0)
    drv.submit(Request(prompt, prompt_id=1, sample_idx=0, step_key=key))
    assert drv.step() == []  # one chunk of 4 under version 0
    drv.set_params(new, 1)
    assert drv.carried_tokens == 4
    (done,) = [x for _ in range(3) for x in drv.step()]
    assert done.versions == [0] * 5 + [1] * 7 and len(done.token_ids) == 12
    alone = Driver(engine, old, step_key=key).generate_all(
        [Request(prompt, prompt_id=1, sample_idx=0)])[0]  # the old weights throughout
    assert done.token_ids[:5] == alone.token_ids[:5]
    np.testing.assert_allclose(done.logprobs[:5], alone.logprobs[:5], atol=1e-6)
    by_old, by_new = (model_logprobs(p, c, prompt, done.token_ids[:5])[4] for p in (old, new))
    assert abs(done.logprobs[4] - by_old) < 2e-5 < abs(done.logprobs[4] - by_new)
    lag = 1 - np.asarray(done.versions)  # as the batch of the step that trains it (batch.py)
    assert lag[4] == 1 and not lag[5:].any()
    before = drv.counts.prefilled_prompts
    drv.submit(Request(prompt, prompt_id=1, sample_idx=1, step_key=key))
    (again,) = [x for _ in range(3) for x in drv.step()]
    assert drv.counts.prefilled_prompts == before + 1  # prefilled again, by the new weights
    fresh = Driver(engine, new, step_key=key).generate_all(
        [Request(prompt, prompt_id=1, sample_idx=1)])[0]
    assert again.token_ids == fresh.token_ids and again.versions == [1] * 12
