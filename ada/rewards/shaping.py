"""Reward shaping. DAPO's soft overlong punishment, counted in tokens.

DAPO (arXiv 2503.14476, eq. 13): with L_max the maximum response length and L_cache the
buffer,

    R(y) = 0                                 if |y| <= L_max - L_cache
         = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
         = -1                                if |y| > L_max

scaled here by `penalty_factor` and added to the task reward. |y| must be the response
length in tokens (the sampler's count), never characters.
"""

from __future__ import annotations

import numpy as np


def overlong_penalty(response_len_tokens, max_len: int, buffer_len: int, penalty_factor: float = 1.0):
    """Penalty <= 0 per response: 0 up to `max_len - buffer_len` tokens, then linear down
    to `-penalty_factor` at `max_len` (and beyond). Array in -> float32 array out (same
    shape); scalar in -> float."""
    if max_len <= 0:
        raise ValueError(f"max_len={max_len} must be > 0 (the max response length in tokens)")
    if not 0 <= buffer_len <= max_len:
        raise ValueError(f"buffer_len={buffer_len} must be in [0, max_len={max_len}]")
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor={penalty_factor} must be >= 0 (it is subtracted)")
    length = np.asarray(response_len_tokens, dtype=np.float64)
    if length.size and np.min(length) < 0:
        raise ValueError("response_len_tokens must be >= 0 (token counts)")
    start = max_len - buffer_len
    if buffer_len == 0:
        frac = (length > max_len).astype(np.float64)
    else:
        frac = np.clip((length - start) / buffer_len, 0.0, 1.0)
    penalty = -penalty_factor * frac
    if np.ndim(response_len_tokens) == 0:
        return float(penalty)
    return penalty.astype(np.float32)
