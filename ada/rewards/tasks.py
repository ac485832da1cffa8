"""Synthetic verifiable tasks with exact checkers: multi-digit arithmetic and countdown.

Records are dicts {id, problem, answer, task, difficulty, split, ...} like every other
prompt record; the rewards have the project signature `reward(record, response) -> float`
and never raise.

Answer format the checkers accept (what a small model has to emit):
  arithmetic  The final answer is the last \\boxed{...} if the response has one, else the
              text after the last '=', else the whole response; the number at its start
              (`-12`, `3/4`, `2.5`; no thousands separators) must equal the answer exactly.
              A bare "21" is a correct answer to "What is 3 * 7?".
  countdown   The final expression is the last \\boxed{...}, else the text after the last
              "answer:" (any case), else the last non-empty line; anything from its first
              '=' on is ignored ("(3+5)*2 = 16" is fine). It must use only + - * / and
              parentheses over the given numbers, each at most once, and equal the target
              exactly (Fraction arithmetic; no unary minus, no division by zero).
Expressions are read by `parse_expression`, a small recursive-descent parser with exact
Fraction arithmetic and bounded length and nesting; nothing is passed to eval.

Splits: a problem belongs to 'test' iff the SHA-256 of its canonical key falls in the
first `TEST_FRACTION` of the hash range, so the train and test sets of any seeds never
share a problem. Within one dataset problems are distinct until a level runs out of them
(small levels then repeat; see `make_dataset`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction

TEST_FRACTION = 0.1
EXHAUSTED_AFTER = 2000  # draws without a new problem after which a level counts as used up
MAX_EXPR_CHARS = 256
MAX_EXPR_DEPTH = 32
MAX_NUMBER_DIGITS = 40

# ----------------------------------------------------------------------------------------
# Safe expression parser
# ----------------------------------------------------------------------------------------
_TOKEN_RE = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([-+*/()]))")


class ExpressionError(ValueError):
    """The text is not an expression this parser accepts (or it divides by zero)."""


@dataclasses.dataclass(frozen=True)
class ParsedExpression:
    value: Fraction
    numbers: tuple[Fraction, ...]  # every number literal, in order of appearance
    unary: bool  # a unary + or - was used


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.replace("×", "*").replace("÷", "/").replace("\\times", "*").replace("\\div", "/")
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m:
            if text[pos:].strip() == "":
                break
            raise ExpressionError(f"unexpected character {text[pos]!r} at {pos}")
        tok = m.group(1) or m.group(2)
        if m.group(1) and len(m.group(1)) > MAX_NUMBER_DIGITS:
            raise ExpressionError(f"number longer than {MAX_NUMBER_DIGITS} digits")
        tokens.append(tok)
        pos = m.end()
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ;
    factor := ('+'|'-') factor | NUMBER | '(' expr ')'"""

    def __init__(self, tokens: list[str]):
        self.tokens, self.i = tokens, 0
        self.numbers: list[Fraction] = []
        self.unary = False

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExpressionError("expression ends too early")
        self.i += 1
        return tok

    def expr(self, depth: int) -> Fraction:
        if depth > MAX_EXPR_DEPTH:
            raise ExpressionError(f"nesting deeper than {MAX_EXPR_DEPTH}")
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op, rhs = self.take(), self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.factor(depth)
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise ExpressionError("division by zero")
            else:
                value = value / rhs
        return value

    def factor(self, depth: int) -> Fraction:
        tok = self.take()
        if tok in ("+", "-"):
            self.unary = True
            if depth > MAX_EXPR_DEPTH:
                raise ExpressionError(f"nesting deeper than {MAX_EXPR_DEPTH}")
            value = self.factor(depth + 1)
            return value if tok == "+" else -value
        if tok == "(":
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise ExpressionError("missing ')'")
            return value
        if tok[0].isdigit():
            number = Fraction(tok)
            self.numbers.append(number)
            return number
        raise ExpressionError(f"unexpected {tok!r}")


def parse_expression(text: str) -> ParsedExpression:
    """Exact value of an arithmetic expression over + - * / ( ) and decimal numbers.

    Raises ExpressionError on anything else, on more than MAX_EXPR_CHARS characters,
    nesting deeper than MAX_EXPR_DEPTH, numbers longer than MAX_NUMBER_DIGITS digits, or
    division by zero.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"expected a string, got {type(text).__name__}")
    if len(text) > MAX_EXPR_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPR_CHARS} characters")
    tokens = _tokenize(text)
    if not tokens:
        raise ExpressionError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr(0)
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r} after the expression")
    return ParsedExpression(value, tuple(parser.numbers), parser.unary)


# ----------------------------------------------------------------------------------------
# Final-answer segments
# ----------------------------------------------------------------------------------------
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_SPACE_RE = re.compile(r"\\boxed +([^\s{$\\][^\s$]*)")
_NUMBER_RE = re.compile(r"\s*\$?\s*(-?\d+(?:\.\d+)?(?:\s*/\s*\d+)?)(?!\d)")
_ANSWER_RE = re.compile(r"(?i)answer\s*(?:is)?\s*:?")


def _brace_pairs(text: str) -> dict[int, int]:
    """{index of '{': index of its matching '}'} in one pass (\\{ and \\} are literal)."""
    pairs, stack, i = {}, [], 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def last_boxed(text: str) -> str | None:
    """Content of the last complete \\boxed{...} or \\fbox{...} (nested braces kept),
    else of a last brace-less `\\boxed 5`; None if there is none. Linear time."""
    boxes = list(_BOX_RE.finditer(text))
    if boxes:
        pairs = _brace_pairs(text)
        for m in reversed(boxes):
            close = pairs.get(m.end() - 1)
            if close is not None:
                return text[m.end() : close].strip()
    spaced = list(_BOX_SPACE_RE.finditer(text))
    return spaced[-1].group(1).rstrip(".") if spaced else None


def _final_number_segment(response: str) -> str:
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    if "=" in response:
        return response.rsplit("=", 1)[1]
    return response


def parse_final_number(response: str) -> Fraction | None:
    """The number a response gives as its final answer (see the module docstring)."""
    if not isinstance(response, str):
        return None
    segment = _final_number_segment(response[-2000:])
    m = _NUMBER_RE.match(segment)
    if not m or len(m.group(1)) > MAX_NUMBER_DIGITS:
        return None
    text = m.group(1).replace(" ", "")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def final_expression(response: str) -> str | None:
    """The expression a countdown response gives as its final answer."""
    if not isinstance(response, str):
        return None
    text = response[-2000:]
    segment = last_boxed(text)
    if segment is None:
        answers = list(_ANSWER_RE.finditer(text))
        if answers:
            segment = text[answers[-1].end() :].split("\n", 1)[0]
        else:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            segment = lines[-1] if lines else ""
    segment = segment.split("=", 1)[0].strip().strip("$").strip()
    return segment or None


# ----------------------------------------------------------------------------------------
# Rewards
# ----------------------------------------------------------------------------------------
def arithmetic_reward(record: dict, response_text: str) -> float:
    """1.0 if the response's final number equals record['answer'] exactly; never raises."""
    try:
        got = parse_final_number(response_text)
        return 1.0 if got is not None and got == Fraction(str(record["answer"])) else 0.0
    except Exception:  # noqa: BLE001 - the contract is "never raises"
        return 0.0


def check_countdown(expression: str, numbers, target) -> bool:
    """True if `expression` uses each of `numbers` at most once and equals `target`."""
    try:
        parsed = parse_expression(expression)
    except ExpressionError:
        return False
    if parsed.unary:
        return False
    available = Counter(Fraction(n) for n in numbers)
    used = Counter(parsed.numbers)
    if any(used[n] > available[n] for n in used):
        return False
    return parsed.value == Fraction(target)


def countdown_reward(record: dict, response_text: str) -> float:
    """1.0 if the response's final expression reaches record['target'] with
    record['numbers'] (each at most once); never raises."""
    try:
        expression = final_expression(response_text)
        if expression is None:
            return 0.0
        return 1.0 if check_countdown(expression, record["numbers"], record["target"]) else 0.0
    except Exception:  # noqa: BLE001
        return 0.0


# ----------------------------------------------------------------------------------------
# Generators
# ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ArithmeticLevel:
    """Operands are integers in [0, 10**num_digits); operators drawn from `operators`."""

    num_digits: int
    num_operands: int
    operators: str = "+-*"


@dataclasses.dataclass(frozen=True)
class CountdownLevel:
    """`num_numbers` numbers in [1, max_number]; the target (at most `max_target`, not
    itself one of the numbers) is reached with `min_used`..all of them."""

    num_numbers: int
    max_number: int
    max_target: int
    min_used: int = 2


ARITHMETIC_LEVELS: dict[int, ArithmeticLevel] = {
    1: ArithmeticLevel(1, 2, "+-*"),  # 300 problems in all: ~270 train, ~30 test
    2: ArithmeticLevel(2, 2, "+-"),
    3: ArithmeticLevel(2, 3, "+-*"),
    4: ArithmeticLevel(3, 3, "+-*"),
    5: ArithmeticLevel(4, 4, "+-*"),
}
COUNTDOWN_LEVELS: dict[int, CountdownLevel] = {
    1: CountdownLevel(3, 10, 50, 2),
    2: CountdownLevel(4, 20, 200, 3),
    3: CountdownLevel(5, 50, 500, 4),
    4: CountdownLevel(6, 100, 1000, 5),
}
# The default mixes (what make_dataset uses without a difficulty_mix): easy enough that a
# tiny model gets some prompts right some of the time, hard enough that it does not
# get all of them.
DEFAULT_MIX: dict[str, dict[int, float]] = {
    "arithmetic": {1: 0.2, 2: 0.5, 3: 0.3},
    "countdown": {1: 0.6, 2: 0.4},
}
TASKS = ("arithmetic", "countdown")


def split_of(key: str, test_fraction: float = TEST_FRACTION) -> str:
    """'test' or 'train', a fixed function of the problem's canonical key."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "test" if h < test_fraction * 2**64 else "train"


def _arithmetic_problem(rng: random.Random, level: ArithmeticLevel) -> tuple[str, dict]:
    hi = 10**level.num_digits
    operands = [rng.randrange(hi) for _ in range(level.num_operands)]
    ops = [rng.choice(level.operators) for _ in range(level.num_operands - 1)]
    if "/" in ops:  # keep division exact and defined: a nonzero divisor
        operands = [max(1, x) if i > 0 and ops[i - 1] == "/" else x for i, x in enumerate(operands)]
    expression = str(operands[0]) + "".join(f" {o} {x}" for o, x in zip(ops, operands[1:], strict=True))
    value = parse_expression(expression).value
    answer = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    return expression, {
        "problem": f"What is {expression}?", "answer": answer, "expression": expression,
    }


def _random_expression(rng: random.Random, values: list[int]) -> tuple[str, Fraction] | None:
    """A random expression tree over `values` (all used once) with a positive integer
    value and exact divisions; None if this draw hits a dead end."""
    items = [(str(v), Fraction(v)) for v in values]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (sa, a), (sb, b) = items[i], items[j]
        choices = [("+", a + b), ("*", a * b)]
        if a - b > 0:
            choices.append(("-", a - b))
        if b != 0 and (a / b).denominator == 1:
            choices.append(("/", a / b))
        op, value = rng.choice(choices)
        merged = (f"({sa} {op} {sb})", value)
        items = [it for k, it in enumerate(items) if k not in (i, j)] + [merged]
    text, value = items[0]
    if value.denominator != 1 or value <= 0:
        return None
    return (text[1:-1] if text.startswith("(") and len(values) > 1 else text), value


def _countdown_problem(rng: random.Random, level: CountdownLevel) -> tuple[str, dict]:
    for _ in range(1000):
        numbers = [rng.randint(1, level.max_number) for _ in range(level.num_numbers)]
        k = rng.randint(min(level.min_used, level.num_numbers), level.num_numbers)
        made = _random_expression(rng, rng.sample(numbers, k))
        if made is None:
            continue
        solution, value = made
        target = int(value)
        if target > level.max_target or target in numbers:
            continue
        key = f"{sorted(numbers)}->{target}"
        problem = (
            f"Using the numbers {numbers}, each at most once, and + - * / with parentheses, "
            f"write an expression equal to {target}."
        )
        return key, {
            "problem": problem, "answer": str(target), "numbers": numbers,
            "target": target, "solution": solution,
        }
    raise RuntimeError(f"could not draw a countdown problem at {level}")  # pragma: no cover


def _normalise_mix(task: str, levels: Mapping, difficulty_mix) -> dict[int, float]:
    if difficulty_mix is None:
        difficulty_mix = DEFAULT_MIX[task] if set(DEFAULT_MIX[task]) <= set(levels) else {min(levels): 1.0}
    elif isinstance(difficulty_mix, int):
        difficulty_mix = {difficulty_mix: 1.0}
    elif not isinstance(difficulty_mix, Mapping):
        difficulty_mix = {int(d): 1.0 for d in difficulty_mix}
    bad = [d for d in difficulty_mix if d not in levels]
    if bad:
        raise ValueError(f"difficulty {bad} not defined for task {task!r}; levels: {sorted(levels)}")
    total = float(sum(difficulty_mix.values()))
    if total <= 0 or any(w < 0 for w in difficulty_mix.values()):
        raise ValueError(f"difficulty_mix={dict(difficulty_mix)} needs non-negative weights with a positive sum")
    return {int(d): w / total for d, w in difficulty_mix.items() if w > 0}


def make_dataset(
    task: str,
    n: int,
    seed: int,
    difficulty_mix: Mapping[int, float] | int | None = None,
    split: str = "train",
    test_fraction: float = TEST_FRACTION,
    levels: Mapping[int, ArithmeticLevel | CountdownLevel] | None = None,
    allow_repeats: bool = True,
) -> list[dict]:
    """`n` distinct records of `task` ('arithmetic' or 'countdown') for `split`.

    `difficulty_mix` maps a level (see ARITHMETIC_LEVELS / COUNTDOWN_LEVELS, or `levels`
    to define your own) to its weight, e.g. {1: 0.3, 2: 0.5, 3: 0.2}; an int means one
    level; None means DEFAULT_MIX[task]. Each record's level is drawn from the mix.
    Same arguments, same records. Problems are distinct until a level runs out (no new
    problem in EXHAUSTED_AFTER draws; arithmetic level 1 holds ~270 train / ~30 test
    problems); then that level repeats its problems, or, with allow_repeats=False,
    ValueError. Repeats never cross splits.
    """
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not one of {TASKS}")
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} must be 'train' or 'test'")
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    table = dict(levels) if levels is not None else (
        ARITHMETIC_LEVELS if task == "arithmetic" else COUNTDOWN_LEVELS)
    mix = _normalise_mix(task, table, difficulty_mix)
    make = _arithmetic_problem if task == "arithmetic" else _countdown_problem
    rng = random.Random(f"{task}:{seed}:{split}")
    order = sorted(mix)
    weights = [mix[d] for d in order]
    records, seen = [], set()
    stale = dict.fromkeys(order, 0)  # draws of a level since it last gave a new problem
    for difficulty in rng.choices(order, weights, k=n):  # the levels first: the mix holds
        while True:
            key, fields = make(rng, table[difficulty])
            if split_of(f"{task}:{key}", test_fraction) == split:
                if key not in seen:
                    stale[difficulty] = 0
                    break
                if allow_repeats and stale[difficulty] >= EXHAUSTED_AFTER:
                    break
            stale[difficulty] += 1
            if stale[difficulty] >= (10 if allow_repeats else 1) * EXHAUSTED_AFTER:
                raise ValueError(
                    f"make_dataset({task!r}, n={n}, split={split!r}): level {difficulty} ran "
                    f"out of distinct problems after {len(records)} records "
                    f"(difficulty_mix={mix}); lower n, add harder levels, or allow_repeats=True"
                )
        seen.add(key)
        records.append({
            "id": f"{task}-{split}-{seed}-{len(records)}", "task": task,
            "difficulty": difficulty, "split": split, **fields,
        })
    return records


__all__ = [
    "DEFAULT_MIX", "last_boxed", "ARITHMETIC_LEVELS", "COUNTDOWN_LEVELS", "ArithmeticLevel", "CountdownLevel",
    "ExpressionError", "ParsedExpression", "TASKS", "arithmetic_reward", "check_countdown",
    "countdown_reward", "final_expression", "make_dataset", "parse_expression",
    "parse_final_number", "split_of",
]
