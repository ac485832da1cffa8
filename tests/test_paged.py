"""Paged KV cache and ragged paged attention (docs/paged.md): the host allocator's
invariants, paged attention against dense attention and the Pallas kernel's own reference,
whole-model paged decode against ada.models.transformer's dense cached forward (identical
greedy tokens, logits within float32 rounding at their scale: tests/tolerances.py) with shared prefixes, slots that finish
mid-chunk and are refilled, and a pool that runs out of pages; the kernel path compiled for
v5e through libtpu; the planner's slots at mean fill."""

from __future__ import annotations

import collections
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DENSE_FAMILIES, jit_forward, random_params
from tolerances import logprob_tol, model_tol

from ada.models import init_cache, param_shapes, positions_from_mask, preset
from ada.models.known import known
from ada.models.layers import score_scale
from ada.models.paged_attention import (
    attention_gather,
    init_pages,
    kernel_read_bytes,
    page_bytes,
    tuned_blocks,
    write_kv,
    write_positions,
)
from ada.sampling.paged import PagedEngine, PagedState, generate_fn
from ada.sampling.pages import OutOfPages, PageAllocator, grow_or_preempt, slots_that_fit
from ada.sampling.samplers import SamplingConfig

pytestmark = pytest.mark.numerics  # CI runs it again under another CPU's kernels

GEMMA_WINDOW = 8  # the Gemma models' sliding window here: the requests run past it
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "default.py")


def tiny(family):
    """The family's tiny preset; Gemma's with windows of GEMMA_WINDOW on its local layers."""
    c = preset("tiny", family=family)
    return c.replace(sliding_windows=tuple(w and GEMMA_WINDOW for w in c.sliding_windows))
# Attention alone on unit-normal q, k, v (Hd = 16): a score sums 16 products (|q||k| ~ 16,
# scaled by 1/4), so reordering errs by ~sqrt(16) u * 4 ~ 1e-6; the softmax carries a score's
# error into the output as that error times |v| (<= ~3): ~3e-6. 1e-5 leaves 3x.
TOL = 1e-5
GREEDY = SamplingConfig(temperature=0.0)
NUM_PAGES_SMALL = 9


def dense_greedy(params, config, prompts, steps):
    """Greedy decoding with the dense KVCache (transformer.forward, left-padded prompts):
    tokens [R, steps] and logits [R, steps, V] (row i's distribution of token i)."""
    R, P = len(prompts), max(len(p) for p in prompts)
    tokens, mask = np.zeros((R, P), np.int32), np.zeros((R, P), bool)
    for i, p in enumerate(prompts):
        tokens[i, P - len(p):], mask[i, P - len(p):] = p, True
    cache = init_cache(config, R, P + steps)
    logits, cache = jit_forward(params, config, tokens, positions_from_mask(mask), mask, cache)
    last, pos, out_t, out_l = logits[:, -1], mask.sum(1).astype(np.int32), [], []
    for _ in range(steps):
        out_l.append(np.asarray(last))
        tok = jnp.argmax(last, -1).astype(jnp.int32)
        out_t.append(np.asarray(tok))
        logits, cache = jit_forward(params, config, tok[:, None], pos[:, None],
                                    np.ones((R, 1), bool), cache)
        last, pos = logits[:, 0], pos + 1
    return np.stack(out_t, 1), np.stack(out_l, 1)


def dense_attention(q_BxTxHxHd, k_BxSxKxHd, v_BxSxKxHd, q_pos_BxT):
    """Plain causal attention over a dense per-slot cache (the layout-free reference)."""
    B, T, H, Hd = q_BxTxHxHd.shape
    K = k_BxSxKxHd.shape[2]
    q = q_BxTxHxHd.reshape(B, T, K, H // K, Hd)
    s = jnp.einsum("btkgh,bskh->bkgts", q, k_BxSxKxHd) / np.sqrt(Hd)
    allowed = np.arange(k_BxSxKxHd.shape[1])[None, None] <= q_pos_BxT[:, :, None]
    s = jnp.where(allowed[:, None, None], s, -jnp.inf)
    return jnp.einsum("bkgts,bskh->btkgh", jax.nn.softmax(s, -1), v_BxSxKxHd).reshape(B, T, -1)


# ----------------------------------------------------------------------------- allocator


def test_allocator_shares_prefix_pages_and_copies_the_partial_one():
    a = PageAllocator(num_pages=32, page_size=4, num_slots=4, pages_per_slot=8)
    pp = a.alloc_prompt(10)  # pages 1, 2 full, 3 partial
    assert pp.pages == [1, 2, 3]
    copies = [a.attach(s, pp, lookahead=3) for s in range(3)]
    a.check()
    assert all(a.table[s, :2].tolist() == [1, 2] for s in range(3))  # shared, not copied
    assert a.refcount[[1, 2, 3]].tolist() == [4, 4, 1]
    assert [c[0][0] for c in copies] == [3, 3, 3]  # each sample copies the partial page
    assert len({c[0][1] for c in copies}) == 3  # ... into a page of its own
    a.release_prompt(pp)
    a.check()
    assert a.refcount[3] == 0 and a.refcount[1] == 3
    for s in range(3):
        a.free(s)
    a.check()
    assert a.free_pages() == 31  # everything back but the null page
    b = PageAllocator(32, 4, 4, 8)
    assert b.attach(0, b.alloc_prompt(8)) == []  # a whole-page prompt copies nothing


def test_allocator_is_all_or_nothing_and_deterministic():
    def run():
        a = PageAllocator(num_pages=8, page_size=4, num_slots=4, pages_per_slot=8)
        pp = a.alloc_prompt(6)
        a.attach(0, pp, lookahead=4)  # pages for 10 tokens: 1 shared + 2 own; 3 left
        before = (a.table.copy(), a.refcount.copy(), a.free_pages())
        with pytest.raises(OutOfPages):
            a.attach(1, pp, lookahead=20)
        assert not a.grow(0, 32)
        assert (a.table == before[0]).all() and (a.refcount == before[1]).all()
        assert a.free_pages() == before[2] == 3
        with pytest.raises(ValueError):
            a.grow(0, 33)  # past a slot's row: a caller's bug, not a full pool
        assert a.can_admit(6, 4, prefilled=True) and not a.can_admit(6, 20, prefilled=True)
        assert a.can_admit(6, 20, prefilled=True, lookahead=4)  # admission by expected fill
        assert not a.can_admit(6, 4)  # its own prompt pages too: 4 > 3
        a.check()
        return a.table.copy()

    assert (run() == run()).all()


def test_random_operations_keep_the_invariants():
    rng = np.random.default_rng(0)
    a = PageAllocator(num_pages=48, page_size=4, num_slots=6, pages_per_slot=10, shards=2)
    prompts, order = [], {}
    for step in range(400):
        op = rng.integers(4)
        busy = [s for s in range(6) if a.num_held[s]]
        if op == 0:
            try:
                prompts.append(a.alloc_prompt(int(rng.integers(1, 20)), int(rng.integers(2))))
            except OutOfPages:
                pass
        elif op == 1 and prompts:
            pp = prompts[rng.integers(len(prompts))]
            slot = next((s for s in range(6) if not a.num_held[s] and a.shard_of(s) == pp.shard),
                        None)
            if slot is not None:
                try:
                    a.attach(slot, pp, lookahead=int(rng.integers(0, 8)))
                    order[slot] = step
                except OutOfPages:
                    pass
        elif op == 2 and busy:
            demands = {s: min(int(a.num_held[s]) * 4 + int(rng.integers(0, 9)), 40) for s in busy}
            kept = {s: a.table[s, :a.num_held[s]].copy() for s in busy}
            victims = grow_or_preempt(a, demands, order)
            for s in busy:
                if s in victims:
                    assert a.num_held[s] == 0
                else:  # survivors keep every page they had and get what they asked for
                    assert (a.table[s, :len(kept[s])] == kept[s]).all()
                    assert a.num_held[s] * 4 >= demands[s]
        elif op == 3:
            if busy and rng.random() < 0.7:
                a.free(busy[rng.integers(len(busy))])
            elif prompts:
                a.release_prompt(prompts.pop(rng.integers(len(prompts))))
        a.check()


# ----------------------------------------------------------------------------- attention


@jax.jit
def _write_all(pool, table, start, count, k, v):
    page, off = write_positions(table, start, count, k.shape[1], pool.shape[1], pool.shape[0])
    return write_kv(pool, k, v, page, off)


def _paged_copy(rng, alloc, lengths, shared_len, K, Hd, pool):
    """Random dense k/v per slot, slots 0 and 1 sharing their first shared_len tokens (a
    prompt prefilled once: its full pages shared, the partial one copied), laid into pages
    through the allocator and write_kv. Returns (pool, k [B, S, K, Hd], v)."""
    B, S = len(lengths), max(lengths)
    k = rng.standard_normal((B, S, K, Hd)).astype(np.float32)
    v = rng.standard_normal((B, S, K, Hd)).astype(np.float32)
    k[1, :shared_len], v[1, :shared_len] = k[0, :shared_len], v[0, :shared_len]
    pp = alloc.alloc_prompt(shared_len)
    table = np.zeros((B, alloc.pages_per_slot), np.int32)
    table[0, :len(pp.pages)] = pp.pages
    pool = _write_all(pool, table, np.zeros(B, np.int32), np.array([shared_len] + [0] * (B - 1)),
                      k, v)
    start = np.array([shared_len] * 2 + [0] * (B - 2), np.int32)
    for s in range(B):
        if s < 2:
            (src, dst), = alloc.attach(s, pp, lookahead=lengths[s] - shared_len)
            pool = pool.at[dst].set(pool[src])
        else:
            assert alloc.grow(s, lengths[s])
    alloc.release_prompt(pp)
    shift = lambda x: np.stack([np.roll(x[b], -start[b], 0) for b in range(B)])  # from start
    pool = _write_all(pool, alloc.table, start, np.asarray(lengths) - start, shift(k), shift(v))
    return pool, k, v


@pytest.mark.parametrize("family", DENSE_FAMILIES)
def test_paged_attention_equals_dense_attention(family):
    c = preset("tiny", family=family)
    H, K, Hd = c.num_heads, c.num_kv_heads, c.head_dim
    rng = np.random.default_rng(1)
    alloc = PageAllocator(num_pages=64, page_size=4, num_slots=5, pages_per_slot=8)
    lengths = [13, 22, 1, 7, 32]  # ragged; slots 0 and 1 share 10 tokens (2 pages + 2)
    pool, k, v = _paged_copy(rng, alloc, lengths, 10, K, Hd, init_pages(c, 64, 4)[0])
    alloc.check()
    assert alloc.table[0, :2].tolist() == alloc.table[1, :2].tolist()
    for T in (1, 3):  # decode, and T queries per slot (the last T of each sequence)
        q = jnp.asarray(rng.standard_normal((5, T, H, Hd)), jnp.float32)
        start = np.asarray([max(n - T, 0) for n in lengths], np.int32)
        got = jax.jit(attention_gather, static_argnums=4)(q, pool, alloc.table, start, c)
        want = dense_attention(q, k, v, start[:, None] + np.arange(T))
        live = np.arange(T)[None] < np.asarray(lengths)[:, None]
        assert np.abs(np.asarray(got - want))[live].max() < TOL


@pytest.mark.parametrize("family, window", [("qwen2", None), ("gemma2", 6)])
def test_gather_path_equals_the_kernel_reference(family, window):
    """Same layout and contract as jax's ragged_paged_attention (its pure-JAX reference),
    with Gemma 2's score scale, soft-cap and a sliding window as the kernel's options."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention

    rng = np.random.default_rng(2)
    B, H, K, Hd, ps, P = 4, 8, 2, 32, 8, 40
    c = preset("tiny", family=family).replace(num_heads=H, num_kv_heads=K, head_dim=Hd)
    if family == "gemma2":
        c = c.replace(query_pre_attn_scalar=24.0, attn_logit_softcap=2.0)
    q = jnp.asarray(rng.standard_normal((B, H, Hd)), jnp.float32)
    pages = jnp.asarray(rng.standard_normal((P, ps, 2 * K, Hd)), jnp.float32)
    lens = np.array([5, 17, 1, 40], np.int32)
    table = jnp.asarray(rng.integers(1, P, (B, 5)), jnp.int32)
    got = jax.jit(attention_gather, static_argnums=(4, 5))(q[:, None], pages, table, lens - 1,
                                                           c, window)[:, 0]
    want = jax.jit(lambda q, p, t: ref_ragged_paged_attention(  # lengths concrete: its loop
        q, p, lens, t, np.arange(B + 1, dtype=np.int32), np.array([B], np.int32),
        sm_scale=score_scale(c), sliding_window=window, soft_cap=c.attn_logit_softcap))(
        q, pages, table)
    np.testing.assert_allclose(got, want.reshape(B, -1), atol=TOL)


# ----------------------------------------------------------------------------- the model

# Requests (prompt index, max new tokens) of the model tests: prompt 0 is sampled four
# times, max_new is rarely a multiple of the chunk, so slots finish mid-chunk.
PROMPT_LENS = (9, 4, 14, 6)
REQUESTS = [(0, 11), (1, 6), (0, 13), (2, 5), (3, 14), (0, 3), (2, 9), (1, 12)]
_SETUPS: dict = {}


def setup_family(family):
    """Config, params, one PagedEngine and the dense model's greedy answers, per family
    (shared by the tests: each shape compiles once; attention windows on one family)."""
    if family not in _SETUPS:
        c = tiny(family)
        params = random_params(c, seed=5)
        rng = np.random.default_rng(6)
        base = [rng.integers(1, c.vocab_size, n).tolist() for n in PROMPT_LENS]
        steps = max(m for _, m in REQUESTS)
        tokens, logits = dense_greedy(params, c, [base[p] for p, _ in REQUESTS], steps)
        lp = np.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[..., None], -1)[..., 0]
        eng = PagedEngine(c, num_slots=4, num_pages=64, page_size=4, max_prompt_len=16,
                          max_new_tokens=16,  # 8 pages per slot
                          sampling=GREEDY, chunk_size=4, min_prompt_bucket=16,
                          max_prefill_rows=1, num_windows=2 if family == "qwen2" else 1)
        _SETUPS[family] = dict(config=c, params=params, base=base, engine=eng, tokens=tokens,
                               logits=logits, logprobs=lp, tol=model_tol(logits, c),
                               lp_tol=logprob_tol(logits, c))
    return _SETUPS[family]


@pytest.mark.parametrize("family", DENSE_FAMILIES + ("gemma2", "gemma3"))
def test_paged_decode_equals_dense_decode(family):
    """Four slots in lockstep: the same greedy tokens as the dense cache, log-probs at
    every step and full logits at every chunk boundary within model_tol; prompt 0 is prefilled
    once and its full pages referenced by two samples."""
    f = setup_family(family)
    eng, params, base = f["engine"], f["params"], f["base"]
    reqs = [0, 2, 1, 3]  # requests 0 and 2 share prompt 0
    alloc = PageAllocator(eng.num_pages, eng.page_size, eng.num_slots, eng.pages_per_slot)
    state = eng.init_decode_state()
    handles, logits = {}, {}
    for p in sorted({REQUESTS[r][0] for r in reqs}):
        handles[p] = alloc.alloc_prompt(len(base[p]))
        state, logits[p] = eng.prefill(params, state, [base[p]], [handles[p]])
    for slot, r in enumerate(reqs):
        p, m = REQUESTS[r]
        copies = alloc.attach(slot, handles[p], lookahead=m)
        state = eng.attach(state, logits[p], copies, [slot], [0], [len(base[p])],
                           jax.random.PRNGKey(0), [r], [0], [m])
    for h in handles.values():
        alloc.release_prompt(h)  # the slots keep the pages they reference
    alloc.check()
    assert alloc.refcount[alloc.table[0, :2]].tolist() == [2, 2]  # shared, not copied
    out_t, out_lp, max_logit_diff = [[] for _ in reqs], [[] for _ in reqs], 0.0
    for step in range(0, max(REQUESTS[r][1] for r in reqs), eng.chunk_size):
        live = [s for s, r in enumerate(reqs) if step < REQUESTS[r][1]]
        for s in live:  # the logits the next token is drawn from
            d = np.abs(np.asarray(state.logits[s]) - f["logits"][reqs[s], step]).max()
            max_logit_diff = max(max_logit_diff, d)
        filled = max(len(base[REQUESTS[reqs[s]][0]]) + step for s in live)
        state, chunk = eng.generate(params, state, alloc.table, filled)
        for s in range(len(reqs)):
            out_t[s] += np.asarray(chunk.tokens[s])[np.asarray(chunk.valid[s])].tolist()
            out_lp[s] += np.asarray(chunk.logprobs[s])[np.asarray(chunk.valid[s])].tolist()
    for s, r in enumerate(reqs):
        m = REQUESTS[r][1]
        np.testing.assert_array_equal(out_t[s], f["tokens"][r, :m])
        assert np.abs(np.asarray(out_lp[s]) - f["logprobs"][r, :m]).max() < f["lp_tol"]
    assert max_logit_diff < f["tol"], (max_logit_diff, f["tol"])


@pytest.mark.slow
@pytest.mark.parametrize("family", DENSE_FAMILIES + ("gemma2", "gemma3"))
def test_kernel_arguments_give_the_gather_paths_outputs(family):
    """The arguments the engine's kernel path hands ragged_paged_attention (which cannot run
    here), passed to the kernel's own reference, give the gather path's logits: every
    family (Gemma's windows, reached: the slots hold more than GEMMA_WINDOW tokens), prompt
    0's full pages shared by two slots, and an idle slot whose length is stale and whose
    table row is null: it reads one token of the null page, not up to its old length."""
    from ada.models.paged_attention import PagedKV, paged_forward, reference_decode

    f = setup_family(family)
    eng, params, base, c = f["engine"], f["params"], f["base"], f["config"]
    reqs = [0, 2, 1, 3]  # requests 0 and 2 share prompt 0
    alloc = PageAllocator(eng.num_pages, eng.page_size, eng.num_slots, eng.pages_per_slot)
    state, handles, logits = eng.init_decode_state(), {}, {}
    for p in sorted({REQUESTS[r][0] for r in reqs}):
        handles[p] = alloc.alloc_prompt(len(base[p]))
        state, logits[p] = eng.prefill(params, state, [base[p]], [handles[p]])
    for slot, r in enumerate(reqs):
        p, m = REQUESTS[r]
        state = eng.attach(state, logits[p], alloc.attach(slot, handles[p], lookahead=m),
                           [slot], [0], [len(base[p])], jax.random.PRNGKey(0), [r], [0], [m])
    state, _ = eng.generate(params, state, alloc.table, len(base[2]))  # a chunk: 14 + 4 > 8
    state = eng.stop(state, [3])  # slot 3 idle: its length stays, its pages go back
    alloc.free(3)
    live = np.asarray(state.active)
    assert live.tolist() == [True, True, True, False] and int(state.lengths[3]) > 1
    tokens = jnp.argmax(state.logits, -1).astype(jnp.int32)[:, None]
    kv = PagedKV(pages=state.pages, page_table=jnp.asarray(alloc.table), lengths=state.lengths)
    counts = jnp.asarray(live, jnp.int32)
    want, want_kv = paged_forward(params, c, tokens, kv, counts)
    seen = []

    def reference(q, pages, kv_lens, table, **options):
        seen.append(np.asarray(kv_lens))
        return reference_decode(q, pages, kv_lens, table, **options)

    got, got_kv = paged_forward(params, c, tokens, kv, counts, attention="kernel",
                                blocks=tuned_blocks(c, eng.page_size, eng.num_slots,
                                                    eng.pages_per_slot), kernel=reference)
    assert len(seen) == c.num_layers
    np.testing.assert_array_equal(seen[0], np.where(live, np.asarray(state.lengths) + 1, 1))
    assert np.abs(np.asarray(got - want))[live].max() <= f["tol"]
    # the same writes: the first layer's keys and values bit for bit, later layers' from
    # inputs equal up to rounding
    np.testing.assert_array_equal(np.asarray(got_kv.pages[0]), np.asarray(want_kv.pages[0]))
    for a, b in zip(got_kv.pages[1:], want_kv.pages[1:], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=model_tol(b, c))


def run_paged(eng, alloc, params, requests, lookahead):
    """The driver loop over pages (docs/paged.md): admit FIFO while can_admit (else defer),
    prefill each new prompt once and attach its samples, grow every running slot for the
    chunk or preempt the youngest (requeued at the front, restarted from scratch), run the
    chunk, free finished slots. Checks the allocator after every round, and that no shared
    prompt page changes after its prefill. Returns ({request: (tokens, logprobs)},
    preemptions)."""
    K = eng.chunk_size
    queue = collections.deque(enumerate(requests))
    state, slots, order, done, prompts = eng.init_decode_state(), {}, {}, {}, {}
    preempted, admitted, rounds = 0, 0, 0
    while queue or slots:
        rounds += 1
        assert rounds < 200, "no progress"
        free = [s for s in range(eng.num_slots) if s not in slots]
        starts = []
        while queue and free:
            i, (prompt, mnt) = queue[0]
            key = tuple(prompt)
            if not alloc.can_admit(len(prompt), mnt, prefilled=key in prompts,
                                   lookahead=lookahead):
                if slots or not any(k != key for k in prompts):
                    break  # deferred: stays queued until pages come back
                for k in [k for k in prompts if k != key]:  # nothing runs: evict cached
                    alloc.release_prompt(prompts.pop(k)[0])  # prompts, prefill again later
                continue
            queue.popleft()
            if key not in prompts:  # prefill once; keep its pages' content to compare
                pp = alloc.alloc_prompt(len(prompt))
                state, logits = eng.prefill(params, state, [prompt], [pp])
                prompts[key] = (pp, logits, [np.asarray(p)[pp.pages] for p in state.pages])
            slot = free.pop(0)
            ahead = mnt if lookahead is None else min(lookahead, mnt)
            starts.append((slot, i, key, mnt, alloc.attach(slot, prompts[key][0], ahead)))
            slots[slot] = dict(req=i, n=len(prompt), cap=len(prompt) + mnt, tokens=[], lps=[])
            order[slot], admitted = admitted, admitted + 1
        for slot, i, key, mnt, copies in starts:
            state = eng.attach(state, prompts[key][1], copies, [slot], [0], [len(key)],
                               jax.random.PRNGKey(0), [i], [0], [mnt])
        for key in [k for k in prompts if all(tuple(r[0]) != k for _, r in queue)]:
            alloc.release_prompt(prompts.pop(key)[0])  # no queued request needs it
        demands = {s: min(v["n"] + len(v["tokens"]) + K, v["cap"]) for s, v in slots.items()}
        victims = grow_or_preempt(alloc, demands, order)
        if victims:
            state = eng.stop(state, victims)
            for s in victims:  # back to the front of the queue, oldest first
                v = slots.pop(s)
                queue.appendleft((v["req"], requests[v["req"]]))
            preempted += len(victims)
        alloc.check()
        if not slots:
            continue
        filled = max(v["n"] + len(v["tokens"]) for v in slots.values())
        state, chunk = eng.generate(params, state, alloc.table, filled)
        tokens, lps, valid, active = jax.device_get(
            (chunk.tokens, chunk.logprobs, chunk.valid, chunk.active))
        for s in sorted(slots):
            slots[s]["tokens"] += tokens[s][valid[s]].tolist()
            slots[s]["lps"] += lps[s][valid[s]].tolist()
            if not active[s]:
                v = slots.pop(s)
                done[v["req"]] = (v["tokens"], v["lps"])
                alloc.free(s)
        for pp, _, snap in prompts.values():  # shared prompt pages are read-only
            for p, before in zip(state.pages, snap, strict=True):
                np.testing.assert_array_equal(np.asarray(p)[pp.pages], before)
    alloc.check()
    assert alloc.free_pages() == alloc.num_pages - 1  # every page came back
    return done, preempted


@pytest.mark.parametrize("family", DENSE_FAMILIES + ("gemma3",))
def test_continuous_batching_and_running_out_of_pages(family):
    """Continuous batching over pages equals dense greedy decoding request by request:
    slots finish mid-chunk and are refilled with the freed pages (full reservation: never
    preempts); then with a pool of 8 usable pages admitted by expected fill (a chunk of
    lookahead), requests are deferred and the youngest preempted, and every request still
    comes out exactly as the dense model's."""
    f = setup_family(family)
    requests = [(f["base"][p], m) for p, m in REQUESTS]
    eng = f["engine"]
    for num_pages, lookahead in ((eng.num_pages, None), (NUM_PAGES_SMALL, 4)):
        # the small pool: the allocator hands out only the first pages of the engine's
        alloc = PageAllocator(num_pages, 4, 4, 8, watermark=1 if lookahead else 0)
        done, preempted = run_paged(eng, alloc, f["params"], requests, lookahead)
        assert sorted(done) == list(range(len(requests)))
        for i, (_, m) in enumerate(requests):
            np.testing.assert_array_equal(done[i][0], f["tokens"][i, :m])
            assert np.abs(np.asarray(done[i][1]) - f["logprobs"][i, :m]).max() < f["lp_tol"]
        assert (preempted > 0) == (lookahead is not None), preempted


# ----------------------------------------------------------------------------- TPU and planning


def _compile_kernel_step(c, B, ps, pps, blocks):
    """One paged decode step through the Pallas kernel, compiled for one abstract v5e chip
    (libtpu ahead of time; skipped without it): abstract bf16 decode params, B slots of pps
    pages, a pool of B * pps + 1 pages of ps positions per layer, 1 KV head of 128."""
    import functools

    from ada import tpu
    from ada.models.transformer import decode_params

    try:
        devices, _ = tpu.tpu_devices("v5e:2x2")
    except tpu.SliceError as e:
        pytest.skip(f"libtpu is not usable here: {e}")
    mesh = jax.sharding.Mesh(np.array(devices[:1]), ("x",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    A = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rep)
    params = jax.tree.map(lambda x: A(x.shape, x.dtype), jax.eval_shape(
        lambda: decode_params(jax.tree.map(lambda s: jnp.zeros(s, jnp.bfloat16), param_shapes(c),
                                           is_leaf=lambda x: isinstance(x, tuple)), c)))
    i32 = A((B,), jnp.int32)
    state = PagedState(pages=(A((B * pps + 1, ps, 2, 128), jnp.bfloat16),) * c.num_layers,
                       lengths=i32, logits=A((B, c.vocab_size), jnp.float32), generated=i32,
                       max_new=i32, active=A((B,), bool), keys=A((B, 2), jnp.uint32))
    fn = jax.jit(functools.partial(generate_fn, config=c, sampling=SamplingConfig(), eos_ids=(0,),
                                   num_steps=1, attention="kernel", blocks=blocks),
                 donate_argnums=(1,))
    with jax.set_mesh(mesh):  # the kernel lowers for the mesh's (TPU) devices
        return fn.lower(params, state, A((B, pps), jnp.int32)).compile()


@pytest.mark.slow
def test_kernel_path_compiles_for_v5e():
    """A paged decode step with the Pallas kernel compiles for v5e through libtpu (ahead of
    time, abstract chips), with a pool the size of the 1.5B preset's per-chip cache (80
    slots x 3,072 positions, 1 KV head, page 32) on a 1-layer model: no copy or transpose
    of a pool-sized buffer, the write in place (aliased), one kernel call per layer. The
    kernel's reads are counted from its pages (the compiler's cost analysis cannot see
    them)."""
    import re

    c = known("qwen2.5-math-1.5b").replace(
        hidden_size=256, num_heads=6, num_kv_heads=1, intermediate_size=512, vocab_size=4096,
        num_layers=1, dtype="bfloat16", param_dtype="bfloat16")
    B, ps, pps = 80, 32, 96
    P = B * pps + 1
    blocks = tuned_blocks(c, ps, B, pps)
    assert blocks == (16, 32)  # the table's (96, 32) for v5e, page block capped at 16
    compiled = _compile_kernel_step(c, B, ps, pps, blocks)
    hlo = compiled.as_text()
    pool = f"[{P},{ps},2,128]"
    copies = [line for line in hlo.splitlines() if pool in line
              and re.search(r"= \S+ (copy|copy-start|transpose)\(", line)]
    assert not copies, copies[:3]
    assert hlo.count("ragged_paged_attention_kernel") >= 1
    pool_bytes = P * ps * 2 * 128 * 2
    assert compiled.memory_analysis().alias_size_in_bytes >= pool_bytes  # written in place
    one_page = page_bytes(c, ps)
    full = kernel_read_bytes([3072] * B, ps, blocks[0], one_page)
    assert full == B * pps * one_page  # the whole window: every page once
    assert kernel_read_bytes([700] * B, ps, blocks[0], one_page) == B * 32 * one_page


def test_make_engine_builds_the_kernel_on_tpu_and_it_compiles_for_v5e():
    """make_engine on TPU chips (an abstract v5e:2x2 slice, sampling.mesh (2, 2), the default
    sampling.paged_attention=auto) builds the kernel path with its blocks for v5e, and the
    engine's own generate compiles with a kernel call per layer run on every chip's own
    slots and heads: no collective moves a pool-sized buffer and the pool is not copied. On
    CPU, auto is the gather path and 'kernel' is refused in one line."""
    import re

    from ada import config as C
    from ada import sharding as shd
    from ada import tpu
    from ada.sampling.backends import make_engine

    c = known("qwen2.5-math-1.5b").replace(  # head_dim 128 (the kernel's), 2 KV heads
        hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512, vocab_size=4096,
        num_layers=2, dtype="bfloat16", param_dtype="bfloat16")
    cfg = C.build_config(DEFAULT_CONFIG, [("sampling.kv_cache", "paged"),
                                          ("sampling.num_slots", "16"),
                                          ("sampling.page_size", "16")])
    assert cfg.sampling.paged_attention == "auto"
    assert make_engine(cfg, c, None, None).attention == "gather"  # this CPU
    bad = C.build_config(DEFAULT_CONFIG, [("sampling.kv_cache", "paged"),
                                          ("sampling.paged_attention", "kernel")])
    with pytest.raises(C.ConfigError, match="needs TPU devices") as e:
        make_engine(bad, c, None, None)
    assert "\n" not in str(e.value) and "--config.sampling.paged_attention" in str(e.value)
    try:
        devices, _ = tpu.tpu_devices("v5e:2x2")
    except tpu.SliceError as err:
        pytest.skip(f"libtpu is not usable here: {err}")
    mesh = shd.make_mesh((2, 1, 2), devices)
    eng = make_engine(cfg, c, None, mesh)
    assert eng.attention == "kernel" and eng.blocks == tuned_blocks(
        c, eng.page_size, 8, eng.pages_per_slot, "TPU v5 lite", kv_head_shards=2)
    stacked = jax.eval_shape(lambda: jax.tree.map(
        lambda s: jnp.zeros(s, jnp.bfloat16), param_shapes(c),
        is_leaf=lambda x: isinstance(x, tuple)))
    params = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                          jax.eval_shape(eng._sampling_fn, stacked),
                          shd.param_shardings(jax.eval_shape(eng._sampling_fn, stacked), mesh))
    hlo = eng.lower_generate(params).compile().as_text()
    assert hlo.count("ragged_paged_attention") >= c.num_layers
    pool = eng.num_pages * eng.page_size * 2 * c.num_kv_heads // 2 * c.head_dim * 2  # per chip
    big = [line.strip()[:200] for line in hlo.splitlines()
           if re.search(r"= \S+ (all-gather|all-to-all|collective-permute|all-reduce|copy)"
                        r"(-start)?\(", line)
           and any(int(np.prod([int(d) for d in dims.split(",") if d])) * 2 >= pool
                   for dims in re.findall(r"bf16\[([\d,]*)\]", line.split("(")[0]))]
    assert not big, big[:3]


def test_slots_that_fit_at_mean_fill():
    """The KV budget per chip that the README's 'most that fit' dense slot counts give the
    1.5B (v5e:2x2, sampling.mesh (2, 2)) and 7B (v5e:4x4, (1, 4)) presets, spent on pages at
    a planned mean fill instead of every slot reserving 1,024 + 2,048 positions: at least 2x
    the slots per host with pages living with their slots (pool_shards = data, the engine);
    were every data shard to hold the whole pool, the 1.5B's data 2 would halve that."""
    for name, most, (data, tensor) in (("qwen2.5-math-1.5b", 488, (2, 2)),
                                       ("qwen2.5-math-7b", 169, (1, 4))):
        c = known(name)
        token_bytes = page_bytes(c, 1, kv_head_shards=tensor)
        assert token_bytes == 28 * 2 * 128 * 2  # one KV head per chip, bf16, 28 layers
        budget = most // data * (3072 * token_bytes + 3 * 4 * c.vocab_size / tensor)
        fit = functools.partial(
            slots_that_fit, c, budget, 32, mean_response_len=1024, prompt_len=256,
            max_response_len=2048, max_prompt_len=1024, samples_per_prompt=8,
            kv_head_shards=tensor, slot_shards=data)
        sharded, replicated = fit(pool_shards=data), fit()
        assert sharded["worst_case_slots"] == replicated["worst_case_slots"] == most
        assert sharded["mean_fill_slots"] >= 2 * most, sharded
        assert replicated["mean_fill_slots"] * data == sharded["mean_fill_slots"]


def test_kernel_path_compiles_gemma_options_for_v5e():
    """Gemma 2's local and global layers through the kernel (its own sliding_window,
    soft_cap and sm_scale options) compile for v5e: one kernel call per layer."""
    c = known("gemma-2-2b").replace(
        hidden_size=256, num_heads=2, num_kv_heads=1, head_dim=128, intermediate_size=512,
        vocab_size=4096, num_layers=2, sliding_windows=(64, None), dtype="bfloat16",
        param_dtype="bfloat16")
    B, ps, pps = 16, 16, 8
    hlo = _compile_kernel_step(c, B, ps, pps, tuned_blocks(c, ps, B, pps)).as_text()
    assert hlo.count("ragged_paged_attention_kernel") >= 2
