"""Token-level policy losses as pure functions over [B, T] arrays with a response mask.

PPO-clip (asymmetric clip range, dual clip for negative advantages), entropy bonus and KL
to a reference policy, aggregated over tokens in one of verl's three modes:

  token-mean            sum over all response tokens / number of response tokens
  seq-mean-token-sum    mean over sequences of each sequence's token sum
  seq-mean-token-mean   mean over sequences of each sequence's token mean

Every aggregate is written as  sum_bt w[b, t] * x[b, t]  /  denominator, where the weights
w depend only on the row itself and the denominator on the whole mini-batch. A mini-batch
split into micro-batches therefore gives exactly the unsplit loss and gradient when each
micro-batch divides by the *mini-batch's* denominator and the results are summed
(`denominators` below). Rows with no response token count for nothing: they add no weight,
and the sequence means run over non-empty rows only (a mini-batch with no response token
has loss 0, not NaN).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_ESTIMATORS = ("k1", "k2", "k3")
STALE_OBJECTIVES = ("decoupled", "naive")
IS_WEIGHT_RULES = ("truncate", "filter")
LOG_RATIO_CLAMP = 20.0  # as verl: keeps exp() finite for wildly off-policy tokens
K3_CLAMP = 10.0  # as verl's low_var_kl


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Knobs of the policy loss, the run config's `loss` section field for field (paper
    defaults: clip 0.2 / 0.28, dual clip 10, entropy 1e-4, no KL)."""

    clip_low: float = 0.2  # the ratio is clipped below at 1 - clip_low
    clip_high: float = 0.28  # and above at 1 + clip_high (DAPO's clip-higher)
    dual_clip: float = 10.0  # A < 0: the loss is at most -A * dual_clip (> 1); 0 disables
    loss_agg: str = "token-mean"  # one of AGG_MODES
    entropy_coef: float = 1e-4
    kl_coef: float = 0.0  # > 0 needs ref_logp in the batch
    kl_estimator: str = "k3"  # one of KL_ESTIMATORS
    # Tokens sampled by an older policy (a stream with rl.max_staleness > 0, ada/stream.py):
    # "decoupled" clips the ratio against the proximal policy (the weights before this
    # update) and weighs each stale token by proximal / behaviour, capped at is_weight_cap;
    # "naive" takes the behaviour log-probs as PPO's old log-probs (`is_weights`).
    stale_objective: str = "decoupled"
    is_weight_cap: float = 2.0
    # a weight above the cap: "truncate" sets it to the cap (the token still trains, as in
    # truncated importance sampling); "filter" sets it to 0 (the token does not train, as
    # the AReaL paper's decoupled objective)
    is_weight_rule: str = "truncate"

    def __post_init__(self):
        problems = []
        if not 0 <= self.clip_low < 1:
            problems.append(f"clip_low={self.clip_low} must be in [0, 1)")
        if not self.clip_high >= 0:
            problems.append(f"clip_high={self.clip_high} must be >= 0")
        if self.dual_clip != 0 and not self.dual_clip > 1:
            problems.append(f"dual_clip={self.dual_clip} must be > 1 (or 0 to disable)")
        if self.loss_agg not in AGG_MODES:
            problems.append(f"loss_agg={self.loss_agg!r} is not one of {AGG_MODES}")
        if not self.kl_coef >= 0:
            problems.append(f"kl_coef={self.kl_coef} must be >= 0 (0 disables the KL term)")
        if self.kl_estimator not in KL_ESTIMATORS:
            problems.append(f"kl_estimator={self.kl_estimator!r} is not one of {KL_ESTIMATORS}")
        if self.stale_objective not in STALE_OBJECTIVES:
            problems.append(f"stale_objective={self.stale_objective!r} is not one of "
                            f"{STALE_OBJECTIVES}")
        if not self.is_weight_cap >= 1:
            problems.append(f"is_weight_cap={self.is_weight_cap} must be >= 1 (the weight of "
                            "a token the proximal policy likes more than the sampler did)")
        if self.is_weight_rule not in IS_WEIGHT_RULES:
            problems.append(f"is_weight_rule={self.is_weight_rule!r} is not one of "
                            f"{IS_WEIGHT_RULES}")
        if problems:
            raise ValueError("invalid LossConfig: " + "; ".join(problems))


# ----------------------------------------------------------------------------- aggregation


def agg_weights(mask_BxT: jax.Array, mode: str) -> jax.Array:
    """Per-token weights of an aggregate; each row's weights depend only on that row."""
    mask = mask_BxT.astype(jnp.float32)
    if mode in ("token-mean", "seq-mean-token-sum"):
        return mask
    if mode == "seq-mean-token-mean":
        return mask / jnp.maximum(mask.sum(-1, keepdims=True), 1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {AGG_MODES}")


def denominators(mask_BxT: jax.Array, mode: str) -> dict[str, jax.Array]:
    """Mini-batch normalisers: 'loss' for the aggregation mode, 'tokens' for token means."""
    mask = mask_BxT.astype(jnp.float32)
    tokens = mask.sum()
    rows = (mask.sum(-1) > 0).astype(jnp.float32).sum()
    loss = tokens if mode == "token-mean" else rows
    return {"loss": jnp.maximum(loss, 1.0), "tokens": jnp.maximum(tokens, 1.0)}


# ----------------------------------------------------------------------------- per-token terms


def ppo_clip_terms(logp_BxT, old_logp_BxT, adv_BxT, config: LossConfig) -> dict[str, jax.Array]:
    """Per-token PPO-clip loss (to minimise) and which branch was taken.

    loss = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)), and for A < 0 additionally
    min(that, -A dual_clip) (dual clip: a token with a huge ratio and negative advantage
    cannot dominate the batch; dual_clip = 0 turns it off).
    """
    log_ratio = jnp.clip(logp_BxT - old_logp_BxT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    loss_plain = -adv_BxT * ratio
    loss_clipped = -adv_BxT * jnp.clip(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    loss = jnp.maximum(loss_plain, loss_clipped)
    clipped = loss_clipped > loss_plain
    dual_clipped = jnp.zeros_like(clipped)
    if config.dual_clip:
        loss_dual = -adv_BxT * config.dual_clip
        negative = adv_BxT < 0
        dual_clipped = negative & (loss > loss_dual)
        loss = jnp.where(negative, jnp.minimum(loss, loss_dual), loss)
    return {"loss": loss, "ratio": ratio, "log_ratio": log_ratio,
            "clipped": clipped, "dual_clipped": dual_clipped}


def is_weights(proximal_logp_BxT, behav_logp_BxT, lag_BxT, cap: float,
               rule: str = "truncate") -> dict[str, jax.Array]:
    """Decoupled PPO's importance weight of each token (AReaL): proximal / behaviour for
    tokens sampled `lag` > 0 versions ago, and above `cap` by `rule` (IS_WEIGHT_RULES):
    "truncate" gives the cap, "filter" gives 0 (the AReaL paper's choice: the token does not
    train). A token of the proximal version itself has weight 1 exactly (its behaviour
    policy is the proximal one; the sampler's and the trainer's numerics may differ, which
    is not staleness). The log-ratio is clipped before exp(), so no weight overflows; a
    non-finite one (a behaviour log-prob of -inf or NaN) gives weight 0: that token does
    not train. Returns weight, truncated (over the cap: truncated or filtered, by the rule)
    and nonfinite [B, T]."""
    if rule not in IS_WEIGHT_RULES:
        raise ValueError(f"unknown importance-weight rule {rule!r}; choose one of "
                         f"{IS_WEIGHT_RULES}")
    stale = lag_BxT > 0
    log_w = jax.lax.stop_gradient(proximal_logp_BxT) - behav_logp_BxT
    finite = jnp.isfinite(log_w)
    log_cap = jnp.log(jnp.float32(cap))
    over = stale & finite & (log_w > log_cap)
    w = jnp.exp(jnp.minimum(jnp.where(finite, log_w, 0.0), log_cap))
    keep = finite & ~over if rule == "filter" else finite
    return {"weight": jnp.where(stale, jnp.where(keep, w, 0.0), 1.0),
            "truncated": over, "nonfinite": stale & ~finite}


def stale_terms(proximal_logp_BxT, behav_logp_BxT, lag_BxT,
                config: LossConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO's old log-probs and the importance weights (`is_weights`) of a batch that holds
    stale tokens (a stream), by config.stale_objective: "decoupled" keeps the proximal
    log-probs as the old ones (`policy_loss` then weighs each term); "naive" takes a stale
    token's behaviour log-prob instead where it is finite (the weights are then metrics
    only). Returns (old_logp [B, T], the weights)."""
    weight = is_weights(proximal_logp_BxT, behav_logp_BxT, lag_BxT, config.is_weight_cap,
                        config.is_weight_rule)
    old = proximal_logp_BxT
    if config.stale_objective == "naive":
        usable = (lag_BxT > 0) & jnp.isfinite(behav_logp_BxT)
        old = jnp.where(usable, behav_logp_BxT, old)
    return old, weight


def kl_penalty(logp_BxT, ref_logp_BxT, estimator: str) -> jax.Array:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1/k2/k3)."""
    log_r = logp_BxT - ref_logp_BxT
    if estimator == "k1":
        return log_r
    if estimator == "k2":
        return 0.5 * log_r * log_r
    if estimator == "k3":
        neg = -log_r
        return jnp.clip(jnp.exp(neg) - neg - 1.0, -K3_CLAMP, K3_CLAMP)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def logp_and_entropy(logits_BxTxV, targets_BxT,
                     temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """log p(target) and the entropy of the full next-token distribution softmax(logits / T),
    in float32 (scaled after the cast, as the sampler does, so both see the same numbers)."""
    logits = logits_BxTxV.astype(jnp.float32) / temperature
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets_BxT[..., None], axis=-1)[..., 0]
    probs = jnp.exp(logits - log_z[..., None])
    entropy = log_z - jnp.sum(probs * logits, axis=-1)
    return target_logit - log_z, entropy


# ----------------------------------------------------------------------------- the loss


def policy_loss(
    logp_BxT: jax.Array,
    old_logp_BxT: jax.Array,
    advantages_B: jax.Array,
    response_mask_BxT: jax.Array,
    config: LossConfig,
    entropy_BxT: jax.Array | None = None,
    ref_logp_BxT: jax.Array | None = None,
    denoms: dict[str, jax.Array] | None = None,
    is_weight: dict[str, jax.Array] | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO-clip loss + KL - entropy bonus, and metrics, over one (micro-)batch.

    `is_weight` (`is_weights`): under the decoupled objective each token's clipped term is
    multiplied by its weight; either way metrics then also hold is_weight_mean (over
    response tokens, 1 for fresh ones), is_weight_truncated_share and
    is_weight_nonfinite_share (under "naive", what the decoupled weights would have been).

    `denoms` are the enclosing mini-batch's `denominators`; with them every returned value
    (loss and metrics alike) is this micro-batch's additive share of the mini-batch value.
    Metrics: pg_loss, entropy (token mean), kl, approx_kl (token mean of old - new logp, the
    sampler-to-learner drift), clip_frac, dual_clip_frac, ratio_mean.
    """
    c = config
    mask = response_mask_BxT.astype(jnp.float32)
    if denoms is None:
        denoms = denominators(mask, c.loss_agg)
    weights = agg_weights(mask, c.loss_agg)

    def agg(x):
        return jnp.sum(weights * x) / denoms["loss"]

    def token_mean(x):
        return jnp.sum(mask * x) / denoms["tokens"]

    adv_BxT = jnp.broadcast_to(advantages_B.astype(jnp.float32)[:, None], mask.shape)
    terms = ppo_clip_terms(logp_BxT, old_logp_BxT, adv_BxT, c)
    weigh = is_weight is not None and c.stale_objective == "decoupled"
    pg_loss = agg(terms["loss"])
    if weigh:  # plus the stale tokens' correction: exactly 0 when every weight is 1 (k = 0),
        # so the loss is then the unweighted one bit for bit (w x term would not be: another
        # fusion of the sum)
        pg_loss = pg_loss + agg((is_weight["weight"] - 1.0) * terms["loss"])
    loss = pg_loss
    metrics = {
        "pg_loss": pg_loss,
        "approx_kl": token_mean(-terms["log_ratio"]),
        "clip_frac": token_mean(terms["clipped"].astype(jnp.float32)),
        "dual_clip_frac": token_mean(terms["dual_clipped"].astype(jnp.float32)),
        "ratio_mean": token_mean(terms["ratio"]),
    }
    if is_weight is not None:
        metrics.update(
            is_weight_mean=token_mean(is_weight["weight"]),
            is_weight_truncated_share=token_mean(is_weight["truncated"].astype(jnp.float32)),
            is_weight_nonfinite_share=token_mean(is_weight["nonfinite"].astype(jnp.float32)))
    if entropy_BxT is not None:
        metrics["entropy"] = token_mean(entropy_BxT)
        if c.entropy_coef:
            loss = loss - c.entropy_coef * agg(entropy_BxT)
    if ref_logp_BxT is not None:
        kl = kl_penalty(logp_BxT, ref_logp_BxT, c.kl_estimator)
        metrics["kl"] = agg(kl)
        if c.kl_coef:
            loss = loss + c.kl_coef * metrics["kl"]
    elif c.kl_coef:
        raise ValueError(f"kl_coef={c.kl_coef} needs ref_logp in the batch (recompute it "
                         "with the reference params) or kl_coef=0")
    metrics["loss"] = loss
    return loss, metrics
