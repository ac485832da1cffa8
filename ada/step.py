"""One RL step, top-down: collect -> select -> advantages -> batch -> update -> metrics.

    collected = rollout.collect(params, prompts, key)     ada/rollout.py -> ada/adaptive
                                                          (rounds, exit rules, selection)
    advantages = methods.advantages(method, collected)    ada/methods.py -> ada/rl/advantages
    batch = build_train_batch(collected, advantages)      ada/rl/batch.py
    batch = fns.add_logps(state, batch, ref_params)       ada/rl/train.py (old / reference logp)
    state, m = fns.train_step(state, batch)               ada/rl/train.py (PPO-clip, AdamW)
    metrics = step_metrics(collected, m)                  here, summed over processes

Every input is explicit, so the step runs the same in the loop, a benchmark or a test.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from ada import distributed, methods
from ada.adaptive.collect import Collected
from ada.rl.batch import BatchLayout, build_train_batch, to_global
from ada.rl.train import TrainFns, TrainState
from ada.rollout import Rollout

ROUNDS_LOGGED = 64  # per-round counts kept per step (DAPO runs a few batches of N rounds)


def rl_step(state: TrainState, prompts: list[dict], key, *, rollout: Rollout, fns: TrainFns,
            method: str, layout: BatchLayout, normalize_std: bool | None = None,
            ref_params=None, more_prompts=None) -> tuple[TrainState, dict, Collected]:
    """One collection and update on this process's `prompts`; returns (state, metrics, the
    collected batch). `state` is donated under a mesh: use the returned one."""
    t0 = time.perf_counter()
    collected = rollout.collect(state.params, prompts, key, more_prompts)
    t1 = time.perf_counter()
    adv_PxN = methods.advantages(method, collected, normalize_std)
    batch = build_train_batch(collected, adv_PxN, layout)
    batch = fns.shard_batch(batch) if jax.process_count() == 1 else to_global(batch, fns.mesh)
    batch = fns.add_logps(state, batch, ref_params)
    state, train_m = fns.train_step(state, batch)
    metrics = step_metrics(collected, jax.device_get(train_m))
    metrics["time_collect_s"] = t1 - t0
    metrics["time_update_s"] = time.perf_counter() - t1
    return state, metrics, collected


def step_metrics(collected: Collected, train_m: dict) -> dict:
    """Per-step statistics; the counts behind them are summed over processes, so every
    process logs the same numbers.

    reward_round0_mean is the policy's own accuracy on the batch (first round's draws);
    reward_mean averages the kept [P, n] groups, which balanced selection pulls towards 1/2.
    """
    P = collected.group_valid.shape[0]
    kept_r = np.where(collected.group_valid, collected.rewards, 0.0)
    active = np.zeros(ROUNDS_LOGGED, np.int64)
    for rd in collected.rounds:
        if rd.get("round", 0) < ROUNDS_LOGGED:
            active[rd["round"]] += rd["active_prompts"]
    lengths = [len(c.token_ids) for row in collected.completions for c in row if c is not None]
    cm = collected.metrics
    local = np.concatenate([
        [P, kept_r.sum(), collected.group_valid.sum(), (~collected.mixed).sum(),
         collected.samples.sum(), collected.done.sum(), sum(lengths), len(lengths),
         cm.get("reward_failures", 0), collected.pool.pos.sum(),
         (collected.pool.pos + collected.pool.neg).sum(), cm.get("round0_reward_sum", 0.0),
         cm.get("round0_samples", 0)], active]).astype(np.float64)
    rounds_per_process = distributed.allgather(np.int64(len(collected.rounds)))
    g = distributed.global_sum(local)
    (Pg, rsum, nvalid, zero_var, samples, done, toks, nresp, fails, pos, seen, r0sum,
     r0n) = g[:13]
    act = g[13:]
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
    }
    m.update({k: float(v) for k, v in train_m.items()})
    return m
