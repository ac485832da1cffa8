"""Token samplers on logits: greedy, temperature, top-k, top-p (nucleus).

The sampling distribution is built in the transformers order — temperature, then top-k,
then top-p — and renormalised. `sample` returns, with each token, its log-probability under
*that* distribution (the one actually sampled from: temperature-scaled and truncated), not
under the raw model distribution. For greedy decoding (temperature 0) it is the raw
log-softmax of the chosen token. The RL code recomputes the policy's own log-probs anyway;
these are the behaviour-policy log-probs of the sampler.

Randomness is one key per row, so a row's draw does not depend on the other rows.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Static sampling settings (hashable: a `jit` static argument).

    temperature: 0 means greedy (argmax); top_k: 0 means off; top_p: 1.0 means off.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        problems = []
        if not self.temperature >= 0:
            problems.append(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            problems.append(f"top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p={self.top_p} must be in (0, 1] (1 = off)")
        if problems:
            raise ValueError("invalid SamplingConfig: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_logprobs(logits_BxV: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Log-probabilities [B, V] of the distribution `sample` draws from (-inf outside it).

    Ties at the top-k / top-p threshold are all kept (the support can exceed k by ties).
    """
    logits = logits_BxV.astype(jnp.float32)
    if cfg.greedy:
        return jax.nn.log_softmax(logits, axis=-1)
    logits = logits / cfg.temperature
    neg_inf = jnp.array(-jnp.inf, jnp.float32)
    V = logits.shape[-1]
    if 0 < cfg.top_k < V:
        kth_B = jax.lax.top_k(logits, cfg.top_k)[0][:, -1]
        logits = jnp.where(logits < kth_B[:, None], neg_inf, logits)
    if cfg.top_p < 1.0:
        sorted_BxV = -jnp.sort(-logits, axis=-1)  # descending
        probs = jax.nn.softmax(sorted_BxV, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs  # exclusive cumulative mass
        keep = mass_before < cfg.top_p  # always keeps the most likely token
        threshold_B = jnp.min(jnp.where(keep, sorted_BxV, jnp.inf), axis=-1)
        logits = jnp.where(logits < threshold_B[:, None], neg_inf, logits)
    return jax.nn.log_softmax(logits, axis=-1)


def sample(logits_BxV: jax.Array, keys_Bx2: jax.Array, cfg: SamplingConfig):
    """Draw one token per row. Returns (tokens [B] int32, logprobs [B] float32).

    keys_Bx2: one raw uint32 PRNG key per row (unused when greedy).
    """
    logp_BxV = sampling_logprobs(logits_BxV, cfg)
    if cfg.greedy:
        tokens_B = jnp.argmax(logp_BxV, axis=-1)
    else:
        # Inverse CDF with one uniform per row: exact in distribution and ~V times fewer
        # random bits than Gumbel-max (threefry dominates a CPU decode step otherwise).
        cdf_BxV = jnp.cumsum(jnp.exp(logp_BxV), axis=-1)
        u_B = jax.vmap(lambda k: jax.random.uniform(k, ()))(keys_Bx2) * cdf_BxV[:, -1]
        tokens_B = jnp.minimum(jnp.sum(cdf_BxV <= u_B[:, None], axis=-1), logp_BxV.shape[-1] - 1)
        # Never land on a zero-probability token through cumsum rounding.
        tokens_B = jnp.where(jnp.isfinite(jnp.take_along_axis(logp_BxV, tokens_B[:, None], -1)[:, 0]),
                             tokens_B, jnp.argmax(logp_BxV, axis=-1))
    tokens_B = tokens_B.astype(jnp.int32)
    logprobs_B = jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]
    return tokens_B, logprobs_B
