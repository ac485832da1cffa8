"""Data sources: JSONL / Parquet readers, shared benchmark files, bad input, the iterator."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from benchmark_files import BENCHMARKS, SHARED, TRAIN_SETS, load_known, needs_shared

from ada.data.iterator import PromptIterator
from ada.data.sources import (
    DataError,
    RecordFormat,
    load_records,
    read_records,
    write_jsonl,
)


def _write_lines(path: Path, lines: list[str | bytes]) -> Path:
    with open(path, "wb") as f:
        for line in lines:
            f.write(line if isinstance(line, bytes) else line.encode("utf-8"))
            f.write(b"\n")
    return path


# ----------------------------------------------------------------------------- sources


def test_jsonl_math_style_with_solution_and_extra_columns(tmp_path):
    rows = [
        {"id": "a", "problem": "1+1?", "answer": "2", "solution": "It is \\boxed{2}.", "level": 1},
        {"problem": "  Half of 1? ", "answer": " \\frac{1}{2} "},
        {"problem": "Three?", "answer": 3},  # numeric gold becomes text
    ]
    p = _write_lines(tmp_path / "m.jsonl", [json.dumps(r) for r in rows])
    recs = load_records(p)
    assert [r["id"] for r in recs] == ["a", "m_1", "m_2"]
    assert recs[0] == {"id": "a", "problem": "1+1?", "answer": "2",
                       "solution": "It is \\boxed{2}.", "level": 1, "source": "m"}
    assert recs[1]["problem"] == "Half of 1?" and recs[1]["answer"] == "\\frac{1}{2}"
    assert "solution" not in recs[1]
    assert recs[2]["answer"] == "3"


def test_jsonl_configurable_columns_and_gsm8k_answers(tmp_path):
    rows = [{"question": "Q1", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"},
            {"question": "Q2", "answer": "so 1,000 + 125\n#### 1,125 "}]
    p = _write_lines(tmp_path / "gsm.jsonl", [json.dumps(r) for r in rows])
    fmt = RecordFormat(problem_key="question", answer_key="answer", answer_format="gsm8k",
                       source="gsm8k")
    recs = load_records(p, fmt)
    assert [(r["problem"], r["answer"], r["solution"]) for r in recs] == [
        ("Q1", "4", "2 + 2 = <<2+2=4>>4"), ("Q2", "1,125", "so 1,000 + 125")]
    assert all(r["source"] == "gsm8k" for r in recs) and "question" not in recs[0]
    # A gsm8k row without the marker names file and line.
    _write_lines(p, [json.dumps({"question": "Q", "answer": "no marker"})])
    with pytest.raises(DataError, match=r"gsm\.jsonl: line 1: .*'####'"):
        load_records(p, fmt)


def test_parquet_source_matches_jsonl(tmp_path):
    rows = [{"question": f"q{i}", "final": str(i * i), "sol": f"s{i}"} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    _write_lines(tmp_path / "d.jsonl", [json.dumps(r) for r in rows])
    fmt = RecordFormat(problem_key="question", answer_key="final", solution_key="sol")
    from_pq = load_records(tmp_path / "d.parquet", fmt)
    from_js = load_records(tmp_path / "d.jsonl", fmt)
    assert from_pq == from_js
    assert [r["answer"] for r in from_pq] == ["0", "1", "4", "9", "16"]
    assert [r["id"] for r in from_pq] == [f"d_{i}" for i in range(5)]


def test_write_jsonl_round_trip(tmp_path):
    recs = [{"id": "x", "problem": "π²?", "answer": "\\pi^2", "source": "s"}]
    assert write_jsonl(recs, tmp_path / "o.jsonl") == 1
    assert load_records(tmp_path / "o.jsonl") == recs


@needs_shared
@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_shared_benchmarks_load_with_gold_answers(name):
    recs = load_known(name)
    raw = [json.loads(line) for line in open(SHARED / BENCHMARKS[name].path, encoding="utf-8")]
    assert [(r["id"], r["problem"], r["answer"]) for r in recs] == [
        (str(x["id"]), x["problem"].strip(), x["answer"].strip()) for x in raw]


def test_benchmark_counts_match_the_readme():
    expected = {"math500": 500, "minerva_math": 272, "olympiadbench": 675, "aime24": 30,
                "amc23": 40, "gsm8k_test": 1319, "aime25": 30}
    assert {k: v.rows for k, v in BENCHMARKS.items()} == expected
    assert {k: v.rows for k, v in TRAIN_SETS.items()} == {
        "math_train": 7470, "gsm8k_train": 7473, "aime_1983_2023": 975}


@needs_shared
def test_shared_train_sets():
    math500 = load_known("math500")
    assert math500[0]["id"] == "test/precalculus/807.json"
    assert math500[0]["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    gsm = load_known("gsm8k_test")
    assert (gsm[0]["id"], gsm[0]["answer"]) == ("gsm8k_test_0", "18")
    for name in TRAIN_SETS:
        load_known(name)  # checks the row count


# ----------------------------------------------------------------------------- bad input

GOOD = json.dumps({"problem": "p0", "answer": "1"})


@pytest.mark.parametrize("bad_line,reason,message", [
    (json.dumps({"question": "p", "answer": "1"}), "missing-column",
     r"line 2: missing column 'problem' \(columns present: \['answer', 'question'\]\).*problem_key"),
    (b'{"problem": "caf\xe9", "answer": "1"}', "non-utf8",
     r"line 2: not valid UTF-8 \(byte 0xe9 at column 17\)"),
    (json.dumps({"problem": "p", "answer": "  "}), "empty-answer",
     r"line 2: column 'answer' \(the gold answer\) is empty"),
    (json.dumps({"problem": "p", "answer": None}), "bad-type", r"line 2: column 'answer' is None"),
    # the column in the row, not 1 (the next line, past the newline, as it said before)
    ('{"problem": "p", "answer": "1"', "bad-json",
     r"line 2: malformed JSON \(Expecting ',' delimiter at column 31\)"),
    ('["p", "1"]', "bad-json", r"line 2: a JSON list, expected an object"),
    (json.dumps({"id": "x", "problem": "p", "answer": "1"}), "duplicate-id",
     r"line 2: duplicate id 'x' \(first at line 1\)"),
])
def test_bad_rows_raise_naming_file_and_line_or_are_skipped(tmp_path, bad_line, reason, message):
    first = json.dumps({"id": "x", "problem": "p0", "answer": "1"})
    p = _write_lines(tmp_path / "bad.jsonl", [first, bad_line, GOOD.replace("p0", "p2")])
    with pytest.raises(DataError, match=r"bad\.jsonl: " + message) as e:
        read_records(p)
    assert "on_bad_row" in str(e.value) and "on_bad_row" not in e.value.problem
    assert e.value.skippable
    assert e.value.problem.startswith(f"{p}: line 2: ")
    recs, skipped = read_records(p, on_bad_row="skip")
    assert skipped == {reason: 1}
    assert [r["problem"] for r in recs] == ["p0", "p2"]


def test_empty_file_always_raises(tmp_path):
    for content in (b"", b"\n  \n"):
        p = tmp_path / "empty.jsonl"
        p.write_bytes(content)
        for policy in ("raise", "skip"):
            with pytest.raises(DataError, match=r"empty\.jsonl: file is empty") as e:
                read_records(p, on_bad_row=policy)
            assert not e.value.skippable and e.value.problem == str(e.value)
    pq.write_table(pa.table({"problem": pa.array([], pa.string()),
                             "answer": pa.array([], pa.string())}), tmp_path / "e.parquet")
    with pytest.raises(DataError, match=r"e\.parquet: file is empty"):
        load_records(tmp_path / "e.parquet")


def test_all_rows_skipped_is_an_error_not_an_empty_dataset(tmp_path):
    p = _write_lines(tmp_path / "q.jsonl", [json.dumps({"question": f"q{i}", "answer": "1"})
                                             for i in range(3)])
    with pytest.raises(DataError, match=r"q\.jsonl: no usable rows \(3 skipped: "
                                        r"\{'missing-column': 3\}\)"):
        read_records(p, on_bad_row="skip")


def test_parquet_bad_input(tmp_path):
    pq.write_table(pa.table({"question": ["a"], "answer": ["1"]}), tmp_path / "m.parquet")
    with pytest.raises(DataError, match=r"m\.parquet: missing column 'problem' \(columns: "
                                        r"\['question', 'answer'\]\).*problem_key"):
        load_records(tmp_path / "m.parquet")
    pq.write_table(pa.table({"problem": ["a", "b", "c"], "answer": ["1", "", None]}),
                   tmp_path / "r.parquet")
    with pytest.raises(DataError, match=r"r\.parquet: row 1: column 'answer' .* is empty"):
        load_records(tmp_path / "r.parquet")
    recs, skipped = read_records(tmp_path / "r.parquet", on_bad_row="skip")
    assert [r["problem"] for r in recs] == ["a"]
    assert skipped == {"empty-answer": 1, "bad-type": 1}
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"junk\.parquet: not a readable Parquet file"):
        load_records(tmp_path / "junk.parquet")


def test_file_level_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_records(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("problem,answer\n")
    with pytest.raises(DataError, match=r"unknown file type '\.csv'"):
        load_records(tmp_path / "x.csv")
    a = _write_lines(tmp_path / "a.jsonl", [json.dumps({"id": "1", "problem": "p", "answer": "1"})])
    b = _write_lines(tmp_path / "b.jsonl", [json.dumps({"id": "1", "problem": "q", "answer": "2"})])
    with pytest.raises(DataError, match=r"b\.jsonl: id '1' also appears in .*a\.jsonl") as e:
        load_records([a, b])
    assert e.value.problem == f"{b}: id '1' also appears in {a}" and e.value.skippable
    assert [r["problem"] for r in load_records([a, b], on_bad_row="skip")] == ["p"]


# ----------------------------------------------------------------------------- iterator


def _records(n):
    return [{"id": str(i), "problem": f"p{i}", "answer": str(i), "source": "t"} for i in range(n)]


def _ids(batch):
    return [int(r["id"]) for r in batch]


def test_iterator_epochs_are_permutations_and_seeded():
    recs = _records(10)
    it = PromptIterator(recs, batch_size=4, seed=3)
    assert it.batches_per_epoch == 2
    batches = [_ids(next(it)) for _ in range(6)]  # 3 epochs
    for e in range(3):
        epoch_ids = batches[2 * e] + batches[2 * e + 1]
        assert len(set(epoch_ids)) == 8  # no repeats within an epoch
        assert epoch_ids == it.epoch_order(e)[:8].tolist()
    assert batches[0:2] != batches[2:4]  # reshuffled per epoch
    again = PromptIterator(recs, batch_size=4, seed=3)
    assert [_ids(next(again)) for _ in range(6)] == batches
    other = PromptIterator(recs, batch_size=4, seed=4)
    assert [_ids(next(other)) for _ in range(6)] != batches
    plain = PromptIterator(recs, batch_size=5, shuffle=False)
    assert [_ids(next(plain)) for _ in range(3)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9],
                                                    [0, 1, 2, 3, 4]]


def test_iterator_state_save_restore_is_exact():
    recs = _records(23)
    ref = PromptIterator(recs, batch_size=6, seed=7)
    stream = [_ids(next(ref)) for _ in range(20)]
    for cut in (0, 1, 3, 7, 11):
        it = PromptIterator(recs, batch_size=6, seed=7)
        for _ in range(cut):
            next(it)
        saved = json.loads(json.dumps(it.get_state()))  # survives a JSON checkpoint
        resumed = PromptIterator(recs, batch_size=6, seed=7)
        resumed.set_state(saved)
        assert [_ids(next(resumed)) for _ in range(20 - cut)] == stream[cut:]
    assert saved["epoch"] == 11 // 3 and saved["position"] == 11 % 3


def test_iterator_state_mismatch_is_refused():
    it = PromptIterator(_records(10), batch_size=4, seed=0)
    state = it.get_state()
    with pytest.raises(ValueError, match="num_records=10 but this iterator has 9"):
        PromptIterator(_records(9), batch_size=4, seed=0).set_state(state)
    with pytest.raises(ValueError, match="seed=0 but this iterator has 1"):
        PromptIterator(_records(10), batch_size=4, seed=1).set_state(state)
    with pytest.raises(ValueError, match="out of range"):
        it.set_state({"epoch": 0, "position": 2})


@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_iterator_process_shards_are_disjoint_equal_and_cover(process_count):
    recs = _records(37)
    P = 8
    glob = PromptIterator(recs, batch_size=P, seed=5)
    shards = [PromptIterator(recs, batch_size=P, seed=5, process_index=i,
                             process_count=process_count) for i in range(process_count)]
    for _ in range(10):  # crosses two epoch boundaries (4 batches per epoch)
        g = _ids(next(glob))
        local = [_ids(next(s)) for s in shards]
        assert all(len(x) == P // process_count for x in local)
        assert sum(local, []) == g  # disjoint, ordered slices that cover the global batch
    assert all(s.get_state() == glob.get_state() for s in shards)


def test_iterator_bad_settings():
    with pytest.raises(ValueError, match="not divisible by process_count=3"):
        PromptIterator(_records(10), batch_size=4, process_count=3)
    with pytest.raises(ValueError, match=r"process_index=2 must be in \[0, process_count=2\)"):
        PromptIterator(_records(10), batch_size=4, process_index=2, process_count=2)
    with pytest.raises(DataError, match="only 3 prompts for a global batch of 4"):
        PromptIterator(_records(3), batch_size=4)
    np.testing.assert_array_equal(  # the order is a permutation of all records
        np.sort(PromptIterator(_records(10), batch_size=4).epoch_order(0)), np.arange(10))
