"""Exact checkers for the synthetic tasks (arithmetic, countdown) and their safe parser.

The rewards have the project signature `reward(record, response) -> float` and never
raise; the records they check come from ada.data.synthetic.make_dataset (arithmetic:
'answer'; countdown: 'numbers', 'target').

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
`last_boxed` is shared with the math verifier.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from fractions import Fraction

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


__all__ = [
    "ExpressionError", "ParsedExpression", "arithmetic_reward", "check_countdown",
    "countdown_reward", "final_expression", "last_boxed", "parse_expression",
    "parse_final_number",
]
