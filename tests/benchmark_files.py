"""The shared benchmark and training files the tests read (normalised public JSONL copies,
`{id, problem, answer, source}` per line; origins in shared/data/README.md).

The library reads any such file with ada.data.sources.load_records; this list only says
which files the tests expect and how many rows each published copy has. SHARED is the
folder holding benchmarks/ and train/: $ADA_DATA_DIR, else ../shared/data next to the
repository; None when neither exists (tests marked `needs_shared` then skip).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from ada.data.sources import RecordFormat, load_records


@dataclasses.dataclass(frozen=True)
class KnownFile:
    path: str  # relative to the data dir
    rows: int  # published size; a different count means a truncated or different copy
    origin: str


_QWEN = "QwenLM/Qwen2.5-Math evaluation/data/{}/test.jsonl (MIT)"
BENCHMARKS: dict[str, KnownFile] = {
    "math500": KnownFile("benchmarks/math500.jsonl", 500,
                         "openai/prm800k prm800k/math_splits/test.jsonl (MIT)"),
    "minerva_math": KnownFile("benchmarks/minerva_math.jsonl", 272, _QWEN.format("minerva_math")),
    "olympiadbench": KnownFile("benchmarks/olympiadbench.jsonl", 675,
                               _QWEN.format("olympiadbench")),
    "aime24": KnownFile("benchmarks/aime24.jsonl", 30, _QWEN.format("aime24")),
    "amc23": KnownFile("benchmarks/amc23.jsonl", 40, _QWEN.format("amc23")),
    "gsm8k_test": KnownFile("benchmarks/gsm8k_test.jsonl", 1319,
                            "openai/grade-school-math grade_school_math/data/test.jsonl (MIT)"),
    "aime25": KnownFile("benchmarks/aime25.jsonl", 30,
                        "inclusionAI/AReaL evaluation/data/aime25/test.jsonl"),
}
TRAIN_SETS: dict[str, KnownFile] = {
    "math_train": KnownFile("train/math_train_deepscaler.jsonl", 7470,
                            "agentica-project/deepscaler deepscaler/data/train/math.json (MIT)"),
    "gsm8k_train": KnownFile("train/gsm8k_train.jsonl", 7473,
                             "openai/grade-school-math grade_school_math/data/train.jsonl (MIT)"),
    "aime_1983_2023": KnownFile("train/aime_1983_2023_deepscaler.jsonl", 975,
                                "agentica-project/deepscaler deepscaler/data/train/aime.json (MIT)"),
}


def _shared_data_dir() -> Path | None:
    candidates = [Path(__file__).resolve().parents[1].parent / "shared" / "data"]
    if os.environ.get("ADA_DATA_DIR"):
        candidates.insert(0, Path(os.environ["ADA_DATA_DIR"]))
    for c in candidates:
        if (c / "benchmarks").is_dir():
            return c
    return None


SHARED = _shared_data_dir()
needs_shared = pytest.mark.skipif(
    SHARED is None, reason="shared data dir (../shared/data or $ADA_DATA_DIR) not present")


def load_known(name: str) -> list[dict]:
    """The records of a listed benchmark or training file, read from SHARED with the
    library's reader; its row count must be the published one."""
    entry = BENCHMARKS.get(name) or TRAIN_SETS[name]
    records = load_records(SHARED / entry.path, RecordFormat(source=name))
    assert len(records) == entry.rows, (
        f"{entry.path}: {len(records)} rows, expected {entry.rows} (a copy of {entry.origin})")
    return records
