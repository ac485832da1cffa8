"""Samplers: the distributions drawn from, checked against a float64 NumPy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from ada.sampling.samplers import SamplingConfig, inverse_cdf, sample, sampling_logprobs

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, 0.75])


def reference_probs(logits, temperature, top_k=0, top_p=1.0):
    """float64 NumPy: temperature -> top-k -> top-p, renormalised."""
    z = np.asarray(logits, np.float64) / temperature
    if 0 < top_k < len(z):
        z = np.where(z < np.sort(z)[::-1][top_k - 1], -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p)
        before = np.cumsum(p[order]) - p[order]
        keep = np.zeros_like(p, bool)
        keep[order[before < top_p]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    return p


def draw(cfg, n=20000, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), n)
    logits = jnp.broadcast_to(jnp.asarray(LOGITS, jnp.float32), (n, len(LOGITS)))
    tokens, logprobs = jax.jit(sample, static_argnums=2)(logits, keys, cfg)
    return np.asarray(tokens), np.asarray(logprobs)


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.5, 0, 1.0), (1.7, 0, 1.0), (1.0, 3, 1.0), (0.8, 0, 0.7), (1.3, 4, 0.9),
])
def test_sampled_frequencies_match_reference(temperature, top_k, top_p):
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    p = reference_probs(LOGITS, temperature, top_k, top_p)
    tokens, logprobs = draw(cfg)
    counts = np.bincount(tokens, minlength=len(LOGITS))
    support = p > 0
    assert counts[~support].sum() == 0, "sampled a token outside the top-k/top-p support"
    expected = p[support] * len(tokens)
    chi2 = ((counts[support] - expected) ** 2 / expected).sum()
    df = max(int(support.sum()) - 1, 1)
    assert chi2 < stats.chi2.ppf(1 - 1e-3, df), (chi2, counts, expected)
    # The returned log-prob is the log of the distribution sampled from.
    np.testing.assert_allclose(logprobs, np.log(p[tokens]), atol=2e-6)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 5, 0.6)])
def test_sampling_logprobs_match_reference(temperature, top_k, top_p):
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    got = np.exp(np.asarray(sampling_logprobs(jnp.asarray(LOGITS[None], jnp.float32), cfg)))[0]
    np.testing.assert_allclose(got, reference_probs(LOGITS, temperature, top_k, top_p), atol=1e-6)


def test_greedy_is_argmax_with_raw_logprob():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 50)).astype(np.float32)
    tokens, logprobs = sample(jnp.asarray(logits), jnp.zeros((5, 2), jnp.uint32),
                              SamplingConfig(temperature=0.0))
    np.testing.assert_array_equal(np.asarray(tokens), logits.argmax(-1))
    ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(logprobs), ref[np.arange(5), logits.argmax(-1)], atol=1e-6)


@pytest.mark.slow
def test_a_row_does_not_depend_on_its_neighbours():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(6, 40)), jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(3), 6)
    cfg = SamplingConfig(temperature=1.0, top_p=0.9)
    full, _ = sample(logits, keys, cfg)
    for i in range(6):
        one, _ = sample(logits[i:i + 1], keys[i:i + 1], cfg)
        assert int(one[0]) == int(full[i])


@pytest.mark.parametrize("vocab, shards", [(300, 1), (1024, 1), (8192, 1), (300, 2), (1000, 4),
                                           (1024, 4)])
def test_inverse_cdf_equals_brute_force_search(vocab, shards):
    """The two-level lookup picks exactly the token a linear scan of the cumulative weights
    picks. Integer weights (with zeros and a vocabulary that is not a multiple of the block)
    keep every float32 sum exact, so the two must agree bit for bit. With the vocabulary in
    `shards` shards (blocks padded per shard, the sampler's layout over a tensor axis), run
    sharded that way over CPU devices: the same tokens, and the [B, V] weights are never
    gathered onto one device."""
    rng = np.random.default_rng(vocab)
    B = 64
    w = rng.integers(0, 64, (B, vocab)).astype(np.float32)
    w[rng.random((B, vocab)) < 0.5] = 0.0  # many zero-weight tokens
    w[:4] = 0.0
    w[:4, [0, vocab - 1, vocab // 2, 7][:4]] = 1.0  # mass on a single token: edges of the range
    w[0] = 0.0
    w[0, vocab - 1] = 3.0  # only the last (padded block) token
    u = rng.random(B).astype(np.float32)
    u[1], u[2] = 0.0, np.nextafter(np.float32(1.0), np.float32(0.0))
    fn = jax.jit(functools.partial(inverse_cdf, vocab_shards=shards))
    w_in = jnp.asarray(w)
    if shards > 1:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:shards]), ("tensor",))
        w_in = jax.device_put(w_in, jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec(None, "tensor")))
        hlo = fn.lower(w_in, jnp.asarray(u)).compile().as_text()
        assert not [line for line in hlo.splitlines() if "all-gather(" in line
                    and (f"[{B},{vocab}]" in line or f"[{vocab},{B}]" in line)]
    got = np.asarray(fn(w_in, jnp.asarray(u)))
    for b in range(B):
        target = np.float32(u[b]) * np.float32(w[b].sum())
        cdf = np.cumsum(w[b].astype(np.float64))
        expect = next(i for i in range(vocab) if cdf[i] > target)  # the linear scan
        assert got[b] == expect, (b, got[b], expect)
        assert w[b, got[b]] > 0


@pytest.mark.parametrize("kwargs,msg", [
    (dict(temperature=-0.1), "temperature"), (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
])
def test_bad_sampling_config(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingConfig(**kwargs)
