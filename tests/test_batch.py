"""The train batch (ada/rl/batch.py) cut to the lengths it needs: the same rows and real
tokens as the full layout, and the same update up to float summation order."""

import dataclasses
import types

import jax
import numpy as np
import pytest
from tolerances import assert_same_adam_update

from ada.models import init_params, preset
from ada.rl import train
from ada.rl.batch import BatchLayout, build_train_batch, length_bucket, longest
from ada.rl.optimizer import OptimConfig

CFG = preset("tiny", family="llama")  # no q/k/v biases: see tests/test_train_step.py
FULL = BatchLayout(prompt_len=24, response_len=20, pad_id=0, mini_batches=2)


def collected(P=8, n=4, seed=0, max_prompt=11, max_response=9):
    """A [P, n] collected batch of random prompts and responses, one invalid group slot."""
    rng = np.random.default_rng(seed)
    prompts = [{"prompt_tokens": rng.integers(1, CFG.vocab_size, rng.integers(3, max_prompt + 1)).tolist()}
               for _ in range(P)]
    valid = np.ones((P, n), bool)
    valid[2, 3] = False
    comps = [[types.SimpleNamespace(token_ids=rng.integers(1, CFG.vocab_size,
                                                           rng.integers(1, max_response + 1)).tolist())
              if valid[p, j] else None for j in range(n)] for p in range(P)]
    return types.SimpleNamespace(prompts=prompts, completions=comps, group_valid=valid)


def test_length_bucket_is_the_next_power_of_two_capped():
    for full in (5, 8, 24, 64):
        for n in range(0, full + 1):
            b = length_bucket(n, full)
            want = min(full, max(8, next(2 ** k for k in range(10) if 2 ** k >= n)))
            assert b == want, (n, full)
            assert b >= min(n, full)


def test_trimmed_batch_is_the_full_batch_without_its_padding_columns():
    col = collected()
    adv = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    lp, lr = longest(col)
    assert (lp, lr) == (max(len(p["prompt_tokens"]) for p in col.prompts),
                        max(len(c.token_ids) for row in col.completions for c in row if c))
    assert FULL.fit(lp, lr) == dataclasses.replace(FULL, prompt_len=16, response_len=16)
    full = build_train_batch(col, adv, dataclasses.replace(FULL, trim_padding=False))
    cut = build_train_batch(col, adv, FULL)
    assert all(v.shape[1] == 32 for k, v in cut.items() if k != "advantages")
    keep = np.r_[FULL.prompt_len - 16:FULL.prompt_len + 16]
    assert not full["mask"][:, np.setdiff1d(np.arange(44), keep)].any()  # only padding cut
    for k in ("tokens", "positions", "mask", "response_mask"):
        np.testing.assert_array_equal(cut[k], full[k][:, keep], err_msg=k)
    np.testing.assert_array_equal(cut["advantages"], full["advantages"])
    off = dataclasses.replace(FULL, trim_padding=False)
    assert off.fit(lp, lr) is off


def test_a_streamed_batch_carries_each_tokens_behaviour_logp_and_lag():
    """With the training version, each response token's sampler log-prob and its lag
    (version - the version that sampled it) sit at the token's position; elsewhere 0."""
    col = collected()
    rng = np.random.default_rng(2)
    for row in col.completions:
        for c in row:
            if c is not None:
                c.logprobs = (-rng.exponential(1.0, len(c.token_ids))).tolist()
                c.versions = sorted(rng.integers(3, 6, len(c.token_ids)).tolist())
    adv = np.zeros((8, 4), np.float32)
    plain = build_train_batch(col, adv, FULL)
    assert "lag" not in plain and "behav_logp" not in plain
    batch = build_train_batch(col, adv, FULL, version=5)
    Tp = batch["tokens"].shape[1] - FULL.fit(*longest(col)).response_len
    for c in (c for row in col.completions for c in row if c is not None):
        want = np.zeros(batch["tokens"].shape[1], np.int32)
        # mini_batches=2 permutes the rows: find the response's row by its tokens
        b = next(i for i in range(32) if list(batch["tokens"][i, Tp:Tp + len(c.token_ids)])
                 == c.token_ids and batch["response_mask"][i].sum() == len(c.token_ids))
        want[Tp:Tp + len(c.token_ids)] = 5 - np.asarray(c.versions)
        np.testing.assert_array_equal(batch["lag"][b], want)
        np.testing.assert_allclose(batch["behav_logp"][b, Tp:Tp + len(c.token_ids)],
                                   c.logprobs, rtol=1e-6)
    assert batch["lag"].max() == 2 and (batch["lag"][batch["response_mask"] == 0] == 0).all()


def test_a_prompt_longer_than_the_layout_is_named():
    col = collected(max_prompt=11)
    with pytest.raises(ValueError, match="prompt_len=8.*longest"):
        build_train_batch(col, np.zeros((8, 4), np.float32), FULL, lengths=(4, 5))


@pytest.mark.slow
@pytest.mark.numerics
def test_update_on_the_trimmed_batch_equals_the_full_one():
    """The same old log-probs, metrics and Adam update (two epochs of two mini-batches of
    two micro-batches), up to the float summation order of the shorter rows, which Adam's
    normalisation magnifies for parameters whose gradient is ~0 (tolerances.py)."""
    config = train.TrainConfig(optim=OptimConfig(lr=1e-3, warmup_steps=0), epochs=2,
                               mini_batches=2, micro_batches=2)
    col = collected(seed=3)
    adv = np.random.default_rng(4).normal(size=(8, 4)).astype(np.float32)
    fns = train.make_train_fns(CFG, config)
    params = init_params(CFG, jax.random.key(0))
    fitted = FULL.fit(*longest(col))
    keep = np.r_[FULL.prompt_len - fitted.prompt_len:FULL.prompt_len + fitted.response_len]
    out = []
    for layout in (dataclasses.replace(FULL, trim_padding=False), FULL):
        state = fns.init_state(jax.tree.map(np.copy, params))
        batch = fns.add_logps(state, fns.shard_batch(build_train_batch(col, adv, layout)))
        state, m = fns.train_step(state, batch)
        out.append(dict(logp=np.asarray(batch["old_logp"]),
                        response=np.asarray(batch["response_mask"]) > 0,
                        params=jax.device_get(state.params), metrics=jax.device_get(m)))
    full, cut = out
    assert cut["logp"].shape[1] == len(keep) < full["logp"].shape[1]
    np.testing.assert_array_equal(cut["response"], full["response"][:, keep])
    np.testing.assert_allclose(cut["logp"][cut["response"]], full["logp"][full["response"]],
                               rtol=1e-5)
    for k in full["metrics"]:
        np.testing.assert_allclose(cut["metrics"][k], full["metrics"][k], rtol=1e-4,
                                   atol=1e-6, err_msg=k)
    assert_same_adam_update(params, cut["params"], full["params"], lr=config.optim.lr,
                            updates=config.epochs * config.mini_batches)
