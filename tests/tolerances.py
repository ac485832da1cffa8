"""Float32 tolerances derived from the computation, not from one machine's rounding.

Two float32 computations of the same model output differ when they sum in other orders:
ada against transformers or float64 NumPy, the paged cache against the dense one, a cache
step against a whole forward, and any of them on another CPU (XLA:CPU and torch pick their
kernels, hence their summation orders, by the instruction set). Reordering a float32 sum of
n terms moves it by about sqrt(n) u of the terms' scale (u = 2**-24, rounding as a random
walk); sums in a chain add. A transformer layer chains ~8 sums (q / k / v projection, the
score, the softmax's normaliser, the weighted values, the output projection, the MLP's two
matmuls) of at most max(hidden, intermediate) terms, and the unembedding one more. So two
float32 forwards of a model agree within

    (8 layers + 1) sqrt(max(hidden, intermediate)) u  x  the largest |value|

which for the 2-layer tiny models is ~190 u of the largest logit (seen, paged vs dense: 9-12
u on a Xeon with XLA:CPU's defaults, up to 5 u there with AVX2 code and no YNNPACK, 27 u on
an AMD EPYC). A wrong position, mask, page or weight moves logits by about their standard
deviation (~1 here): 10^3-10^4 times more.
"""

from __future__ import annotations

import math

import numpy as np

U32 = 2.0**-24  # float32 unit roundoff


def model_tol(reference, config) -> float:
    """How far a float32 model output (logits, or a cache's keys and values) may be from
    `reference` for `config`'s depth and widths (the module docstring derives it)."""
    sums = 8 * config.num_layers + 1
    terms = max(config.hidden_size, config.intermediate_size)
    return sums * math.sqrt(terms) * U32 * float(np.abs(np.asarray(reference)).max())


def logprob_tol(logits, config) -> float:
    """A log-prob log_softmax(z)_i errs by at most |dz_i| + max |dz|: twice the logits'."""
    return 2 * model_tol(logits, config)


def adam_step_bound(t: int, b1: float = 0.9, b2: float = 0.999) -> float:
    """The largest |m_hat| / sqrt(v_hat) of Adam's t-th step, whatever the gradients:
    Cauchy-Schwarz over the bias-corrected averages of the same gradients (1 at t = 1,
    1.0014 at t = 2, 1.0068 at t = 4). eps only shrinks the step."""
    i = np.arange(1, t + 1)
    w = (1 - b1) * b1 ** (t - i) / (1 - b1**t)
    v = (1 - b2) * b2 ** (t - i) / (1 - b2**t)
    return float(np.sqrt((w**2 / v).sum()))


def assert_same_adam_update(start, ours, theirs, *, lr: float, updates: int,
                            b1: float = 0.9, b2: float = 0.999) -> None:
    """Two runs took the same `updates` Adam steps from `start` (pytrees of params), up to
    the order in which they summed their gradients.

    Where a gradient is near eps, Adam's g / (|g| + eps) turns any rounding into any part
    of a step (seen: 1e-6 of a step on one CPU, 1.5% on another), so parameters are not
    compared one by one beyond Adam's own bound: (b) each moved at most sum_t bound(t) lr,
    so the runs differ by at most twice that. (c) The whole update is compared as a vector:
    the same direction and size within 1e-2. That is a test of meaning, not of rounding:
    equal batches give 1e-5 to 1e-4 here, while a wrong batch or sample changes nearly every
    parameter's move by O(lr), a relative difference of order 1 (two independent Adam
    updates are near orthogonal: sqrt(2)).
    """
    import jax

    def flat(tree):
        return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])

    s = flat(start)
    ours, theirs = flat(ours) - s, flat(theirs) - s
    most = 2 * lr * sum(adam_step_bound(t, b1, b2) for t in range(1, updates + 1))
    assert np.abs(ours - theirs).max() <= most, (np.abs(ours - theirs).max(), most)  # (b)
    rel = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
    assert rel < 1e-2, rel  # (c)
