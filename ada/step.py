"""One RL step, top-down: collect -> select -> advantages -> batch -> update -> metrics.

    collected = rollout.collect(params, prompts, key)     ada/rollout.py -> ada/adaptive
                                                          (rounds, exit rules, selection);
                                                          the run's loop takes it from
                                                          ada/stream.py instead
    advantages = methods.advantages(method, collected)    ada/methods.py -> ada/rl/advantages
    batch = build_train_batch(collected, advantages)      ada/rl/batch.py (cut to its lengths)
    batch = fns.add_logps(state, batch, ref_params)       ada/rl/train.py (old / reference logp)
    state, m = fns.train_step(state, batch)               ada/rl/train.py (PPO-clip, AdamW)
    metrics = step_metrics(collected, m)                  here, summed over processes

Every input is explicit, so the step runs the same in the loop, a benchmark or a test.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from ada import distributed, methods
from ada.adaptive.collect import Collected
from ada.rl.batch import BatchLayout, build_train_batch, longest, to_global
from ada.rl.train import TrainFns, TrainState
from ada.rollout import Rollout
from ada.trajectory import env_metrics

ROUNDS_LOGGED = 64  # per-round counts kept per step (DAPO runs a few batches of N rounds)


def rl_step(state: TrainState, prompts: list[dict], key, *, rollout: Rollout, fns: TrainFns,
            method: str, layout: BatchLayout, normalize_std: bool | None = None,
            ref_params=None, more_prompts=None, caps=None,
            update_diagnostics: bool = False) -> tuple[TrainState, dict, Collected]:
    """One collection and update on this process's `prompts`; returns (state, metrics, the
    collected batch). `state` is donated under a mesh: use the returned one.

    caps: per prompt, the samples it may draw (`ada.adaptive.allocation.allocate` over a
    success memory; a run's are ada/run/allocator.py's); None: M x N each.

    update_diagnostics: also log how the update moved the batch's own responses
    (`update_diagnostics`); costs two more forward passes over the batch."""
    t0 = time.perf_counter()
    collected = rollout.collect(state.params, prompts, key, more_prompts, caps=caps)
    t1 = time.perf_counter()
    state, metrics = update_step(state, collected, fns=fns, method=method, layout=layout,
                                 normalize_std=normalize_std, ref_params=ref_params,
                                 update_diagnostics=update_diagnostics)
    metrics["time_collect_s"] = t1 - t0
    metrics["time_update_s"] = time.perf_counter() - t1
    return state, metrics, collected


def update_step(state: TrainState, collected: Collected, *, fns: TrainFns, method: str,
                layout: BatchLayout, normalize_std: bool | None = None, ref_params=None,
                update_diagnostics: bool = False,
                version: int | None = None) -> tuple[TrainState, dict]:
    """The update half of `rl_step` on a collected batch: advantages, batch, log-probs,
    train step, metrics. `version` (the policy version of `state`; the loop passes it at
    every rl.max_staleness, where at k = 0 every lag is 0): the batch also carries each
    token's behaviour log-prob and lag behind it, for the decoupled objective
    (ada/rl/losses.py: `is_weights`)."""
    adv_PxN = methods.advantages(method, collected, normalize_std)
    lengths = None  # the batch's own; across processes, one shape for the global batch
    if jax.process_count() > 1:
        lengths = distributed.allgather(longest(collected)).max(axis=0)
    batch = build_train_batch(collected, adv_PxN, layout, lengths, version=version)
    batch = fns.shard_batch(batch) if jax.process_count() == 1 else to_global(batch, fns.mesh)
    batch = fns.add_logps(state, batch, ref_params)
    if update_diagnostics:
        logp_before = fns.response_logp(state.params, batch)
    state, train_m = fns.train_step(state, batch)
    if update_diagnostics:
        train_m = dict(train_m, **_update_effect(logp_before, fns.response_logp(
            state.params, batch), batch["advantages"], batch["response_mask"]))
    return state, step_metrics(collected, jax.device_get(train_m))


@jax.jit
def _update_effect(before_B, after_B, adv_B, response_mask_BxT) -> dict:
    """What one update did to the responses it trained on, split by the advantage's sign:
    the mean advantage and the mean change of a response's log-probability (summed over its
    tokens), and KL(old || new) per token estimated on these samples of the old policy.
    A working update raises the positives and lowers the negatives; if both fall together
    the step is noise (e.g. Adam's sign-like steps on a small batch)."""
    def mean(x, m):
        return jnp.sum(jnp.where(m, x, 0.0)) / jnp.maximum(jnp.sum(m), 1)
    pos, neg, change = adv_B > 0, adv_B < 0, after_B - before_B
    return {"adv_pos_mean": mean(adv_B, pos), "adv_neg_mean": mean(adv_B, neg),
            "logp_change_pos": mean(change, pos), "logp_change_neg": mean(change, neg),
            "update_kl": -jnp.sum(change) / jnp.maximum(jnp.sum(response_mask_BxT), 1)}


def step_metrics(collected: Collected, train_m: dict) -> dict:
    """Per-step statistics; the counts behind them are summed over processes, so every
    process logs the same numbers.

    reward_round0_mean is the policy's own accuracy on the batch (first round's draws);
    reward_mean averages the kept [P, n] groups, which balanced selection pulls towards 1/2.
    """
    P = collected.group_valid.shape[0]
    kept_r = np.where(collected.group_valid, collected.rewards, 0.0)
    active, lack_pos, lack_neg = (np.zeros(ROUNDS_LOGGED, np.int64) for _ in range(3))
    for rd in collected.rounds:
        if rd.get("round", 0) < ROUNDS_LOGGED:
            active[rd["round"]] += rd["active_prompts"]
            lack_pos[rd["round"]] += rd.get("lacking_pos", 0)
            lack_neg[rd["round"]] += rd.get("lacking_neg", 0)
    lengths = [len(c.token_ids) for row in collected.completions for c in row if c is not None]
    cm = collected.metrics
    local = np.concatenate([
        [P, kept_r.sum(), collected.group_valid.sum(), (~collected.mixed).sum(),
         # every response drawn (DAPO's discarded prompt batches too), not only kept rows'
         cm.get("samples", collected.samples.sum()), collected.done.sum(), sum(lengths),
         len(lengths), cm.get("reward_failures", 0), collected.pool.pos.sum(),
         (collected.pool.pos + collected.pool.neg).sum(), cm.get("round0_reward_sum", 0.0),
         cm.get("round0_samples", 0), cm.get("prefilled_prompts", 0),
         cm.get("prefilled_tokens", 0), cm.get("page_copies", 0)], active, lack_pos,
        lack_neg]).astype(np.float64)
    rounds_per_process = distributed.allgather(np.int64(len(collected.rounds)))
    g = distributed.global_sum(local)
    (Pg, rsum, nvalid, zero_var, samples, done, toks, nresp, fails, pos, seen, r0sum,
     r0n, prefilled, prefill_tokens, copies) = g[:16]
    act, lack_pos, lack_neg = np.split(g[16:], 3)
    last_round = int(np.max(np.nonzero(act)[0]) + 1) if act.any() else 1
    m = {
        "reward_round0_mean": r0sum / max(r0n, 1),  # the policy's accuracy on this batch
        "reward_mean": rsum / max(nvalid, 1),  # over the selected [P, n] responses
        "pool_reward_mean": pos / max(seen, 1),  # share positive over every response drawn
        "zero_variance_share": zero_var / Pg,
        "samples_per_prompt": samples / Pg,
        "samples": samples,
        "exited_share": done / Pg,
        "response_tokens_mean": toks / max(nresp, 1),
        "reward_failures": fails,
        "rounds_per_process": [int(x) for x in rounds_per_process],
        "active_prompts_per_round": [int(a) for a in act[:last_round]],
        # after each round's draws, how many of its prompts still lack the positives /
        # negatives of a balanced group (ada/adaptive/collect.py: _lacking)
        "lacking_pos_per_round": [int(a) for a in lack_pos[:last_round]],
        "lacking_neg_per_round": [int(a) for a in lack_neg[:last_round]],
        "lacking_pos_share_round0": lack_pos[0] / max(act[0], 1),
        "lacking_neg_share_round0": lack_neg[0] / max(act[0], 1),
        # the sampler's prefill work for the collection (a prompt kept across rounds is
        # prefilled once: Driver.keep_prompts) and the paged cache's partial-page copies
        "prefilled_prompts": prefilled,
        "prefill_tokens": prefill_tokens,
        "page_copies": copies,
    }
    if "env" in cm:  # trajectories with tools (ada/trajectory.py)
        m.update(env_metrics(cm["env"]))
    m.update({k: float(v) for k, v in train_m.items()})
    return m
