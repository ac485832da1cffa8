"""Decode engine + driver: parity with transformers and the model, reproducibility,
continuous batching without recompiles, stops, bad input, sharded == unsharded.

One tiny Qwen2 model (random, non-trivial weights from tests/tiny_hf.py) and a few engines
shared across the module so each shape compiles once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from tiny_hf import make_tiny_hf

from ada.models.hf import load_hf
from ada.models.transformer import forward
from ada.sampling.driver import Driver, Request
from ada.sampling.engine import Engine
from ada.sampling.samplers import SamplingConfig
from ada.sharding import make_mesh

pytestmark = pytest.mark.numerics  # CI runs it again under another CPU's kernels

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,"


class CharTokenizer:
    """One character per token id (mod the alphabet): enough to test stop strings."""

    eos_ids = ()
    pad_id = 0

    def decode(self, ids):
        return "".join(ALPHABET[i % len(ALPHABET)] for i in ids)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    hf, _ = make_tiny_hf("qwen2", tmp_path_factory.mktemp("qwen2"))
    params, config = load_hf(tmp_path_factory.getbasetemp() / "qwen20")
    return hf, params, config


@pytest.fixture(scope="module")
def sampler_engine(model):
    _, _, config = model
    return Engine(config, num_slots=4, max_prompt_len=16, max_new_tokens=24, chunk_size=8,
                  sampling=SamplingConfig(temperature=1.0), slot_bucketing=False,
                  max_prefill_rows=4)


@pytest.fixture(scope="module")
def greedy_engine(model):
    _, _, config = model
    return Engine(config, num_slots=4, max_prompt_len=16, max_new_tokens=24, chunk_size=8,
                  sampling=SamplingConfig(temperature=0.0), max_prefill_rows=4)


def prompts(n, seed=0, lo=3, hi=16, vocab=512):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, rng.integers(lo, hi + 1)).tolist() for _ in range(n)]


def test_greedy_equals_transformers_generate(model, greedy_engine):
    hf, params, _ = model
    ps = prompts(5, seed=1)
    new = [24, 7, 16, 24, 1]
    out = Driver(greedy_engine, params).generate_all(
        [Request(p, i, 0, n) for i, (p, n) in enumerate(zip(ps, new, strict=True))])
    for p, n, c in zip(ps, new, out, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              do_sample=False, max_new_tokens=n, min_new_tokens=n,
                              eos_token_id=None, pad_token_id=0)
        assert c.token_ids == ref[0, len(p):].tolist()
        assert c.finish_reason == "length" and c.length == n


def test_tpu_form_equals_cpu_form(model, greedy_engine, monkeypatch):
    """The decode step as other backends lay it out (engine.backend_choices: the tied
    embedding held once, the cache read before the step's write), run here on CPU: the
    greedy tokens of the CPU form, and logprobs equal up to rounding."""
    from ada.sampling import engine as engine_mod

    _, params, config = model
    monkeypatch.setattr(engine_mod, "backend_choices", lambda platform: engine_mod.BackendChoices(
        unembed_copy=False, read_then_write=True, paged_attention="gather"))
    tpu_form = Engine(config, num_slots=4, max_prompt_len=16, max_new_tokens=24, chunk_size=8,
                      sampling=SamplingConfig(temperature=0.0), max_prefill_rows=4)
    reqs = [Request(p, i, 0, n) for i, (p, n) in enumerate(zip(prompts(5, seed=1),
                                                                [24, 7, 16, 24, 1], strict=True))]
    driver = Driver(tpu_form, params)
    assert config.tie_embeddings and "lm_head" not in driver.params
    got, want = driver.generate_all(reqs), Driver(greedy_engine, params).generate_all(reqs)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def model_logprobs(params, config, prompt, response, temperature=1.0):
    seq = jnp.asarray([prompt + response])
    logits, _ = forward(params, config, seq, jnp.arange(seq.shape[1])[None])
    z = np.asarray(logits[0], np.float64) / temperature
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    idx = np.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    return logp[idx, np.asarray(response)]


@pytest.mark.slow
def test_sampled_logprobs_equal_model_log_softmax(model, sampler_engine):
    _, params, config = model
    ps = prompts(3, seed=2)
    out = Driver(sampler_engine, params, step_key=7).generate_all(
        [Request(p, i, s, 24) for i, p in enumerate(ps) for s in range(2)])
    for c in out:
        ref = model_logprobs(params, config, c.prompt_tokens, c.token_ids)
        np.testing.assert_allclose(c.logprobs, ref, atol=2e-5)
    assert out[0].token_ids != out[1].token_ids, "two samples of one prompt should differ"


def test_reproducible_across_slot_round_and_neighbours(model, sampler_engine):
    """Same bucket: a response does not depend on its slot, round or neighbours."""
    _, params, _ = model
    target = Request(prompts(1, seed=4, lo=9, hi=9)[0], prompt_id=11, sample_idx=3,
                     max_new_tokens=20)
    (alone,) = Driver(sampler_engine, params, step_key=5).generate_all([target])
    # Ten others first (different lengths, same prompt bucket) so the target lands in a
    # later round, another slot, beside other requests.
    others = [Request(p, 100 + i, 0, n) for i, (p, n) in
              enumerate(zip(prompts(10, seed=5, lo=9, hi=16), [3, 20, 7, 12, 5, 9, 14, 2, 20, 6], strict=True))]
    crowd = Driver(sampler_engine, params, step_key=5).generate_all(others + [target])[-1]
    assert crowd.token_ids == alone.token_ids
    # Batched prefill (4 rows vs 1) rounds differently in the last bits.
    np.testing.assert_allclose(crowd.logprobs, alone.logprobs, atol=1e-5)
    # ...and it does depend on the sample index and the step key.
    other_idx = Driver(sampler_engine, params, step_key=5).generate_all(
        [Request(target.prompt_tokens, 11, 4, 20)])[0]
    other_key = Driver(sampler_engine, params, step_key=6).generate_all([target])[0]
    assert other_idx.token_ids != alone.token_ids
    assert other_key.token_ids != alone.token_ids


def test_continuous_batching_refills_without_recompiling(model, greedy_engine):
    _, params, _ = model
    driver = Driver(greedy_engine, params)
    rng = np.random.default_rng(6)
    lengths = rng.integers(1, 25, 14).tolist()
    reqs = [Request(p, i, 0, n) for i, (p, n) in enumerate(zip(prompts(14, seed=6), lengths, strict=True))]
    first = driver.generate_all(reqs)
    assert [c.length for c in first] == lengths
    compiles = greedy_engine.compiles()
    buckets = greedy_engine.num_buckets()
    assert all(compiles[k] <= buckets[k] for k in compiles), (compiles, buckets)
    # A second wave with new prompts refills slots and reuses every compilation.
    second = driver.generate_all(
        [Request(p, 50 + i, 0, n) for i, (p, n) in enumerate(zip(prompts(14, seed=7), lengths, strict=True))])
    assert [c.length for c in second] == lengths
    assert greedy_engine.compiles() == compiles
    assert driver.free_slots() == greedy_engine.num_slots
    # Short responses attend to the filled front of the cache, not all of it.
    assert greedy_engine.window_buckets[-1] == greedy_engine.cache_len
    assert len(greedy_engine.window_buckets) > 1
    assert driver.stats()["attention_window"] < 1.0


def test_prefix_is_prefilled_once_for_all_samples(model, sampler_engine):
    _, params, _ = model
    driver = Driver(sampler_engine, params, step_key=2)
    p = prompts(1, seed=8)[0]
    out = driver.generate_all([Request(p, 0, s, 10) for s in range(4)])
    assert driver.counts.prefills == 1
    assert len({tuple(c.token_ids) for c in out}) == 4


def test_eos_and_max_length(model, greedy_engine):
    _, params, config = model
    tok = CharTokenizer()
    p = prompts(1, seed=9)[0]
    (full,) = Driver(greedy_engine, params, tokenizer=tok).generate_all([Request(p, 0, 0, 24)])
    assert full.finish_reason == "length" and full.length == 24
    assert full.text == tok.decode(full.token_ids)
    # EOS on the device: the first occurrence of the token sampled at step 6 ends it.
    eos = full.token_ids[6]
    first = full.token_ids.index(eos)
    eos_engine = Engine(config, num_slots=4, max_prompt_len=16, max_new_tokens=24,
                        sampling=SamplingConfig(temperature=0.0), eos_ids=[eos],
                        slot_bucketing=False, max_prefill_rows=1)
    (e,) = Driver(eos_engine, params, tokenizer=tok).generate_all([Request(p, 0, 0, 24)])
    assert e.finish_reason == "eos"
    assert e.token_ids == full.token_ids[:first + 1]
    assert e.text == tok.decode(full.token_ids[:first])


def test_bad_requests_fail_alone(model, greedy_engine):
    _, params, _ = model
    good = prompts(3, seed=10)
    reqs = [
        Request(good[0], 0, 0, 5),
        Request([], 1, 0, 5),
        Request(list(range(1, 18)), 2, 0, 5),  # 17 > the largest bucket (16)
        Request([3, 512, 4], 3, 0, 5),
        Request([-1, 4], 4, 0, 5),
        Request(good[1], 5, 0, 0),
        Request(good[1], 6, 0, 25),  # above the engine's cap
        Request(good[2], 7, 0, 9),
    ]
    out = Driver(greedy_engine, params).generate_all(reqs)
    assert [c.finish_reason for c in out] == ["length"] + ["error"] * 6 + ["length"]
    assert [c.length for c in out] == [5, 0, 0, 0, 0, 0, 0, 9]
    messages = [c.error for c in out[1:7]]
    for msg, needle in zip(messages, ["empty prompt", "largest prompt bucket", "vocabulary",
                                      "vocabulary", "positive", "cap"], strict=True):
        assert needle in msg, msg


@pytest.mark.slow
def test_sharded_equals_unsharded_and_temperature_logprobs(model):
    """8 CPU devices (data 2 x fsdp 2 x tensor 2) give the same tokens as 1; with temperature 0.6 the
    log-probs are those of the scaled distribution."""
    _, params, config = model
    assert len(jax.devices()) >= 8
    mesh = make_mesh((2, 2, 2))  # data, fsdp, tensor
    kw = dict(num_slots=8, max_prompt_len=16, max_new_tokens=12, chunk_size=6,
              sampling=SamplingConfig(temperature=0.6), slot_bucketing=False,
              max_prefill_rows=4)
    reqs = [Request(p, i, s, 12) for i, p in enumerate(prompts(4, seed=11)) for s in range(3)]
    plain = Driver(Engine(config, **kw), params, step_key=3).generate_all(reqs)
    engine = Engine(config, mesh=mesh, **kw)
    driver = Driver(engine, params, step_key=3)
    # per-layer weights laid out by the tables, the "layers" axis indexed away
    assert tuple(driver.params["layers"][1]["q"].sharding.spec) == ("fsdp", "tensor")
    k0 = driver.state.cache.k[0]  # [B, K, S, Hd]
    assert k0.sharding.spec[0] == ("data", "fsdp") and k0.sharding.spec[1] == "tensor"
    sharded = driver.generate_all(reqs)
    assert [c.token_ids for c in sharded] == [c.token_ids for c in plain]
    for a, b in zip(sharded, plain, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    for c in plain[:3]:
        ref = model_logprobs(params, config, c.prompt_tokens, c.token_ids, temperature=0.6)
        np.testing.assert_allclose(c.logprobs, ref, atol=2e-5)


def test_insert_many_equals_one_insert_per_request(model, sampler_engine):
    """The driver's refill (one insert_many per prefix, padded to a power of two by
    repeating the last request) leaves the decode state one insert per request leaves."""
    _, params, _ = model
    eng = sampler_engine
    params = eng.prepare_params(params)
    prefix = eng.prefill(params, prompts(3, seed=9))
    step_key = jax.random.PRNGKey(4)
    slots, rows, pids, sidxs, mnts = [2, 0, 3], [1, 0, 2], [7, 5, 7], [0, 3, 1], [24, 5, 9]

    one = eng.init_decode_state()
    for s, r, p, i, m in zip(slots, rows, pids, sidxs, mnts, strict=True):
        one = eng.insert(prefix, one, s, row=r, key=eng.request_key(step_key, p, i),
                         max_new_tokens=m)
    many = eng.insert_many(prefix, eng.init_decode_state(), slots, rows, step_key, pids,
                           sidxs, mnts)
    assert 3 not in eng.insert_buckets  # three requests ran padded to a bucket of four
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(many), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
