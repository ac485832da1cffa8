"""Math answer checking: answer extraction, `math-verify` equivalence, hard time limits.

Three layers:
  `extract_answer(response)`   the final answer as text (last \\boxed / \\fbox, GSM8K
                               `#### x`, "the answer is x"); for logs and simple tasks.
  `check(gold, response)`      1.0/0.0 in this process, no time limit. Parses both sides
                               with math-verify (numbers, fractions, intervals, sets,
                               equations, matrices, LaTeX) and compares them.
  `verify` / `MathVerifier`    the same check in worker processes under a hard wall-clock
                               limit (see ada/rewards/workers.py): 0.0 on timeout or error,
                               never raises, never hangs. Use these on model output.

How text becomes an answer (`_gold_candidates`, `_pred_candidates`): math-verify extracts from a whole response
(boxed first, then "final answer is", then the last LaTeX span or number). A text with no
math delimiters and no prose (a bare answer such as `\\frac34i`, `4, 12, 2`, `(x-2)(x+2)`;
typical of dataset gold answers) is first read as one LaTeX span `$...$`, so `4, 12, 2`
is the set {2, 4, 12} rather than the last number 2. A GSM8K `#### x` line is read as `$x$`.
Only the tail of a long response is read (`MAX_RESPONSE_CHARS`, extended back to the last
\\boxed), since the final answer sits at the end and regex cost grows with length; text
nested deeper than `MAX_NESTING` brackets scores 0 at once (the parser needs seconds).

Safety (model output never reaches eval/exec/sympify as text):
  * LaTeX goes through latex2sympy2_extended, an ANTLR grammar that builds sympy objects
    node by node. Its only string-to-sympy calls are `sympy.Number(token)` on NUMBER
    tokens of its lexer (digits, ',' and '.'), and `parse_expr` on `variable_values`,
    which math-verify never passes.
  * math-verify's plain-expression path (`ExprExtractionConfig`) calls
    `sympy.parse_expr` (i.e. `eval`) on regex matches made of digits and + - * / ^ ( ) × ÷.
    Even so restricted it is eval of model text (and `9**9**9**9` is a way to stall), so
    this module replaces `math_verify.parser.parse_expr_cached` with `_safe_plain_expr`,
    which re-checks the alphabet and hands the string to latex2sympy instead. The
    swap is process-wide for math-verify and checked at import (math-verify==0.9.0).
  * Its number path calls `sympy.Number(s)` on regex matches of the form -?digits.digits.
  * sympy itself evaluates strings it writes: nsimplify sympifies mpmath.identify's closed
    forms such as "(30+sqrt(528))/2" (built from numbers, not from the text).
  tests/test_verifier.py records every string sympy evaluates while checking all the
  reference cases and the adversarial inputs, and asserts each is made of numerals and
  the names Integer/Float/Rational/sqrt/log/exp/pi/E/I only.
The hard time limit covers the remaining risk (a huge power or factorial): the worker is
killed. Workers start through 'forkserver' (never fork after JAX); see workers.py.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import os
import re
import threading
from collections.abc import Sequence

import numpy as np

try:  # math-verify is a hard requirement of the verifier; fail with the fix, not a trace.
    import math_verify
    import math_verify.parser as _mv_parser
    from latex2sympy2_extended.latex2sympy2 import latex2sympy as _latex2sympy
    from math_verify import ExprExtractionConfig, LatexExtractionConfig
except ImportError as e:  # pragma: no cover
    raise ImportError(
        "ada.rewards.math_verifier needs math-verify: pip install 'math-verify==0.9.0'"
    ) from e

from ada.rewards.tasks import last_boxed
from ada.rewards.workers import HardTimeoutPool

DEFAULT_TIMEOUT_S = 5.0  # per check; legitimate checks take milliseconds
MAX_RESPONSE_CHARS = 6000  # tail of a response that is read (plus back to the last \boxed)
MAX_GOLD_CHARS = 2000
MAX_NESTING = 48  # deeper ({[ nesting is never an answer, and costs the parser seconds

# math-verify logs every timeout / parse failure at WARNING; this module counts them.
logging.getLogger("math_verify").setLevel(logging.ERROR)
logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)

# ----------------------------------------------------------------------------------------
# No eval on model text: replace math-verify's sympy.parse_expr on plain expressions.
# ----------------------------------------------------------------------------------------
_PLAIN_EXPR_RE = re.compile(r"[0-9.\s+\-*/^()×÷]+")


def _safe_plain_expr(expr: str):
    """math-verify's plain-expression parser, without `eval`: via latex2sympy."""
    if not _PLAIN_EXPR_RE.fullmatch(expr):
        raise ValueError(f"not a plain arithmetic expression: {expr[:40]!r}")
    expr = re.sub(r"(\d)\.(?!\d)", r"\1", expr)  # "2/3." (a sentence's full stop) -> "2/3"
    latex = expr.replace("**", "^").replace("×", r"\times ").replace("÷", r"\div ")
    return _latex2sympy(latex, normalization_config=None)


if not hasattr(_mv_parser, "parse_expr_cached"):  # pragma: no cover
    raise ImportError(
        f"math-verify {getattr(math_verify, '__version__', '?')} has no "
        "parser.parse_expr_cached; ada.rewards.math_verifier expects math-verify==0.9.0"
    )
_mv_parser.parse_expr_cached = _safe_plain_expr

_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())

# ----------------------------------------------------------------------------------------
# Answer extraction (plain text)
# ----------------------------------------------------------------------------------------
_GSM8K_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS_RE = re.compile(
    r"(?i)(?:final answer|the answer|answer)\s*(?:is|:)\s*:?\s*([^\n]+)"
)


def _clean_tail_answer(s: str) -> str:
    s = s.strip()
    math = re.fullmatch(r"\$+([^$]+)\$+\.?", s) or re.match(r"\$([^$]+)\$", s)
    if math:
        return math.group(1).strip()
    s = re.sub(r"[.\s]+$", "", s)  # trailing full stop
    return s.strip("* ")


def extract_answer(response: str) -> str | None:
    """The final answer in `response` as text, or None.

    Order: the last complete \\boxed{...}/\\fbox{...} (nested braces kept), the last GSM8K
    `#### x` line, the last "final answer is / the answer is / answer:" phrase (rest of
    its line, surrounding `$` and a trailing full stop removed).
    """
    if not isinstance(response, str) or not response:
        return None
    text = _clip(response)
    boxed = last_boxed(text)
    if boxed:
        return boxed
    for regex in (_GSM8K_RE, _ANSWER_IS_RE):
        matches = list(regex.finditer(text))
        if matches:
            answer = _clean_tail_answer(matches[-1].group(1))
            if answer:
                return answer
    return None


# ----------------------------------------------------------------------------------------
# Checking (in this process; no time limit — use verify/MathVerifier on model output)
# ----------------------------------------------------------------------------------------
_DELIMS = ("$", "\\[", "\\(", "\\boxed", "\\fbox")
_TEXT_GROUP_RE = re.compile(
    r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|textnormal|operatorname|begin|end)\s*\{[^{}]*\}"
)
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_WORD_RE = re.compile(r"[A-Za-z]{3,}")


def _is_bare_answer(text: str) -> bool:
    """True for a lone answer without delimiters or prose, e.g. `\\frac34i`, `4, 12, 2`."""
    unescaped = text.replace("\\$", "")
    if len(text) > 300 or any(d in unescaped for d in _DELIMS) or "\n" in text.strip():
        return False
    stripped = _COMMAND_RE.sub(" ", _TEXT_GROUP_RE.sub(" ", text))
    return not _WORD_RE.search(stripped)


def _clip(response: str) -> str:
    """The part of a long response that is read: the tail, back to the last \\boxed."""
    if len(response) <= MAX_RESPONSE_CHARS:
        return response
    start = len(response) - MAX_RESPONSE_CHARS
    box = response.rfind("\\boxed", max(0, start - 3 * MAX_RESPONSE_CHARS), start)
    if box >= 0:
        return response[box:]
    newline = response.find("\n", start, start + MAX_RESPONSE_CHARS // 4)
    return response[newline + 1 if newline >= 0 else start :]


def _parsed(text: str) -> list:
    return math_verify.parse(text, _EXTRACTION, parsing_timeout=None)


def _first_parse(candidates: Sequence[str]) -> list:
    """Parse candidates in order; the first with a sympy result wins, else the first
    non-empty string-only result (math-verify then compares strings)."""
    fallback: list = []
    for text in candidates:
        result = _parsed(text)
        if any(not isinstance(x, str) for x in result):
            return result
        if result and not fallback:
            fallback = result
    return fallback


def _gold_candidates(gold: str) -> list[str]:
    g = gold.strip()
    if _is_bare_answer(g):
        return [f"${g}$", g]
    return [g] if "$" in g.replace("\\$", "") else [g, f"${g}$"]


def _pred_candidates(response: str) -> list[str]:
    text = _clip(response).replace("\\fbox{", "\\boxed{")
    out = []
    if "\\boxed" in text:
        out.append(text)  # math-verify reads \boxed first
    gsm = list(_GSM8K_RE.finditer(text))
    if gsm and gsm[-1].group(1).strip():
        out.append(f"${gsm[-1].group(1).strip()}$")
    if _is_bare_answer(text):
        out.append(f"${text.strip()}$")
    out.append(text)
    return list(dict.fromkeys(out))


def _nesting(text: str) -> int:
    """Maximum depth of ( { [ nesting (closers of any kind pop; never below zero)."""
    depth = deepest = 0
    for c in text:
        if c in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")}]" and depth:
            depth -= 1
    return deepest


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    return tuple(_first_parse(_gold_candidates(gold[:MAX_GOLD_CHARS])))


def check(gold: str, response: str) -> float:
    """1.0 if `response`'s final answer equals `gold`, else 0.0. No time limit; raises on
    non-string input. Prefer `verify` / `MathVerifier` for model output."""
    if not isinstance(gold, str) or not isinstance(response, str):
        raise TypeError(
            f"check(gold, response) takes strings, got {type(gold).__name__}, "
            f"{type(response).__name__}"
        )
    if not gold.strip() or not response.strip():
        return 0.0
    response = _clip(response)
    if _nesting(response) > MAX_NESTING or _nesting(gold) > MAX_NESTING:
        return 0.0
    gold_parsed = list(_parse_gold(gold))
    if not gold_parsed:
        return 0.0
    pred_parsed = _first_parse(_pred_candidates(response))
    if not pred_parsed:
        return 0.0
    ok = math_verify.verify(gold_parsed, pred_parsed, timeout_seconds=None)
    return 1.0 if ok else 0.0


def gold_parses(answer: str) -> bool:
    """True if the verifier reads `answer` (a gold answer) as a math object. No time limit."""
    if not isinstance(answer, str) or not answer.strip() or _nesting(answer) > MAX_NESTING:
        return False
    return any(not isinstance(x, str) for x in _parse_gold(answer))


def _task(kind: str, a: str, b: str):
    """The one function the worker processes run."""
    if kind == "check":
        return check(a, b)
    if kind == "gold":
        return gold_parses(a)
    raise ValueError(f"unknown task kind {kind!r}")


# ----------------------------------------------------------------------------------------
# Under hard time limits, in worker processes
# ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class VerifierStats:
    """Counters since the verifier was made; `checks_per_s` = checks / wall time in score."""

    checks: int
    timeouts: int
    errors: int
    restarts: int
    busy_s: float
    retries: int = 0  # checks run again because their worker died under them

    @property
    def checks_per_s(self) -> float:
        return self.checks / self.busy_s if self.busy_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "checks_per_s": self.checks_per_s}


class MathVerifier:
    """Batch math checking in `num_workers` processes, each check limited to `timeout_s`.

        with MathVerifier(num_workers=4, timeout_s=5.0) as verifier:
            rewards = verifier.score(records, responses)   # float32 [N], 1.0 / 0.0
            verifier.stats.checks_per_s

    A check that times out or fails scores 0.0 and is counted in `stats`; its worker is
    killed and replaced. `records` are dicts with an 'answer' (the gold answer).
    """

    def __init__(self, num_workers: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        self._pool = HardTimeoutPool(
            _task, num_workers=num_workers, timeout_s=timeout_s,
            preload=("ada.rewards.math_verifier",),
        )
        self.timeout_s = self._pool.timeout_s
        self.num_workers = self._pool.num_workers
        self._lock = threading.Lock()  # one batch at a time through the pool's pipes

    def _map(self, args: list[tuple]) -> list:
        with self._lock:
            return self._pool.map(args)

    @property
    def stats(self) -> VerifierStats:
        s = self._pool.stats
        return VerifierStats(s.tasks, s.timeouts, s.errors, s.restarts, s.busy_s, s.retries)

    def score_pairs(self, golds: Sequence[str], responses: Sequence[str], *,
                    failed: float = 0.0) -> np.ndarray:
        """float32 [N]: 1.0 where responses[i] answers golds[i]; never raises per item. A
        check that errored (its worker died twice, or it raised) scores `failed` (NaN: for
        ada.rewards.score to count it as a failed reward); a timeout scores 0."""
        if len(golds) != len(responses):
            raise ValueError(
                f"score: {len(golds)} gold answers but {len(responses)} responses; "
                "pass one response per record"
            )
        out = np.zeros(len(golds), np.float32)
        todo, args = [], []
        for i, (g, r) in enumerate(zip(golds, responses, strict=True)):
            if isinstance(g, str) and isinstance(r, str) and g.strip() and r.strip():
                todo.append(i)
                args.append(("check", g[:MAX_GOLD_CHARS], _clip(r)))
        for i, (status, value) in zip(todo, self._map(args), strict=True):
            out[i] = float(value) if status == "ok" else failed if status == "error" else 0.0
        return out

    def score(self, records: Sequence[dict], responses: Sequence[str], *,
              failed: float = 0.0) -> np.ndarray:
        """float32 [N] rewards of responses[i] against records[i]['answer'] (`failed`: see
        score_pairs)."""
        golds = [r.get("answer") if isinstance(r, dict) else None for r in records]
        return self.score_pairs(golds, responses, failed=failed)

    def golds_parseable(self, answers: Sequence[str]) -> np.ndarray:
        """bool [N]: which gold answers the verifier reads as math (timeouts: False)."""
        out = np.zeros(len(answers), bool)
        todo = [i for i, a in enumerate(answers) if isinstance(a, str) and a.strip()]
        outcomes = self._map([("gold", answers[i], "") for i in todo])
        for i, (status, value) in zip(todo, outcomes, strict=True):
            out[i] = status == "ok" and bool(value)
        return out

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_DEFAULT: dict[tuple[float], MathVerifier] = {}


def default_verifier(timeout_s: float = DEFAULT_TIMEOUT_S) -> MathVerifier:
    """One small shared pool per timeout for the one-at-a-time API (lazy; closed at exit)."""
    key = (float(timeout_s),)
    v = _DEFAULT.get(key)
    if v is None:
        if len(_DEFAULT) >= 4:  # callers varying the timeout: do not pile up pools
            _DEFAULT.pop(next(iter(_DEFAULT))).close()
        v = _DEFAULT[key] = MathVerifier(num_workers=1, timeout_s=timeout_s)
    return v


_BATCH: dict[str, MathVerifier] = {}


def close_default_verifiers() -> None:
    while _DEFAULT:
        _DEFAULT.popitem()[1].close()
    while _BATCH:
        _BATCH.popitem()[1].close()


atexit.register(close_default_verifiers)


def verify(gold: str, response: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """1.0 if `response`'s final answer equals `gold`, else 0.0 (also on timeout or error).

    Runs in a worker process killed after `timeout_s`; never raises, never hangs.
    For many checks use `MathVerifier.score`, which runs them in parallel. A
    non-positive `timeout_s` is a configuration error and raises ValueError.
    """
    if not timeout_s > 0:
        raise ValueError(f"verify: timeout_s={timeout_s} must be > 0 seconds")
    try:
        return float(default_verifier(timeout_s).score_pairs([gold], [response])[0])
    except Exception:  # noqa: BLE001 - the contract is "never raises"
        return 0.0


def gold_is_parseable(answer: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """True if the verifier can read `answer` as a gold answer (preprocessing drops the
    rest). Runs under the same hard time limit; False on timeout or error."""
    if not timeout_s > 0:
        raise ValueError(f"gold_is_parseable: timeout_s={timeout_s} must be > 0 seconds")
    try:
        return bool(default_verifier(timeout_s).golds_parseable([answer])[0])
    except Exception:  # noqa: BLE001
        return False


def math_reward(record: dict, response_text: str) -> float:
    """Project reward signature: 1.0 if the response answers record['answer']; never raises."""
    try:
        return verify(record["answer"], response_text)
    except Exception:  # noqa: BLE001
        return 0.0


def _math_score_batch(records: Sequence[dict], responses: Sequence[str]) -> np.ndarray:
    """Batch form of `math_reward` (the Collector calls it once per round or driver step):
    the checks fan out over a shared pool with one worker per CPU, up to 32 (lazy; closed at
    exit). At ~50 checks/s per worker, one at a time would stall a 512-prompt step. A check
    whose worker died twice is NaN, so ada.rewards.score counts it (reward_failures)."""
    v = _BATCH.get("pool")
    if v is None:
        v = _BATCH["pool"] = MathVerifier(num_workers=max(1, min(32, os.cpu_count() or 1)))
    return v.score(records, responses, failed=float("nan"))


math_reward.score_batch = _math_score_batch


__all__ = [
    "DEFAULT_TIMEOUT_S", "MathVerifier", "VerifierStats", "check", "close_default_verifiers",
    "default_verifier",
    "extract_answer", "gold_is_parseable", "gold_parses", "math_reward", "verify",
]
