"""Synthetic tasks: the safe expression parser and checkers (ada.rewards.tasks), the seeded
generators (ada.data.synthetic)."""

import ast
import random
from collections import Counter
from fractions import Fraction

import pytest

from ada.data import synthetic
from ada.data.synthetic import ARITHMETIC_LEVELS, COUNTDOWN_LEVELS, make_dataset
from ada.rewards import get_reward_fn
from ada.rewards.tasks import (
    ExpressionError,
    arithmetic_reward,
    check_countdown,
    countdown_reward,
    parse_expression,
    parse_final_number,
)


def reference_value(text: str):
    """Independent evaluator: Python's own grammar (ast), exact Fractions; None on x/0."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.Div):
                if b == 0:
                    raise ZeroDivisionError
                return a / b
        raise ValueError(ast.dump(node))

    try:
        return ev(ast.parse(text, mode="eval"))
    except ZeroDivisionError:
        return None


def random_expression(rng: random.Random, depth: int = 0) -> str:
    if depth > 3 or rng.random() < 0.3:
        lit = str(rng.randrange(0, 1000)) if rng.random() < 0.8 else f"{rng.randrange(100)}.{rng.randrange(100)}"
        return ("-" + lit) if rng.random() < 0.1 else lit
    a, b = random_expression(rng, depth + 1), random_expression(rng, depth + 1)
    op = rng.choice("+-*/")
    sp = rng.choice(["", " ", "  "])
    text = f"{a}{sp}{op}{sp}{b}"
    return f"({text})" if rng.random() < 0.5 else text


# -- parser ----------------------------------------------------------------------------
def test_parser_matches_reference_on_random_expressions():
    rng = random.Random(0)
    checked = zero_div = 0
    for _ in range(400):
        text = random_expression(rng)
        want = reference_value(text)
        if want is None:
            with pytest.raises(ExpressionError, match="division by zero"):
                parse_expression(text)
            zero_div += 1
            continue
        assert parse_expression(text).value == want, text
        checked += 1
    assert checked > 300


def test_parser_precedence_and_literals():
    p = parse_expression("2 + 3 * (4 - 1) / 6")
    assert p.value == Fraction(7, 2)
    assert p.numbers == (2, 3, 4, 1, 6) and not p.unary
    assert parse_expression("7 - 2 - 1").value == 4  # left associative
    assert parse_expression("8 / 4 / 2").value == 1
    assert parse_expression("-(3)").unary
    assert parse_expression("2 × 3 ÷ 4").value == Fraction(3, 2)


@pytest.mark.parametrize("text", [
    "", "   ", "1 +", "(1", "1)", "1 2", "2**3", "2^3", "abc", "1e5", "1,000",
    "__import__('os').system('touch MARKER')", "(lambda: 1)()", "1/0", "1/(2-2)",
    "(" * 40 + "1" + ")" * 40,   # deeper than MAX_EXPR_DEPTH
    "-" * 40 + "1",              # unary chains count as depth
    "1+" * 200 + "1",            # longer than MAX_EXPR_CHARS
    "9" * 50,                    # number longer than MAX_NUMBER_DIGITS
])
def test_parser_rejects_malformed(text):
    with pytest.raises(ExpressionError):
        parse_expression(text)


def test_parser_rejects_non_strings():
    with pytest.raises(ExpressionError):
        parse_expression(None)


# -- countdown checker -----------------------------------------------------------------
REC = {"problem": "...", "answer": "24", "task": "countdown", "numbers": [3, 8, 2, 1], "target": 24}


@pytest.mark.parametrize("response", [
    "3 * 8",
    "(2 + 1) * 8",
    "8 * 3 * 1",
    "8 / (1 - 2/3)",                         # exact fractions in between
    "Let me think.\n(2 + 1) * 8 = 24",
    "Answer: 3*8 = 24. Done",
    "so the answer is $3 \\times 8$",
    "\\boxed{8 * 3}",
])
def test_countdown_valid(response):
    assert countdown_reward(REC, response) == 1.0


@pytest.mark.parametrize("response", [
    "3 * 8 * 1 * 1",          # 1 used twice, given once
    "3 * 8 + 0",              # 0 not given
    "4 * 6",                  # numbers not given
    "3 + 8 + 2 + 1",          # wrong value
    "-(3 - 8) * 2",           # unary minus
    "3 * 8 / (2 - 2)",        # division by zero
    "24",                     # the target is not one of the numbers
    "3 * 8 abc",
    "",
    "Answer:",
    "__import__('os').system('touch MARKER')",
])
def test_countdown_invalid(response):
    assert countdown_reward(REC, response) == 0.0


def test_countdown_repeated_numbers_count():
    assert check_countdown("5 * 5 - 1", [5, 5, 1], 24)
    assert not check_countdown("5 * 5 - 1", [5, 1, 2], 24)


def test_rewards_never_raise_on_bad_records_or_responses():
    for fn in (arithmetic_reward, countdown_reward):
        assert fn({}, "1") == 0.0
        assert fn(REC, None) == 0.0
        assert fn(None, "3 * 8") == 0.0
        assert fn({"answer": "x", "numbers": "??", "target": None}, "3*8") == 0.0


# -- arithmetic checker ----------------------------------------------------------------
@pytest.mark.parametrize("response,reward", [
    ("12", 1.0), (" 12 ", 1.0), ("= 12", 1.0), ("7 + 5 = 12", 1.0), ("x = \\boxed{12}", 1.0),
    ("12.0", 1.0), ("24/2", 1.0), ("so 7 + 5 = 12.", 1.0), ("= $12$", 1.0),
    ("13", 0.0), ("= 12 = 13", 0.0), ("1 2", 0.0), ("7 + 5", 0.0), ("twelve", 0.0),
    ("The result is 12", 0.0), ("", 0.0), ("120", 0.0), ("\\boxed{13} = 12", 0.0),
])
def test_arithmetic_formats(response, reward):
    assert arithmetic_reward({"answer": "12"}, response) == reward


def test_arithmetic_fraction_and_negative_answers():
    assert arithmetic_reward({"answer": "-3/4"}, "= -0.75") == 1.0
    assert arithmetic_reward({"answer": "-3/4"}, "= -3/4") == 1.0
    assert arithmetic_reward({"answer": "-3"}, "= 3") == 0.0
    assert parse_final_number("= 1" + "0" * 60) is None  # too many digits


# -- generators ------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["arithmetic", "countdown"])
def test_generators_are_seeded(task):
    a = make_dataset(task, 50, seed=3, difficulty_mix={1: 1, 2: 1})
    assert a == make_dataset(task, 50, seed=3, difficulty_mix={1: 1, 2: 1})
    assert a != make_dataset(task, 50, seed=4, difficulty_mix={1: 1, 2: 1})
    assert len({r["problem"] for r in a}) == 50 and len({r["id"] for r in a}) == 50
    for r in a:
        assert {"id", "problem", "answer", "task", "difficulty", "split"} <= set(r)
        assert r["task"] == task and r["split"] == "train"


@pytest.mark.parametrize("task,mix", [("arithmetic", {1: 1, 2: 1, 3: 1}), ("countdown", {1: 1, 2: 1})])
def test_train_and_test_never_overlap(task, mix):
    train = [r for seed in range(3) for r in make_dataset(task, 300, seed, mix)]
    test = [r for seed in range(3) for r in make_dataset(task, 60, seed, mix, split="test")]
    assert {r["problem"] for r in train}.isdisjoint({r["problem"] for r in test})
    assert all(r["split"] == "test" for r in test)


@pytest.mark.parametrize("level", sorted(ARITHMETIC_LEVELS))
def test_arithmetic_answers_and_knobs(level):
    spec = ARITHMETIC_LEVELS[level]
    for r in make_dataset("arithmetic", 40, seed=level, difficulty_mix=level):
        operands = [int(t) for t in r["expression"].split() if t.isdigit()]
        ops = [t for t in r["expression"].split() if not t.isdigit()]
        assert len(operands) == spec.num_operands
        assert all(0 <= x < 10**spec.num_digits for x in operands)
        assert set(ops) <= set(spec.operators)
        assert Fraction(r["answer"]) == reference_value(r["expression"])
        assert r["expression"] in r["problem"] and r["difficulty"] == level
        assert arithmetic_reward(r, f"= {r['answer']}") == 1.0
        assert arithmetic_reward(r, f"= {Fraction(r['answer']) + 1}") == 0.0


@pytest.mark.parametrize("level", sorted(COUNTDOWN_LEVELS))
def test_countdown_solutions_and_knobs(level):
    spec = COUNTDOWN_LEVELS[level]
    for r in make_dataset("countdown", 40, seed=level, difficulty_mix=level):
        assert len(r["numbers"]) == spec.num_numbers
        assert all(1 <= x <= spec.max_number for x in r["numbers"])
        assert 0 < r["target"] <= spec.max_target and r["target"] not in r["numbers"]
        assert reference_value(r["solution"]) == r["target"]
        used = Counter(int(t) for t in r["solution"].replace("(", " ").replace(")", " ").split() if t.isdigit())
        assert sum(used.values()) >= spec.min_used
        assert all(used[n] <= r["numbers"].count(n) for n in used)
        assert countdown_reward(r, f"Answer: {r['solution']} = {r['target']}") == 1.0


def test_difficulty_mix_proportions():
    records = make_dataset("arithmetic", 2000, seed=0, difficulty_mix={2: 0.2, 3: 0.5, 4: 0.3})
    counts = Counter(r["difficulty"] for r in records)
    for level, p in {2: 0.2, 3: 0.5, 4: 0.3}.items():
        sd = (2000 * p * (1 - p)) ** 0.5
        assert abs(counts[level] - 2000 * p) < 4 * sd, counts


def test_generator_errors_name_the_fix():
    with pytest.raises(ValueError, match="task"):
        make_dataset("chess", 1, 0)
    with pytest.raises(ValueError, match="levels"):
        make_dataset("arithmetic", 1, 0, difficulty_mix={9: 1.0})
    with pytest.raises(ValueError, match="split"):
        make_dataset("arithmetic", 1, 0, split="val")
    with pytest.raises(ValueError, match="positive sum"):
        make_dataset("arithmetic", 1, 0, difficulty_mix={1: 0.0})
    with pytest.raises(ValueError, match="ran out of distinct"):  # level 1: 300 problems in all
        make_dataset("arithmetic", 500, 0, difficulty_mix=1, allow_repeats=False)


def test_small_levels_repeat_but_never_cross_splits():
    train = make_dataset("arithmetic", 1000, 0, difficulty_mix=1)
    test = make_dataset("arithmetic", 100, 0, difficulty_mix=1, split="test")
    train_set, test_set = {r["problem"] for r in train}, {r["problem"] for r in test}
    assert train_set.isdisjoint(test_set)
    assert len(train_set) + len(test_set) == 300  # every level-1 problem appears: a + b, a - b, a * b
    assert len(train) == 1000 and len(test) == 100


@pytest.mark.parametrize("task", ["arithmetic", "countdown"])
def test_default_mix_makes_train_and_test_sets(task):
    train = make_dataset(task, 4000, seed=0)  # the runner's default sizes, and more
    test = make_dataset(task, 100, seed=0, split="test")
    assert set(Counter(r["difficulty"] for r in train)) == set(synthetic.DEFAULT_MIX[task])
    assert {r["problem"] for r in train}.isdisjoint({r["problem"] for r in test})


def test_custom_levels():
    levels = {7: synthetic.ArithmeticLevel(num_digits=5, num_operands=2, operators="*")}
    (r,) = make_dataset("arithmetic", 1, 0, difficulty_mix=7, levels=levels)
    a, op, b = r["expression"].split()
    assert op == "*" and int(r["answer"]) == int(a) * int(b) and r["difficulty"] == 7


def test_generated_answers_follow_precedence_and_exact_division():
    """The generator computes answers itself; they must agree with the parser and Python."""
    levels = {1: synthetic.ArithmeticLevel(num_digits=2, num_operands=5, operators="+-*/")}
    for r in make_dataset("arithmetic", 200, 0, difficulty_mix=1, levels=levels):
        assert Fraction(r["answer"]) == reference_value(r["expression"])
        assert Fraction(r["answer"]) == parse_expression(r["expression"]).value
        assert arithmetic_reward(r, f"\\boxed{{{r['answer']}}}") == 1.0


def test_registry():
    assert get_reward_fn("arithmetic") is arithmetic_reward
    assert get_reward_fn("countdown") is countdown_reward
    with pytest.raises(ValueError, match="unknown reward"):
        get_reward_fn("chess")
