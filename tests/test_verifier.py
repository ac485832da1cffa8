"""Math verifier: reference cases, an equivalence table, benchmark golds, adversarial input.

Heavy checks run through one shared MathVerifier (2 worker processes) so they exercise
the production path: worker processes, hard time limits, batch scoring.
"""

import json
import os
import pathlib
import re
import time

import numpy as np
import pytest

from ada.rewards import get_reward_fn
from ada.rewards import math_verifier as mv
from ada.rewards.workers import HardTimeoutPool

DATA = pathlib.Path(os.environ.get("ADA_SHARED_DATA", "/work/shared/data"))
CASES = DATA / "verifier_cases.jsonl"
BENCH = DATA / "benchmarks"


def _jsonl(path):
    if not path.exists():
        pytest.skip(f"{path} not present (set ADA_SHARED_DATA to the shared data folder)")
    return [json.loads(line) for line in path.open(encoding="utf-8")]


@pytest.fixture(scope="module")
def verifier():
    with mv.MathVerifier(num_workers=2, timeout_s=20.0) as v:  # generous: the CI box is shared
        yield v


# -- reference cases -------------------------------------------------------------------
@pytest.mark.slow
def test_reference_cases_agreement(verifier):
    rows = _jsonl(CASES)
    got = verifier.score_pairs([r["gold"] for r in rows], [r["pred"] for r in rows])
    want = np.array([r["equal"] for r in rows], np.float32)
    wrong = np.flatnonzero(got != want)
    agreement = 1.0 - len(wrong) / len(rows)
    print(f"\nverifier agreement: {len(rows) - len(wrong)}/{len(rows)} = {agreement:.2%}")
    for i in wrong:
        r = rows[i]
        print(f"  DISAGREE #{i} want={r['equal']} origin={r['origin']}\n"
              f"    gold={r['gold'][:120]!r}\n    pred={r['pred'][-160:]!r}")
    assert agreement >= 0.99
    assert verifier.stats.timeouts == 0 and verifier.stats.errors == 0


# -- equivalence table -----------------------------------------------------------------
EQUIVALENT = [
    ("1/2", "The answer is $\\boxed{0.5}$."),        # fraction vs decimal
    ("0.5", "\\boxed{\\frac{1}{2}}"),
    ("\\frac{3}{4}", "\\boxed{\\dfrac{3}{4}}"),      # \dfrac, \tfrac
    ("\\frac{3}{4}", "\\boxed{\\tfrac34}"),
    ("[1, 3)", "\\boxed{[1,3)}"),                     # intervals
    ("(-\\infty, 2] \\cup (5, \\infty)", "\\boxed{(-\\infty,2]\\cup(5,\\infty)}"),
    ("\\{1, 2, 3\\}", "\\boxed{\\{3, 2, 1\\}}"),        # sets, any order
    ("3", "\\boxed{x = 3}"),                          # x=3 vs 3
    ("x = 3", "\\boxed{3}"),
    ("90^\\circ", "\\boxed{90}"),                      # degrees
    ("90", "\\boxed{90^{\\circ}}"),
    ("25\\%", "\\boxed{25}"),                          # percents
    ("25\\%", "\\boxed{25\\%}"),
    ("12 \\text{ cm}", "\\boxed{12}"),                 # units
    ("5", "\\boxed{5\\text{ meters}}"),
    ("-7", "\\boxed{-7}"),                            # negatives
    ("-\\frac{2}{3}", "\\boxed{\\frac{-2}{3}}"),
    ("(1, 2)", "\\boxed{(1,2)}"),                     # tuples / points
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\frac{\\pi}{2})}"),
    ("\\text{Evelyn}", "\\boxed{\\text{Evelyn}}"),      # text answers
    ("\\text{(C)}", "The answer is \\boxed{C}."),
    ("2,125", "#### 2125"),                            # thousands separators, GSM8K style
    ("2125", "so she pays 2,125 dollars.\n#### 2,125"),
    ("\\sqrt{2}/2", "\\boxed{\\frac{\\sqrt{2}}{2}}"),
    ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}"),
    ("x^2+2x+1", "\\boxed{(x+1)^2}"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}"),
    ("10", "\\fbox{10}"),
    ("42", "Final answer: the answer is 42"),
]
NOT_EQUIVALENT = [
    ("1/2", "\\boxed{0.6}"),
    ("\\frac{3}{4}", "\\boxed{\\frac{4}{3}}"),
    ("[1, 3)", "\\boxed{(1,3)}"),                      # open vs half-open
    ("[1, 3)", "\\boxed{[1,3]}"),
    ("\\{1, 2, 3\\}", "\\boxed{\\{1, 2\\}}"),
    ("3", "\\boxed{x = 4}"),
    ("90^\\circ", "\\boxed{45^\\circ}"),
    ("25\\%", "\\boxed{30\\%}"),
    ("-7", "\\boxed{7}"),                              # sign matters
    ("(1, 2)", "\\boxed{(2,1)}"),                      # tuples are ordered
    ("(1, 2)", "\\boxed{(1,2,3)}"),
    ("\\text{Evelyn}", "\\boxed{\\text{Briana}}"),
    ("2,125", "#### 2126"),
    ("x^2+2x+1", "\\boxed{(x-1)^2}"),
    ("5", ""),
    ("5", "I do not know."),
    ("5", "\\boxed{}"),
]


@pytest.mark.parametrize("gold,response", EQUIVALENT)
def test_equivalent_pairs(gold, response):
    assert mv.check(gold, response) == 1.0


@pytest.mark.parametrize("gold,response", NOT_EQUIVALENT)
def test_non_equivalent_pairs(gold, response):
    assert mv.check(gold, response) == 0.0


def test_table_through_the_pool_matches_in_process(verifier):
    pairs = EQUIVALENT + NOT_EQUIVALENT
    got = verifier.score_pairs([g for g, _ in pairs], [r for _, r in pairs])
    want = [1.0] * len(EQUIVALENT) + [0.0] * len(NOT_EQUIVALENT)
    np.testing.assert_array_equal(got, np.array(want, np.float32))


# -- benchmark golds -------------------------------------------------------------------
@pytest.mark.slow
def test_benchmark_golds_verify_against_themselves(verifier):
    rows = _jsonl(BENCH / "math500.jsonl") + _jsonl(BENCH / "gsm8k_test.jsonl")
    assert len(rows) == 1819
    golds = [r["answer"] for r in rows]
    t0 = time.perf_counter()
    ok = verifier.score_pairs(golds, [f"So the final answer is $\\boxed{{{g}}}$." for g in golds])
    gsm = [g for g, r in zip(golds, rows, strict=True) if r["source"] == "gsm8k"]
    ok_gsm = verifier.score_pairs(gsm, [f"Adding up...\n#### {g}" for g in gsm])
    seconds = time.perf_counter() - t0
    print(f"\n{len(golds) + len(gsm)} self-checks in {seconds:.1f}s")
    bad = [g for g, v in zip(golds, ok, strict=True) if v != 1.0]
    assert not bad, f"golds failing self-verification: {bad[:10]}"
    assert ok_gsm.min() == 1.0
    assert all(verifier.golds_parseable(golds))
    # The same golds against the next row's answer must mostly fail (no blanket "equal").
    shifted = verifier.score_pairs(golds[:500], [f"\\boxed{{{g}}}" for g in golds[1:501]])
    same = sum(mv.check(a, f"\\boxed{{{b}}}") for a, b in zip(golds[:500], golds[1:501], strict=True)
               if a.replace(" ", "") == b.replace(" ", ""))
    assert shifted.sum() <= same + 5, shifted.sum()


# -- extraction ------------------------------------------------------------------------
@pytest.mark.parametrize("response,answer", [
    ("so \\boxed{\\frac{1}{2}} then \\boxed{x^{2}+\\{1\\}} end", "x^{2}+\\{1\\}"),  # last, nested
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
    ("\\fbox{3}", "3"),
    ("\\boxed 5.", "5"),
    ("\\boxed{1} then \\boxed{2", "1"),                    # unclosed last box skipped
    ("Natalia sold 48 clips.\n#### 72", "72"),
    ("#### 2,125", "2,125"),
    ("So the answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
    ("The final answer is: 42.", "42"),
    ("Answer: **7**", "7"),
    ("I think it is seven", None),
    ("", None),
])
def test_extract_answer(response, answer):
    assert mv.extract_answer(response) == answer


def test_extract_answer_is_linear_in_length():
    t0 = time.perf_counter()
    assert mv.extract_answer("\\boxed{" * 50_000) is None
    assert time.perf_counter() - t0 < 2.0


# -- adversarial output ----------------------------------------------------------------
def _adversarial(marker: pathlib.Path) -> dict[str, str]:
    cmd = f"touch {marker}"
    return {
        "100KB of digits": "1" * 100_000,
        "100KB of text": "blah $x$ \\boxed{" * 6_000,
        "power tower": "\\boxed{10^{10^{10^{10}}}}",
        "plain power tower": "The answer is 10^10^10^10",
        "python power": "The answer is 9**9**9**9",
        "huge factorial": "\\boxed{(10^{10})!}",
        "nested braces": "\\boxed{" + "{" * 5_000 + "1" + "}" * 5_000 + "}",
        "unclosed braces": "\\boxed{" + "{" * 20_000,
        "nested parens": "$" + "(" * 3_000 + "1" + ")" * 3_000 + "$",
        "import boxed": f"\\boxed{{__import__('os').system('{cmd}')}}",
        "import text": f"The answer is __import__('os').system('{cmd}')",
        "import bare": f"__import__('os').system('{cmd}')",
        "lambda": f"$(lambda: __import__('os').system('{cmd}'))()$",
        "exec": f"Answer: exec(\"import os; os.system('{cmd}')\")",
        "dollars": "$" * 50_000,
    }


def test_adversarial_outputs_score_zero_within_limit(tmp_path):
    marker = tmp_path / "MARKER"
    limit = 1.0
    with mv.MathVerifier(num_workers=2, timeout_s=limit) as v:
        for name, response in _adversarial(marker).items():
            v.score_pairs(["5", "5"], ["\\boxed{5}"] * 2)  # both workers up (not timed)
            t0 = time.perf_counter()
            got = v.score([{"answer": "5"}], [response])
            elapsed = time.perf_counter() - t0
            assert got.tolist() == [0.0], name
            assert elapsed < limit + 1.5, f"{name}: {elapsed:.2f}s"
        assert v.stats.timeouts >= 1  # the towers and the factorial hit the hard limit
        assert v.score_pairs(["5"], ["\\boxed{5}"]).tolist() == [1.0]  # replaced workers work
    assert not marker.exists()
    # and the one-at-a-time API:
    for response in list(_adversarial(marker).values())[:4]:
        assert mv.verify("5", response, timeout_s=limit) == 0.0
    assert not marker.exists()


def test_no_sympy_eval_of_model_text(monkeypatch, tmp_path):
    """Every string sympy evaluates while checking is built from numerals and a few sympy
    names: numeral literals from the LaTeX/number parsers, and the closed forms sympy's
    own nsimplify (mpmath.identify) writes, e.g. "(30+sqrt(528))/2". No model text."""
    import sympy.parsing.sympy_parser as sp

    rows = _jsonl(CASES)
    mv.check("x", "\\boxed{5\\text{ km}}")  # lazy library imports (sympy units) happen here
    evaluated = []
    original = sp.eval_expr

    def recording_eval_expr(code, local_dict, global_dict):
        evaluated.append(code)
        return original(code, local_dict, global_dict)

    monkeypatch.setattr(sp, "eval_expr", recording_eval_expr)
    mv._parse_gold.cache_clear()
    texts = [r["pred"] for r in rows] + [
        r for k, r in _adversarial(tmp_path / "M").items()
        if "tower" not in k and "factorial" not in k  # these need the hard time limit
    ] + ["The answer is 2*3+4", "answer: (1/2)*(4/3)", "The answer is 9**9"]
    for text in texts:
        mv.check("5", text)
    for r in rows:
        mv.check(r["gold"], "0")
    allowed_names = {"Integer", "Float", "Rational", "sqrt", "log", "exp", "pi", "E", "I"}
    assert evaluated, "the recorder saw nothing; the check would be vacuous"
    bad = [
        c for c in evaluated
        if not set(re.findall(r"[A-Za-z_]\w*", re.sub(r"'[0-9.eE+-]*'", "", c))) <= allowed_names
        or re.search(r"[^\w\s()+\-*/.,'\[\]]", c)
    ]
    assert not bad, bad[:5]
    assert not (tmp_path / "M").exists()


def test_plain_expressions_still_parse_without_eval():
    assert mv.check("10", "The answer is 2*3+4") == 1.0
    assert mv.check("2/3", "P(A) = (1/2) * (4/3) P(A) = 2/3.") == 1.0
    assert mv.check("11", "The answer is 2*3+4") == 0.0


# -- API contracts ---------------------------------------------------------------------
def test_verify_and_reward_never_raise():
    assert mv.verify("1/2", "\\boxed{0.5}") == 1.0
    assert mv.verify("1/2", None) == 0.0
    assert mv.verify(None, "\\boxed{1}") == 0.0
    assert mv.verify(3, "\\boxed{3}") == 0.0
    reward = get_reward_fn("math")
    assert reward({"problem": "p", "answer": "7"}, "so \\boxed{7}") == 1.0
    assert reward({"problem": "p"}, "so \\boxed{7}") == 0.0  # no 'answer'
    assert reward("not a dict", "x") == 0.0
    with pytest.raises(ValueError, match="timeout_s"):
        mv.verify("1", "1", timeout_s=0)


def test_gold_is_parseable():
    assert mv.gold_is_parseable("\\frac{1}{2}")
    assert mv.gold_is_parseable("2,125")
    assert mv.gold_is_parseable("\\text{(C)}")
    assert not mv.gold_is_parseable("")
    assert not mv.gold_is_parseable("   ")
    assert not mv.gold_is_parseable("!!!")
    assert not mv.gold_is_parseable(None)


def test_score_shapes_stats_and_errors(verifier):
    before = verifier.stats.checks
    records = [{"answer": "4"}, {"answer": "4"}, {"answer": ""}, {"problem": "no answer"}]
    got = verifier.score(records, ["\\boxed{4}", "\\boxed{5}", "\\boxed{4}", "\\boxed{4}"])
    assert got.dtype == np.float32 and got.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert verifier.stats.checks == before + 2  # empty / missing golds are not sent
    assert verifier.stats.checks_per_s > 0
    assert set(verifier.stats.as_dict()) >= {"checks", "timeouts", "errors", "checks_per_s"}
    with pytest.raises(ValueError, match="one response per record"):
        verifier.score([{"answer": "1"}], [])


# -- the worker pool -------------------------------------------------------------------
def _sleep_then(seconds, value):
    time.sleep(seconds)
    if value == "raise":
        raise RuntimeError("boom")
    return value


def test_pool_kills_and_replaces_stuck_workers():
    with HardTimeoutPool(_sleep_then, num_workers=2, timeout_s=0.5) as pool:
        pool.map([(0.0, 0)] * 2)  # both workers started and ready
        pids = set(pool.pids)
        t0 = time.perf_counter()
        out = pool.map([(0.0, 1), (0.0, "raise"), (0.0, 3), (30.0, 4), (30.0, 5)])
        elapsed = time.perf_counter() - t0
        assert [o[0] for o in out] == ["ok", "error", "ok", "timeout", "timeout"]
        assert [o[1] for o in out[:3:2]] == [1, 3] and "boom" in out[1][1]
        assert elapsed < 5.0  # the two sleepers were killed at 0.5 s, not after 30 s
        assert pool.stats.timeouts == 2 and pool.stats.errors == 1 and pool.stats.restarts == 2
        assert not set(pool.pids) & pids  # both stuck workers were replaced
        assert pool.map([(0.0, 7), (0.0, 8)]) == [("ok", 7), ("ok", 8)]  # replacements work
        processes = [w.process for w in pool._workers]
    assert not any(p.is_alive() for p in processes)  # closed cleanly
    with pytest.raises(RuntimeError, match="closed"):
        pool.map([(0.0, 1)])
    with pytest.raises(ValueError, match="fork"):
        HardTimeoutPool(_sleep_then, num_workers=1, context="fork")


def _die(code):
    os._exit(code)


def test_pool_survives_a_worker_that_dies():
    with HardTimeoutPool(_die, num_workers=1, timeout_s=5.0) as pool:
        out = pool.map([(3,), (4,)])
        assert [o[0] for o in out] == ["error", "error"]
        assert "died" in out[0][1]
        # each task is retried once on a fresh worker, then counted as an error
        assert pool.stats.retries == 2 and pool.stats.restarts == 4 and pool.stats.errors == 2


def test_math_reward_batch_form_equals_one_at_a_time():
    """The Collector's batch path (math_reward.score_batch, a parallel pool) gives the same
    rewards as the per-response math_reward."""
    from ada.rewards.math_verifier import math_reward

    records = [{"answer": "\\frac{1}{2}"}, {"answer": "3"}, {"answer": "(1,2)"}, {"answer": "7"}]
    texts = ["so it is \\boxed{0.5}", "the answer is 4", "\\boxed{(1, 2)}", "#### 7"]
    one = [math_reward(r, t) for r, t in zip(records, texts, strict=True)]
    assert one == [1.0, 0.0, 1.0, 1.0]
    np.testing.assert_array_equal(math_reward.score_batch(records, texts), one)
