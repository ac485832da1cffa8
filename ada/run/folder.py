"""The run folder's contract: what a training run reads and writes under its workdir.

A run folder is never broken by a later command: before anything is written, a resume's
config is compared with the run's `config.json` (`check_resume`); a change to what the
checkpoint holds or to the training recipe is refused (ConfigError) unless forced, and the
changes a resume may make (steps, evaluation, logging, checkpoint cadence) are recorded in
`config_history.jsonl`, with config.json left as it was. config.json is written only once a
checkpoint is restored (or on a fresh start), so nothing a failed start does reaches it.
The folder holds config.json, config_history.jsonl, checkpoints/, metrics.jsonl (and
TensorBoard, the plot), summary.json and, with checkpoint.export_hf, hf/.
"""

from __future__ import annotations

import contextlib
import datetime
import json

from ada import distributed, knobs, paths
from ada.checkpoint import Checkpointer, StorageError, complete_steps, storage_errno
from ada.config import load_run_config
from ada.errors import ConfigError
from ada.metrics import plot_run, read_jsonl
from ada.tracking import TrackingError, WandbLogger

HISTORY_FILE = "config_history.jsonl"


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


def write_json(path: str, obj, what: str, *, append: bool = False) -> None:
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
        write_json(paths.join(workdir, "config.json"), config.to_dict(), "the run's config")
    if resume and resume["changes"]:
        write_json(paths.join(workdir, HISTORY_FILE), {
            "time": datetime.datetime.now().isoformat(timespec="seconds"), "step": step,
            "changes": resume["changes"], "forced": resume["forced"],
            "restart": resume["restart"]}, "the config history", append=True)


def start_tracker(c, workdir: str):
    """The W&B run of this run directory (log.wandb), before anything expensive starts."""
    try:
        return WandbLogger(workdir, c.to_dict(), project=c.log.wandb_project,
                           entity=c.log.wandb_entity, mode=c.log.wandb_mode)
    except TrackingError as e:
        raise ConfigError(str(e)) from None


def checkpoints(workdir: str, keep: int) -> Checkpointer:
    """The run's checkpoints/, with what a killed save left behind removed."""
    try:
        ckpt = Checkpointer(paths.join(workdir, "checkpoints"), keep=keep)
    except OSError as e:
        if storage_errno(e) is None:
            raise
        raise StorageError("checkpoints to", workdir, storage_errno(e)) from None
    ckpt.clean_partial()
    return ckpt


def resume_text(at: int | None) -> str:
    return f"to resume from step {at} (the latest checkpoint)" if at else "to start again"


@contextlib.contextmanager
def storage_hint(workdir: str):
    """A StorageError (a full disk) raised inside says where a rerun starts."""
    try:
        yield
    except StorageError as e:
        last = complete_steps(paths.join(workdir, "checkpoints"))
        e.resume = f"step {last[-1]}" if last else "the start"
        raise


def write_summary(config, workdir: str, summary: dict) -> dict:
    """summary.json (process 0): the run's figures, its first and final eval accuracy (from
    metrics.jsonl: every segment's) and the plot."""
    evals = [r for r in read_jsonl(paths.join(workdir, "metrics.jsonl"))
             if r.get("eval_accuracy") is not None]
    if evals:
        summary["eval_accuracy_first"] = evals[0]["eval_accuracy"]
        summary["eval_accuracy_final"] = evals[-1]["eval_accuracy"]
    if config.log.plots:
        summary["plot"] = plot_run(workdir)
    write_json(paths.join(workdir, "summary.json"), summary, "the run's summary")
    return summary
