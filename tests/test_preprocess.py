"""Preprocessing: dedup normalisation, parseable gold, difficulty filter with resume."""

import dataclasses
import json

import numpy as np
import pytest

from ada.data.preprocess import (
    EASY_FILTER,
    HARD_FILTER,
    DifficultyFilter,
    PreprocessCounts,
    cached_pass_rates,
    dedup,
    difficulty_filter,
    normalize_problem,
    preprocess,
)
from ada.data.sources import DataError, read_records


@pytest.mark.parametrize("a,b", [
    ("What is  1+1?", "what is 1 + 1 ?"),
    ("Find $x$ if $2x = 4$.", "Find x if 2x=4."),
    ("Compute $\\dfrac{1}{2}$", "compute \\frac{1}{2}"),
    ("Let $a\\,=\\;3$", "Let a = 3"),
    ("$\\left( 1, 2 \\right)$", "(1,2)"),
    ("Ｆｉｎｄ １２", "find 12"),  # NFKC: full-width letters and digits
    ("x\n\ty\\quad z", "x y z"),
])
def test_normalize_problem_merges(a, b):
    assert normalize_problem(a) == normalize_problem(b)


@pytest.mark.parametrize("a,b", [
    ("Find 1 2", "Find 12"),
    ("x^2", "x^3"),
    ("\\leftarrow", "\\arrow"),  # \left is removed only as a whole command
    ("What is 1+1?", "What is 1+1"),
])
def test_normalize_problem_keeps_apart(a, b):
    assert normalize_problem(a) != normalize_problem(b)


def test_dedup_keeps_first_occurrence():
    recs = [{"id": str(i), "problem": p} for i, p in enumerate(
        ["A b", "a  B", "c", "C", "d", "a b"])]
    kept, n = dedup(recs)
    assert [r["id"] for r in kept] == ["0", "2", "4"] and n == 3


# ----------------------------------------------------------------------------- fake sampler


class FakeSampler:
    """Deterministic rewards: record['n_correct'] ones out of k; logs which ids it sampled."""

    def __init__(self, fail_on_call: int | None = None):
        self.calls: list[list[str]] = []
        self.fail_on_call = fail_on_call

    def __call__(self, records, k):
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise KeyboardInterrupt("simulated kill")
        self.calls.append([r["id"] for r in records])
        out = np.zeros((len(records), k))
        for i, r in enumerate(records):
            out[i, np.random.default_rng(i).permutation(k)[:r["n_correct"]]] = 1.0
        return out

    @property
    def sampled(self):
        return [i for c in self.calls for i in c]


def _recs(n_correct):
    return [{"id": f"r{i}", "problem": f"problem {i}", "answer": str(i), "n_correct": c}
            for i, c in enumerate(n_correct)]


def _filter(records, sampler, cfg, cache):
    """Pass rates (resumable through `cache`), then the filter: what preprocess does."""
    return difficulty_filter(records, cached_pass_rates(records, sampler, cfg, cache), cfg)


def test_paper_presets_on_every_pass_count(tmp_path):
    counts = list(range(17))  # 0..16 correct out of 16
    kept_hard, _ = _filter(_recs(counts), FakeSampler(), HARD_FILTER, tmp_path / "h")
    assert [r["n_correct"] for r in kept_hard] == [1, 2]  # >= 1 correct, rate <= 2/16
    assert [r["pass_rate"] for r in kept_hard] == [1 / 16, 2 / 16]
    kept_easy, n_easy = _filter(_recs(counts), FakeSampler(), EASY_FILTER, tmp_path / "e")
    assert [r["n_correct"] for r in kept_easy] == [1, 2, 3, 4, 5] and n_easy == 12
    band = DifficultyFilter(k=16, min_pass_rate=0.25, max_pass_rate=0.75)
    kept, _ = _filter(_recs(counts), FakeSampler(), band, tmp_path / "b")
    assert [r["n_correct"] for r in kept] == list(range(4, 13))


def test_difficulty_filter_reads_only_the_results_it_is_given():
    """The filter samples nothing: it keeps by the results dict (any extra ids ignored) and
    adds the cached pass rate, not one recomputed from the record."""
    recs = _recs([0, 0, 0])
    results = {"r0": {"num_correct": 1, "pass_rate": 0.25}, "r1": {"num_correct": 4, "pass_rate": 1.0},
               "r2": {"num_correct": 0, "pass_rate": 0.0}, "other": {"num_correct": 2, "pass_rate": 0.5}}
    cfg = DifficultyFilter(k=4, max_pass_rate=0.5, require_one_correct=True)
    kept, dropped = difficulty_filter(recs, results, cfg)
    assert [(r["id"], r["pass_rate"]) for r in kept] == [("r0", 0.25)] and dropped == 2
    assert "pass_rate" not in recs[0]  # the input records are not modified
    with pytest.raises(KeyError):
        difficulty_filter(_recs([0] * 4), results, cfg)  # r3 has no result


def test_pass_rates_match_brute_force(tmp_path):
    cfg = DifficultyFilter(k=8, prompts_per_call=3, correct_threshold=0.5)
    rng = np.random.default_rng(0)
    table = {f"r{i}": rng.uniform(size=8) for i in range(7)}
    table["r6"][:3] = 0.5  # exactly the threshold: not correct (reward > threshold)
    calls = []

    def rewards_fn(recs, k):
        calls.append(len(recs))
        return np.stack([table[r["id"]] for r in recs])

    res = cached_pass_rates(_recs([0] * 7), rewards_fn, cfg, tmp_path / "c.jsonl")
    assert list(res) == [f"r{i}" for i in range(7)] and calls == [3, 3, 1]
    for rid, rewards in table.items():
        n = sum(1 for x in rewards if x > 0.5)
        assert res[rid]["num_correct"] == n and res[rid]["pass_rate"] == n / 8
        assert res[rid]["k"] == 8 and res[rid]["id"] == rid
        np.testing.assert_array_equal(res[rid]["rewards"], rewards)
    # what is on disk is what was returned
    on_disk = {e["id"]: e for e in map(json.loads, (tmp_path / "c.jsonl").read_text().splitlines())}
    assert on_disk == res


@pytest.mark.parametrize("threshold,expected", [(0.5, [0, 1, 2]), (0.0, [2, 2, 2]),
                                                (1.0, [0, 0, 0])])
def test_correct_is_strictly_above_the_threshold(tmp_path, threshold, expected):
    """reward > correct_threshold, as the training rule (adaptive.positive_threshold) and
    evaluation count it: a reward equal to the threshold is not a pass."""
    table = {"r0": [0.0, 0.5, 0.5], "r1": [0.0, 0.5, 1.0], "r2": [0.0, 1.0, 1.0]}
    cfg = DifficultyFilter(k=3, correct_threshold=threshold)
    res = cached_pass_rates(_recs([0, 0, 0]), lambda recs, k: [table[r["id"]] for r in recs],
                            cfg, tmp_path / "c.jsonl")
    assert [res[f"r{i}"]["num_correct"] for i in range(3)] == expected
    if threshold == 0.5:  # a half-credit reward is stored as it was, but counts as a miss
        assert res["r0"]["rewards"] == [0.0, 0.5, 0.5] and res["r0"]["pass_rate"] == 0.0


def test_difficulty_filter_resumes_without_resampling(tmp_path):
    recs = _recs([0, 1, 2, 3, 1, 16, 2, 0, 1, 5])
    cfg = DifficultyFilter(k=16, max_pass_rate=0.125, require_one_correct=True,
                           prompts_per_call=3)
    cache = tmp_path / "passrates.jsonl"

    crashing = FakeSampler(fail_on_call=2)  # dies on the third chunk
    with pytest.raises(KeyboardInterrupt):
        _filter(recs, crashing, cfg, cache)
    assert crashing.sampled == ["r0", "r1", "r2", "r3", "r4", "r5"]
    assert len(cache.read_text().splitlines()) == 6  # two chunks written before the kill

    resumed = FakeSampler()
    kept, n_drop = _filter(recs, resumed, cfg, cache)
    assert resumed.sampled == ["r6", "r7", "r8", "r9"]  # finished prompts not re-sampled
    assert resumed.calls == [["r6", "r7", "r8"], ["r9"]]

    fresh = FakeSampler()
    kept_ref, n_ref = _filter(recs, fresh, cfg, tmp_path / "fresh.jsonl")
    assert kept == kept_ref and n_drop == n_ref == 5
    assert [r["id"] for r in kept] == ["r1", "r2", "r4", "r6", "r8"]

    again = FakeSampler()  # fully cached: no sampling at all
    assert _filter(recs, again, cfg, cache) == (kept, n_drop) and again.calls == []
    # another range re-filters the cached rates without sampling
    easy = FakeSampler()
    kept_easy, _ = _filter(recs, easy, dataclasses.replace(cfg, max_pass_rate=0.3125), cache)
    assert easy.calls == [] and [r["id"] for r in kept_easy] == ["r1", "r2", "r3", "r4", "r6",
                                                                  "r8", "r9"]


def test_cache_torn_last_line_is_dropped_and_resampled(tmp_path):
    recs = _recs([1, 2, 3])
    cfg = DifficultyFilter(k=4, prompts_per_call=1)
    cache = tmp_path / "c.jsonl"
    cached_pass_rates(recs[:2], FakeSampler(), cfg, cache)
    lines = cache.read_bytes().splitlines(keepends=True)
    cache.write_bytes(lines[0] + lines[1][:20])  # killed halfway through writing r1
    s = FakeSampler()
    res = cached_pass_rates(recs, s, cfg, cache)
    assert s.sampled == ["r1", "r2"]
    assert [res[r["id"]]["num_correct"] for r in recs] == [1, 2, 3]
    assert [json.loads(x)["id"] for x in cache.read_text().splitlines()] == ["r0", "r1", "r2"]


def test_cache_mismatches_are_refused(tmp_path):
    cache = tmp_path / "c.jsonl"
    cached_pass_rates(_recs([1, 2]), FakeSampler(), DifficultyFilter(k=4), cache)
    with pytest.raises(DataError, match=r"c\.jsonl: line 1: cached with k=4 samples, this run "
                                        r"asks k=8"):
        cached_pass_rates(_recs([1, 2]), FakeSampler(), DifficultyFilter(k=8), cache)
    other = _recs([1, 2])
    other[1]["problem"] = "a different problem"
    with pytest.raises(DataError, match="cached id 'r1' was computed for a different problem"):
        cached_pass_rates(other, FakeSampler(), DifficultyFilter(k=4), cache)
    with pytest.raises(DataError, match="record ids are not unique"):
        cached_pass_rates(_recs([1, 2]) + _recs([3]), FakeSampler(), DifficultyFilter(k=4),
                          tmp_path / "dup.jsonl")
    cache.write_text('{"id": "r0"}\n' + cache.read_text())  # corruption before the last line
    with pytest.raises(DataError, match=r"line 1: corrupt pass-rate cache entry"):
        cached_pass_rates(_recs([1, 2]), FakeSampler(), DifficultyFilter(k=4), cache)


def test_rewards_fn_contract_checked(tmp_path):
    with pytest.raises(ValueError, match=r"shape \(2, 3\), expected \(2, 4\)"):
        cached_pass_rates(_recs([1, 2]), lambda r, k: np.zeros((2, 3)), DifficultyFilter(k=4),
                          tmp_path / "a.jsonl")
    with pytest.raises(ValueError, match="non-finite"):
        cached_pass_rates(_recs([1, 2]), lambda r, k: np.full((2, k), np.nan),
                          DifficultyFilter(k=4), tmp_path / "b.jsonl")
    with pytest.raises(ValueError, match="min_pass_rate"):
        DifficultyFilter(min_pass_rate=0.5, max_pass_rate=0.25)
    with pytest.raises(ValueError, match="prompts_per_call=0 must be positive"):
        DifficultyFilter(prompts_per_call=0)
    with pytest.raises(ValueError, match="k=0"):
        DifficultyFilter(k=0)

# ----------------------------------------------------------------------------- pipeline

PLANTED = [
    # kept candidates (n_correct drives the fake sampler)
    '{"id": "a", "problem": "Compute $1+1$.", "answer": "2", "n_correct": 1}',
    '{"id": "b", "problem": "Compute $\\\\dfrac{1}{2}+\\\\dfrac{1}{2}$.", "answer": "1", "n_correct": 2}',
    '{"id": "c", "problem": "Solve $x^2 = 4$, $x>0$.", "answer": "\\\\frac{4}{2}", "n_correct": 0}',
    '{"id": "d", "problem": "Find the interval.", "answer": "(0, 1]", "n_correct": 1}',
    '{"id": "e", "problem": "Hard one.", "answer": "7", "n_correct": 9}',
    # planted duplicates of a and b (whitespace, case, LaTeX spacing, \\frac vs \\dfrac)
    '{"id": "a2", "problem": "compute  $1 + 1$ .", "answer": "2", "n_correct": 1}',
    '{"id": "b2", "problem": "Compute $\\\\frac{1}{2}\\\\,+\\\\,\\\\frac{1}{2}$.", "answer": "1", "n_correct": 2}',
    '{"id": "a3", "problem": "COMPUTE 1+1.", "answer": "2", "n_correct": 1}',
    # gold answers the verifier cannot parse
    '{"id": "u1", "problem": "Broken gold 1.", "answer": "\\\\frac{", "n_correct": 1}',
    '{"id": "u2", "problem": "Broken gold 2.", "answer": "\\\\sqrt{", "n_correct": 1}',
    # bad rows: empty answer, malformed JSON, missing column, non-UTF-8
    '{"id": "x1", "problem": "Empty gold.", "answer": ""}',
    '{"id": "x2", "problem": "Truncated",',
    '{"id": "x3", "question": "Wrong column.", "answer": "3"}',
    b'{"id": "x4", "problem": "Bad \xff byte.", "answer": "3"}',
]


@pytest.fixture(scope="module")
def planted_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("planted") / "planted.jsonl"
    with open(path, "wb") as f:
        for line in PLANTED:
            f.write((line if isinstance(line, bytes) else line.encode()) + b"\n")
    return path


def test_preprocess_counts_on_planted_file(planted_file, tmp_path):
    with pytest.raises(DataError, match=r"planted\.jsonl: line 11: .*gold answer\) is empty"):
        read_records(planted_file)
    recs, skipped = read_records(planted_file, on_bad_row="skip")
    assert skipped == {"empty-answer": 1, "bad-json": 1, "missing-column": 1, "non-utf8": 1}
    sampler = FakeSampler()
    cfg = DifficultyFilter(k=16, max_pass_rate=0.125, require_one_correct=True,
                           prompts_per_call=2)
    asked = []

    def rates(records):  # what `ada.evaluation.pass_rates` is to preprocess
        asked.append([r["id"] for r in records])
        return cached_pass_rates(records, sampler, cfg, tmp_path / "pr.jsonl")

    kept, counts = preprocess(recs, pass_rates_fn=rates, difficulty=cfg)  # real verifier
    assert counts == PreprocessCounts(input=10, duplicates=3, unparseable=2, filtered=2, kept=3)
    assert [r["id"] for r in kept] == ["a", "b", "d"]
    assert [r["pass_rate"] for r in kept] == [1 / 16, 2 / 16, 1 / 16]
    assert asked == [["a", "b", "c", "d", "e"]]  # called once, with only the 5 survivors
    assert sampler.calls == [["a", "b"], ["c", "d"], ["e"]]  # prompts_per_call at a time
    with pytest.raises(ValueError, match="needs `difficulty`"):
        preprocess(recs, is_parseable=lambda a: True, pass_rates_fn=rates)


def test_preprocess_without_sampler_and_empty_result(planted_file):
    recs, _ = read_records(planted_file, on_bad_row="skip")
    kept, counts = preprocess(recs, is_parseable=lambda a: a != "7")
    assert counts == PreprocessCounts(input=10, duplicates=3, unparseable=1, filtered=0, kept=6)
    assert "e" not in [r["id"] for r in kept]
    with pytest.raises(DataError, match="preprocessing left no prompts"):
        preprocess(recs, is_parseable=lambda a: False)


def test_dedup_on_shared_math_train_finds_the_known_duplicates():
    from benchmark_files import SHARED, load_known

    if SHARED is None:
        pytest.skip("shared data dir (../shared/data or $ADA_DATA_DIR) not present")
    recs = load_known("math_train")
    kept, n = dedup(recs)
    dropped = sorted({r["id"] for r in recs} - {r["id"] for r in kept})
    # Found by this normaliser and checked by eye: same problem, same gold answer, differing
    # only in spacing, \left|..\right| vs |..|, or $...$ vs \[...\].
    assert n == 4 and dropped == ["math_train_3870", "math_train_4310", "math_train_7353",
                                  "math_train_957"]
    assert dedup(load_known("math500"))[1] == 0
