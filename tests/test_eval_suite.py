"""`python -m ada.evaluate --suite paper`: the Reinforce-Ada paper's evaluation as one
command, on the shared benchmark files (../shared/data/benchmarks, never copied into the
repo) with the tiny random model of test_cli's run directory: the table, the count-weighted
average, the JSON, a resume of an interrupted suite, and the one-line errors."""

import hashlib
import json
import sys
import types

import pytest
from benchmark_files import SHARED, needs_shared
from test_cli import run_dir  # noqa: F401 - a run directory with no checkpoint (initial params)

from ada.cli import eval as ev
from ada.data.benchmarks import PAPER, load_benchmark
from ada.evaluation import weighted_average

NAMES = [b.name for b in PAPER.benchmarks]


def _lines(text):
    return [ln for ln in text.splitlines() if ln.strip()]


def _pooled(results):
    """The hand computation: every problem's avg@k pooled."""
    return (sum(r["avg_at_k"] * r["n"] for r in results.values())
            / sum(r["n"] for r in results.values()))


def test_weighted_average_weighs_each_benchmark_by_its_problems():
    """2 problems at 0.5 and 6 at 0.25: (1 + 1.5) / 8 = 0.3125, not the mean of the rows
    (0.375). Breaking it: a plain mean of the benchmarks' avg@k."""
    res = {"a": {"avg_at_k": 0.5, "n": 2}, "b": {"avg_at_k": 0.25, "n": 6}}
    assert weighted_average(res) == pytest.approx(0.3125)
    with pytest.raises(ValueError, match="at least one problem"):
        weighted_average({"a": {"avg_at_k": 0.0, "n": 0}})


@pytest.mark.slow
@needs_shared
def test_paper_suite_table_json_and_resume(run_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The command on the shared files (the 1 to 4 shortest problems of each, in a test
    folder) at the suite's own k (32) and temperature (1.0), under a reward that marks some
    problems right. Ctrl-C during the third benchmark: one line, exit 130, the two finished
    benchmarks in --json. The same command then samples only the four others, keeps the two
    as they were, prints six rows in the paper's order and the weighted average, and writes
    the same numbers in the issue's JSON format; the weighted average is the hand-pooled one,
    which differs here from the rows' mean. A rerun with another k is refused.
    Breaking it: a rerun that starts over, a partial file lost on interrupt, a resume that
    takes results made with other settings, a k other than 32, a missing or reordered row, a
    plain mean of the rows."""
    from ada import evaluation
    from ada.data import task

    data = tmp_path / "data"
    data.mkdir()
    sizes = dict(zip(NAMES, (4, 2, 3, 1, 2, 1), strict=True))
    for b in PAPER.benchmarks:  # two prompt buckets (128, 256): two prefill compiles
        rows = (SHARED / "benchmarks" / b.file).read_text().splitlines()
        rows = sorted(rows, key=lambda r: len(json.loads(r)["problem"]))[: sizes[b.name]]
        (data / b.file).write_text("\n".join(rows) + "\n")
    monkeypatch.setattr(task, "load_reward", lambda spec: lambda rec, text: float(
        hashlib.sha256(rec["id"].encode()).digest()[0] % 2))
    calls, stop, real = [], [True], evaluation.evaluate_policy

    def interrupted(*a, **kw):
        calls.append(len(a[2]))  # the benchmark's problems
        if len(calls) == 3 and stop[0]:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(evaluation, "evaluate_policy", interrupted)
    out = tmp_path / "paper.json"
    argv = ["--workdir", str(run_dir), "--suite", "paper", "--data_dir", str(data),
            "--max_prompt_len", "256", "--max_new_tokens", "4", "--json", str(out)]
    assert ev.main(argv) == 130
    err = _lines(capsys.readouterr().err)
    assert err[-1] == f"interrupted: the benchmarks done are in {out}; the same command resumes"
    first = json.loads(out.read_text())
    assert list(first["benchmarks"]) == sorted(NAMES[:2]) and first["weighted_avg"] is None

    calls.clear()
    stop[0] = False
    assert ev.main(argv) == 0
    assert calls == [sizes[n] for n in NAMES[2:]]  # only the four left, each whole
    saved = json.loads(out.read_text())
    res = saved["benchmarks"]
    assert {n: res[n] for n in NAMES[:2]} == first["benchmarks"]  # kept, not redone
    assert [(res[n]["n"], res[n]["k"]) for n in NAMES] == [(sizes[n], 32) for n in NAMES]
    assert (saved["settings"]["samples"], saved["settings"]["temperature"]) == (32, 1.0)
    mean = sum(r["avg_at_k"] for r in res.values()) / len(res)
    assert saved["weighted_avg"] == pytest.approx(_pooled(res))
    assert abs(saved["weighted_avg"] - mean) > 1e-3, res  # the weighting is exercised

    rows = [ln.split() for ln in _lines(capsys.readouterr().out)]
    assert rows[0] == ["benchmark", "n", "avg@32"] and len(rows) == 8, rows
    titles = [b.title for b in PAPER.benchmarks]
    assert [" ".join(row[:-2]) for row in rows[1:]] == titles + ["weighted avg"]
    for b, row in zip(PAPER.benchmarks, rows[1:7], strict=True):
        assert row[-2:] == [str(sizes[b.name]), f"{100 * res[b.name]['avg_at_k']:.1f}"]
    assert rows[7][-2:] == [str(sum(sizes.values())), f"{100 * saved['weighted_avg']:.1f}"]

    assert ev.main(argv[:-2] + ["--samples", "3", "--json", str(out)]) == 2
    err = _lines(capsys.readouterr().err)
    assert len(err) == 1 and "samples: 32 then, 3 now" in err[0] and "--json" in err[0], err


def _one_error(argv, capsys) -> str:
    assert ev.main(argv) == 2
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_suite_errors_are_one_line_before_the_model_loads(run_dir, tmp_path, capsys,  # noqa: F811
                                                          monkeypatch):
    """A missing benchmark file, an unknown suite, a Hub that cannot be reached (offline) or
    no `datasets` package, and flags that do not go with --suite: each one line naming the
    fix, exit 2, and no model loaded (ada.run.saved.load_run is never reached). Breaking it: a
    traceback, a second line, or the model loading first."""
    from ada.run import saved

    monkeypatch.setattr(saved, "load_run", lambda *a, **k: pytest.fail("the model loaded"))
    suite = ["--workdir", str(run_dir), "--suite", "paper"]
    (tmp_path / "math500.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n')
    line = _one_error(suite + ["--data_dir", str(tmp_path)], capsys)
    assert f"--data_dir {tmp_path}: no minerva_math.jsonl, olympiadbench.jsonl, aime24.jsonl, " \
        "aime25.jsonl, amc23.jsonl; the paper suite reads math500.jsonl, " in line
    assert "nope: no such suite; known suites: ['paper']" in _one_error(
        ["--workdir", str(run_dir), "--suite", "nope"], capsys)
    assert "pass one" in _one_error(suite + ["--benchmark", "x.jsonl"], capsys)
    assert "pass --suite" in _one_error(["--workdir", str(run_dir), "--data_dir", "d"], capsys)

    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    line = _one_error(suite, capsys)
    assert "needs the Hugging Face `datasets` package" in line and "--data_dir" in line

    def offline(name, split):  # what datasets raises with HF_HUB_OFFLINE=1 and no cache
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)\n"
                              "more detail")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _one_error(suite, capsys)
    assert "cannot load weqweasdas/math500 (MATH500) from the Hugging Face Hub (HF_HUB_OFFLINE=1)" \
        in line and "ConnectionError: Couldn't reach" in line and "--data_dir" in line


def test_hub_rows_become_records_by_each_benchmark_columns(monkeypatch):
    """Without --data_dir a benchmark loads by its Hub name and split, its own columns
    mapped onto problem / answer (AMC23's copy: `question`, a float answer). Breaking it:
    another column, split or name."""
    asked = []

    def load_dataset(name, split):
        asked.append((name, split))
        return [{"question": "What is 3*9?", "answer": 27.0}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    amc = next(b for b in PAPER.benchmarks if b.name == "amc23")
    (rec,) = load_benchmark(amc)
    assert asked == [("math-ai/amc23", "test")]
    assert (rec["problem"], rec["answer"], rec["id"]) == ("What is 3*9?", "27.0", "amc23_0")
