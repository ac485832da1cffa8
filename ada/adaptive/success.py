"""A per-prompt success memory: a Beta posterior over each prompt's pass rate.

Why: the allocation (`ada.adaptive.allocation`) splits a step's samples across prompts by
how much signal each is predicted to give, and that prediction needs every prompt's recent
record. Every draw adds its outcome to the prompt's evidence (pos += correct, neg += wrong).
Because the policy moves, evidence is forgotten with a half-life in RL steps: evidence last
updated at step s and read at step t counts 2^(-(t - s) / half_life) times. The decay is
applied lazily at a read or an update, so a step costs O(its prompts), not O(dataset).

The posterior of a prompt is Beta(s m + pos, s (1 - m) + neg): its decayed evidence on top of
a prior of strength s (`prior_strength`) centred on m, the pass rate of all recent draws
(every prompt's evidence summed, with the same half-life, Laplace-smoothed). A prompt unseen
or long forgotten is thus predicted at the population's rate, which moves from ~0.3 to ~0.9
over the default run, not at 1/2; and GRESO's "retry a skipped prompt later" comes from the
decay back to that prior, not from a separate rule.

The state is [D] arrays indexed by the prompt's dataset index (the data iterator's, the same
on every process) and the population's two sums: a small tree that checkpoints as is and is
exact on resume. Every function is NumPy float64 with a fixed order of operations
(duplicates are summed by `np.add.at` over sorted unique ids), so every process that feeds
the same (ids, pos, neg) computes the same bits; under several processes the caller
gathers the step's counts first.

The default half-life, 40 steps, is chosen in docs/results.md ("A step's budget across
prompts, in the simulator"): on the default run's moving pass rates it tops a plateau from 20
to 80 steps; at 2 steps the memory forgets before a prompt returns (every ~31 steps there)
and the allocation's gain is gone.
"""

from __future__ import annotations

import numpy as np
from flax import struct

HALF_LIFE = 40.0  # RL steps; the module doc
PRIOR_STRENGTH = 2.0  # pseudo-draws of the population prior (Beta(1, 1) has 2)


@struct.dataclass
class SuccessMemory:
    """Per dataset prompt, evidence as of step `last` (decay not yet applied); and the
    population's, as of `pop_last`."""

    pos: np.ndarray  # [D] float64
    neg: np.ndarray  # [D] float64
    last: np.ndarray  # [D] int64, the step of the prompt's last update
    pop: np.ndarray  # [2] float64: every prompt's (pos, neg), decayed to pop_last
    pop_last: np.ndarray  # [] int64


def init(num_prompts: int) -> SuccessMemory:
    z = np.zeros(num_prompts, np.float64)
    return SuccessMemory(pos=z, neg=z.copy(), last=np.zeros(num_prompts, np.int64),
                         pop=np.zeros(2, np.float64), pop_last=np.zeros((), np.int64))


def check(half_life: float, prior_strength: float) -> str | None:
    """Why (half_life, prior_strength) is unusable, or None."""
    if not half_life > 0:
        return f"half_life={half_life} must be > 0 steps (inf never forgets)"
    if not prior_strength > 0:
        return f"prior_strength={prior_strength} must be > 0 pseudo-draws"
    return None


def _keep(now, then, half_life):
    return np.exp2(-(now - np.asarray(then)).astype(np.float64) / half_life)


def evidence(mem: SuccessMemory, ids, step: int,
             half_life: float = HALF_LIFE) -> tuple[np.ndarray, np.ndarray]:
    """The decayed (pos, neg) draws of prompts `ids` as read at `step`: their own record."""
    keep = _keep(step, mem.last[np.asarray(ids, np.int64)], half_life)
    return mem.pos[ids] * keep, mem.neg[ids] * keep


def posterior(mem: SuccessMemory, ids, step: int, half_life: float = HALF_LIFE,
              prior_strength: float = PRIOR_STRENGTH) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, beta) of prompts `ids` as read at `step`; float64 [len(ids)]."""
    pop = mem.pop * _keep(step, mem.pop_last, half_life)
    m = (1.0 + pop[0]) / (2.0 + pop[0] + pop[1])
    pos, neg = evidence(mem, ids, step, half_life)
    return prior_strength * m + pos, prior_strength * (1.0 - m) + neg


def update(mem: SuccessMemory, ids, pos, neg, step: int,
           half_life: float = HALF_LIFE) -> SuccessMemory:
    """The memory after prompts `ids` drew `pos` correct and `neg` wrong responses at `step`
    (an id may repeat: its counts are summed). A new memory; `mem` is unchanged."""
    ids = np.asarray(ids, np.int64)
    uid, inv = np.unique(ids, return_inverse=True)
    dpos, dneg = np.zeros(uid.size, np.float64), np.zeros(uid.size, np.float64)
    np.add.at(dpos, inv, np.asarray(pos, np.float64))
    np.add.at(dneg, inv, np.asarray(neg, np.float64))
    keep = _keep(step, mem.last[uid], half_life)
    p, n, last = mem.pos.copy(), mem.neg.copy(), mem.last.copy()
    p[uid] = p[uid] * keep + dpos
    n[uid] = n[uid] * keep + dneg
    last[uid] = step
    pop = mem.pop * _keep(step, mem.pop_last, half_life) + np.array([dpos.sum(), dneg.sum()])
    return SuccessMemory(pos=p, neg=n, last=last, pop=pop,
                         pop_last=np.asarray(step, np.int64))


def state(mem: SuccessMemory) -> dict:
    """The memory as a checkpointable tree of arrays."""
    return {k: getattr(mem, k) for k in ("pos", "neg", "last", "pop", "pop_last")}


def from_state(tree: dict) -> SuccessMemory:
    f, i = np.float64, np.int64
    return SuccessMemory(pos=np.asarray(tree["pos"], f), neg=np.asarray(tree["neg"], f),
                         last=np.asarray(tree["last"], i), pop=np.asarray(tree["pop"], f),
                         pop_last=np.asarray(tree["pop_last"], i))
