"""TFDS source on a tiny dataset the test writes itself (no network)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from ada.data.sources import DataError, RecordFormat
from ada.data.tfds_source import load_tfds, process_split


def test_missing_tfds_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install 'ada\[tfds\]'"):
        load_tfds("anything", data_dir="/nonexistent")


def test_process_split_ranges():
    assert process_split("train", 10, 0, 1) == ("train", 0)
    assert [process_split("train", 10, i, 3) for i in range(3)] == [
        ("train[0:3]", 0), ("train[3:6]", 3), ("train[6:9]", 6)]
    with pytest.raises(ValueError, match="plain split name"):
        process_split("train[:50%]", 10, 0, 2)
    with pytest.raises(DataError, match="fewer than 4 processes"):
        process_split("train", 3, 0, 4)


try:
    import tensorflow_datasets as tfds
except ImportError:
    tfds = None
needs_tfds = pytest.mark.skipif(
    tfds is None, reason="tensorflow-datasets not installed (pip install 'ada[tfds]')")

N = 11
ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3}
        for i in range(N)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    features = tfds.features.FeaturesDict({
        "question": tfds.features.Text(), "answer": tfds.features.Text(),
        "level": tfds.features.Scalar(dtype=np.int64)})
    bad = [{"question": "Empty gold?", "answer": "", "level": 0},
           {"question": "Fine.", "answer": "1", "level": 0}]
    builder = tfds.dataset_builders.store_as_tfds_dataset(
        name="tiny_math", version="1.0.0", features=features, data_dir=data_dir,
        split_datasets={"train": [(i, r) for i, r in enumerate(ROWS)],
                        "bad": [(i, r) for i, r in enumerate(bad)]},
        disable_shuffling=True)
    return data_dir, builder.data_dir


FMT = RecordFormat(problem_key="question", answer_key="answer", source="tiny")


@needs_tfds
def test_reads_records_by_name_and_by_directory(tiny):
    data_dir, version_dir = tiny
    by_name = load_tfds("tiny_math", data_dir=data_dir, fmt=FMT)
    by_dir = load_tfds(version_dir, fmt=FMT)
    assert by_name == by_dir
    assert [(r["problem"], r["answer"], r["level"]) for r in by_name] == [
        (r["question"], r["answer"], r["level"]) for r in ROWS]
    assert by_name[3] == {"id": "tiny_train_3", "problem": "What is 3 + 3?", "answer": "6",
                          "source": "tiny", "level": 0}


@needs_tfds
@pytest.mark.parametrize("count", [2, 3, 4])
def test_process_shards_disjoint_equal_and_match_even_splits(tiny, count):
    data_dir, _ = tiny
    full = load_tfds("tiny_math", data_dir=data_dir, fmt=FMT)
    shards = [load_tfds("tiny_math", data_dir=data_dir, fmt=FMT, process_index=i,
                        process_count=count) for i in range(count)]
    per = N // count
    assert all(len(s) == per for s in shards)  # equal: every host runs the same steps
    flat = sum(shards, [])
    assert len({r["id"] for r in flat}) == per * count  # disjoint
    assert flat == full[:per * count]  # covering, in order; the N mod count tail is dropped
    # Same examples as TFDS's own even split.
    builder = tfds.builder("tiny_math", data_dir=data_dir)
    for i, sp in enumerate(tfds.even_splits("train", n=count, drop_remainder=True)):
        ref = [ex["question"].decode() for ex in tfds.as_numpy(builder.as_dataset(split=sp))]
        assert [r["problem"] for r in shards[i]] == ref


@needs_tfds
def test_tfds_bad_input(tiny, tmp_path):
    data_dir, _ = tiny
    with pytest.raises(DataError, match=r"missing feature 'problem' \(features: .*question.*"
                                        r"problem_key"):
        load_tfds("tiny_math", data_dir=data_dir)  # default RecordFormat expects 'problem'
    with pytest.raises(DataError, match=r"tiny_math:bad: example 0: column 'answer' \(the gold "
                                        r"answer\) is empty"):
        load_tfds("tiny_math", data_dir=data_dir, split="bad", fmt=FMT)
    recs = load_tfds("tiny_math", data_dir=data_dir, split="bad", fmt=FMT, on_bad_row="skip")
    assert [r["problem"] for r in recs] == ["Fine."]
    with pytest.raises(DataError, match="has no split 'test'"):
        load_tfds("tiny_math", data_dir=data_dir, split="test", fmt=FMT)
    with pytest.raises(DataError, match="not found|not prepared"):
        load_tfds("tiny_math", data_dir=tmp_path, fmt=FMT)
    with pytest.raises(DataError, match="no dataset_info.json"):
        load_tfds(tmp_path, fmt=FMT)


# ----------------------------------------------------------------------------- as a config source

DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                       "default.py")


def _overrides(data_dir, **extra):
    ov = {"data.source": "tfds", "data.tfds_name": "tiny_math", "data.tfds_data_dir": str(data_dir),
          "data.tfds_split": "train", "data.tfds_eval_split": "train[:4]",
          "data.problem_key": "question", "warmstart.enabled": "false"}
    ov.update(extra)
    return ov


@pytest.mark.slow
@needs_tfds
def test_runner_trains_two_steps_from_tfds(tiny, tmp_path):
    from ada.cli.train import main as train_main
    from ada.metrics import read_jsonl

    data_dir, _ = tiny
    ov = _overrides(data_dir, **{
        "data.prompts_per_step": "4", "adaptive.samples_per_round": "4",
        "adaptive.max_rounds": "2", "sampling.num_slots": "32", "sampling.max_new_tokens": "6",
        "train.steps": "2", "eval.every": "2", "eval.samples": "2", "eval.pass_k": "(1,2)",
        "checkpoint.every": "2", "warmstart.cache_dir": str(tmp_path / "cache"),
        "log.progress": "false", "log.plots": "false"})
    wd = tmp_path / "run"
    assert train_main([f"--config.{k}={v}" for k, v in ov.items()] + ["--workdir", str(wd)]) == 0
    rows = read_jsonl(str(wd / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "eval_accuracy" in rows[-1] and rows[1]["samples"] > 0
    assert (wd / "checkpoints" / "2").is_dir()


@needs_tfds
def test_config_source_by_version_folder_and_eval_cap(tiny):
    from ada import config as C
    from ada.data.task import load_task
    from ada.rewards.math_verifier import math_reward

    data_dir, version_dir = tiny
    cfg = C.build_config(DEFAULT, list(_overrides(
        "", **{"data.tfds_name": str(version_dir), "data.tfds_data_dir": "",
               "data.tfds_eval_split": "train", "data.num_eval": "3"}).items()))
    C.validate(cfg)
    task = load_task(cfg)
    assert [r["problem"] for r in task.train] == [r["question"] for r in ROWS]
    assert len(task.eval) == 3 and task.reward is math_reward


@needs_tfds
@pytest.mark.parametrize("change, want", [
    ({"data.tfds_name": "no_such_dataset"}, "set --config.data.tfds_name"),
    ({"data.tfds_split": "test"}, "has no split 'test' (splits: ['bad', 'train']); set "
                                  "--config.data.tfds_split"),
    ({"data.tfds_eval_split": "validation"}, "set --config.data.tfds_eval_split"),
    ({"data.tfds_split": "train[a:b]"}, "set --config.data.tfds_split"),
    ({"data.problem_key": "problem"}, "missing feature 'problem'"),
    ({"data.answer_key": "solution"}, "set --config.data.answer_key"),
    ({"data.tfds_split": "bad"}, "--config.data.on_bad_row=skip"),
])
def test_bad_tfds_input_is_one_line_naming_the_knob(tiny, change, want):
    from ada import config as C
    from ada.config import ConfigError
    from ada.data.task import load_task

    data_dir, _ = tiny
    cfg = C.build_config(DEFAULT, list(_overrides(data_dir, **change).items()))
    C.validate(cfg)
    with pytest.raises(ConfigError) as e:
        load_task(cfg)
    assert want in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_tfds_not_installed_names_the_extra(monkeypatch, tmp_path):
    from ada import config as C
    from ada.config import ConfigError
    from ada.data.task import load_task

    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    cfg = C.build_config(DEFAULT, list(_overrides(tmp_path).items()))
    with pytest.raises(ConfigError, match=r"^data.source=tfds: .*pip install 'ada\[tfds\]'"):
        load_task(cfg)


def test_validate_needs_a_tfds_name_and_an_existing_data_dir(tmp_path):
    from ada import config as C
    from ada.config import ConfigError

    cfg = C.build_config(DEFAULT, list(_overrides(tmp_path, **{"data.tfds_name": ""}).items()))
    with pytest.raises(ConfigError, match="--config.data.tfds_name="):
        C.validate(cfg)
    cfg = C.build_config(DEFAULT, list(_overrides(tmp_path / "missing").items()))
    with pytest.raises(ConfigError, match="data.tfds_data_dir=.* does not exist"):
        C.validate(cfg)


@pytest.mark.slow
@needs_tfds
def test_runner_refuses_an_unknown_split_in_one_line_before_training(tiny, tmp_path):
    data_dir, _ = tiny
    ov = _overrides(data_dir, **{"data.tfds_split": "test",
                                 "warmstart.cache_dir": str(tmp_path / "cache")})
    args = [f"--config.{k}={v}" for k, v in ov.items()] + ["--workdir", str(tmp_path / "run")]
    r = subprocess.run([sys.executable, "-m", "ada.runner", *args], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("error: ") and "--config.data.tfds_split" in lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()
