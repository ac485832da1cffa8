"""TensorFlow Datasets source (optional extra: `pip install 'ada[tfds]'`).

Reads an already-prepared TFDS dataset from a local directory (no download is ever
attempted) and yields the same record dicts as the file sources (`RecordFormat` maps the
features). For multi-host runs each process reads only its own slice of the split:
process i of n reads `split[i*m:(i+1)*m]` with m = num_examples // n, i.e. the shards of
`tfds.even_splits(split, n, drop_remainder=True)`: disjoint, equal-sized (so every host
runs the same number of steps), dropping the last `num_examples mod n` examples.
Generated ids use the global example index, so they agree whatever the process count.

A dataset, split or feature that cannot be used raises `TfdsError`, whose `arg` names the
argument to change, so a command line can name its own knob instead.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ada.data.sources import (
    BAD_ROW_POLICIES,
    DataError,
    Record,
    RecordFormat,
    _BadRow,
    _RowCollector,
    row_to_record,
)


class TfdsError(DataError):
    """A dataset, split or feature that cannot be used. `problem` is the fault alone and
    `arg` the load_tfds argument that fixes it: name_or_dir, split, problem_key or
    answer_key."""

    def __init__(self, problem: str, fix: str, arg: str):
        super().__init__(f"{problem}; {fix}", problem=problem)
        self.arg = arg


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(
            f"the TFDS source needs tensorflow-datasets and tensorflow ({e}); install the "
            "extra with `pip install 'ada[tfds]'`") from e
    return tfds


def _hide_gpus_from_tensorflow() -> None:
    """TF only reads records here; left alone it would reserve the GPUs' memory JAX needs.
    (Importing TensorFlow waits until now: the checks before it need only the metadata.)"""
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TF's devices were already set up in this process
        pass


def _builder(tfds, name_or_dir: str | os.PathLike, data_dir):
    """A prepared builder: a directory with dataset_info.json, else a name in data_dir."""
    p = Path(name_or_dir)
    if (p / "dataset_info.json").is_file():
        return tfds.builder_from_directory(p)
    if p.is_dir():
        raise TfdsError(f"{p} has no dataset_info.json",
                        "point at the version folder of a prepared TFDS dataset (e.g. "
                        "<data_dir>/<name>/<version>) or pass its name and data_dir",
                        "name_or_dir")
    # tfds logs a warning for each unprepared version folder; the errors below say it once.
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        try:
            builder = tfds.builder(str(name_or_dir), data_dir=data_dir)
        except Exception as e:  # unknown name, unreadable dir: tfds raises several types
            raise TfdsError(f"TFDS dataset {name_or_dir!r} not found in data_dir={data_dir!r} "
                            f"({type(e).__name__}: {_first_line(e)})",
                            "pass a prepared dataset's name and the data_dir that holds it, or "
                            "its version folder (no download is done)", "name_or_dir") from e
        prepared = builder.is_prepared()
    finally:
        absl.setLevel(level)
    if not prepared:
        raise TfdsError(f"TFDS dataset {name_or_dir!r} is not prepared in {builder.data_dir}",
                        "prepare it there first (e.g. `tfds build`) or pass the data_dir that "
                        "holds it; this source never downloads", "name_or_dir")
    return builder


def _first_line(e: Exception) -> str:
    """tfds errors run over several lines (an unknown name lists every registered one)."""
    return (str(e).strip().splitlines() or [""])[0]


def _python(value: Any) -> Any:
    """numpy scalar/bytes from tfds.as_numpy -> plain Python; text features -> str.

    Bytes that are not UTF-8 stay bytes, so problem/answer columns report them as bad rows.
    """
    if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0:
        value = value.item()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def process_split(split: str, num_examples: int, process_index: int,
                  process_count: int) -> tuple[str, int]:
    """(split string for this process, global index of its first example)."""
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index={process_index} must be in [0, process_count={process_count})")
    if process_count == 1:
        return split, 0
    if "[" in split or "+" in split:
        raise ValueError(f"split={split!r}: sharding over processes needs a plain split name")
    per = num_examples // process_count
    if per == 0:
        raise DataError(
            f"split {split!r} has {num_examples} examples, fewer than {process_count} processes")
    start = process_index * per
    return f"{split}[{start}:{start + per}]", start


def load_tfds(
    name_or_dir: str | os.PathLike,
    *,
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
    fmt: RecordFormat | None = None,
    process_index: int = 0,
    process_count: int = 1,
    on_bad_row: str = "raise",
) -> list[Record]:
    """This process's records of a prepared TFDS dataset (see the module docstring)."""
    if on_bad_row not in BAD_ROW_POLICIES:
        raise ValueError(f"on_bad_row={on_bad_row!r} is not one of {BAD_ROW_POLICIES}")
    tfds = _import_tfds()
    fmt = fmt or RecordFormat()
    builder = _builder(tfds, name_or_dir, data_dir)
    base = split.split("[")[0]
    try:
        tfds.core.ReadInstruction.from_spec(split)
    except ValueError as e:  # a malformed slice such as train[a:b]
        raise TfdsError(f"TFDS split {split!r} of {builder.name!r} is malformed "
                        f"({_first_line(e)})",
                        "pass a split name, optionally sliced like train[:90%]", "split") from e
    if base not in builder.info.splits:
        raise TfdsError(f"TFDS dataset {builder.name!r} has no split {base!r} (splits: "
                        f"{sorted(builder.info.splits)})", "pass one of them", "split")
    features = list(builder.info.features.keys())
    for key, what in ((fmt.problem_key, "problem"), (fmt.answer_key, "answer")):
        if key not in features:
            raise TfdsError(f"TFDS dataset {builder.name!r}: missing feature {key!r} "
                            f"(features: {features})",
                            f"set RecordFormat({what}_key=...) to the feature that holds it",
                            f"{what}_key")
    num = builder.info.splits[base].num_examples
    local_split, offset = process_split(split, num, process_index, process_count)
    source = fmt.source or builder.name
    where = f"TFDS {builder.name}:{local_split}"
    col = _RowCollector(where, on_bad_row, "example")
    _hide_gpus_from_tensorflow()
    ds = builder.as_dataset(split=local_split, shuffle_files=False)
    for i, example in enumerate(tfds.as_numpy(ds)):
        gi = offset + i
        try:
            row = {k: _python(v) for k, v in example.items()}
            record = row_to_record(row, fmt, f"{source}_{base}_{gi}", source)
        except _BadRow as err:
            col.bad(gi, err)
            continue
        col.add(gi, record)
    records, _ = col.finish()
    return records
