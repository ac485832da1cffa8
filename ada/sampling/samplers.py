"""Token samplers on logits: greedy, temperature, top-k, top-p (nucleus).

The sampling distribution is built in the transformers order — temperature, then top-k,
then top-p — and renormalised. `sample` returns, with each token, its log-probability under
*that* distribution (the one actually sampled from: temperature-scaled and truncated), not
under the raw model distribution. For greedy decoding (temperature 0) it is the raw
log-softmax of the chosen token.

What the engines record (`sample_and_stop`, Completion.logprobs) is instead the policy's
untruncated log-prob, log softmax(logits / temperature) of the token: the trainer's log-prob
(ada/rl/losses.py: logp_and_entropy), the same whether or not top-k / top-p cut the draw.
A stream's stale token is weighed by proximal / behaviour (losses.is_weights); that weight
is meant to measure how far the policy moved since the token was drawn, and a fresh token's
is 1. With the truncated log-prob as the behaviour one, every stale token would also be
weighed down by the mass the truncation dropped, which a fresh token never is.

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


def sample(logits_BxV: jax.Array, keys_Bx2: jax.Array, cfg: SamplingConfig, *,
           vocab_shards: int = 1):
    """Draw one token per row. Returns (tokens [B] int32, logprobs [B] float32).

    keys_Bx2: one raw uint32 PRNG key per row (unused when greedy).
    vocab_shards: how many shards the logits' vocabulary axis is split into (inverse_cdf).
    """
    if cfg.greedy:
        logp_BxV = sampling_logprobs(logits_BxV, cfg)
        tokens_B = jnp.argmax(logp_BxV, axis=-1).astype(jnp.int32)
        return tokens_B, jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]
    # Inverse CDF with one uniform per row: exact in distribution and ~V times fewer
    # random bits than Gumbel-max (threefry dominates a CPU decode step otherwise).
    u_B = jax.vmap(lambda k: jax.random.uniform(k, ()))(keys_Bx2)
    if cfg.top_k == 0 and cfg.top_p == 1.0:
        # Plain temperature (the RL default): draw from the unnormalised weights and take
        # the log-normaliser once, instead of materialising a [B, V] log-softmax.
        z_BxV = logits_BxV.astype(jnp.float32) / cfg.temperature
        z_BxV = z_BxV - jnp.max(z_BxV, axis=-1, keepdims=True)
        w_BxV = jnp.exp(z_BxV)
        tokens_B = inverse_cdf(w_BxV, u_B, vocab_shards=vocab_shards)
        z_B = jnp.take_along_axis(z_BxV, tokens_B[:, None], axis=-1)[:, 0]
        return tokens_B, z_B - jnp.log(jnp.sum(w_BxV, axis=-1))
    logp_BxV = sampling_logprobs(logits_BxV, cfg)
    tokens_B = inverse_cdf(jnp.exp(logp_BxV), u_B, vocab_shards=vocab_shards)
    return tokens_B, jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]


def inverse_cdf(w_BxV: jax.Array, u01_B: jax.Array, block: int = 128,
                vocab_shards: int = 1) -> jax.Array:
    """The token each row's uniform u lands on under the (unnormalised) weights w >= 0:
    the first i with cumsum(w)[i] > u * sum(w). Never a zero-weight token.

    Two levels (block sums, then one block's weights) instead of a cumsum over V: a
    [B, V] cumsum is an O(V log V) reduce-window on XLA:CPU, ~1 ms of a ~30 ms decode step
    at V=8192, B=32.

    vocab_shards: the shards the vocabulary axis of w is split into (the sampler's tensor
    axis). Blocks then never straddle two shards: each shard's V / vocab_shards entries are
    padded to whole blocks on their own, so the block split is local to a shard and the
    [B, V] weights are not gathered onto every chip (the TPU compile of the 1.5B preset
    gathered and relaid out the whole [B, V] per step otherwise). One shard: the plain
    padding at the end, as before.
    """
    B, V = w_BxV.shape
    s = vocab_shards if vocab_shards > 1 and V % vocab_shards == 0 else 1
    per = V // s
    nb_s = -(-per // block)  # blocks per shard
    w = jnp.pad(w_BxV.reshape(B, s, per), ((0, 0), (0, 0), (0, nb_s * block - per)))
    w = w.reshape(B, s * nb_s, block)
    nb = s * nb_s
    block_sums = jnp.sum(w, axis=-1)  # [B, nb]
    block_cdf = jnp.cumsum(block_sums, axis=-1)
    u_B = u01_B * block_cdf[:, -1]
    j_B = jnp.minimum(jnp.sum(block_cdf <= u_B[:, None], axis=-1), nb - 1)
    in_block = jnp.take_along_axis(w, j_B[:, None, None], axis=1)[:, 0]  # [B, block]
    before_B = jnp.take_along_axis(block_cdf - block_sums, j_B[:, None], axis=-1)[:, 0]
    i_B = jnp.sum(jnp.cumsum(in_block, axis=-1) <= (u_B - before_B)[:, None], axis=-1)
    i_B = jnp.minimum(i_B, block - 1)
    # Cumsum rounding can step past the last positive weight of the block: take the
    # block's largest weight then (a rounding-level event, never a zero-weight token).
    hit = jnp.take_along_axis(in_block, i_B[:, None], axis=-1)[:, 0] > 0
    i_B = jnp.where(hit, i_B, jnp.argmax(in_block, axis=-1))
    return ((j_B // nb_s) * per + (j_B % nb_s) * block + i_B).astype(jnp.int32)


def policy_logprob(logits_BxV: jax.Array, tokens_B: jax.Array, temperature: float) -> jax.Array:
    """log softmax(logits / temperature) [B] of each row's token, untruncated: the trainer's
    log-prob of it (float32, scaled after the cast, as losses.logp_and_entropy)."""
    z_BxV = logits_BxV.astype(jnp.float32) / temperature
    z_B = jnp.take_along_axis(z_BxV, tokens_B[:, None], axis=-1)[:, 0]
    return z_B - jax.nn.logsumexp(z_BxV, axis=-1)


def sample_and_stop(state, sampling: SamplingConfig, eos_ids: tuple[int, ...],
                    vocab_shards: int = 1, turn_end_ids: tuple[int, ...] = ()):
    """One decode step's sampling and stop rules, the same for every KV cache: each slot's
    token drawn from its logits with its request's key folded with the tokens it has
    generated (so a token does not depend on the slot or the batch), then whether the slot
    stays active (it drew, the token is no EOS and no turn-end id, it is under its max_new).
    A turn-end id (a tool call's end marker) stops the slot like an EOS; the host tells them
    apart by the last token (Driver: finish_reason "turn", the slot parked). `generated`
    counts every token the request drew, over all its turns. `state` has `logits`, `keys`,
    `generated`, `max_new` and `active`. Returns (tokens, logprobs: the policy's untruncated
    ones (module doc), valid: the slots that drew, generated, active)."""
    keys = jax.vmap(jax.random.fold_in)(state.keys, state.generated)
    tokens_B, logprobs_B = sample(state.logits, keys, sampling, vocab_shards=vocab_shards)
    if not sampling.greedy and (sampling.top_k or sampling.top_p < 1.0):
        logprobs_B = policy_logprob(state.logits, tokens_B, sampling.temperature)
    valid_B = state.active
    generated = state.generated + valid_B.astype(jnp.int32)
    stop_ids = tuple(eos_ids) + tuple(turn_end_ids)
    is_eos = (jnp.isin(tokens_B, jnp.asarray(stop_ids, jnp.int32)) if stop_ids
              else jnp.zeros_like(valid_B))
    return tokens_B, logprobs_B, valid_B, generated, valid_B & ~is_eos & (generated < state.max_new)
