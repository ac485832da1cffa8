"""The training loop: check the run folder, build the run, restore, then step / evaluate /
save until done or stopped, and write the summary. The pieces live in ada/run/: `build`
(the composition root), `folder` (what the run folder holds and when it is written),
`state` (the one RunState a checkpoint holds) and `trainer` (the Trainer: restore, step,
evaluate, save, close).

Everything random in a step derives from fold_in(key(seed), step), and the data position is
checkpointed, so a run killed at any point and restarted from its latest checkpoint ends
with the same parameters and metrics as an uninterrupted one. The KL reference
(loss.kl_coef > 0) is the initial policy, made again by the Trainer on resume (under LoRA
it is the frozen base the train params hold).

Faults (docs/reliability.md): a Preemption (SIGTERM / SIGINT, ada/preemption.py) ends the
loop after the current step with a checkpoint every process joins; a full disk stops it with
StorageError (ada/checkpoint.py); `optim.max_skipped_in_row` steps in a row with a non-finite
update, or parameters that are no longer finite, stop it with RunError and no checkpoint of
the bad state (ada/run/trainer.py).

Multi-host: each process collects its own shard of the prompts (ada/rollout.py); metrics
are summed over processes (ada/step.py) and written by process 0; the update is one SPMD
train step over the global mesh with the fixed [P, n] batch shape.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from ada import distributed, paths, quiet, watch
from ada import sharding as shd
from ada.checkpoint import FAULT_ENV
from ada.export import export_hf, export_peft
from ada.metrics import MetricsWriter, Progress
from ada.preemption import Preemption
from ada.run import folder
from ada.run.build import build
from ada.run.trainer import Trainer

log = logging.getLogger(__name__)


def train(config, workdir: str, *, stop_after: int | None = None, force_config: bool = False,
          preemption: Preemption | None = None, observe=None) -> dict:
    """Run (or resume) training; returns the final summary dict. `preemption` (the command
    line's): stop after the step a signal arrives in, with a checkpoint (summary["stopped"]).
    `observe(phase, step, stream)`, if given, is called at each phase boundary (init, collect,
    update, handoff, eval, save): what the chips hold there is what ada.plan's memory
    ledger says (tests/test_memory.py).
    Raises ConfigError before writing anything when a resume's config is refused."""
    quiet.quiet_logging()
    c, workdir, t_invocation = config, str(paths.path(workdir)), time.perf_counter()
    resume, main = folder.check_resume(c, workdir, force_config), distributed.is_main()
    with folder.storage_hint(workdir):
        tracker = folder.start_tracker(c, workdir) if main and c.log.wandb else None
        trainer = Trainer(c, workdir, build(c), observe)
        try:  # from here a failure closes the stream and the checkpointer
            setup_s = time.perf_counter() - t_invocation
            resumed = trainer.restore()
            step = start = trainer.state.step
            if resumed:
                log.info("resumed from step %d (%s)", start, trainer.ckpt.directory)
            folder.record_config(c, workdir, resume, start)
            writer = MetricsWriter(workdir, tensorboard=c.log.tensorboard, enabled=main,
                                   resume_step=start if resumed else None, tracker=tracker)
            bar = Progress(c.train.steps, initial=start, enabled=main, bar=c.log.progress,
                           every=c.log.every)

            def hint(at):
                if preemption is not None:  # read when its line is due (a save may complete)
                    preemption.training(lambda: folder.resume_text(trainer.ckpt.latest_step()),
                                        lambda: step)
                watch.set_resume_hint("rerun the same command on every host "
                                      + folder.resume_text(at))

            hint(trainer.saved)
            if not resumed:
                first = trainer.evaluate() if c.eval.every else {}
                writer.write(0, {"warmstart_loss": trainer.setup.warm_info.get("loss"),
                                 "warmstart_cached": trainer.setup.warm_info.get("cached"),
                                 "warmstart_sha256": trainer.setup.warm_info.get("sha256"),
                                 "dropped_prompts": trainer.setup.dropped_prompts,
                                 "setup_s": setup_s, **first})
                bar.update(first, n=0)  # the starting accuracy, shown until the next eval
            stopped = preemption.requested() if preemption else None  # e.g. during the first eval
            while step < c.train.steps and not stopped:
                step += 1
                _injected_fault(step)
                m = trainer.step()
                if c.eval.every and (step % c.eval.every == 0 or step == c.train.steps):
                    m.update(trainer.evaluate())
                writer.write(step, m)
                bar.update(m)
                trainer.check_guard()
                if step % c.checkpoint.every == 0 or step == c.train.steps:
                    trainer.save()
                    hint(trainer.ckpt.last_complete)  # this step is written while the next run
                if stop_after is not None and step >= stop_after:
                    break
                stopped = preemption.requested() if preemption else None  # every process agrees
                if stopped and trainer.saved != step:
                    trainer.save()
        except BaseException:
            trainer.close(failed=True)
            raise
        saved = trainer.close()  # the last save complete (StorageError if its write failed)
        hint(saved)
        bar.close()
        writer.close()
        return _summary(c, workdir, trainer, step, stopped, saved, t_invocation)


def _summary(c, workdir: str, trainer: Trainer, step: int, stopped, saved, t_invocation) -> dict:
    """The run's summary; at the end of training (not stopped) its Hugging Face export
    (checkpoint.export_hf) and summary.json."""
    summary = {"steps": step, "seconds": trainer.state.seconds,
               "invocation_seconds": time.perf_counter() - t_invocation,
               "samples_total": trainer.state.counters["samples_total"], "method": c.method}
    main = distributed.is_main()
    if stopped:
        summary.update(stopped=signal.Signals(stopped).name,
                       checkpoint=paths.join(trainer.ckpt.directory, str(saved)) if saved else None)
    elif c.checkpoint.export_hf and step >= c.train.steps:
        params = shd.gather_to_host(trainer.state.train.params)  # every process joins
        if main:
            summary["hf"] = paths.join(workdir, "hf")
            s = trainer.setup
            if c.checkpoint.export_format == "peft":
                base = os.path.abspath(c.model.path) if c.model.path else None
                export_peft(params, s.model_cfg, s.tokenizer, summary["hf"], base,
                            c.tokenizer.template)
            else:
                export_hf(params, s.model_cfg, s.tokenizer, summary["hf"], c.tokenizer.template)
    if main and not stopped:
        folder.write_summary(c, workdir, summary)
    distributed.sync("train_stopped" if stopped else "train_end")
    return summary


def _injected_fault(step: int) -> None:
    """Tests: ADA_FAULT=loop.raise@STEP makes this process raise as that step starts (an
    ordinary crash of one process of a run)."""
    if os.environ.get(FAULT_ENV) == f"loop.raise@{step}":
        raise RuntimeError(f"fault injected by {FAULT_ENV}=loop.raise@{step}")
