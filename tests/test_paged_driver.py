"""The paged KV cache in the sampler (docs/paged.md, "The paged engine in the driver"): the
real Driver over a PagedEngine against the dense Driver, request by request (identical
greedy tokens, log-probs within float32 rounding at the logits' scale, tiny qwen2 / qwen3 /
llama / gemma2): one prompt
sampled four times (its full pages shared, not copied), slots finishing mid-chunk and
refilled, a pool so small that requests are deferred and preempted, and sampling at
temperature 1 drawing the same tokens (keys depend on the request, not the slot). The
allocator's invariants hold after every step. Then the config knobs, their one-line
errors, the engine factory, and a short RL run with sampling.kv_cache=paged."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from helpers import jit_forward, random_params
from test_runner import DEFAULT, tiny_overrides
from tolerances import logprob_tol

from ada import config as C
from ada.models import preset
from ada.sampling.driver import Driver, Request
from ada.sampling.engine import Engine
from ada.sampling.paged import PagedEngine
from ada.sampling.samplers import SamplingConfig

pytestmark = pytest.mark.numerics  # CI runs it again under another CPU's kernels

PROMPT_LENS = (9, 4, 14, 6)
# (prompt, max new tokens): prompt 0 four times; lengths rarely a multiple of the chunk
REQUESTS = [(0, 11), (1, 6), (0, 13), (2, 5), (3, 14), (0, 3), (2, 9), (1, 12)]
SMALL_POOL = 9  # 8 usable pages of 4 tokens: one request's worst case (16 + 16 tokens)
ENGINE = dict(num_slots=4, max_prompt_len=16, max_new_tokens=16, chunk_size=4, eos_ids=(7,))


def _requests(config):
    rng = np.random.default_rng(6)
    base = [rng.integers(1, config.vocab_size, n).tolist() for n in PROMPT_LENS]
    return [Request(base[p], prompt_id=p, sample_idx=i, max_new_tokens=m)
            for i, (p, m) in enumerate(REQUESTS)]


def run_paged(engine, params, requests, step_key=0):
    """The Driver over `engine`, stepped by hand: the allocator checked after every step,
    and on the first step that prompt 0's samples hold its full page by reference."""
    drv = Driver(engine, params, step_key=step_key)
    seqs = [drv.submit(r) for r in requests]
    out, steps = {}, 0
    while drv.busy():
        steps += 1
        assert steps < 300, "no progress"
        out.update((c.seq, c) for c in drv.step())
        a = drv.backend.alloc
        a.check()
        if steps == 1 and engine.full_reservation:  # requests 0 and 2 share prompt 0
            s0, s2 = (next(s for s, x in drv.running.items() if x.seq == q) for q in (0, 2))
            assert a.table[s0, 1] == a.table[s2, 1] and a.refcount[a.table[s0, 1]] == 3
            assert a.table[s0, 2] != a.table[s2, 2]  # the partial page: one copy each
    return [out[q] for q in seqs], drv.stats()


def requests_tol(params, config, requests) -> float:
    """tolerances.logprob_tol at the largest |logit| the model gives over the prompts."""
    prompts = {r.prompt_id: r.prompt_tokens for r in requests}.values()
    return max(logprob_tol(jit_forward(params, config, np.asarray([p]), np.arange(len(p))[None],
                                       np.ones((1, len(p)), bool), None)[0], config) for p in prompts)


def assert_same(dense, paged, tol):
    diff = 0.0
    for d, p in zip(dense, paged, strict=True):
        assert p.token_ids == d.token_ids and p.finish_reason == d.finish_reason
        diff = max(diff, float(np.abs(np.subtract(p.logprobs, d.logprobs)).max()))
    assert diff < tol, (diff, tol)
    return diff


@pytest.mark.slow
@pytest.mark.parametrize("family, pools, temperature", [
    ("qwen2", (0, SMALL_POOL), 0.0),
    ("qwen3", (SMALL_POOL,), 0.0),
    ("llama", (SMALL_POOL,), 1.0),
    ("gemma2", (SMALL_POOL,), 1.0),
])
def test_paged_driver_equals_dense_driver(family, pools, temperature):
    """Every request comes out of the paged Driver as out of the dense one. A pool sized
    for the worst case never defers or preempts; the 9-page pool does both, and the
    preempted requests restart with the same tokens (at temperature 1 too)."""
    c = preset("tiny", family=family)
    c = c.replace(sliding_windows=tuple(w and 8 for w in c.sliding_windows))  # Gemma: bites
    params = random_params(c, seed=5)
    reqs = _requests(c)
    sampling = SamplingConfig(temperature=temperature)
    key = jax.random.key_data(jax.random.PRNGKey(3))
    dense = Driver(Engine(c, sampling=sampling, **ENGINE), params, step_key=key).generate_all(reqs)
    assert len({len(d.token_ids) % ENGINE["chunk_size"] for d in dense}) > 1  # mid-chunk ends
    for num_pages in pools:
        eng = PagedEngine(c, sampling=sampling, page_size=4, num_pages=num_pages, **ENGINE)
        paged, stats = run_paged(eng, params, reqs, step_key=key)
        assert_same(dense, paged, requests_tol(params, c, reqs))
        if num_pages:
            assert stats["preemptions"] > 0 and stats["deferrals"] > 0, stats
        else:
            assert stats["preemptions"] == stats["deferrals"] == 0, stats
            assert stats["prefilled_prompts"] == len(PROMPT_LENS)  # each prompt once


@pytest.mark.slow
def test_paged_driver_on_a_mesh_samples_as_dense():
    """On a (data 4, tensor 2) sampler mesh, the pool is split with the slots: each data
    shard holds its own 10 pages (its slots' pages only), each pool's KV heads over tensor.
    A 40-page pool at temperature 1 draws the dense engine's tokens, with requests deferred;
    every sample of a prompt admitted together shares that prompt's pages in one shard."""
    from ada import sharding as shd

    c = preset("tiny", family="qwen2")
    params = random_params(c, seed=5)
    kw = dict(ENGINE, num_slots=8, sampling=SamplingConfig(temperature=1.0),
              mesh=shd.local_mesh(4, 2))
    reqs = _requests(c) * 2
    dense = Driver(Engine(c, **kw), params, step_key=7).generate_all(reqs)
    eng = PagedEngine(c, page_size=4, num_pages=40, **kw)
    assert (eng.pool_shards, eng.shard_pages) == (4, 10)
    assert eng.state_shardings().pages[0].spec[:3] == ("data", None, "tensor")
    state = eng.init_decode_state()
    device_pool = state.pages[0].addressable_shards[0].data.shape
    assert device_pool == (10, 4, c.num_kv_heads, c.head_dim)  # 2K / tensor 2 = K heads
    paged, stats = run_paged(eng, params, reqs, step_key=7)
    assert_same(dense, paged, requests_tol(params, c, reqs))
    assert stats["deferrals"] > 0, stats
    # full reservation: requests 0 and 2 (prompt 0) enter shard 0 and share its full page
    # (run_paged checks); a prompt cached in a full shard is prefilled again in another
    full = PagedEngine(c, page_size=4, **kw)
    paged, stats = run_paged(full, params, reqs, step_key=7)
    assert_same(dense, paged, requests_tol(params, c, reqs))
    assert stats["preemptions"] == stats["deferrals"] == 0, stats
    assert stats["prefilled_prompts"] > len(PROMPT_LENS), stats
    with pytest.raises(ValueError, match="in each of 4 data shards: pass 36 or more"):
        PagedEngine(c, page_size=4, num_pages=20, **kw)


def test_paged_knobs_and_their_errors():
    """sampling.kv_cache / page_size / num_pages: defaults, --print_config lines, and one
    line naming the knob for a bad value or a pool too small for one request; the factory
    builds the paged engine."""
    from ada.sampling.backends import make_engine

    base = C.build_config(DEFAULT)
    assert (base.sampling.kv_cache, base.sampling.num_pages) == ("dense", 0)
    text = C.describe(base)
    assert "sampling.kv_cache = 'dense'  # dense | paged" in text
    assert "sampling.num_pages = 0  # paged: pages in the pool" in text
    for overrides, message in (
        ([("sampling.kv_cache", "pages")], "sampling.kv_cache='pages' is not one of"),
        ([("sampling.kv_cache", "paged"), ("sampling.num_pages", "3")],
         "sampling.num_pages=3 cannot hold one request of 32 prompt + 8 new tokens"),
        ([("sampling.kv_cache", "paged"), ("sampling.num_pages", "6"), ("sampling.mesh", "(2,1)")],
         "in each of sampling.mesh's 2 data shards; pass --config.sampling.num_pages="),
    ):
        cfg = C.build_config(DEFAULT, overrides)
        with pytest.raises(C.ConfigError, match=re.escape(message)) as e:
            C.validate(cfg)
        assert "\n" not in str(e.value) and "--config." in str(e.value)
    cfg = C.build_config(DEFAULT, [("sampling.kv_cache", "paged"), ("sampling.num_slots", "8"),
                                   ("sampling.page_size", "8")])
    C.validate(cfg)
    eng = make_engine(cfg, preset("tiny"), None, num_slots=8)
    assert isinstance(eng, PagedEngine) and eng.page_size == 8 and eng.full_reservation
    assert eng.num_pages == 1 + 8 * eng.pages_per_slot + 32 // 8
    lowered = eng.lower_generate(jax.eval_shape(eng.prepare_params, random_params(preset("tiny"))),
                                 filled=12)
    assert "while" in lowered.as_text()  # the chunk's scan, from abstract arguments


@pytest.mark.slow
def test_rl_run_with_paged_sampling(tmp_path, monkeypatch):
    """Two RL steps and an evaluation of the tiny default-style run sample through the
    paged engine (collection and held-out evaluation), never the dense one."""
    from ada.loop import train
    from ada.metrics import read_jsonl

    chunks, generate = [], PagedEngine.generate
    monkeypatch.setattr(PagedEngine, "generate",
                        lambda self, *a, **k: chunks.append(1) or generate(self, *a, **k))
    monkeypatch.setattr(Engine, "generate", None)  # the dense engine must not decode

    ov = [*tiny_overrides(str(tmp_path / "cache")), ("train.steps", "2"), ("eval.every", "2"),
          ("warmstart.enabled", "false"), ("sampling.kv_cache", "paged"),
          ("sampling.page_size", "4"), ("sampling.mesh", "(1,1)"), ("mesh.data", "1")]
    cfg = C.build_config(DEFAULT, ov)
    C.validate(cfg, str(tmp_path / "run"))
    assert train(cfg, str(tmp_path / "run"))["steps"] == 2
    rows = read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [0, 1, 2] and "eval_accuracy" in rows[2]
    assert all(np.isfinite(r["reward_mean"]) for r in rows[1:]) and chunks


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["rounds", "continuous"])
def test_prompts_kept_across_rounds_are_prefilled_once(scheduler):
    """A collection whose prompts stay active for every round (no response is ever correct)
    on a paged Driver whose prefix LRU holds one prompt: the Collector keeps its active
    prompts (Driver.keep_prompts), so each is prefilled once and later rounds attach to its
    pages; with keeping turned off the LRU evicts them and every round prefills again. The
    responses are the same either way (a prompt's pages hold the same keys and values)."""
    from ada.adaptive.collect import CollectConfig, Collector

    c = preset("tiny", family="qwen2")
    params = random_params(c, seed=5)
    prompts = [{"tokens": list(range(3 + i, 15 + i))} for i in range(4)]  # 12 tokens each
    cfg = CollectConfig(rule="balance", n=4, samples_per_round=2, max_rounds=3,
                        scheduler=scheduler)
    runs = {}
    for keep in (True, False):
        eng = PagedEngine(c, page_size=8, sampling=SamplingConfig(temperature=1.0), **ENGINE)
        drv = Driver(eng, params, step_key=11, prefix_cache_size=1)
        if not keep:
            drv.keep_prompts = lambda ids: None
        col = Collector(cfg, lambda prompt, text: 0.0, driver=drv, make_request=lambda r: Request(
            r.prompt["tokens"], r.prompt_id, r.sample_idx, max_new_tokens=6))
        out = col.collect(prompts, jax.random.PRNGKey(0))
        tokens = sorted((x.prompt_id, x.sample_idx, tuple(x.token_ids))
                        for p in out.completions for x in p if x is not None)
        runs[keep] = (drv.stats(), tokens, int(out.samples.sum()))
    (kept, tok_kept, drawn), (lru, tok_lru, _) = runs[True], runs[False]
    assert drawn == 4 * 2 * 3 and all(t[2] for t in tok_kept)  # every prompt, every round
    assert kept["prefilled_prompts"] == 4 and kept["prefilled_tokens"] == 4 * 12
    assert lru["prefilled_prompts"] > 4, lru
    assert kept["page_copies"] == drawn  # each sample copies the partial last prompt page
    assert tok_kept == tok_lru
