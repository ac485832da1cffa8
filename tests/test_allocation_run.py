"""The budget split in a run (adaptive.allocation, ada/run/allocator.py): its metrics, its
success memory saved and restored exactly (the same allocations, the same rows after a
resume), and its knobs' one-line errors. allocation=none is today's run bit for bit:
tests/test_stream.py's synchronous-loop test runs with the knobs set."""

import hashlib
import json
import os

import numpy as np
import pytest
from test_stream import _config, _train

from ada import config as C
from ada.adaptive import allocation, success
from ada.data.iterator import PromptIterator
from ada.metrics import is_timing, read_jsonl
from ada.run.allocator import Allocator
from ada.run.state import memory_from_json, memory_json

KNOBS = ("budget_used", "skipped_prompts", "zero_variance_share", "cap_min", "cap_max",
         "cap_std", "predicted_signal_share", "realised_signal_share")


def fixed_reward(record, text):
    """A third of the prompts always right, a third always wrong, the rest a coin: records
    that predict no signal, so the allocation skips some once it has seen them."""
    kind = hashlib.sha256(record["id"].encode()).digest()[0] % 3
    coin = hashlib.sha256((record["id"] + text).encode()).digest()[0] < 128
    return float(kind == 0 or (kind == 2 and coin))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def _knapsack(tmp_path, cache, steps, k=0, **extra):
    # 16 prompts, 8 a step: each comes back every other step, so records build up and skip
    return _config(tmp_path, cache, steps, k, **{
        "data.num_train": "16", "data.reward": "test_allocation_run:fixed_reward",
        "adaptive.allocation": "knapsack", "adaptive.skip_above": "0.25",
        "adaptive.budget": "40", **extra})


def _rows(workdir):
    return [{k: v for k, v in r.items() if not is_timing(k)}
            for r in read_jsonl(str(workdir / "metrics.jsonl"))[1:]]


@pytest.mark.slow
def test_knapsack_run_logs_its_split_and_resumes_exactly(tmp_path, cache):
    """A knapsack run logs the split's metrics every step, skips prompts whose record
    predicts no signal and still trains 8 prompts a step; stopped after step 2 and resumed,
    its rows are the uninterrupted run's (the memory is restored exactly: a memory lost or
    rounded on resume gives other caps or skips at steps 3-5)."""
    cfg = _knapsack(tmp_path, cache, 5)
    _train(cfg, tmp_path / "whole")
    rows = _rows(tmp_path / "whole")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for r in rows:
        assert all(k in r for k in KNOBS), sorted(set(KNOBS) - set(r))
        assert r["budget_used"] <= 40 and r["samples"] <= 40
        assert 2 <= r["cap_min"] <= r["cap_max"] <= 12
        assert r["realised_signal_share"] == 1 - r["zero_variance_share"]
    assert sum(r["skipped_prompts"] for r in rows) > 0
    assert any(r["cap_max"] > r["cap_min"] for r in rows)  # caps differ once records differ
    meta = json.load(open(tmp_path / "whole" / "checkpoints" / "5" / "meta" / "metadata"))
    assert meta["success_memory"]["size"] == 16

    trained = []
    _train(cfg, tmp_path / "resumed", trained, stop_after=2)
    _train(cfg, tmp_path / "resumed", trained)
    assert _rows(tmp_path / "resumed") == rows


@pytest.mark.slow
def test_knapsack_under_a_threaded_stream(tmp_path, cache):
    """k = 2 with the sampler on a thread of its own: cohorts are allocated while the trainer
    publishes memories, each from the memory of step t - 3 (a cohort that read a memory
    not yet published raises KeyError in the sampler thread); every step trains 8 prompts."""
    cfg = _knapsack(tmp_path, cache, 4, k=2, **{"rl.sampler_devices": "1"})
    trained = []
    _train(cfg, tmp_path / "k2", trained)
    rows = _rows(tmp_path / "k2")
    assert [s for s, _ in trained] == [1, 2, 3, 4] and all(len(b) == 8 for _, b in trained)
    assert all(r["staleness_max"] <= 2 and r["budget_used"] <= 40 for r in rows)


def test_allocation_none_logs_and_saves_nothing_new(tmp_path, cache):
    """allocation=none: no split metric in the rows and no memory in the checkpoint, the
    format runs have always had."""
    cfg = _config(tmp_path, cache, 1, 0, **{"adaptive.budget": "16"})
    _train(cfg, tmp_path / "none")
    row = _rows(tmp_path / "none")[0]
    assert not {"budget_used", "cap_max", "predicted_signal_share"} & set(row)
    meta = json.load(open(tmp_path / "none" / "checkpoints" / "1" / "meta" / "metadata"))
    assert "success_memory" not in meta


def _iter(process_index=0, process_count=1):
    """12 prompts in global batches of 4."""
    return PromptIterator([{"id": str(i)} for i in range(12)], 4, seed=3,
                          process_index=process_index, process_count=process_count)


def _memory(seed=0):
    rng = np.random.default_rng(seed)
    mem = success.init(12)
    for step in range(1, 6):
        ids = rng.choice(12, 4, replace=False)
        pos = rng.choice([0, 8, 8, 3, 5], 4)  # some all right or all wrong: skipped
        mem = success.update(mem, ids, pos, 8 - pos, step)
    return success.update(mem, [2], [16], [0], 5)  # in the first batch drawn: skipped


def test_saved_memory_gives_the_same_allocations_on_every_process():
    """The memory through the checkpoint's JSON is bit for bit the same, and allocators of
    two processes over it agree: the same prompts and caps, each process its own slice (a
    memory rounded on save, or a process allocating its own slice alone, differs)."""
    cfg = allocation.AllocConfig("knapsack", budget=24, max_cap=16, skip_above=0.3)
    mem = _memory()
    back = memory_from_json(json.loads(json.dumps(memory_json(mem))), success.init(12))
    for a, b in zip(success.state(mem).values(), success.state(back).values(), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    draws = []
    for m, pi, pc in ((mem, 0, 1), (back, 0, 1), (back, 0, 2), (back, 1, 2)):
        alloc = Allocator(cfg, _iter(pi, pc), m, start=5, max_staleness=0, half_life=40.0)
        first = alloc.draw(6)
        alloc.publish(6, _memory(1))  # as the trainer's gathered update would
        draws.append([first, alloc.draw(7)])
    for a, b in zip(draws[0], draws[1], strict=True):  # saved and restored
        assert [r["id"] for r in a[0]] == [r["id"] for r in b[0]]
        assert np.array_equal(a[1], b[1]) and a[2]["metrics"] == b[2]["metrics"]
    for whole, p0, p1 in zip(*draws[1:], strict=True):  # two processes: halves of the whole
        assert [r["id"] for r in p0[0] + p1[0]] == [r["id"] for r in whole[0]]
        assert np.array_equal(np.concatenate([p0[1], p1[1]]), whole[1])
        assert p0[2]["metrics"] == p1[2]["metrics"] == whole[2]["metrics"]
    assert any(d[2]["metrics"]["skipped_prompts"] for d in draws[0])


@pytest.mark.parametrize("extra,message", [
    ({"adaptive.allocation": "knapsack", "adaptive.budget": "10"},
     r"^adaptive.budget=10 is below adaptive.floor=2 x data.prompts_per_step=8 = 16 samples; "
     r"raise the budget"),
    ({"adaptive.allocation": "greedy"}, r"^adaptive.allocation='greedy' is not one of"),
    ({"adaptive.half_life": "0"}, r"^adaptive.half_life=0.0 must be > 0 steps"),
    ({"method": "dapo", "adaptive.allocation": "knapsack"},
     r"^adaptive.allocation=knapsack with method=dapo: DAPO's further batches have no caps"),
    ({"method": "ada_knapsack", "adaptive.allocation": "variance"},
     r"^adaptive.allocation='variance' with method=ada_knapsack, which splits by knapsack"),
])
def test_allocation_knobs_fail_in_one_line(tmp_path, cache, extra, message):
    with pytest.raises(C.ConfigError, match=message) as e:
        _config(tmp_path, cache, 1, 0, **extra)
    assert "\n" not in str(e.value)


def test_method_rows_set_the_split():
    """ada_knapsack is Ada-balance's rounds under knapsack caps; grpo_knapsack one round of
    up to M x N under them; the budget defaults to n x prompts_per_step."""
    cfg = C.build_config(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs",
                                      "default.py"), [("method", "grpo_knapsack")])
    a, c = C.alloc_config(cfg), C.collect_config(cfg)
    assert (a.allocation, a.budget, a.max_cap) == ("knapsack", 4 * 128, 32)
    assert (c.rule, c.samples_per_round, c.max_rounds) == ("none", 32, 1)
    cfg.method = "ada_knapsack"
    assert C.collect_config(cfg).rule == "balance" and C.alloc_config(cfg).allocation == "knapsack"
