"""Policy losses against a float64 NumPy reference written independently (per-row loops)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ada.rl import losses
from ada.rl.losses import LossConfig, policy_loss


def np_reference(logp, old, adv_B, mask, ent, ref, cfg: LossConfig, weight=None):
    """Brute-force float64 reference of `policy_loss` (loss and metrics); `weight`: each
    token's importance weight (decoupled PPO)."""
    logp, old, ent, ref = (np.asarray(x, np.float64) for x in (logp, old, ent, ref))
    adv_B = np.asarray(adv_B, np.float64)
    mask = np.asarray(mask, bool)
    B, T = logp.shape
    per_tok = np.zeros((B, T))
    clipped = np.zeros((B, T))
    dual = np.zeros((B, T))
    ratio = np.zeros((B, T))
    log_ratio = np.zeros((B, T))
    kl = np.zeros((B, T))
    for b in range(B):
        a = adv_B[b]
        for t in range(T):
            lr = min(max(logp[b, t] - old[b, t], -20.0), 20.0)
            r = np.exp(lr)
            l1 = -a * r
            l2 = -a * min(max(r, 1 - cfg.clip_low), 1 + cfg.clip_high)
            loss = max(l1, l2)
            clipped[b, t] = l2 > l1
            if cfg.dual_clip and a < 0:
                l3 = -a * cfg.dual_clip
                dual[b, t] = loss > l3
                loss = min(loss, l3)
            per_tok[b, t], ratio[b, t], log_ratio[b, t] = loss, r, lr
            d = logp[b, t] - ref[b, t]
            kl[b, t] = {"k1": d, "k2": 0.5 * d * d,
                        "k3": min(max(np.exp(-d) + d - 1, -10.0), 10.0)}[cfg.kl_estimator]

    def agg(x):
        rows = [x[b][mask[b]] for b in range(B)]
        if cfg.loss_agg == "token-mean":
            n = sum(len(r) for r in rows)
            return sum(r.sum() for r in rows) / max(n, 1)
        nonempty = [r for r in rows if len(r)]
        if cfg.loss_agg == "seq-mean-token-sum":
            vals = [r.sum() for r in nonempty]
        else:
            vals = [r.mean() for r in nonempty]
        return float(np.mean(vals)) if vals else 0.0

    def tmean(x):
        n = mask.sum()
        return x[mask].sum() / max(n, 1)

    pg = agg(per_tok if weight is None else per_tok * weight)
    total = pg - cfg.entropy_coef * agg(ent) + cfg.kl_coef * agg(kl)
    return {"loss": total, "pg_loss": pg, "kl": agg(kl), "entropy": tmean(ent),
            "clip_frac": tmean(clipped), "dual_clip_frac": tmean(dual),
            "approx_kl": tmean(-log_ratio), "ratio_mean": tmean(ratio)}


def random_inputs(seed, B=6, T=9):
    rng = np.random.default_rng(seed)
    logp = -rng.exponential(1.0, (B, T))
    old = logp + rng.normal(0, 0.4, (B, T))  # ratios spread over and beyond the clip range
    old[0, 3] = logp[0, 3] - 4.0  # ratio e^4 > dual-clip cap
    adv = rng.normal(0, 1, B)
    adv[0] = -1.5
    mask = rng.random((B, T)) < 0.7
    mask[2] = False  # an empty row
    ent = rng.exponential(2.0, (B, T))
    ref = logp + rng.normal(0, 0.3, (B, T))
    return logp, old, adv, mask, ent, ref


@pytest.mark.parametrize("mode", losses.AGG_MODES)
@pytest.mark.parametrize("dual", [0.0, 3.0])
@pytest.mark.parametrize("kl_est", losses.KL_ESTIMATORS)
def test_policy_loss_matches_numpy(mode, dual, kl_est):
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, dual_clip=dual, loss_agg=mode,
                     entropy_coef=0.01, kl_coef=0.05, kl_estimator=kl_est)
    logp, old, adv, mask, ent, ref = random_inputs(1)
    want = np_reference(logp, old, adv, mask, ent, ref, cfg)
    _, got = policy_loss(f32(logp), f32(old), f32(adv), jnp.asarray(mask), cfg,
                         entropy_BxT=f32(ent), ref_logp_BxT=f32(ref))
    assert set(want) <= set(got)
    for k, v in want.items():
        np.testing.assert_allclose(float(got[k]), v, rtol=2e-6, atol=1e-7, err_msg=k)
    if dual:
        assert want["dual_clip_frac"] > 0  # the case is exercised
    assert want["clip_frac"] > 0


def test_all_rows_empty_gives_zero_not_nan():
    logp, old, adv, _, ent, ref = random_inputs(2)
    mask = np.zeros(logp.shape, bool)
    for mode in losses.AGG_MODES:
        cfg = LossConfig(loss_agg=mode, kl_coef=0.1)
        loss, m = policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv),
                              jnp.asarray(mask), cfg, jnp.asarray(ent), jnp.asarray(ref))
        assert float(loss) == 0.0 and all(np.isfinite(float(v)) for v in m.values())


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_row_split_with_batch_denominators_is_additive(mode):
    """Micro-batches that divide by the mini-batch's denominators sum to the unsplit loss."""
    cfg = LossConfig(loss_agg=mode, entropy_coef=0.01, kl_coef=0.05)
    logp, old, adv, mask, ent, ref = (jnp.asarray(x, jnp.float32) if x.dtype != bool
                                      else jnp.asarray(x) for x in random_inputs(3, B=8))
    full_loss, full_m = policy_loss(logp, old, adv, mask, cfg, ent, ref)
    den = losses.denominators(mask, mode)
    parts = [policy_loss(logp[s], old[s], adv[s], mask[s], cfg, ent[s], ref[s], den)
             for s in (slice(0, 3), slice(3, 8))]
    np.testing.assert_allclose(sum(float(p[0]) for p in parts), float(full_loss), rtol=1e-6)
    for k in full_m:
        np.testing.assert_allclose(sum(float(p[1][k]) for p in parts), float(full_m[k]),
                                   rtol=1e-5, atol=1e-7, err_msg=k)


def test_logp_and_entropy_match_numpy():
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 3, (2, 5, 11))
    targets = rng.integers(0, 11, (2, 5))
    logp, ent = losses.logp_and_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(targets))
    z = logits - logits.max(-1, keepdims=True)
    logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
    want_logp = np.take_along_axis(logq, targets[..., None], -1)[..., 0]
    want_ent = -(np.exp(logq) * logq).sum(-1)
    np.testing.assert_allclose(np.asarray(logp), want_logp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ent), want_ent, rtol=1e-5, atol=1e-6)


def test_gradient_of_clipped_tokens_is_zero():
    """Where the clipped branch is active the token carries no gradient (PPO's trust region)."""
    cfg = LossConfig(dual_clip=0.0, entropy_coef=0.0)
    old = jnp.zeros((1, 4))
    logp = jnp.array([[0.5, -0.5, 0.1, -0.1]])  # ratios e^0.5, e^-0.5, ~1.1, ~0.9
    mask = jnp.ones((1, 4))
    g_pos = jax.grad(lambda lp: policy_loss(lp, old, jnp.array([1.0]), mask, cfg)[0])(logp)
    g_neg = jax.grad(lambda lp: policy_loss(lp, old, jnp.array([-1.0]), mask, cfg)[0])(logp)
    # A > 0: ratio above 1 + clip_high is clipped; A < 0: ratio below 1 - clip_low is clipped.
    assert float(g_pos[0, 0]) == 0.0 and float(g_pos[0, 1]) != 0.0
    assert float(g_neg[0, 1]) == 0.0 and float(g_neg[0, 0]) != 0.0
    np.testing.assert_allclose(float(g_pos[0, 2]), -np.exp(0.1) / 4, rtol=1e-6)


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="loss_agg='mean'"):
        LossConfig(loss_agg="mean")
    with pytest.raises(ValueError, match="kl_estimator"):
        LossConfig(kl_estimator="k4")
    with pytest.raises(ValueError, match=r"dual_clip=0.5 must be > 1 \(or 0 to disable\)"):
        LossConfig(dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_low=1.0"):
        LossConfig(clip_low=1.0)
    with pytest.raises(ValueError, match="kl_coef=-0.1"):
        LossConfig(kl_coef=-0.1)
    with pytest.raises(ValueError, match="is_weight_rule='clip' is not one of"):
        LossConfig(is_weight_rule="clip")
    with pytest.raises(ValueError, match="ref_logp"):
        z = jnp.zeros((2, 3))
        policy_loss(z, z, jnp.zeros(2), z, LossConfig(kl_coef=0.1))


def np_is_weights(prox, behav, lag, cap, rule="truncate"):
    """float64 reference of `losses.is_weights`: 1 for fresh tokens; for stale ones
    prox / behav, above the cap the cap ("truncate") or 0 ("filter"), 0 where the ratio
    is not finite."""
    w = np.ones(prox.shape)
    truncated = np.zeros(prox.shape, bool)
    nonfinite = np.zeros(prox.shape, bool)
    for idx in np.ndindex(prox.shape):
        if lag[idx] <= 0:
            continue
        log_w = float(prox[idx]) - float(behav[idx])
        if not np.isfinite(log_w):
            w[idx], nonfinite[idx] = 0.0, True
            continue
        truncated[idx] = np.exp(log_w) > cap
        w[idx] = np.exp(log_w) if not truncated[idx] else cap if rule == "truncate" else 0.0
    return w, truncated, nonfinite


def stale_inputs():
    """A hand-made stale batch: `random_inputs` plus behaviour log-probs on both sides of
    the cap, lags 0..2, a -inf and a NaN behaviour log-prob."""
    logp, old, adv, mask, ent, ref = random_inputs(3)
    rng = np.random.default_rng(4)
    behav = old + rng.normal(0, 0.8, old.shape)  # ratios on both sides of the cap
    lag = rng.integers(0, 3, old.shape)
    behav[1, 2], lag[1, 2] = -np.inf, 1
    behav[3, 4], lag[3, 4] = np.nan, 2
    mask[1, 2] = mask[3, 4] = True
    return logp, old, adv, mask, ent, ref, behav, lag


def f32(x):
    return jnp.asarray(x, jnp.float32)


@pytest.mark.parametrize("rule", losses.IS_WEIGHT_RULES)
def test_decoupled_is_weights_match_numpy(rule):
    """Stale tokens weigh proximal / behaviour, above the cap the cap (truncate) or 0
    (filter); fresh ones exactly 1; a behaviour log-prob of -inf or NaN gives weight 0 and
    no non-finite loss."""
    cfg = LossConfig(is_weight_cap=2.0, is_weight_rule=rule)
    logp, old, adv, mask, ent, ref, behav, lag = stale_inputs()
    w, truncated, nonfinite = np_is_weights(old, behav, lag, cfg.is_weight_cap, rule)
    got_w = losses.is_weights(f32(old), f32(behav), jnp.asarray(lag), cfg.is_weight_cap, rule)
    np.testing.assert_allclose(np.asarray(got_w["weight"]), w, rtol=1e-6)
    assert np.array_equal(np.asarray(got_w["truncated"]), truncated) and truncated[mask].any()
    assert np.array_equal(np.asarray(got_w["nonfinite"]), nonfinite)
    assert np.all(np.asarray(got_w["weight"])[lag == 0] == 1.0)
    want = np_reference(logp, old, adv, mask, ent, ref, cfg, weight=w)
    _, got = policy_loss(f32(logp), f32(old), f32(adv), jnp.asarray(mask), cfg,
                         entropy_BxT=f32(ent), ref_logp_BxT=f32(ref), is_weight=got_w)
    for k in ("loss", "pg_loss"):
        np.testing.assert_allclose(float(got[k]), want[k], rtol=2e-6, atol=1e-7, err_msg=k)
    n = mask.sum()
    np.testing.assert_allclose(float(got["is_weight_mean"]), w[mask].sum() / n, rtol=1e-6)
    assert float(got["is_weight_truncated_share"]) == pytest.approx(truncated[mask].sum() / n)
    assert float(got["is_weight_nonfinite_share"]) == pytest.approx(nonfinite[mask].sum() / n)
    grads = jax.grad(lambda lp: policy_loss(lp, f32(old), f32(adv), jnp.asarray(mask), cfg,
                                            is_weight=got_w)[0])(f32(logp))
    assert np.isfinite(np.asarray(grads)).all()


@pytest.mark.parametrize("objective,rule", [("decoupled", "truncate"), ("decoupled", "filter"),
                                            ("naive", "truncate")])
@pytest.mark.parametrize("on_policy", [False, True])
def test_stale_loss_and_gradient_match_numpy(objective, rule, on_policy):
    """The lag branch of the loss as train.loss_fn runs it (`stale_terms`, then
    `policy_loss`) on a hand-made stale batch: its value and its gradient in the log-probs
    against float64 NumPy (`np_reference`, gradient by central differences). Decoupled: the
    old log-probs are the proximal ones and each stale term is weighed; naive: a stale
    token's finite behaviour log-prob is PPO's old one, no weight. On-policy the proximal
    log-probs are the current ones, stop-gradient'd (as loss_fn): every ratio is 1 and the
    weight scales each token's gradient. Breaking it (naive keeping the proximal log-probs,
    a fresh token weighed, the filter truncating) fails here (checked)."""
    cfg = LossConfig(is_weight_cap=2.0, stale_objective=objective, is_weight_rule=rule,
                     entropy_coef=0.0)
    logp, prox, adv, mask, _, _, behav, lag = stale_inputs()
    if on_policy:
        prox = logp
    w, truncated, _ = np_is_weights(prox, behav, lag, cfg.is_weight_cap, rule)
    old, weight = prox, w
    if objective == "naive":
        old, weight = np.where((lag > 0) & np.isfinite(behav), behav, prox), None
    zeros = np.zeros(logp.shape)

    def want(lp):
        return np_reference(lp, old, adv, mask, zeros, zeros, cfg, weight)["loss"]

    eps = 1e-6
    want_grad = np.zeros(logp.shape)
    for idx in np.ndindex(logp.shape):
        up, down = logp.copy(), logp.copy()
        up[idx] += eps
        down[idx] -= eps
        want_grad[idx] = (want(up) - want(down)) / (2 * eps)

    def loss(lp):
        proximal = jax.lax.stop_gradient(lp) if on_policy else f32(prox)
        o, wt = losses.stale_terms(proximal, f32(behav), jnp.asarray(lag), cfg)
        return policy_loss(lp, o, f32(adv), jnp.asarray(mask), cfg, is_weight=wt)[0]

    got, grad = jax.value_and_grad(loss)(f32(logp))
    np.testing.assert_allclose(float(got), want(logp), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-6)
    assert (truncated & mask & (want_grad != 0)).any() or rule == "filter"  # exercised
    if objective == "decoupled" and rule == "filter":  # over the cap: no gradient at all
        assert (truncated & mask).any() and np.all(np.asarray(grad)[truncated] == 0)
