"""AdamW with linear warm-up and global-norm clipping, plus the non-finite-step guard.

The schedule counts RL steps (train_step calls), as verl does: every mini-batch x epoch
update of RL step s uses lr * min(1, (s + 1) / warmup_steps), so the first update already
moves (transformers' schedule spends update 0 at lr 0) and warm-up does not end sooner with
more mini-batches. Hence the optimizer is AdamW without its learning rate (clip -> Adam ->
decayed weights) and `guarded_update` applies the lr of the step; for a constant lr this is
optax.adamw exactly. Weight decay, when non-zero, applies to every parameter as torch's AdamW
does in verl.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """The run config's `optim` section field for field, plus Adam's constants."""

    lr: float = 1e-6
    warmup_steps: int = 10  # RL steps of linear warm-up
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # global grad-norm clip; 0 disables
    max_skipped_in_row: int = 10  # the loop stops after this many skipped RL steps in a row
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self):
        problems = []
        if not self.lr > 0:
            problems.append(f"lr={self.lr} must be > 0")
        if self.warmup_steps < 0:
            problems.append(f"warmup_steps={self.warmup_steps} must be >= 0")
        if not self.weight_decay >= 0:
            problems.append(f"weight_decay={self.weight_decay} must be >= 0")
        if not self.grad_clip >= 0:
            problems.append(f"grad_clip={self.grad_clip} must be >= 0 (0 disables clipping)")
        if self.max_skipped_in_row < 1:
            problems.append(f"max_skipped_in_row={self.max_skipped_in_row} must be >= 1")
        if problems:
            raise ValueError("invalid OptimConfig: " + "; ".join(problems))


def lr_schedule(config: OptimConfig):
    """RL step -> learning rate."""

    def schedule(count):
        warm = jnp.minimum(1.0, (count + 1.0) / max(config.warmup_steps, 1))
        return config.lr * warm

    return schedule


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    """AdamW up to the learning rate, which `guarded_update` applies (see module doc)."""
    parts = []
    if config.grad_clip:
        parts.append(optax.clip_by_global_norm(config.grad_clip))
    parts.append(optax.scale_by_adam(b1=config.b1, b2=config.b2, eps=config.eps))
    parts.append(optax.add_decayed_weights(config.weight_decay))
    return optax.chain(*parts)


def all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def guarded_update(optimizer, grads, opt_state, params, ok: jax.Array, lr: jax.Array):
    """One optimizer update, scaled by the learning rate `lr`, applied only where `ok` (a
    scalar bool) holds.

    Returns (params, opt_state); when not ok both come back bit-for-bit unchanged. A
    `lax.cond` rather than a `where` over old and new: only one branch's result is ever
    materialised, so the guard costs no extra copy of the parameters and Adam moments.
    """

    def apply(args):
        grads, opt_state, params = args
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        updates = jax.tree.map(lambda u: -lr * u, updates)  # as optax.scale_by_learning_rate
        return optax.apply_updates(params, updates), new_opt_state

    def keep(args):
        _, opt_state, params = args
        return params, opt_state

    return jax.lax.cond(ok, apply, keep, (grads, opt_state, params))
