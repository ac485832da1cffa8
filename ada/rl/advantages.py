"""Group-relative (GRPO-style) advantages, with the baseline from the whole pool or the group.

  stats_from="pool"   Reinforce-Ada's global statistics: mean / std of every response drawn
                      for the prompt (PoolStats), not only the n kept. As the verl fork:
                      A = (r - mean) / (max(std, eps) + eps), pools of <= 1 sample mean 0 std 1.
  stats_from="group"  standard GRPO over the n kept (valid) members, as verl's local stats:
                      A = (r - mean) / (std + eps), groups of <= 1 member mean 0 std 1.

std is Bessel-corrected (torch.std) in both. norm_by_std=False gives A = r - mean
(Dr. GRPO / the paper's "optionally divided by std"). Invalid group slots get advantage 0.
"""

from __future__ import annotations

import jax.numpy as jnp

from ada.adaptive.pool import PoolStats

EPS = 1e-6


def advantages(rewards_PxN, *, stats_from: str = "pool", pool: PoolStats | None = None,
               group_valid_PxN=None, norm_by_std: bool = True, eps: float = EPS):
    """Advantages [P, n] of the kept rewards (float32)."""
    r = jnp.asarray(rewards_PxN, jnp.float32)
    valid = (jnp.ones(r.shape, bool) if group_valid_PxN is None
             else jnp.asarray(group_valid_PxN, bool))
    if stats_from == "pool":
        if pool is None:
            raise ValueError("stats_from='pool' needs pool=PoolStats of the whole pools")
        mean, std = pool.mean_std()  # float64 on host when the pool is NumPy
        mean, std = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
        denom = jnp.maximum(std, eps) + eps
    elif stats_from == "group":
        c = jnp.sum(valid, axis=1)
        many = c > 1
        mean = jnp.where(many, jnp.sum(jnp.where(valid, r, 0.0), axis=1) / jnp.maximum(c, 1), 0.0)
        dev = jnp.where(valid, r - mean[:, None], 0.0)  # centred: exact for a handful of members
        std = jnp.where(many, jnp.sqrt(jnp.sum(dev * dev, axis=1) / jnp.maximum(c - 1, 1)), 1.0)
        denom = std + eps
    else:
        raise ValueError(f"stats_from={stats_from!r}; use 'pool' or 'group'")
    a = r - mean[:, None]
    if norm_by_std:
        a = a / denom[:, None]
    return jnp.where(valid, a, 0.0)
