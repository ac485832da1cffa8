"""Prompt sources: JSONL / Parquet files.

Every source yields the same record dict, so the rest of the pipeline never sees a file
format:

    {"id": str, "problem": str, "answer": str, "source": str,
     "solution": str (only when the file has one), ...any other columns, verbatim}

Column names are configurable (`RecordFormat`), so OpenR1-Math / MATH style files
(`problem`, `answer`, `solution`), GSM8K (`question`, `answer` = "... #### 42") and the
files in shared/data all load through one reader. Bad input stops at the boundary: a
missing column, non-UTF-8 bytes, a malformed JSON line, an empty answer or a duplicate id
raises `DataError` naming the file and the line (JSONL, 1-based) or row (Parquet, 0-based),
unless `on_bad_row="skip"`, where the row is skipped, counted and logged. An empty file, or
a file where nothing usable is left, always raises: a run never trains on a silently empty
dataset. The training stream over these records is ada.data.iterator.PromptIterator.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

Record = dict[str, Any]

ANSWER_FORMATS = ("plain", "gsm8k")
BAD_ROW_POLICIES = ("raise", "skip")


class DataError(ValueError):
    """A data file (or a row of it) that cannot be used; the message names file, row, fix.

    `problem` is the fault alone (file, row, what is wrong), without the message's advice
    on library arguments, so a command line can append the fix in its own terms;
    `skippable` says whether on_bad_row="skip" would have skipped it instead; `key` names the
    RecordFormat field ("problem_key" / "answer_key") of a missing column, else None.
    """

    def __init__(self, message: str, problem: str | None = None, skippable: bool = False,
                 key: str | None = None):
        super().__init__(message)
        self.problem = message if problem is None else problem
        self.skippable = skippable
        self.key = key


@dataclasses.dataclass(frozen=True)
class RecordFormat:
    """How the columns of a file map onto a record.

    problem_key / answer_key: required columns. solution_key / id_key / source_key are
    optional: a missing solution is left out, a missing id becomes `<source>_<row index>`,
    a missing source becomes `source` (or the file stem). answer_format="gsm8k" takes the
    text after the last "####" as the answer and the text before it as the solution.
    """

    problem_key: str = "problem"
    answer_key: str = "answer"
    solution_key: str | None = "solution"
    id_key: str | None = "id"
    source_key: str | None = "source"
    answer_format: str = "plain"
    source: str | None = None

    def __post_init__(self):
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"answer_format={self.answer_format!r} is not one of {ANSWER_FORMATS}"
            )
        if not self.problem_key or not self.answer_key:
            raise ValueError("problem_key and answer_key must be non-empty column names")


class _BadRow(Exception):
    """Internal: one row is unusable; `reason` is a short category used for counting; `key`
    the RecordFormat field of a missing column."""

    def __init__(self, reason: str, detail: str, key: str | None = None):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.key = key


def _check_policy(on_bad_row: str) -> None:
    if on_bad_row not in BAD_ROW_POLICIES:
        raise ValueError(f"on_bad_row={on_bad_row!r} is not one of {BAD_ROW_POLICIES}")


def _as_text(value: Any, column: str) -> str:
    """Scalars to str; bytes must be UTF-8; containers are rejected rather than str()-ed."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _BadRow("non-utf8", f"column {column!r} is not valid UTF-8 ({e})") from None
    if isinstance(value, bool) or value is None:
        raise _BadRow("bad-type", f"column {column!r} is {value!r}, expected text")
    if isinstance(value, (int, float, np.integer, np.floating)):
        return str(value.item() if isinstance(value, np.generic) else value)
    raise _BadRow(
        "bad-type", f"column {column!r} is a {type(value).__name__}, expected text or a number"
    )


def row_to_record(row: Mapping[str, Any], fmt: RecordFormat, default_id: str, source: str) -> Record:
    """One raw row (dict of columns) -> record; raises _BadRow with a reason on bad input."""
    for key, field in ((fmt.problem_key, "problem_key"), (fmt.answer_key, "answer_key")):
        if key not in row:
            raise _BadRow("missing-column",
                          f"missing column {key!r} (columns present: {sorted(row)})", field)
    problem = _as_text(row[fmt.problem_key], fmt.problem_key).strip()
    if not problem:
        raise _BadRow("empty-problem", f"column {fmt.problem_key!r} is empty")
    raw_answer = _as_text(row[fmt.answer_key], fmt.answer_key)
    solution = None
    if fmt.answer_format == "gsm8k":
        head, sep, tail = raw_answer.rpartition("####")
        if not sep:
            raise _BadRow(
                "no-final-answer",
                f"column {fmt.answer_key!r} has no '####' final-answer marker "
                "(answer_format='gsm8k')",
            )
        answer, solution = tail.strip(), head.strip()
    else:
        answer = raw_answer.strip()
    if not answer:
        raise _BadRow("empty-answer", f"column {fmt.answer_key!r} (the gold answer) is empty")
    if fmt.solution_key and row.get(fmt.solution_key) is not None:
        solution = _as_text(row[fmt.solution_key], fmt.solution_key)
    rid = default_id
    if fmt.id_key and row.get(fmt.id_key) is not None:
        rid = _as_text(row[fmt.id_key], fmt.id_key)
    src = source
    if fmt.source_key and row.get(fmt.source_key) is not None:
        src = _as_text(row[fmt.source_key], fmt.source_key)

    used = {fmt.problem_key, fmt.answer_key, fmt.solution_key, fmt.id_key, fmt.source_key}
    canonical = ("id", "problem", "answer", "solution", "source")
    record: Record = {k: v for k, v in row.items() if k not in used and k not in canonical}
    record.update(id=rid, problem=problem, answer=answer, source=src)
    if solution is not None:
        record["solution"] = solution
    return record


class _RowCollector:
    """Accumulates records from one file; applies the bad-row policy and unique ids."""

    def __init__(self, path: str, on_bad_row: str, unit: str):
        self.path, self.on_bad_row, self.unit = path, on_bad_row, unit
        self.records: list[Record] = []
        self.skipped: collections.Counter[str] = collections.Counter()
        self._first_skips: list[str] = []
        self._id_where: dict[str, int] = {}
        self._keys: set[str] = set()  # RecordFormat fields of the missing columns

    def bad(self, where: int, err: _BadRow) -> None:
        msg = f"{self.path}: {self.unit} {where}: {err.detail}"
        fix = f"set RecordFormat({err.key}=...) to the column that holds it, " if err.key else ""
        if self.on_bad_row == "raise":
            raise DataError(f"{msg} ({fix}or pass on_bad_row='skip' to skip such rows)",
                            problem=msg, skippable=True, key=err.key)
        if err.key:
            self._keys.add(err.key)
        self.skipped[err.reason] += 1
        if len(self._first_skips) < 5:
            self._first_skips.append(msg)

    def add(self, where: int, record: Record) -> None:
        first = self._id_where.get(record["id"])
        if first is not None:
            self.bad(where, _BadRow(
                "duplicate-id", f"duplicate id {record['id']!r} (first at {self.unit} {first})"))
            return
        self._id_where[record["id"]] = where
        self.records.append(record)

    def finish(self) -> tuple[list[Record], dict[str, int]]:
        n_skip = sum(self.skipped.values())
        if n_skip:
            log.warning("%s: skipped %d bad rows %s; first: %s", self.path, n_skip,
                        dict(self.skipped), self._first_skips)
        if not self.records:
            problem = f"{self.path}: no usable rows ({n_skip} skipped: {dict(self.skipped)})"
            raise DataError(f"{problem}; check the column names (RecordFormat) and the file "
                            "contents", problem=problem,
                            key=min(self._keys) if len(self._keys) == 1 else None)
        return self.records, dict(self.skipped)


def _read_jsonl(path: Path, fmt: RecordFormat, on_bad_row: str):
    source = fmt.source or path.stem
    col = _RowCollector(str(path), on_bad_row, "line")
    n_nonblank = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # UTF-8 byte-order mark
            if not raw.strip():
                continue
            n_nonblank += 1
            try:
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise _BadRow(
                        "non-utf8",
                        f"not valid UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                        "re-encode the file as UTF-8",
                    ) from None
                try:
                    row = json.loads(text.rstrip("\r\n"))  # else an unclosed row's error
                    # points past its newline: column 1 of the next line
                except json.JSONDecodeError as e:
                    raise _BadRow("bad-json", f"malformed JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(row, dict):
                    raise _BadRow("bad-json", f"a JSON {type(row).__name__}, expected an object")
                record = row_to_record(row, fmt, f"{source}_{lineno - 1}", source)
            except _BadRow as err:
                col.bad(lineno, err)
                continue
            col.add(lineno, record)
    if n_nonblank == 0:
        raise DataError(f"{path}: file is empty (no JSON lines); expected one object per line")
    return col.finish()


def _read_parquet(path: Path, fmt: RecordFormat, on_bad_row: str):
    import pyarrow.parquet as pq

    source = fmt.source or path.stem
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for corrupt/non-parquet files
        raise DataError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from e
    columns = pf.schema_arrow.names
    for key, field in ((fmt.problem_key, "problem_key"), (fmt.answer_key, "answer_key")):
        if key not in columns:
            problem = f"{path}: missing column {key!r} (columns: {columns})"
            raise DataError(f"{problem}; set RecordFormat({field}=...) to the column that "
                            "holds it", problem=problem, key=field)
    if pf.metadata.num_rows == 0:
        raise DataError(f"{path}: file is empty (0 rows)")
    col = _RowCollector(str(path), on_bad_row, "row")
    index = 0
    for batch in pf.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            try:
                record = row_to_record(row, fmt, f"{source}_{index}", source)
            except _BadRow as err:
                col.bad(index, err)
            else:
                col.add(index, record)
            index += 1
    return col.finish()


def read_records(
    path: str | os.PathLike, fmt: RecordFormat | None = None, on_bad_row: str = "raise"
) -> tuple[list[Record], dict[str, int]]:
    """Read one .jsonl / .parquet file -> (records, skipped rows per reason)."""
    _check_policy(on_bad_row)
    fmt = fmt or RecordFormat()
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(path, fmt, on_bad_row)
    if suffix in (".parquet", ".pq"):
        return _read_parquet(path, fmt, on_bad_row)
    raise DataError(f"{path}: unknown file type {suffix!r}; expected .jsonl or .parquet")


def load_records(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    fmt: RecordFormat | None = None,
    on_bad_row: str = "raise",
) -> list[Record]:
    """Read one or several files into one record list; ids must be unique across files."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise DataError("load_records: no files given")
    out: list[Record] = []
    seen: dict[str, str] = {}
    for p in paths:
        records, _ = read_records(p, fmt, on_bad_row)
        for r in records:
            if r["id"] in seen:
                msg = f"{p}: id {r['id']!r} also appears in {seen[r['id']]}"
                if on_bad_row == "raise":
                    raise DataError(msg + "; give the files distinct ids (or on_bad_row='skip')",
                                    problem=msg, skippable=True)
                log.warning("%s; skipped", msg)
                continue
            seen[r["id"]] = str(p)
            out.append(r)
    return out


def write_jsonl(records: Iterable[Record], path: str | os.PathLike) -> int:
    """Write records one JSON object per line (UTF-8), atomically; returns the count."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n
