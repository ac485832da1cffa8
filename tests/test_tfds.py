"""TFDS source on a tiny dataset the test writes itself (no network)."""

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
