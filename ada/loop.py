"""The training loop: config -> setup -> (resume) -> RL steps, evals, checkpoints -> summary.

Everything random in a step derives from fold_in(key(seed), step), and the data iterator's
position is checkpointed, so a run killed at any point and restarted from its latest
checkpoint ends with the same parameters and metrics as an uninterrupted one. The KL
reference (loss.kl_coef > 0) is the initial policy, rebuilt by the setup on resume.

A run folder is never broken by a later command: before anything is written, a resume's
config is compared with the run's `config.json` (`check_resume`); a change to what the
checkpoint holds or to the training recipe is refused (ConfigError) unless forced, and the
changes a resume may make (steps, evaluation, logging, checkpoint cadence) are recorded in
`config_history.jsonl`, with config.json left as it was. config.json is written only once a
checkpoint is restored (or on a fresh start), so nothing a failed start does reaches it.

Faults (docs/reliability.md): a Preemption (SIGTERM / SIGINT, ada/preemption.py) ends the
loop after the current step with a checkpoint every process joins; a full disk stops it with
StorageError (ada/checkpoint.py); `optim.max_skipped_in_row` steps in a row with a non-finite
update, or parameters that are no longer finite, stop it with RunError and no checkpoint of
the bad state.

Multi-host: each process collects its own shard of the prompts (ada/rollout.py); metrics
are summed over processes (ada/step.py) and written by process 0; the update is one SPMD
train step over the global mesh with the fixed [P, n] batch shape.

Batches come from the stream (ada/stream.py): at rl.max_staleness = 0 each step's batch is
sampled by the weights of the step before, exactly as `ada.step.rl_step` would; above 0 the
next steps' prompts sample while a step drains, at most k versions behind. A checkpoint
holds the data position after the batch it trained; batches in flight are drawn again.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np

from ada import distributed, knobs, paths, quiet, setup, watch
from ada import sharding as shd
from ada.checkpoint import FAULT_ENV, Checkpointer, StorageError, complete_steps, storage_errno
from ada.config import ConfigError, load_run_config
from ada.data.iterator import PromptIterator
from ada.evaluation import evaluate_policy
from ada.export import export_hf
from ada.metrics import MetricsWriter, Progress, plot_run, read_jsonl
from ada.preemption import Preemption
from ada.rl.batch import BatchLayout
from ada.rl.optimizer import all_finite
from ada.rl.train import TrainState
from ada.step import update_step
from ada.stream import Stream
from ada.tracking import TrackingError, WandbLogger

log = logging.getLogger("ada.loop")
HISTORY_FILE = "config_history.jsonl"
_all_finite = jax.jit(all_finite)


class RunError(RuntimeError):
    """A run that cannot go on (non-finite updates or parameters); one line for the user."""


def state_tree(state: TrainState, rng_data) -> dict:
    """What a checkpoint holds besides its JSON meta (the data and sampler counters)."""
    return {"params": state.params, "opt_state": state.opt_state, "step": state.step,
            "updates": state.updates, "skipped": state.skipped,
            "rng": np.asarray(jax.device_get(rng_data))}  # host value, same on every process


def evaluate_held_out(s: setup.Setup, params, stream: Stream) -> dict:
    """The run's held-out avg@k / pass@k (eval section), the same draws at every eval, on
    the stream's sampler (`Stream.sample`: no second copy of the weights)."""
    e = s.config.eval
    return evaluate_policy(stream.sampler(s.eval_rollout), params, s.eval_records, samples=e.samples,
                           pass_k=e.pass_k, threshold=s.config.adaptive.positive_threshold,
                           seed=s.config.seed)


def check_resume(config, workdir: str, force: bool = False) -> dict | None:
    """Compare `config` with the run's saved config.json, reading only. None: nothing saved
    (a new run). Else what changed: {"changes": {key: [saved, new]}, "forced": bool,
    "restart": no complete checkpoint (anything may change)}. Raises ConfigError (one line)
    for a change knobs.resume_changes refuses, unless `force`."""
    if not paths.path(workdir).joinpath("config.json").exists():
        return None
    try:
        saved = load_run_config(workdir)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{workdir}/config.json cannot be read ({e}); pass another "
                          "--workdir") from None
    refused, allowed = knobs.resume_changes(saved, config)
    restart = not complete_steps(paths.join(workdir, "checkpoints"))
    if refused and not (force or restart):
        raise ConfigError(knobs.refusal(workdir, refused))
    return {"changes": {k: [a, b] for k, a, b in refused + allowed},
            "forced": bool(refused) and not restart, "restart": restart}


def _write_json(path: str, obj, what: str, *, append: bool = False) -> None:
    """Write (atomically) or append one JSON document; a full disk is a StorageError."""
    try:
        if append:
            paths.append_text(path, json.dumps(obj, sort_keys=True, default=str) + "\n")
        else:
            paths.write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))
    except OSError as e:
        code = storage_errno(e)
        if code is None:
            raise
        raise StorageError(what, path, code) from None


def record_config(config, workdir: str, resume: dict | None, step: int) -> None:
    """config.json for a new run, a restart or a forced change; a history line for every
    change (process 0 only)."""
    if not distributed.is_main():
        return
    if resume is None or resume["restart"] or resume["forced"]:
        _write_json(paths.join(workdir, "config.json"), config.to_dict(), "the run's config")
    if resume and resume["changes"]:
        _write_json(paths.join(workdir, HISTORY_FILE), {
            "time": datetime.datetime.now().isoformat(timespec="seconds"), "step": step,
            "changes": resume["changes"], "forced": resume["forced"],
            "restart": resume["restart"]}, "the config history", append=True)


def train(config, workdir: str, *, stop_after: int | None = None, force_config: bool = False,
          preemption: Preemption | None = None, observe=None) -> dict:
    """Run (or resume) training; returns the final summary dict. `preemption` (the command
    line's): stop after the step a signal arrives in, with a checkpoint (summary["stopped"]).
    `observe(phase, step, stream)`, if given, is called at each phase boundary (init, collect,
    update, handoff, eval, save): what the chips hold there is what ada.plan's memory
    ledger says (tests/test_memory.py).
    Raises ConfigError before writing anything when a resume's config is refused."""
    quiet.quiet_logging()
    workdir = str(paths.path(workdir))
    resume = check_resume(config, workdir, force_config)
    try:
        return _train(config, workdir, resume, stop_after, preemption, observe)
    except StorageError as e:
        last = complete_steps(paths.join(workdir, "checkpoints"))
        e.resume = f"step {last[-1]}" if last else "the start"
        raise


def start_tracker(c, workdir: str):
    """The W&B run of this run directory (log.wandb), before anything expensive starts."""
    try:
        return WandbLogger(workdir, c.to_dict(), project=c.log.wandb_project,
                           entity=c.log.wandb_entity, mode=c.log.wandb_mode)
    except TrackingError as e:
        raise ConfigError(str(e)) from None


def prompts_and_layout(c, s: setup.Setup) -> tuple[PromptIterator, BatchLayout]:
    """This process's prompt iterator and the train batches' layout of a run."""
    iterator = PromptIterator(s.train_records, c.data.prompts_per_step, seed=c.seed,
                              process_index=jax.process_index(),
                              process_count=jax.process_count(), shuffle=c.data.shuffle)
    layout = BatchLayout(prompt_len=s.rollout.engine.max_prompt_len,
                         response_len=c.sampling.max_new_tokens, pad_id=s.tokenizer.pad_id,
                         mini_batches=c.train.mini_batches, trim_padding=c.train.trim_padding)
    return iterator, layout


def _train(c, workdir: str, resume, stop_after, preemption, observe) -> dict:
    t_invocation = time.perf_counter()
    observe = observe or (lambda phase, step, stream: None)
    main = distributed.is_main()
    tracker = start_tracker(c, workdir) if main and c.log.wandb else None
    s = setup.build(c)
    setup_s = time.perf_counter() - t_invocation

    iterator, layout = prompts_and_layout(c, s)
    state = s.fns.init_state(s.params)
    # a copy: the train step donates the state's buffers under a mesh (LoRA's reference is
    # the frozen base inside the state: no copy)
    ref_params = (jax.tree.map(jnp.copy, state.params)
                  if c.loss.kl_coef > 0 and not c.model.lora.rank else None)
    try:
        ckpt = Checkpointer(paths.join(workdir, "checkpoints"), keep=c.checkpoint.keep)
    except OSError as e:
        if storage_errno(e) is None:
            raise
        raise StorageError("checkpoints to", workdir, storage_errno(e)) from None
    ckpt.clean_partial()
    base_key = jax.random.key(c.seed)
    start, counters, run_s = 0, {"samples_total": 0, "prompts_total": 0}, 0.0
    guard = {"skipped_steps": 0, "skipped_in_row": 0}
    resumed = ckpt.latest_step() is not None
    if resumed:
        try:
            tree, meta, start = ckpt.restore(state_tree(state, jax.random.key_data(base_key)))
        except Exception as e:  # noqa: BLE001 - e.g. a forced model change: shapes differ
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise ConfigError(f"checkpoint {ckpt.latest_step()} in {ckpt.directory} does not fit "
                              f"this config ({first}); resume with the run's own settings, or "
                              "start a new run with another --workdir") from None
        state = state.replace(**{k: tree[k] for k in ("params", "opt_state", "step", "updates",
                                                      "skipped")})
        base_key = jax.random.wrap_key_data(np.asarray(tree["rng"]))
        iterator.set_state(meta["data"])
        counters = meta.get("sampler", counters)
        guard = meta.get("guard", guard)
        run_s = meta.get("seconds", run_s)  # the earlier segments' (0: saved before it was kept)
        log.info("resumed from step %d (%s)", start, ckpt.directory)
    record_config(c, workdir, resume, start)

    writer = MetricsWriter(workdir, tensorboard=c.log.tensorboard,
                           resume_step=start if resumed else None, enabled=main, tracker=tracker)
    bar = Progress(c.train.steps, initial=start, enabled=main, bar=c.log.progress, every=c.log.every)
    saved = start if resumed else None

    def resume_text(at):
        return f"to resume from step {at} (the latest checkpoint)" if at else "to start again"

    step = start

    def hint(at):
        if preemption is not None:  # read when its line is due: a save may complete meanwhile
            preemption.training(lambda: resume_text(ckpt.latest_step()), lambda: step)
        watch.set_resume_hint(f"rerun the same command on every host {resume_text(at)}")

    k = c.rl.max_staleness
    stream = Stream(s.rollout, state.params, iterator, base_key, max_staleness=k,
                    version=start, last_step=c.train.steps,
                    threaded=c.rl.sampler_devices > 0)
    observe("init", start, stream)
    hint(saved)
    if not resumed:
        first = evaluate_held_out(s, state.params, stream) if c.eval.every else {}
        observe("eval", start, stream)
        writer.write(0, {"warmstart_loss": s.warm_info.get("loss"),
                         "warmstart_cached": s.warm_info.get("cached"),
                         "dropped_prompts": s.dropped_prompts, "setup_s": setup_s, **first})
        bar.update(first, n=0)  # the starting accuracy, shown until the next eval

    def save(at):
        # the data position after batch `at`: the batches in flight are drawn again on resume
        ckpt.save(at, state_tree(state, jax.random.key_data(base_key)),
                  {"data": stream.data_state(), "sampler": counters, "method": c.method,
                   "guard": guard, "seconds": run_s})
        hint(ckpt.last_complete)  # `at` is written while the next steps run
        return at

    t_run, run_s0 = time.perf_counter(), run_s
    stopped = preemption.requested() if preemption else None  # e.g. during the first eval
    try:
        while step < c.train.steps and not stopped:
            step += 1
            _injected_fault(step)
            t0 = time.perf_counter()
            collected, streamed = stream.next_batch()
            observe("collect", step, stream)
            t1 = time.perf_counter()
            state, m = update_step(state, collected, fns=s.fns, method=c.method, layout=layout,
                                   normalize_std=c.adaptive.normalize_std,
                                   ref_params=ref_params,
                                   update_diagnostics=c.log.update_diagnostics,
                                   version=step - 1)
            observe("update", step, stream)
            stream.set_params(state.params, step)
            observe("handoff", step, stream)
            m.update(time_collect_s=t1 - t0, time_update_s=time.perf_counter() - t1,
                     **stream_metrics(streamed))
            counters = {"samples_total": int(counters["samples_total"] + m["samples"]),
                        "prompts_total": int(counters["prompts_total"] + c.data.prompts_per_step)}
            m["samples_total"] = counters["samples_total"]
            skipped = bool(m.get("skipped", 0) > 0)
            guard = {"skipped_steps": guard["skipped_steps"] + skipped,
                     "skipped_in_row": guard["skipped_in_row"] + 1 if skipped else 0}
            m["skipped_steps"] = guard["skipped_steps"]
            finite = bool(jax.device_get(_all_finite(state.params)))
            if c.eval.every and finite and (step % c.eval.every == 0 or step == c.train.steps):
                m.update(evaluate_held_out(s, state.params, stream))
                observe("eval", step, stream)
            writer.write(step, m)
            bar.update(m)
            _check_finite(c, step, finite, guard, saved)
            run_s = run_s0 + time.perf_counter() - t_run  # to this step's end, as it is saved
            if step % c.checkpoint.every == 0 or step == c.train.steps:
                saved = save(step)
                observe("save", step, stream)
            if stop_after is not None and step >= stop_after:
                break
            stopped = preemption.requested() if preemption else None  # every process: same answer
            if stopped and saved != step:
                saved = save(step)
        saved = ckpt.close()  # the last save complete (StorageError if its write failed)
    except BaseException:
        with contextlib.suppress(Exception):  # the save in flight is of a good step: finish it
            ckpt.close()
        raise
    finally:
        stream.close()
    hint(saved)
    bar.close()
    writer.close()

    summary = {"steps": step, "seconds": run_s,
               "invocation_seconds": time.perf_counter() - t_invocation,
               "samples_total": counters["samples_total"], "method": c.method}
    if stopped:
        summary.update(stopped=signal.Signals(stopped).name,
                       checkpoint=paths.join(ckpt.directory, str(saved)) if saved else None)
        distributed.sync("train_stopped")
        return summary
    if c.checkpoint.export_hf and step >= c.train.steps:
        params = shd.gather_to_host(state.params)  # every process joins
        if main:
            summary["hf"] = paths.join(workdir, "hf")
            export_hf(params, s.model_cfg, s.tokenizer, summary["hf"], c.tokenizer.template)
    if main:
        evals = [r for r in read_jsonl(paths.join(workdir, "metrics.jsonl"))
                 if r.get("eval_accuracy") is not None]
        if evals:
            summary["eval_accuracy_first"] = evals[0]["eval_accuracy"]
            summary["eval_accuracy_final"] = evals[-1]["eval_accuracy"]
        if c.log.plots:
            summary["plot"] = plot_run(workdir)
        _write_json(paths.join(workdir, "summary.json"), summary, "the run's summary")
    distributed.sync("train_end")
    return summary


def stream_metrics(local: dict) -> dict:
    """The stream's per-step metrics over every process: the staleness of the trained
    tokens, the idle shares and queue of the slowest process. (The importance weights' come
    from the loss, at k = 0 too: 1 for the tokens the proximal policy drew.)"""
    hist = distributed.global_sum(np.asarray(local["staleness_hist"], np.int64))
    worst = distributed.allgather(np.array([
        local["staleness_max"], local["sampler_idle_share"], local["trainer_idle_share"],
        local["queue_depth"], local["cohorts_in_flight"]], np.float64)).max(axis=0)
    out = {"staleness_max": int(worst[0]),
           "staleness_mean": float(np.arange(hist.size) @ hist / max(hist.sum(), 1)),
           "staleness_hist": [int(x) for x in hist],
           "sampler_idle_share": float(worst[1]), "trainer_idle_share": float(worst[2]),
           "queue_depth": int(worst[3]), "cohorts_in_flight": int(worst[4]),
           # this process's: the sampler's work, and what an update caught mid-response
           "slot_occupancy": float(local["slot_occupancy"]),
           "spanning_share": float(local["spanning_share"]),
           "carried_tokens": int(local["carried_tokens"])}
    return out


def _injected_fault(step: int) -> None:
    """Tests: ADA_FAULT=loop.raise@STEP makes this process raise as that step starts (an
    ordinary crash of one process of a run)."""
    if os.environ.get(FAULT_ENV) == f"loop.raise@{step}":
        raise RuntimeError(f"fault injected by {FAULT_ENV}=loop.raise@{step}")


def _check_finite(c, step: int, finite: bool, guard: dict, saved) -> None:
    """RunError when the parameters are no longer finite, or after optim.max_skipped_in_row
    steps in a row whose update was skipped (a non-finite loss or gradient)."""
    last = f"step {saved}" if saved else "none"
    if not finite:
        raise RunError(f"step {step} left non-finite parameters (inf or NaN: an update "
                       f"overflowed; is optim.lr={c.optim.lr:g} too high?); nothing of it was "
                       f"checkpointed (latest checkpoint: {last}). Lower --config.optim.lr and "
                       "resume with --force_config, or start again with another --workdir")
    n = c.optim.max_skipped_in_row
    if guard["skipped_in_row"] >= n:
        raise RunError(f"steps {step - n + 1}-{step}: {n} RL steps in a row had a non-finite "
                       f"loss or gradient and were skipped (optim.max_skipped_in_row={n}); the "
                       f"run stops (latest checkpoint: {last}). Lower --config.optim.lr or check "
                       "the data and the reward, then resume with --force_config")
