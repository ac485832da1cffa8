"""Down-sample each prompt's pool to exactly n responses (vectorised over prompts, jittable).

Per prompt, with pos / neg the pool's counts of correct / incorrect responses
(`ada.rewards.score.correct`: reward > threshold), seen = pos + neg, take = min(n, seen), and
done = RULES[mode].done(pos, neg, seen, n):

  balanced fill (done prompts of every rule; not-done prompts of rules whose
  `unfinished_fill` is "balanced": `balance` and `none`):
      n_pos = min(n // 2, pos); n_neg = min(take - n_pos, neg); any shortfall is filled
      from the other kind (so n_pos = take - n_neg). This is verl-fork's `downsample_cache`.
  proportional fill (not-done prompts of `pos`, the reference's positive_focused fallback;
  ada/adaptive/rules.py: `unfinished_fill`):
      target = clip(ceil(pos * n / seen), 1, take - 1) positives, the rest negatives, then
      the same "fill from the other kind". ceil is exact integer ceil (the reference's float
      ceil of pos / seen * n can only differ where the product is an integer up to rounding).
      With both kinds present the group keeps at least one of each; with one kind, all of it.

Within a kind the members are a uniformly random subset (one uniform draw per pool entry
from `fold_in(key, prompt_id)`), so the result is deterministic given the key and the pool,
independent of the pool's arrival order when columns are sample indices, and independent of
which other prompts share the batch (a prompt keeps the same members on 1 or N processes). Members are listed positives
first. A pool with fewer than n responses fills `take` slots; the rest get index -1 and
`group_valid` False (the collectors never produce such pools: the budget is >= n and rules
only exit with >= n responses).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ada.adaptive import rules
from ada.rewards.score import correct


def target_counts(pos, neg, n: int, mode: str):
    """(n_pos, n_neg, done) to keep per prompt; arrays of any shape, jnp."""
    seen = pos + neg
    rule = rules.get_rule(mode)
    done = rule.done(pos, neg, seen, n)
    take = jnp.minimum(n, seen)
    # balanced fill
    n_neg_bal = jnp.minimum(take - jnp.minimum(n // 2, pos), neg)
    n_pos_bal = take - n_neg_bal
    if rule.unfinished_fill == "balanced":
        return n_pos_bal, n_neg_bal, done
    # proportional fill, for prompts that never exited (`pos`)
    prop = (pos * n + seen - 1) // jnp.maximum(seen, 1)  # exact ceil(pos * n / seen)
    tgt = jnp.maximum(jnp.minimum(prop, take - 1), 1)
    n_neg_prop = jnp.minimum(take - jnp.minimum(tgt, pos), neg)
    n_pos_prop = take - n_neg_prop
    n_pos = jnp.where(done, n_pos_bal, n_pos_prop)
    return n_pos, take - n_pos, done


@functools.partial(jax.jit, static_argnames=("n", "mode"))
def select(pool_rewards_PxS, pool_valid_PxS, n: int, mode: str, key, threshold, prompt_ids_P=None):
    """Pick n members per prompt. Returns (indices [P, n] int32, stats dict).

    prompt_ids_P: global ids of the rows (default 0..P-1); each row's randomness comes from
    `fold_in(key, prompt_id)`.

    stats: done [P] (the exit rule holds on the pool's counts); group_valid [P, n];
    rewards [P, n] (the kept rewards, 0 where invalid); mixed [P] (kept rewards not all
    equal). The pool's counts and moments are the collector's (`Pool.stats`).
    """
    P, S = pool_rewards_PxS.shape
    if S < n:
        raise ValueError(f"pool arrays have {S} columns < n={n}; pad the pool to >= n columns")
    r = pool_rewards_PxS
    v = pool_valid_PxS.astype(bool)
    is_pos = v & correct(r, threshold)
    is_neg = v & ~is_pos
    pos = jnp.sum(is_pos, axis=1, dtype=jnp.int32)
    neg = jnp.sum(is_neg, axis=1, dtype=jnp.int32)
    n_pos, n_neg, done = target_counts(pos, neg, n, mode)

    if prompt_ids_P is None:
        prompt_ids_P = jnp.arange(P)
    row_keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.asarray(prompt_ids_P, jnp.uint32))
    u_PxS = jax.vmap(lambda k: jax.random.uniform(k, (S,)))(row_keys)
    order_pos = jnp.argsort(jnp.where(is_pos, u_PxS, 2.0), axis=1)  # positives first, shuffled
    order_neg = jnp.argsort(jnp.where(is_neg, u_PxS, 2.0), axis=1)
    j = jnp.arange(n)[None, :]
    k = n_pos[:, None]
    idx_pos = jnp.take_along_axis(order_pos, jnp.broadcast_to(j, (P, n)), axis=1)
    idx_neg = jnp.take_along_axis(order_neg, jnp.clip(j - k, 0, S - 1), axis=1)
    group_valid = j < (n_pos + n_neg)[:, None]
    idx = jnp.where(j < k, idx_pos, idx_neg)
    idx = jnp.where(group_valid, idx, -1).astype(jnp.int32)

    kept = jnp.where(group_valid, jnp.take_along_axis(r, jnp.maximum(idx, 0), axis=1), 0.0)
    first = kept[:, :1]
    mixed = jnp.any(group_valid & (kept != first), axis=1)
    return idx, dict(done=done, group_valid=group_valid, rewards=kept, mixed=mixed)
