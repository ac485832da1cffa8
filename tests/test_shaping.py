"""DAPO overlong shaping against a plain-Python transcription of DAPO eq. 13."""

import numpy as np
import pytest

from ada.rewards.shaping import overlong_penalty


def dapo_reference(length: int, max_len: int, buffer_len: int, factor: float) -> float:
    expected = max_len - buffer_len
    if length <= expected:
        return 0.0
    if length <= max_len:
        return factor * (expected - length) / buffer_len
    return -factor


@pytest.mark.parametrize("max_len,buffer_len,factor", [(100, 20, 1.0), (4096, 1024, 0.5), (64, 64, 2.0), (10, 1, 1.0)])
def test_matches_reference_on_every_length(max_len, buffer_len, factor):
    lengths = np.arange(0, max_len + 30)
    got = overlong_penalty(lengths, max_len, buffer_len, factor)
    want = np.array([dapo_reference(int(n), max_len, buffer_len, factor) for n in lengths])
    assert got.dtype == np.float32 and got.shape == lengths.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_landmarks_and_scalar():
    assert overlong_penalty(80, 100, 20, 1.0) == 0.0           # end of the free zone
    assert overlong_penalty(90, 100, 20, 1.0) == pytest.approx(-0.5)
    assert overlong_penalty(100, 100, 20, 1.0) == pytest.approx(-1.0)
    assert overlong_penalty(5000, 100, 20, 0.25) == pytest.approx(-0.25)
    assert isinstance(overlong_penalty(90, 100, 20), float)
    got = overlong_penalty(np.array([[0, 90], [100, 120]]), 100, 20)
    np.testing.assert_allclose(got, [[0, -0.5], [-1, -1]])


def test_zero_buffer_is_a_step():
    np.testing.assert_array_equal(overlong_penalty([99, 100, 101], 100, 0, 1.0), [0, 0, -1])


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_len=0, buffer_len=0), "max_len"),
    (dict(max_len=10, buffer_len=11), "buffer_len"),
    (dict(max_len=10, buffer_len=-1), "buffer_len"),
    (dict(max_len=10, buffer_len=2, penalty_factor=-1.0), "penalty_factor"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        overlong_penalty(5, **kwargs)


def test_negative_lengths_rejected():
    with pytest.raises(ValueError, match="token counts"):
        overlong_penalty([3, -1], 10, 2)
