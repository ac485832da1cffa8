"""ada.rewards.score: `score` (batch path, per-item fallback, every kind of failed reward) and
`correct`, the one rule for a correct response."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ada.rewards import get_reward_fn
from ada.rewards.score import FAILURE_SCORE, correct, score

RECORDS = [{"id": str(i)} for i in range(4)]


def _counting(values):
    """A per-item reward returning values[int(response)]; counts its calls."""
    def reward(record, response):
        reward.calls += 1
        v = values[int(response)]
        if isinstance(v, Exception):
            raise v
        return v
    reward.calls = 0
    return reward


def test_per_item_failures_score_zero_and_are_flagged():
    values = [1.0, RuntimeError("boom"), None, math.nan, math.inf, -math.inf, "1.0", b"1",
              [1.0], object(), np.float32(0.5), True, 0]
    reward = _counting(values)
    scores, failed = score(reward, [{}] * len(values), [str(i) for i in range(len(values))])
    assert scores.dtype == np.float64 and failed.dtype == bool and FAILURE_SCORE == 0.0
    assert scores.tolist() == [1.0] + [FAILURE_SCORE] * 9 + [0.5, 1.0, 0.0]
    assert failed.tolist() == [False] + [True] * 9 + [False] * 3
    assert reward.calls == len(values)


def test_batch_path_is_called_once_and_checked():
    reward = _counting([])
    calls = []

    def batch(records, responses):
        calls.append(len(records))
        return np.array([1.0, math.nan, 0.0, 0.25])

    reward.score_batch = batch
    scores, failed = score(reward, RECORDS, ["a", "b", "c", "d"])
    assert calls == [4] and reward.calls == 0  # the per-item reward is never used
    assert scores.tolist() == [1.0, 0.0, 0.0, 0.25]
    assert failed.tolist() == [False, True, False, False]


@pytest.mark.parametrize("broken", [
    lambda records, responses: 1 / 0,  # raises
    lambda records, responses: [1.0] * (len(records) - 1),  # wrong length
    lambda records, responses: 1.0,  # not a sequence
])
def test_broken_batch_falls_back_to_one_item_at_a_time(broken):
    reward = _counting([1.0, ValueError("bad item"), 0.5, None])
    reward.score_batch = broken
    scores, failed = score(reward, RECORDS, ["0", "1", "2", "3"])
    assert reward.calls == 4  # one bad response did not zero the others
    assert scores.tolist() == [1.0, 0.0, 0.5, 0.0]
    assert failed.tolist() == [False, True, False, True]


def test_empty_and_mismatched_inputs():
    reward = _counting([])
    reward.score_batch = lambda records, responses: pytest.fail("no batch call for no items")
    scores, failed = score(reward, [], [])
    assert scores.shape == failed.shape == (0,)
    with pytest.raises(ValueError, match="2 records but 1 responses"):
        score(reward, [{}, {}], ["0"])


def test_synthetic_rewards():
    arithmetic = get_reward_fn("arithmetic")
    scores, failed = score(arithmetic, [{"answer": "12"}] * 3, ["= 12", "= 13", None])
    assert scores.tolist() == [1.0, 0.0, 0.0] and not failed.any()  # checkers never fail
    countdown = get_reward_fn("countdown")
    record = {"numbers": [2, 5, 7], "target": 10}
    scores, _ = score(countdown, [record, record], ["Answer: 2 * 5", "Answer: 7 + 5"])
    assert scores.tolist() == [1.0, 0.0]


def test_math_reward_batch_and_fallback_agree():
    """math_reward fans out over the verifier pool; its per-item path gives the same."""
    math_reward = get_reward_fn("math")
    assert hasattr(math_reward, "score_batch")
    records = [{"answer": "\\frac{1}{2}"}, {"answer": "3"}, {"answer": "(1,2)"}, {"id": "no gold"}]
    texts = ["so it is \\boxed{0.5}", "the answer is 4", "\\boxed{(1, 2)}", "\\boxed{1}"]
    scores, failed = score(math_reward, records, texts)
    assert scores.tolist() == [1.0, 0.0, 1.0, 0.0] and not failed.any()

    def per_item(record, response):
        return math_reward(record, response)

    per_item.score_batch = lambda records, responses: [1.0]  # wrong length: fallback
    scores, failed = score(per_item, records, texts)
    assert scores.tolist() == [1.0, 0.0, 1.0, 0.0] and not failed.any()


def test_correct_is_strictly_above_the_threshold():
    """Equal to the threshold is incorrect; the same on floats, NumPy and jax (jitted)."""
    r = [0.0, 0.5, 0.50001, 1.0]
    assert [correct(x, 0.5) for x in r] == [False, False, True, True]
    np.testing.assert_array_equal(correct(np.array(r), 0.5), [False, False, True, True])
    got = jax.jit(correct)(jnp.asarray(r, jnp.float32), 0.5)
    np.testing.assert_array_equal(np.asarray(got), [False, False, True, True])
    assert not correct(FAILURE_SCORE, 0.0)  # a failed reward is never correct at threshold 0
