"""Benchmark suites: which problem sets a suite evaluates, under which settings, and where
each set's `{problem, answer}` records come from (`python -m ada.evaluate --suite NAME`).

`paper` is the Reinforce-Ada paper's evaluation (Table 1), as its official code runs it
(github.com/RLHFlow/Reinforce-Ada, read at WeiXiongUST/Reinforce-Ada @ 1197333):

- avg@32 at temperature 1.0, top_p 1.0: `scripts/eval_model.sh` (K=32) and
  `eval/gen_data.py` (SamplingParams(temperature=1.0, top_p=1.0, n=K));
- a maximum generation length of 4,096 tokens for every benchmark: gen_data.py's
  `max_new_tokens` default, which eval_model.sh does not override, and the README's note under
  Table 1 ("a maximum generation length of 4096 tokens"). No benchmark has a length of its
  own there, so each benchmark's `max_new_tokens` below is that one value;
- the prompt: the model's chat template with the system turn "Please reason step by step, and
  put your final answer within \\boxed{}." (qwen25_math's default instruction) and the user
  turn `problem + " " + PROMPT_SUFFIX` (gen_data.py's `instruction_following`; training
  prompts in the paper have no suffix, `data_process/reformat.py`);
- the weighted average by the number of problems in each benchmark (Table 1's note).

Responses are scored by ada's math verifier (the `math` reward) for every benchmark; the
official `eval/compute_score.py` uses math-verify with the gold in \\boxed{}, and Qwen2.5-Math's
`math_equal` on the extracted answer for Minerva Math.

gen_data.py lets prompt + response reach 8,192 tokens (`max_input_length`, vLLM's
max_model_len) and so keeps every prompt; here prompts longer than data.max_prompt_len
(`--max_prompt_len`) are skipped and counted. Qwen2.5-Math's window is 4,096 positions, so a
long prompt plus 4,096 response tokens runs past it in both.

The paper's fourth column, "AIME-like", is one Hub set (`weqweasdas/aime_hmmt_brumo_cmimc_amc23`)
that also holds HMMT, BRUMO and CMIMC problems. This suite scores AIME24, AIME25 and AMC23
separately (the sets shared/data holds), so its weighted average is over 1,547 problems and
is not the paper's number to the decimal.

Records come from `data_dir/<file>` (JSONL with `problem` and `answer` fields:
the files of shared/data/benchmarks), or, without a data_dir, from the Hugging Face Hub
through the `datasets` package: the paper's own copies for MATH500, Minerva Math and
OlympiadBench (eval_model.sh; gen_data.py reads `problem` and the gold `gt`, split train),
widely used copies for AIME24, AIME25 and AMC23. Every fault is a `DataError` of one line
naming the fix.
"""

from __future__ import annotations

import dataclasses
import os

from ada.data.sources import (
    DataError,
    Record,
    RecordFormat,
    _BadRow,
    _RowCollector,
    load_records,
    row_to_record,
)

PROMPT_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."


@dataclasses.dataclass(frozen=True)
class Benchmark:
    name: str  # the key in the JSON and the --data_dir file's stem
    title: str  # the table's row label
    file: str  # the file in --data_dir
    hub: str  # the Hugging Face dataset loaded without a data_dir
    split: str
    problem_key: str  # the Hub copy's columns
    answer_key: str
    max_new_tokens: int


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    benchmarks: tuple[Benchmark, ...]
    samples: int  # k of avg@k
    temperature: float
    prompt_suffix: str  # appended to every problem, after a space


_PAPER_LEN = 4096
PAPER = Suite("paper", (
    Benchmark("math500", "MATH500", "math500.jsonl", "weqweasdas/math500", "train", "problem",
              "gt", _PAPER_LEN),
    Benchmark("minerva_math", "Minerva Math", "minerva_math.jsonl", "weqweasdas/minerva_math",
              "train", "problem", "gt", _PAPER_LEN),
    Benchmark("olympiadbench", "OlympiadBench", "olympiadbench.jsonl",
              "weqweasdas/olympiadbench", "train", "problem", "gt", _PAPER_LEN),
    Benchmark("aime24", "AIME24", "aime24.jsonl", "HuggingFaceH4/aime_2024", "train", "problem",
              "answer", _PAPER_LEN),
    Benchmark("aime25", "AIME25", "aime25.jsonl", "math-ai/aime25", "test", "problem", "answer",
              _PAPER_LEN),
    Benchmark("amc23", "AMC23", "amc23.jsonl", "math-ai/amc23", "test", "question", "answer",
              _PAPER_LEN),
), samples=32, temperature=1.0, prompt_suffix=PROMPT_SUFFIX)
SUITES = {s.name: s for s in (PAPER,)}


def source_of(b: Benchmark, data_dir: str) -> str:
    """Where `b`'s records come from: its file in data_dir, else its Hub name."""
    return os.path.join(data_dir, b.file) if data_dir else f"hf:{b.hub}:{b.split}"


def load_suite(suite: Suite, data_dir: str = "") -> dict[str, list[Record]]:
    """Every benchmark's records by name, each file checked before any is read."""
    if data_dir:
        files = [b.file for b in suite.benchmarks]
        if missing := [f for f in files if not os.path.isfile(os.path.join(data_dir, f))]:
            raise DataError(f"--data_dir {data_dir}: no {', '.join(missing)}; the {suite.name} "
                            f"suite reads {', '.join(files)} ({{problem, answer}} JSONL, as "
                            "shared/data/benchmarks holds them)")
    return {b.name: load_benchmark(b, data_dir) for b in suite.benchmarks}


def load_benchmark(b: Benchmark, data_dir: str = "") -> list[Record]:
    """`b`'s records from its file in data_dir, else from the Hugging Face Hub."""
    if data_dir:
        return load_records(os.path.join(data_dir, b.file), RecordFormat(source=b.name))
    return _load_hub(b)


def _load_hub(b: Benchmark) -> list[Record]:
    fix = "or pass --data_dir DIR, a folder of the benchmarks' {problem, answer} JSONL files"
    try:
        import datasets
    except ImportError:
        raise DataError(f"loading {b.title} by name needs the Hugging Face `datasets` package "
                        f"(pip install datasets), {fix}") from None
    try:
        rows = datasets.load_dataset(b.hub, split=b.split)
    except Exception as e:  # offline, unknown name, no such split: datasets raises many types
        offline = " (HF_HUB_OFFLINE=1)" if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise DataError(f"cannot load {b.hub} ({b.title}) from the Hugging Face Hub{offline}: "
                        f"{type(e).__name__}: {first}; connect to the Hub {fix}") from None
    fmt = RecordFormat(problem_key=b.problem_key, answer_key=b.answer_key, source=b.name)
    col = _RowCollector(f"hf:{b.hub}:{b.split}", "raise", "row")
    for i, row in enumerate(rows):
        try:
            col.add(i, row_to_record(dict(row), fmt, f"{b.name}_{i}", b.name))
        except _BadRow as err:
            col.bad(i, err)
    return col.finish()[0]
