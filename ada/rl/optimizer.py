"""AdamW with linear warm-up and global-norm clipping, plus the non-finite-step guard.

The schedule counts *applied* updates (a skipped step leaves the optimizer state, and so
the schedule, untouched). Warm-up is lr * min(1, (k + 1) / warmup_steps) for update k, so
the first update already moves (transformers' schedule spends update 0 at lr 0).
Weight decay, when non-zero, applies to every parameter as torch's AdamW does in verl.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    warmup_steps: int = 10
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_norm: float | None = 1.0  # global grad-norm clip; None disables

    def __post_init__(self):
        if self.lr <= 0 or self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError(
                f"invalid OptimConfig: lr={self.lr} must be > 0, warmup_steps="
                f"{self.warmup_steps} and weight_decay={self.weight_decay} must be >= 0"
            )


def lr_schedule(config: OptimConfig):
    def schedule(count):
        warm = jnp.minimum(1.0, (count + 1.0) / max(config.warmup_steps, 1))
        return config.lr * warm

    return schedule


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    parts = []
    if config.clip_norm is not None:
        parts.append(optax.clip_by_global_norm(config.clip_norm))
    parts.append(optax.adamw(
        lr_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
        weight_decay=config.weight_decay,
    ))
    return optax.chain(*parts)


def all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def guarded_update(optimizer, grads, opt_state, params, ok: jax.Array):
    """One optimizer update, applied only where `ok` (a scalar bool) holds.

    Returns (params, opt_state); when not ok both come back bit-for-bit unchanged. A
    `lax.cond` rather than a `where` over old and new: only one branch's result is ever
    materialised, so the guard costs no extra copy of the parameters and Adam moments.
    """

    def apply(args):
        grads, opt_state, params = args
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt_state

    def keep(args):
        _, opt_state, params = args
        return params, opt_state

    return jax.lax.cond(ok, apply, keep, (grads, opt_state, params))
