"""Synthetic verifiable tasks, seeded generators: multi-digit arithmetic and countdown.

Records are dicts {id, problem, answer, task, difficulty, split, ...} like every other
prompt record; the exact checkers that score them live in ada.rewards.tasks
(`arithmetic_reward`, `countdown_reward`). Answers are computed here with exact Fraction
arithmetic, so data never depends on the reward code.

Difficulty: each task has numbered levels (ARITHMETIC_LEVELS, COUNTDOWN_LEVELS, or your
own `levels`), and `make_dataset` draws each record's level from a weighted mix.

Arithmetic levels 6-8 are the tool task (configs/tools.py, TOOL_MIX): products of two
3-digit or two 4-digit numbers and sums of four 3-digit numbers. Their answers have 4 to 8
digits that hang on many operand digits (long carries), past what the tiny model
computes in its head (its no-tool ceiling is low), while the calculator gives the exact
value: a policy that writes the expression in `<calc>...</calc>` and copies the `<out>` it
reads back is right. Same records, split and `arithmetic_reward` as every other level.

Splits: a problem belongs to 'test' iff the SHA-256 of its canonical key falls in the
first `TEST_FRACTION` of the hash range, so the train and test sets of any seeds never
share a problem. Within one dataset problems are distinct until a level runs out of them
(small levels then repeat; see `make_dataset`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Mapping, Sequence
from fractions import Fraction

TEST_FRACTION = 0.1
EXHAUSTED_AFTER = 2000  # draws without a new problem after which a level counts as used up


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
    # the tool task (TOOL_MIX): past the tiny model's head, one calculator call away
    6: ArithmeticLevel(3, 2, "*"),  # 123 * 456: a 3-digit product (~450k problems)
    7: ArithmeticLevel(4, 2, "*"),  # 1234 * 5678: a 4-digit product
    8: ArithmeticLevel(3, 4, "+"),  # 123 + 456 + 789 + 12: a long sum
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
# The tool task's mix (configs/tools.py: data.level_mix): a third of each kind.
TOOL_MIX: dict[int, float] = {6: 1.0, 7: 1.0, 8: 1.0}
TASKS = ("arithmetic", "countdown")


def split_of(key: str, test_fraction: float = TEST_FRACTION) -> str:
    """'test' or 'train', a fixed function of the problem's canonical key."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "test" if h < test_fraction * 2**64 else "train"


def _flat_value(operands: Sequence[int], ops: Sequence[str]) -> Fraction:
    """Exact value of `o0 op o1 op o2 ...` with * and / binding tighter than + and -."""
    total, sign, term = Fraction(0), 1, Fraction(operands[0])
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            term *= x
        elif op == "/":
            term /= x
        else:
            total, sign, term = total + sign * term, 1 if op == "+" else -1, Fraction(x)
    return total + sign * term


def _arithmetic_problem(rng: random.Random, level: ArithmeticLevel) -> tuple[str, dict]:
    hi = 10**level.num_digits
    operands = [rng.randrange(hi) for _ in range(level.num_operands)]
    ops = [rng.choice(level.operators) for _ in range(level.num_operands - 1)]
    if "/" in ops:  # keep division exact and defined: a nonzero divisor
        operands = [max(1, x) if i > 0 and ops[i - 1] == "/" else x for i, x in enumerate(operands)]
    expression = str(operands[0]) + "".join(f" {o} {x}" for o, x in zip(ops, operands[1:], strict=True))
    value = _flat_value(operands, ops)
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
    "ARITHMETIC_LEVELS", "COUNTDOWN_LEVELS", "DEFAULT_MIX", "EXHAUSTED_AFTER", "TASKS",
    "TEST_FRACTION", "TOOL_MIX", "ArithmeticLevel", "CountdownLevel", "make_dataset", "split_of",
]
