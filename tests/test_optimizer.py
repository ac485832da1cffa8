"""The optimizer without its learning rate + the lr applied in the guarded update: optax's
AdamW exactly for a constant lr, and the warm-up schedule per RL step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ada.rl.optimizer import OptimConfig, guarded_update, lr_schedule, make_optimizer


@pytest.mark.parametrize("grad_clip", [0.0, 0.5])
def test_equals_optax_adamw_for_constant_lr(grad_clip):
    o = OptimConfig(lr=3e-2, warmup_steps=0, weight_decay=0.1, grad_clip=grad_clip)
    ours = make_optimizer(o)
    theirs = optax.adamw(o.lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)
    if grad_clip:  # 0 disables
        theirs = optax.chain(optax.clip_by_global_norm(grad_clip), theirs)
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
              "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}
    target = jax.tree.map(lambda x: x + 1.0, params)
    grad = jax.jit(jax.grad(lambda p: sum(jnp.sum((p[k] - target[k]) ** 2) for k in p)))
    step = jax.jit(lambda g, s, p: guarded_update(ours, g, s, p, jnp.array(True),
                                                  lr_schedule(o)(jnp.int32(0))))
    mine, ref = params, params
    s_mine, s_ref = ours.init(params), theirs.init(params)
    for _ in range(5):
        mine, s_mine = step(grad(mine), s_mine, mine)
        u, s_ref = theirs.update(grad(ref), s_ref, ref)
        ref = optax.apply_updates(ref, u)
    for a, b in zip(jax.tree.leaves(mine), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_schedule_is_linear_warmup_over_rl_steps():
    o = OptimConfig(lr=1e-3, warmup_steps=8)
    got = [float(lr_schedule(o)(jnp.int32(s))) for s in range(10)]
    np.testing.assert_allclose(got, [1e-3 * min(1, (s + 1) / 8) for s in range(10)], rtol=1e-6)
