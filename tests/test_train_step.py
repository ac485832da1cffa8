"""The train step on a tiny model: log-prob alignment, exact on-policy reduction, gradients
vs finite differences, micro-batch accumulation, 8-device parity, the non-finite guard.

Llama-family tiny model: it has no q/k/v biases. (Qwen2's k bias gets an exactly-zero
gradient — softmax is shift-invariant — so Adam turns its float noise into full-size
steps, which would make a parity check on it meaningless.)
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ada import sharding as shd
from ada.models import init_params, positions_from_mask, preset
from ada.models.transformer import forward
from ada.rl import train
from ada.rl.losses import LossConfig, denominators
from ada.rl.optimizer import OptimConfig
from ada.sampling.driver import Driver, Request
from ada.sampling.engine import Engine
from ada.sampling.samplers import SamplingConfig

pytestmark = pytest.mark.numerics  # CI runs it again under another CPU's kernels

CFG = preset("tiny", family="llama")
B, T = 32, 16
OFF_POLICY = train.TrainConfig(
    optim=OptimConfig(lr=1e-3, warmup_steps=2), epochs=2, mini_batches=2,
    micro_batches=2, logit_chunk=6,
)


def make_batch(seed=0, B=B, T=T):
    """Left-padded prompts then right-padded responses; row 5 has an empty response."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
    mask = np.zeros((B, T), bool)
    resp = np.zeros((B, T), np.float32)
    p_end = T // 2
    for b in range(B):
        mask[b, rng.integers(0, 4):p_end] = True
        r_len = 0 if b == 5 else rng.integers(1, T - p_end + 1)
        mask[b, p_end:p_end + r_len] = True
        resp[b, p_end:p_end + r_len] = 1.0
    positions = np.asarray(positions_from_mask(jnp.asarray(mask)))
    return dict(tokens=tokens, positions=positions, mask=mask, response_mask=resp,
                advantages=rng.normal(size=B).astype(np.float32))


@functools.cache
def params0():
    return init_params(CFG, jax.random.key(0))


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


@pytest.mark.slow
def test_token_logp_alignment_and_chunking():
    batch = {k: jnp.asarray(v) for k, v in make_batch(1, B=4).items()}
    f = jax.jit(functools.partial(train.token_logp, model_cfg=CFG, chunk=4))
    logp, ent = f(params0(), batch=batch)
    logits, _ = forward(params0(), CFG, batch["tokens"], batch["positions"], batch["mask"])
    z = np.asarray(logits, np.float64)
    logq = z - z.max(-1, keepdims=True)
    logq = logq - np.log(np.exp(logq).sum(-1, keepdims=True))
    tok = np.asarray(batch["tokens"])
    want = np.zeros((4, T), np.float32)
    want_ent = np.zeros((4, T), np.float32)
    for b in range(4):
        for t in range(1, T):  # token t is predicted from position t - 1
            want[b, t] = logq[b, t - 1, tok[b, t]]
            want_ent[b, t] = -(np.exp(logq[b, t - 1]) * logq[b, t - 1]).sum()
    np.testing.assert_allclose(np.asarray(logp), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), want_ent, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(logp)[:, 0] == 0)


@pytest.mark.slow
@pytest.mark.parametrize("truncate", [{}, {"top_k": 20}, {"top_p": 0.8}])
def test_training_logp_equals_sampler_logprobs_at_temperature(truncate):
    """Responses sampled at T = 0.7 by the engine: the training log-probs of the response
    tokens are the sampler's, i.e. the ratio against the behaviour policy is 1. Under top-k
    / top-p too: the sampler records the untruncated log-prob (samplers.sample_and_stop),
    so a stale token's importance weight proximal / behaviour is 1 when the policy did not
    move. Recording the truncated one fails here: it exceeds the trainer's by the log of
    the mass the truncation dropped (weights biased low by that mass)."""
    temp, Lp, Lr = 0.7, 8, 8
    engine = Engine(CFG, num_slots=4, max_prompt_len=Lp, max_new_tokens=Lr, chunk_size=4,
                    sampling=SamplingConfig(temperature=temp, **truncate),
                    slot_bucketing=False, max_prefill_rows=4)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, CFG.vocab_size, n).tolist() for n in (3, 8, 5, 6)]
    reqs = [Request(p, i, s, n) for i, p in enumerate(prompts)
            for s, n in ((0, Lr), (1, 1 + i))]
    out = Driver(engine, params0(), step_key=3).generate_all(reqs)
    tokens = np.zeros((len(out), Lp + Lr), np.int32)
    mask = np.zeros(tokens.shape, bool)
    for b, c in enumerate(out):
        p, r = c.prompt_tokens, c.token_ids
        tokens[b, Lp - len(p):Lp + len(r)] = p + r
        mask[b, Lp - len(p):Lp + len(r)] = True
    batch = dict(tokens=jnp.asarray(tokens), mask=jnp.asarray(mask),
                 positions=positions_from_mask(jnp.asarray(mask)))
    config = train.TrainConfig(temperature=temp, logit_chunk=5)
    logp = np.asarray(jax.jit(functools.partial(train.compute_logp, model_cfg=CFG,
                                                config=config))(params0(), batch))
    for b, c in enumerate(out):
        np.testing.assert_allclose(logp[b, Lp:Lp + c.length], c.logprobs, atol=1e-4)


@pytest.mark.slow
def test_old_logp_pass_returns_rows_in_order():
    """The strided micro-batch split and merge of the log-prob pass put rows back in place."""
    fns = train.make_train_fns(CFG, OFF_POLICY)
    batch = fns.shard_batch(make_batch(2))
    got = fns.add_logps(fns.init_state(params0()), batch)["old_logp"]
    want, _ = jax.jit(functools.partial(train.token_logp, model_cfg=CFG, chunk=64))(
        params0(), batch=batch)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def _grads_fn(config):
    return jax.jit(functools.partial(train.minibatch_grads, model_cfg=CFG, config=config))


@pytest.mark.slow
def test_on_policy_ratio_is_one_and_loss_is_plain_policy_gradient():
    config = train.TrainConfig(loss=LossConfig(entropy_coef=0.0), logit_chunk=6)
    assert config.on_policy
    batch = {k: jnp.asarray(v) for k, v in make_batch(3).items()}
    mini = jax.tree.map(lambda x: x[None], batch)  # one micro-batch
    grads, m = _grads_fn(config)(params0(), mini)
    assert float(m["ratio_mean"]) == 1.0
    assert float(m["clip_frac"]) == 0.0 and float(m["approx_kl"]) == 0.0
    mask = np.asarray(batch["response_mask"])
    adv = np.asarray(batch["advantages"])
    np.testing.assert_allclose(float(m["pg_loss"]), -(adv[:, None] * mask).sum() / mask.sum(),
                               rtol=1e-6)

    def plain_pg(params):  # -(1/N) sum_t A * log pi(token_t)
        logp, _ = train.token_logp(params, CFG, batch, chunk=64)
        return -jnp.sum(batch["advantages"][:, None] * mask * logp) / mask.sum()

    want = jax.jit(jax.grad(plain_pg))(params0())
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
        assert rel(g, w) < 1e-5


@pytest.mark.slow
def test_micro_batch_accumulation_equals_unsplit():
    """token-mean, where a per-micro-batch mean would be wrong (the other modes' additivity
    is checked on the loss alone in test_losses.py)."""
    loss = LossConfig(loss_agg="token-mean", dual_clip=3.0, entropy_coef=0.01)
    whole = train.TrainConfig(loss=loss, mini_batches=2, micro_batches=1, logit_chunk=6)
    split = train.TrainConfig(loss=loss, mini_batches=2, micro_batches=4, logit_chunk=6)
    batch = make_batch(4, B=16)
    rng = np.random.default_rng(0)
    batch["old_logp"] = rng.normal(-6.2, 0.3, (16, T)).astype(np.float32)  # off-policy ratios
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    rows = batch["tokens"].shape[0] // 2
    mini = jax.tree.map(lambda x: x[:rows], batch)
    g1, m1 = _grads_fn(whole)(params0(), jax.tree.map(lambda x: x[None], mini))
    g4, m4 = _grads_fn(split)(params0(), jax.tree.map(
        lambda x: x.reshape(4, rows // 4, *x.shape[1:]), mini))
    assert float(m1["clip_frac"]) > 0
    for k in m1:
        np.testing.assert_allclose(float(m4[k]), float(m1[k]), rtol=1e-5, atol=1e-7, err_msg=k)
    for a, b in zip(jax.tree.leaves(g4), jax.tree.leaves(g1), strict=True):
        assert rel(a, b) < 1e-5


def test_gradient_matches_finite_differences():
    """Directional derivatives of the full loss (model, chunked log-probs, clipping, entropy,
    KL) against central differences. float32 model: with h = 1e-2 the rounding error of a
    difference is ~1e-7 * |loss| / h ~ 1e-5 and the truncation error ~h^2; 2e-3 relative
    tolerance leaves a margin over both while a wrong gradient is off by O(1)."""
    config = train.TrainConfig(
        loss=LossConfig(loss_agg="seq-mean-token-mean", dual_clip=3.0, entropy_coef=0.05,
                        kl_coef=0.1, kl_estimator="k3"),
        mini_batches=2, logit_chunk=6)
    batch = {k: jnp.asarray(v) for k, v in make_batch(5, B=4).items()}
    rng = np.random.default_rng(1)
    batch["old_logp"] = jnp.asarray(rng.normal(-6.2, 0.2, (4, T)), jnp.float32)
    batch["ref_logp"] = jnp.asarray(rng.normal(-6.2, 0.2, (4, T)), jnp.float32)
    denoms = denominators(batch["response_mask"], config.loss.loss_agg)
    loss = jax.jit(lambda p: train.loss_fn(p, batch, denoms, CFG, config)[0])
    grad = jax.jit(jax.grad(lambda p: train.loss_fn(p, batch, denoms, CFG, config)[0]))
    params = params0()
    g = grad(params)
    h = 1e-2
    for seed in range(3):
        keys = jax.random.split(jax.random.key(10 + seed), len(jax.tree.leaves(params)))
        leaves = [jax.random.normal(k, x.shape) for k, x in zip(keys, jax.tree.leaves(params), strict=False)]
        norm = np.sqrt(sum(float(jnp.sum(v * v)) for v in leaves))
        v = jax.tree.unflatten(jax.tree.structure(params), [x / norm for x in leaves])
        # scale so the step moves each weight by ~h relative to its size
        v = jax.tree.map(lambda x: x * 3.0, v)
        plus = loss(jax.tree.map(lambda p, d: p + h * d, params, v))
        minus = loss(jax.tree.map(lambda p, d: p - h * d, params, v))
        fd = (float(plus) - float(minus)) / (2 * h)
        an = sum(float(jnp.sum(a * b)) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(v), strict=False))
        assert abs(fd - an) <= 2e-3 * abs(an) + 1e-5, (seed, fd, an)


def _run(mesh, steps=3):
    fns = train.make_train_fns(CFG, OFF_POLICY, mesh)
    state = fns.init_state(params0())
    batch = fns.shard_batch(make_batch(6))
    first = None
    for _ in range(steps):
        batch = fns.add_logps(state, batch)
        state, m = fns.train_step(state, batch)
        first = first or m
    return jax.tree.map(np.asarray, state.params), first, state


@pytest.mark.slow
def test_sharded_train_step_equals_single_device():
    p0 = jax.tree.map(np.asarray, params0())
    p1, m1, s1 = _run(None)
    assert int(s1.updates) == 3 * 4 and int(s1.skipped) == 0
    # the first mini-batch of the first epoch sees ratio 1 up to float rounding
    assert abs(float(m1["ratio_mean"]) - 1) < 0.05 and float(m1["grad_norm"]) > 0
    for shape in [(2, 2, 2), (1, 8, 1)]:
        pn, mn, _ = _run(shd.make_mesh(shape))
        for (path, a), b, z in zip(jax.tree_util.tree_flatten_with_path(pn)[0],
                                   jax.tree.leaves(p1), jax.tree.leaves(p0), strict=True):
            name = shd.path_name(path)
            assert rel(a, b) <= 1e-5, (shape, name, "params")
            # a stricter view: the accumulated updates themselves agree
            assert rel(a - z, b - z) <= 3e-5, (shape, name, "updates")
        for k in m1:
            np.testing.assert_allclose(float(mn[k]), float(m1[k]), rtol=1e-4, atol=1e-6,
                                       err_msg=f"{shape} {k}")


KL = LossConfig(kl_coef=0.1, kl_estimator="k1")


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [None, (2, 2, 2)])
def test_kl_to_reference_runs_and_is_zero_at_the_reference(mesh_shape):
    """ref params == params: the first update's KL is 0. Off-policy, the one add_logps call
    fills old_logp and ref_logp (equal here)."""
    mesh = None if mesh_shape is None else shd.make_mesh(mesh_shape)
    fns = train.make_train_fns(CFG, train.TrainConfig(loss=KL, logit_chunk=6), mesh)
    state = fns.init_state(params0())
    batch = fns.add_logps(state, fns.shard_batch(make_batch(9)), params0())
    assert set(batch) - set(train.REQUIRED_KEYS) == {"ref_logp"}
    state, m = fns.train_step(state, batch)
    assert abs(float(m["kl"])) < 1e-6 and np.isfinite(float(m["loss"]))
    fns = train.make_train_fns(CFG, dataclasses.replace(OFF_POLICY, loss=KL), mesh)
    state = fns.init_state(params0())
    batch = fns.add_logps(state, fns.shard_batch(make_batch(9)), params0())
    np.testing.assert_allclose(batch["old_logp"], batch["ref_logp"], atol=1e-6)
    state, m = fns.train_step(state, batch)
    assert int(state.updates) == 4 and float(m["kl"]) != 0


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_metric_equals_numpy_estimator(estimator):
    """After updates away from the frozen reference, the logged kl is the token mean of the
    k1 / k3 estimator over the response tokens."""
    config = train.TrainConfig(loss=dataclasses.replace(KL, kl_estimator=estimator),
                               optim=OptimConfig(lr=1e-3, warmup_steps=1), logit_chunk=6)
    fns = train.make_train_fns(CFG, config)
    state = fns.init_state(params0())
    for seed in range(3):
        state, _ = fns.train_step(
            state, fns.add_logps(state, fns.shard_batch(make_batch(10 + seed)), params0()))
    batch = fns.add_logps(state, fns.shard_batch(make_batch(13)), params0())
    logp = jax.jit(functools.partial(train.compute_logp, model_cfg=CFG, config=config))(
        state.params, batch)
    _, m = fns.train_step(state, batch)
    d = np.asarray(logp, np.float64) - np.asarray(batch["ref_logp"], np.float64)
    per_token = d if estimator == "k1" else np.clip(np.exp(-d) + d - 1, -10, 10)
    want = per_token[np.asarray(batch["response_mask"]) > 0].mean()
    assert abs(want) > 1e-4
    np.testing.assert_allclose(float(m["kl"]), want, rtol=1e-3)


def test_kl_without_reference_params_is_named():
    fns = train.make_train_fns(CFG, train.TrainConfig(loss=KL, logit_chunk=6))
    with pytest.raises(ValueError, match="kl_coef=0.1 needs reference params"):
        fns.add_logps(fns.init_state(params0()), fns.shard_batch(make_batch(11)))


def np_adamw(params, grads, state, lr, o: OptimConfig):
    """One float64 NumPy AdamW update (global-norm clip first), in place on dicts of leaves."""
    norm = np.sqrt(sum(np.sum(g * g) for g in grads.values()))
    scale = 1.0 if not o.grad_clip or norm < o.grad_clip else o.grad_clip / norm
    state["t"] += 1
    t = state["t"]
    for k, g in grads.items():
        g = g * scale
        state["m"][k] = o.b1 * state["m"][k] + (1 - o.b1) * g
        state["v"][k] = o.b2 * state["v"][k] + (1 - o.b2) * g * g
        m_hat, v_hat = state["m"][k] / (1 - o.b1 ** t), state["v"][k] / (1 - o.b2 ** t)
        params[k] = params[k] - lr * (m_hat / (np.sqrt(v_hat) + o.eps)
                                      + o.weight_decay * params[k])


@pytest.mark.slow
def test_warmup_counts_rl_steps_not_optimizer_updates():
    """mini_batches=4: all four updates of RL step s use lr * min(1, (s + 1) / warmup_steps),
    checked on the logged lr and on the parameters against a NumPy AdamW."""
    o = OptimConfig(lr=1e-3, warmup_steps=8, weight_decay=0.01)
    config = train.TrainConfig(loss=LossConfig(entropy_coef=0.0), optim=o, mini_batches=4,
                               logit_chunk=6)
    fns = train.make_train_fns(CFG, config)
    grads_fn = _grads_fn(config)
    state = fns.init_state(params0())

    def flat(tree):
        return {shd.path_name(p): np.asarray(x, np.float64)
                for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}

    treedef = jax.tree.structure(params0())
    ref = flat(params0())
    adam = {"t": 0, "m": {k: 0.0 * x for k, x in ref.items()},
            "v": {k: 0.0 * x for k, x in ref.items()}}
    for s in range(3):
        lr = o.lr * min(1.0, (s + 1) / o.warmup_steps)
        batch = fns.add_logps(state, fns.shard_batch(make_batch(20 + s)))
        before = flat(state.params)
        state, m = fns.train_step(state, batch)
        np.testing.assert_allclose(float(m["lr"]), lr, rtol=1e-6)
        minis = jax.tree.map(lambda x: train._split(x, 4, 1), batch)
        start = dict(ref)
        for k in range(4):
            p32 = jax.tree.unflatten(treedef, [jnp.asarray(x, jnp.float32) for x in ref.values()])
            g, _ = grads_fn(p32, jax.tree.map(lambda x, k=k: x[k], minis))
            np_adamw(ref, flat(g), adam, lr, o)
        got = flat(state.params)
        for name in ref:
            assert rel(got[name] - before[name], ref[name] - start[name]) < 1e-3, (s, name)


def test_non_finite_batch_is_skipped_and_params_unchanged():
    fns = train.make_train_fns(CFG, OFF_POLICY)
    state = fns.init_state(params0())
    batch = fns.add_logps(state, fns.shard_batch(make_batch(7)))
    before = jax.tree.map(np.array, (state.params, state.opt_state))
    bad = fns.shard_batch(dict(batch, advantages=np.full((B,), np.nan)))
    state, m = fns.train_step(state, bad)
    after = jax.tree.map(np.asarray, (state.params, state.opt_state))
    for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(x, y)
    assert float(m["skipped"]) == 4 and int(state.skipped) == 4 and int(state.updates) == 0
    # one bad row poisons only its own mini-batch (row 3 -> mini-batch 1): 2 epochs x 1
    adv = np.asarray(batch["advantages"]).copy()
    adv[3] = np.inf
    state, m = fns.train_step(state, fns.shard_batch(dict(batch, advantages=adv)))
    assert float(m["skipped"]) == 2 and int(state.updates) == 2 and int(state.skipped) == 6


def test_bad_batches_are_named():
    fns = train.make_train_fns(CFG, OFF_POLICY)
    state = fns.init_state(params0())
    batch = make_batch(8)
    with pytest.raises(ValueError, match="old_logp"):
        fns.train_step(state, fns.shard_batch(batch))
    with pytest.raises(ValueError, match="mini_batches x micro_batches"):
        fns.add_logps(state, fns.shard_batch(make_batch(8, B=6)))
    mesh_fns = train.make_train_fns(CFG, OFF_POLICY, shd.make_mesh((2, 2, 2)))
    with pytest.raises(ValueError, match="data\\*fsdp = 4"):
        mesh_fns.shard_batch(make_batch(8, B=6))
    with pytest.raises(ValueError, match="response_mask has shape"):
        train.check_batch(dict(batch, response_mask=batch["response_mask"][:, :3]), OFF_POLICY)
