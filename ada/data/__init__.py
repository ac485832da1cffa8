"""Prompt data: file / TFDS sources, synthetic tasks, a run's task and reward (task.py),
prompt encoding (encode.py), the training iterator, preprocessing.

The TFDS source is an optional extra: `from ada.data.tfds_source import load_tfds`.
A foundation: it may import only other foundations (errors, rewards, templates, tokenizer;
tests/test_layout.py), never the sampler, the config or the run.
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
    DataError,
    RecordFormat,
    load_records,
    read_records,
    write_jsonl,
)

__all__ = [
    "EASY_FILTER", "HARD_FILTER", "DataError", "DifficultyFilter", "PreprocessCounts",
    "PromptIterator", "RecordFormat", "load_records", "normalize_problem", "preprocess",
    "read_records", "write_jsonl",
]
