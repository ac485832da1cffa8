"""Prompt data: file / benchmark / TFDS sources, synthetic tasks, the training iterator,
preprocessing.

The TFDS source is an optional extra: `from ada.data.tfds_source import load_tfds`.
"""

from ada.data.iterator import PromptIterator
from ada.data.preprocess import (
    EASY_FILTER,
    HARD_FILTER,
    DifficultyFilter,
    PreprocessCounts,
    normalize_problem,
    preprocess,
)
from ada.data.sources import (
    BENCHMARKS,
    TRAIN_SETS,
    DataError,
    RecordFormat,
    load_benchmark,
    load_records,
    load_train_set,
    read_records,
    write_jsonl,
)

__all__ = [
    "BENCHMARKS", "EASY_FILTER", "HARD_FILTER", "TRAIN_SETS", "DataError", "DifficultyFilter",
    "PreprocessCounts", "PromptIterator", "RecordFormat", "load_benchmark", "load_records",
    "load_train_set", "normalize_problem", "preprocess", "read_records", "write_jsonl",
]
