"""Preprocessing of training prompts, as in the paper: dedup, parseable gold, difficulty.

Three passes, each counted (input = duplicates + unparseable + filtered + kept):

1. `dedup`: keep the first of the records whose `normalize_problem(problem)` coincide.
2. `drop_unparseable`: drop records whose gold answer the verifier cannot parse
   (`ada.rewards.math_verifier.gold_is_parseable`); such a prompt can only teach noise.
3. `difficulty_filter`: sample k responses per prompt with the policy itself
   (`rewards_fn(records, k) -> rewards [P, k]`; `ada.evaluation.pass_rates` draws them
   through the sampling engine), and keep
   prompts whose pass rate lies in [min_pass_rate, max_pass_rate] (and, optionally, that
   were solved at least once). Results are appended to a JSONL cache chunk by chunk, so a
   killed run resumes without re-sampling the prompts already done.

Paper presets (pass rate over k=16 samples): HARD_FILTER keeps prompts solved at least
once with pass rate <= 0.125 (2/16); EASY_FILTER keeps pass rate <= 0.3125 (5/16), also
solved at least once (an all-wrong prompt gives no learning signal either way).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ada.data.sources import DataError, Record
from ada.rewards.score import correct

log = logging.getLogger(__name__)

RewardsFn = Callable[[Sequence[Record], int], np.ndarray]  # (records, k) -> rewards [P, k]

# ----------------------------------------------------------------------------- dedup

_MATH_DELIMS = re.compile(r"\$|\\\(|\\\)|\\\[|\\\]")
_LATEX_SPACE = re.compile(r"\\(?:[,;:! ]|q?quad(?![a-z])|[hv]space\*?\{[^{}]*\})|~")
_LATEX_SIZING = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![a-zA-Z])")
_SPACE_AROUND_SYMBOL = re.compile(r"\s*([^\w\s])\s*")


def normalize_problem(text: str) -> str:
    """Key for duplicate detection; two problems are duplicates iff their keys are equal.

    Steps, in order: Unicode NFKC (full-width digits, ligatures); case-fold; drop math
    delimiters ($, \\( \\), \\[ \\]); LaTeX spacing commands (\\, \\; \\: \\! \\quad
    \\qquad \\hspace{..} ~ and "\\ ") become a space; sizing commands (\\left \\right
    \\big ...) are dropped; \\dfrac and \\tfrac become \\frac; runs of whitespace become one
    space, and whitespace next to a non-alphanumeric symbol is removed ("x + 1" == "x+1"),
    while the space between two words or numbers is kept ("1 2" != "12").
    """
    t = unicodedata.normalize("NFKC", text).casefold()
    t = _MATH_DELIMS.sub(" ", t)
    t = _LATEX_SPACE.sub(" ", t)
    t = _LATEX_SIZING.sub("", t.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac"))
    t = " ".join(t.split())
    return _SPACE_AROUND_SYMBOL.sub(r"\1", t)


def dedup(records: Sequence[Record]) -> tuple[list[Record], int]:
    """Keep the first record of each normalised problem; returns (kept, n_duplicates)."""
    seen: set[str] = set()
    kept = []
    for r in records:
        key = normalize_problem(r["problem"])
        if key not in seen:
            seen.add(key)
            kept.append(r)
    return kept, len(records) - len(kept)


def drop_unparseable(records: Sequence[Record],
                     is_parseable: Callable[[str], bool] | None = None) -> tuple[list[Record], int]:
    """Drop records whose gold answer the verifier cannot parse; returns (kept, n_dropped).

    Default: `MathVerifier.golds_parseable` (the batch form of `gold_is_parseable`).
    """
    if is_parseable is None:  # the verifier's batch API: its worker pool, time limits
        from ada.rewards.math_verifier import MathVerifier

        with MathVerifier() as verifier:
            ok = verifier.golds_parseable([r["answer"] for r in records])
            failed = verifier.stats.timeouts + verifier.stats.errors
        if failed:  # timeouts/crashes count as unparseable, but say so
            log.warning("gold check: %d of %d answers timed out or failed in the verifier",
                        failed, len(records))
            if failed == len(records):
                raise DataError(
                    f"the verifier failed on all {failed} gold answers (timeouts or crashed "
                    "workers), so none can be judged; check ada.rewards.math_verifier")
    else:
        ok = [is_parseable(r["answer"]) for r in records]
    kept = [r for r, good in zip(records, ok, strict=True) if good]
    return kept, len(records) - len(kept)


# ----------------------------------------------------------------------------- difficulty


@dataclasses.dataclass(frozen=True)
class DifficultyFilter:
    """Keep a prompt iff min <= pass_rate <= max (and solved once, if required)."""

    k: int = 16
    min_pass_rate: float = 0.0
    max_pass_rate: float = 1.0
    require_one_correct: bool = False
    correct_threshold: float = 0.5  # a sample counts as correct iff reward > this
    prompts_per_call: int = 64  # prompts per rewards_fn call (and per cache flush)

    def __post_init__(self):
        if self.k <= 0 or self.prompts_per_call <= 0:
            raise ValueError(f"k={self.k} and prompts_per_call={self.prompts_per_call} must be "
                             "positive")
        if not 0.0 <= self.min_pass_rate <= self.max_pass_rate <= 1.0:
            raise ValueError(
                f"need 0 <= min_pass_rate ({self.min_pass_rate}) <= max_pass_rate "
                f"({self.max_pass_rate}) <= 1")

    def keep(self, num_correct: int) -> bool:
        rate = num_correct / self.k
        if self.require_one_correct and num_correct < 1:
            return False
        return self.min_pass_rate <= rate <= self.max_pass_rate


HARD_FILTER = DifficultyFilter(k=16, max_pass_rate=0.125, require_one_correct=True)
EASY_FILTER = DifficultyFilter(k=16, max_pass_rate=0.3125, require_one_correct=True)


def _problem_hash(r: Record) -> str:
    return hashlib.sha256((r["problem"] + "\x00" + r["answer"]).encode()).hexdigest()[:16]


def _load_cache(path: Path, k: int) -> dict[str, dict]:
    """Read finished results; a torn last line (killed mid-write) is cut off the file."""
    done: dict[str, dict] = {}
    if not path.exists():
        return done
    with open(path, "rb") as f:
        data = f.read()
    good_end = 0
    for lineno, line in enumerate(data.splitlines(keepends=True), start=1):
        try:
            if not line.endswith(b"\n"):
                raise ValueError("no newline")
            entry = json.loads(line)
            if not isinstance(entry, dict) or not {"id", "hash", "k", "num_correct"} <= entry.keys():
                raise ValueError("not a cache entry")
        except ValueError:
            if good_end + len(line) == len(data):  # only the last line may be torn
                log.warning("%s: dropping a torn last line (interrupted write)", path)
                break
            raise DataError(f"{path}: line {lineno}: corrupt pass-rate cache entry; "
                            "delete the file to re-sample") from None
        if entry["k"] != k:
            raise DataError(
                f"{path}: line {lineno}: cached with k={entry['k']} samples, this run asks "
                f"k={k}; use another cache_path or delete the file")
        done[entry["id"]] = entry
        good_end += len(line)
    if good_end != len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return done


def cached_pass_rates(records: Sequence[Record], rewards_fn: RewardsFn, cfg: DifficultyFilter,
                      cache_path: str | os.PathLike) -> dict[str, dict]:
    """Per-prompt {id, hash, k, num_correct, pass_rate, rewards}, resumed from `cache_path`.

    Only prompts missing from the cache are sampled, `cfg.prompts_per_call` at a time; each
    chunk's results are appended and fsync-ed before the next chunk starts.
    """
    path = Path(cache_path)
    done = _load_cache(path, cfg.k)
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise DataError("difficulty filter: record ids are not unique; the cache is keyed by id")
    todo = []
    for r in records:
        entry = done.get(r["id"])
        if entry is None:
            todo.append(r)
        elif entry["hash"] != _problem_hash(r):
            raise DataError(
                f"{path}: cached id {r['id']!r} was computed for a different problem/answer; "
                "use a fresh cache_path for a different dataset")
    if done:
        log.info("pass-rate cache %s: %d done, %d to sample", path, len(records) - len(todo),
                 len(todo))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for start in range(0, len(todo), cfg.prompts_per_call):
            chunk = todo[start:start + cfg.prompts_per_call]
            rewards_PxK = np.asarray(rewards_fn(chunk, cfg.k), dtype=np.float64)
            if rewards_PxK.shape != (len(chunk), cfg.k):
                raise ValueError(f"rewards_fn returned shape {rewards_PxK.shape}, expected "
                                 f"{(len(chunk), cfg.k)} (prompts, k)")
            if not np.all(np.isfinite(rewards_PxK)):
                raise ValueError("rewards_fn returned non-finite rewards")
            correct_PxK = correct(rewards_PxK, cfg.correct_threshold)
            lines = []
            for r, rew, cor in zip(chunk, rewards_PxK, correct_PxK, strict=True):
                n = int(cor.sum())
                entry = {"id": r["id"], "hash": _problem_hash(r), "k": cfg.k,
                         "num_correct": n, "pass_rate": n / cfg.k, "rewards": rew.tolist()}
                done[r["id"]] = entry
                lines.append(json.dumps(entry) + "\n")
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
    return {i: done[i] for i in ids}


def difficulty_filter(records: Sequence[Record], results: dict[str, dict],
                      cfg: DifficultyFilter) -> tuple[list[Record], int]:
    """Keep records whose pass rate (`results`, from `cached_pass_rates`) passes `cfg`; adds
    `pass_rate`. Returns (kept, n_dropped)."""
    kept = []
    for r in records:
        entry = results[r["id"]]
        if cfg.keep(entry["num_correct"]):
            kept.append({**r, "pass_rate": entry["pass_rate"]})
    return kept, len(records) - len(kept)


# ----------------------------------------------------------------------------- pipeline


@dataclasses.dataclass(frozen=True)
class PreprocessCounts:
    input: int
    duplicates: int
    unparseable: int
    filtered: int
    kept: int


def preprocess(
    records: Sequence[Record],
    *,
    is_parseable: Callable[[str], bool] | None = None,
    pass_rates_fn: Callable[[Sequence[Record]], dict[str, dict]] | None = None,
    difficulty: DifficultyFilter | None = None,
) -> tuple[list[Record], PreprocessCounts]:
    """dedup -> drop unparseable gold -> difficulty filter (when `pass_rates_fn(records) ->
    {id: entry}` is given, e.g. `ada.evaluation.pass_rates` over the policy)."""
    n_in = len(records)
    out, n_dup = dedup(records)
    out, n_bad = drop_unparseable(out, is_parseable)
    n_filt = 0
    if pass_rates_fn is not None:
        if difficulty is None:
            raise ValueError("the difficulty filter needs `difficulty`")
        out, n_filt = difficulty_filter(out, pass_rates_fn(out), difficulty)
    counts = PreprocessCounts(n_in, n_dup, n_bad, n_filt, len(out))
    assert n_in == n_dup + n_bad + n_filt + len(out), counts
    log.info("preprocess: %s", counts)
    if not out:
        raise DataError(f"preprocessing left no prompts ({counts}); loosen the filter or "
                        "check the data")
    return out, counts
