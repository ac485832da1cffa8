"""avg@k and the unbiased pass@k estimator against brute-force enumeration."""

import itertools
import math

import numpy as np
import pytest

from ada.evaluation import evaluate, pass_at_k, summarize


def _brute_pass_at_k(n, c, k):
    """Probability that a uniformly drawn k-subset of n samples (c correct) has a correct one."""
    labels = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(labels[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_closed_form_large_n():
    n, c, k = 200, 7, 32
    expect = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expect, rel=1e-12)
    assert pass_at_k(32, 1, 1) == pytest.approx(1 / 32)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_summarize_and_evaluate():
    correct = np.array([1, 4, 0])  # correct responses per prompt, of 4
    s = summarize(correct, 4, pass_k=(1, 2, 4))
    assert s["avg@4"] == pytest.approx(5 / 12) and s["accuracy"] == s["avg@4"]
    assert s["pass@1"] == pytest.approx(s["avg@4"])  # pass@1 is the mean accuracy
    assert s["pass@2"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert s["pass@4"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="at least 8 samples"):
        summarize(correct, 4, pass_k=(8,))

    records = [{"answer": "3", "difficulty": 1}, {"answer": "5", "difficulty": 2}]
    asked = []

    def sample(recs, k, first_id):
        asked.append((len(recs), k, first_id))
        return [[r["answer"] if j % 2 == 0 else "x" for j in range(k)] for r in recs]

    def reward(rec, text):
        if text == "x" and rec["answer"] == "5":
            raise RuntimeError("a bad reward must not stop the eval")
        return float(text == rec["answer"])

    summary = evaluate(records, sample, reward, samples=4, pass_k=(1, 2))
    assert asked == [(2, 4, 0)]
    assert summary["eval_avg@4"] == 0.5 and summary["eval_pass@2"] == pytest.approx(1 - 1 / 6)
    assert summary["eval_accuracy_level1"] == summary["eval_accuracy_level2"] == 0.5
