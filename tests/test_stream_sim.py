"""experiments/stream_sim.py: ada/stream.py's Stream over the simulated driver, colocated and
split, k = 0..2, with and without younger cohorts yielding slots to the head."""

import importlib.util
import json
import os

import numpy as np
import pytest

from ada.adaptive.collect import CollectConfig
from ada.adaptive.simulate import SharedSimDriver, SimulatedDriver, SimulatedPolicy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "stream_sim", os.path.join(ROOT, "experiments", "stream_sim.py"))
sim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim)

TINY = ["--steps", "5", "--prompts", "4", "--slots", "16", "--seeds", "0", "--ks", "0,1,2",
        "--mean-len", "32", "--max-len", "128", "--update", "40"]


def hand_outs(driver, k, steps=5):
    """(clock, lag histogram, kept sample indices) of each batch a colocated stream hands out."""
    cfg = CollectConfig(rule="balance", n=4, samples_per_round=4, max_rounds=3)
    stream = sim.SimStream(driver, cfg, sim.SimPrompts("skewed", 3, 4), max_staleness=k,
                           last_step=steps, seed=3)
    out = []
    for t in range(1, steps + 1):
        batch, m = stream.next_batch()
        out.append((driver.clock, m["staleness_hist"], batch.sample_idx.tolist()))
        driver.wait(7)
        stream.set_params(None, t)
    return out


@pytest.mark.parametrize("k", [0, 2])
def test_shared_driver_gives_the_slots_as_the_stream_does(k):
    """The waiting queue (free slots to the oldest cohort first) hands out the same batches
    at the same simulated times as the stream sharing a plain slot driver, where each cohort
    takes free slots in the order Stream._deliver resumes them. Breaks if the queue's order
    differs from the stream's (e.g. submission order instead of cohort age), which would
    make the head-of-line figures those of another scheduler."""
    policy = SimulatedPolicy(seed=3, mean_len=24, max_len=96)
    shared = hand_outs(SharedSimDriver(policy, 8), k)
    plain = hand_outs(SimulatedDriver(policy, 8), k)
    assert shared == plain
    assert max(len(h) - 1 for _, h, _ in shared) <= k


def test_stream_sim_runs_tiny_and_keeps_the_bound(tmp_path):
    """Every run keeps its bound on every trained token (k = 0: all lag 0), its shares are
    shares, colocated the sampler is idle exactly while the trainer is not, and with
    head_first the head never waits for slots a younger cohort holds. Breaks if admission
    stopped bounding the lag, if the idle or head-of-line accounting double-counted time,
    or if the outputs were not written."""
    out = sim.main([*TINY, "--out", str(tmp_path)])
    runs = out["runs"]
    assert len(runs) == 2 * 2 * 3
    for r in runs:
        assert r["lag_max"] <= r["k"] and len(r["lag_hist"]) == r["k"] + 1
        assert sum(r["lag_share"]) == pytest.approx(1.0)
        for f in ("sampler_idle_share", "trainer_idle_share", "update_share", "slot_occupancy",
                  "hol_share", "hol_slot_share", "spanning_share"):
            assert 0.0 <= r[f] <= 1.0, (f, r)
        if r["k"] == 0:
            assert r["lag_hist"][1:] == [] and r["hol_share"] == 0 == r["spanning_share"]
        if r["mode"] == "colocated":
            assert r["sampler_idle_share"] + r["trainer_idle_share"] == pytest.approx(1.0)
        if r["policy"] == "head_first":
            assert r["hol_share"] == 0
    by = {(r["mode"], r["policy"], r["k"]): r for r in runs}
    # k = 0: one cohort at a time, so colocated and split are the same run
    assert by["colocated", "oldest", 0]["decode_steps"] == by["split", "oldest", 0]["decode_steps"]
    assert np.any([by["split", "oldest", k]["lag_hist"][k] for k in (1, 2)])
    assert json.loads((tmp_path / "stream_sim.json").read_text())["summary"] == out["summary"]
    assert "| split | oldest | 2 |" in (tmp_path / "stream_sim.md").read_text()
