"""The training loop: config -> setup -> (resume) -> RL steps, evals, checkpoints -> summary.

Everything random in a step derives from fold_in(key(seed), step), and the data iterator's
position is checkpointed, so a run killed at any point and restarted from its latest
checkpoint ends with the same parameters and metrics as an uninterrupted one. The KL
reference (loss.kl_coef > 0) is the initial policy, rebuilt by the setup on resume.

Multi-host: each process collects its own shard of the prompts (ada/rollout.py); metrics
are summed over processes (ada/step.py) and written by process 0; the update is one SPMD
train step over the global mesh with the fixed [P, n] batch shape.
"""

from __future__ import annotations

import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from ada import distributed, setup
from ada import sharding as shd
from ada.checkpoint import Checkpointer
from ada.data.iterator import PromptIterator
from ada.evaluation import evaluate_policy
from ada.export import export_hf
from ada.metrics import MetricsWriter, Progress, plot_run, read_jsonl
from ada.rl.batch import BatchLayout
from ada.rl.train import TrainState
from ada.step import rl_step

log = logging.getLogger("ada.loop")


def state_tree(state: TrainState, rng_data) -> dict:
    """What a checkpoint holds besides its JSON meta (the data and sampler counters)."""
    return {"params": state.params, "opt_state": state.opt_state, "step": state.step,
            "updates": state.updates, "skipped": state.skipped,
            "rng": np.asarray(jax.device_get(rng_data))}  # host value, same on every process


def evaluate_held_out(s: setup.Setup, params) -> dict:
    """The run's held-out avg@k / pass@k (eval section), the same draws at every eval."""
    e = s.config.eval
    return evaluate_policy(s.eval_rollout, params, s.eval_records, samples=e.samples,
                           pass_k=e.pass_k, threshold=s.config.adaptive.positive_threshold,
                           seed=s.config.seed)


def train(config, workdir: str, *, stop_after: int | None = None) -> dict:
    """Run (or resume) training; returns the final summary dict."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    c = config
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    main = distributed.is_main()
    t0 = time.perf_counter()
    s = setup.build(c)
    setup_s = time.perf_counter() - t0
    if main:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(c.to_dict(), f, indent=2, sort_keys=True, default=str)

    iterator = PromptIterator(s.train_records, c.data.prompts_per_step, seed=c.seed,
                              process_index=jax.process_index(),
                              process_count=jax.process_count(), shuffle=c.data.shuffle)
    layout = BatchLayout(prompt_len=s.rollout.engine.max_prompt_len,
                         response_len=c.sampling.max_new_tokens, pad_id=s.tokenizer.pad_id,
                         mini_batches=c.train.mini_batches, trim_padding=c.train.trim_padding)
    state = s.fns.init_state(s.params)
    # a copy: the train step donates the state's buffers under a mesh
    ref_params = jax.tree.map(jnp.copy, state.params) if c.loss.kl_coef > 0 else None
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep=c.checkpoint.keep)
    base_key = jax.random.key(c.seed)
    start, counters = 0, {"samples_total": 0, "prompts_total": 0}
    resumed = ckpt.latest_step() is not None
    if resumed:
        tree, meta, start = ckpt.restore(state_tree(state, jax.random.key_data(base_key)))
        state = state.replace(**{k: tree[k] for k in ("params", "opt_state", "step", "updates",
                                                      "skipped")})
        base_key = jax.random.wrap_key_data(np.asarray(tree["rng"]))
        iterator.set_state(meta["data"])
        counters = meta.get("sampler", counters)
        log.info("resumed from step %d (%s)", start, ckpt.directory)

    writer = MetricsWriter(workdir, tensorboard=c.log.tensorboard,
                           resume_step=start if resumed else None, enabled=main)
    bar = Progress(c.train.steps, initial=start, enabled=main and c.log.progress)
    if not resumed:
        first = evaluate_held_out(s, state.params) if c.eval.every else {}
        writer.write(0, {"warmstart_loss": s.warm_info.get("loss"),
                         "warmstart_cached": s.warm_info.get("cached"),
                         "dropped_prompts": s.dropped_prompts, "setup_s": setup_s, **first})
        bar.update(first, n=0)  # the starting accuracy, shown until the next eval

    step, t_run = start, time.perf_counter()
    while step < c.train.steps:
        step += 1
        state, m, _ = rl_step(state, next(iterator), jax.random.fold_in(base_key, step),
                              rollout=s.rollout, fns=s.fns, method=c.method, layout=layout,
                              normalize_std=c.adaptive.normalize_std, ref_params=ref_params,
                              more_prompts=iterator,
                              update_diagnostics=c.log.update_diagnostics)
        counters = {"samples_total": int(counters["samples_total"] + m["samples"]),
                    "prompts_total": int(counters["prompts_total"] + c.data.prompts_per_step)}
        m["samples_total"] = counters["samples_total"]
        if c.eval.every and (step % c.eval.every == 0 or step == c.train.steps):
            m.update(evaluate_held_out(s, state.params))
        writer.write(step, m)
        bar.update(m)
        if step % c.checkpoint.every == 0 or step == c.train.steps:
            ckpt.save(step, state_tree(state, jax.random.key_data(base_key)),
                      {"data": iterator.get_state(), "sampler": counters, "method": c.method})
        if stop_after is not None and step >= stop_after:
            break
    bar.close()
    writer.close()

    summary = {"steps": step, "seconds": time.perf_counter() - t_run,
               "samples_total": counters["samples_total"], "method": c.method}
    if c.checkpoint.export_hf and step >= c.train.steps:
        params = shd.gather_to_host(state.params)  # every process joins
        if main:
            summary["hf"] = os.path.join(workdir, "hf")
            export_hf(params, s.model_cfg, s.tokenizer, summary["hf"])
    if main:
        evals = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
                 if r.get("eval_accuracy") is not None]
        if evals:
            summary["eval_accuracy_first"] = evals[0]["eval_accuracy"]
            summary["eval_accuracy_final"] = evals[-1]["eval_accuracy"]
        if c.log.plots:
            summary["plot"] = plot_run(workdir)
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True, default=str)
    distributed.sync("train_end")
    return summary
