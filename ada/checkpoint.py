"""Training checkpoints with orbax: atomic, keep-last-k, resume from the latest complete.

A checkpoint directory holds one sub-directory per step, `<workdir>/checkpoints/<step>/`,
written by orbax's Checkpointer (it writes into a temporary directory and renames it
into place only when every process has finished, so a kill mid-write leaves no `<step>`
directory). Each step has two items:

  state/  the array pytree: params, optimizer state, RNG key data (any pytree)
  meta/   JSON: step, data-iterator state, adaptive sampler state, config fingerprint

A step directory is *complete* when orbax's commit markers and both items are present.
Anything else in the directory — orbax temporaries, a half-copied step — is ignored with
a warning, never restored and never counted against keep-last-k; training removes such
leftovers when it starts (`clean_partial`, with the same warning). Old steps are deleted only
after the new one is complete, so keep-last-k never leaves fewer complete steps than before;
re-saving an existing step first sets the old one aside (`<step>.superseded`), which a start
puts back if the new one never completed.

A write that fails for want of space or permission (ENOSPC, EDQUOT, EFBIG, EACCES, EPERM,
EROFS) raises `StorageError`, whose one-line message names the path, the errno and the fix;
the temporary directory of that write is removed and no earlier step is touched.

Tests choose the moment of a real SIGKILL inside a save with ADA_FAULT=checkpoint.POINT@STEP
(`_fault`): start (nothing written), tmp (orbax's temporary directory made, no item written),
items (both items written, not committed), committed (in place, old steps not yet deleted),
gc (one old step deleted), superseded (an existing step set aside, the new not written).
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import re
import shutil
import signal
import sys
import time
import warnings
from typing import Any

import jax
import numpy as np

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^\d+$")
_LEFTOVER_RE = re.compile(r"^\d+(\.orbax-checkpoint-tmp.*|\.superseded)?$")
_REQUIRED = ("_CHECKPOINT_METADATA", "state", "meta")
SUPERSEDED = ".superseded"
FAULT_ENV = "ADA_FAULT"  # tests: checkpoint.POINT@STEP -> SIGKILL this process there
# errno of a write that cannot succeed until a person frees space or grants permission
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM,
                  errno.EROFS)


class CheckpointWarning(UserWarning):
    """A step directory that is not a complete checkpoint was skipped."""


class StorageError(RuntimeError):
    """A run's file could not be written (full disk, size limit, no permission); the
    message is one line: what, the path, the errno and the fix."""

    def __init__(self, what: str, path: str, code: int):
        self.what, self.path, self.errno = what, path, code
        fix = ("free space there (or raise the file-size limit)"
               if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else
               "make it writable (or pass another --workdir)")
        super().__init__(f"cannot write {what} {path}: {os.strerror(code)} "
                         f"({errno.errorcode.get(code, code)}); {fix}")


def storage_errno(exc: BaseException) -> int | None:
    """The errno of a failed write that is about space or permission (an OSError, or
    tensorstore's ValueError carrying os_error_code), else None."""
    for e in (exc, exc.__cause__, exc.__context__):
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            return e.errno
    m = re.search(r"os_error_code='?(\d+)", str(exc))
    if m and int(m.group(1)) in STORAGE_ERRNOS:
        return int(m.group(1))
    return next((c for c in STORAGE_ERRNOS if os.strerror(c) in str(exc)), None)


def _fault(point: str, step: int) -> None:
    """SIGKILL this process at `point` of saving `step` when ADA_FAULT asks (tests)."""
    if os.environ.get(FAULT_ENV) == f"checkpoint.{point}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)


class _QuietWriteErrors(logging.Filter):
    """orbax logs a failed write's traceback (absl, ERROR) before raising it; the caller
    reports it in one line instead."""

    def filter(self, record):
        return record.levelno < logging.ERROR


def _ocp():
    import orbax.checkpoint as ocp

    return ocp


def is_complete(step_dir: str) -> bool:
    """True when orbax finished this step (commit markers and both items present)."""
    if not os.path.isdir(step_dir):
        return False
    names = set(os.listdir(step_dir))
    if not all(r in names for r in _REQUIRED):
        return False
    state = os.path.join(step_dir, "state")
    meta = os.path.join(step_dir, "meta")
    return (
        os.path.isdir(state)
        and "_METADATA" in os.listdir(state)
        and os.path.isdir(meta)
        and any(os.path.isfile(os.path.join(meta, f)) for f in os.listdir(meta))
    )


def complete_steps(directory: str) -> list[int]:
    """The complete steps under `directory`, ascending; creates and warns about nothing."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory)
                  if _STEP_RE.match(n) and is_complete(os.path.join(directory, n)))


class Checkpointer:
    """Save / restore (array pytree, JSON meta) per step under one directory.

    All processes call `save` and `restore` (orbax coordinates the per-process writes of
    sharded arrays); only process 0 deletes old steps.
    """

    def __init__(self, directory: str, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep={keep} must be >= 1")
        self.directory = os.path.abspath(directory)
        self.keep = keep
        os.makedirs(self.directory, exist_ok=True)
        ocp = _ocp()
        self._handler = _handler()
        self._ckpt = ocp.Checkpointer(self._handler)
        self._warned: set[str] = set()

    # -------------------------------------------------------------------- listing

    def _scan(self) -> tuple[list[int], list[str]]:
        complete, incomplete = [], []
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if _STEP_RE.match(name) and is_complete(path):
                complete.append(int(name))
            elif os.path.isdir(path) or _STEP_RE.match(name):
                incomplete.append(name)
        return sorted(complete), sorted(incomplete)

    def all_steps(self) -> list[int]:
        """Complete steps, ascending; warns once about each incomplete entry."""
        complete, incomplete = self._scan()
        for name in incomplete:
            if name not in self._warned:
                self._warned.add(name)
                msg = (f"ignoring incomplete checkpoint {os.path.join(self.directory, name)} "
                       "(half-written or not an orbax step); resuming from the latest complete one")
                warnings.warn(msg, CheckpointWarning, stacklevel=2)
                log.warning(msg)
        return complete

    def clean_partial(self) -> None:
        """Training's start: put back a step set aside by a re-save that never completed, and
        remove every incomplete leftover of an ada / orbax write, with a warning; other
        entries are left alone. Process 0 deletes; every process calls it."""
        if jax.process_index() == 0:
            for name in sorted(os.listdir(self.directory)):
                path = os.path.join(self.directory, name)
                step = os.path.join(self.directory, name.removesuffix(SUPERSEDED))
                if name.endswith(SUPERSEDED) and is_complete(path) and not is_complete(step):
                    shutil.rmtree(step, ignore_errors=True)
                    os.rename(path, step)
                    log.warning("put back checkpoint %s: its re-save never completed", step)
                elif _LEFTOVER_RE.match(name) and not is_complete(path):
                    self._warned.add(name)
                    log.warning("ignoring incomplete checkpoint %s (a save was interrupted) and "
                                "removing it; resuming from the latest complete one", path)
                    if os.path.isdir(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        os.remove(path)
        _barrier("ckpt_clean")

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def pick_step(self, step: int | None) -> int | None:
        """`step` if it is a complete checkpoint, the latest when None (None if there is
        none); FileNotFoundError naming the complete steps otherwise (a CLI's --step)."""
        steps = self.all_steps()
        if step is None:
            return steps[-1] if steps else None
        if step not in steps:
            raise FileNotFoundError(f"--step {step}: no complete checkpoint in {self.directory} "
                                    f"(complete steps: {steps})")
        return step

    # -------------------------------------------------------------------- save / restore

    def save(self, step: int, state: Any, meta: dict) -> str:
        """Write step atomically, then keep only the last `keep` complete steps. A full disk
        or a permission error raises StorageError and leaves every earlier step as it was."""
        ocp = _ocp()
        step = int(step)
        path = os.path.join(self.directory, str(step))
        aside = path + SUPERSEDED
        _fault("start", step)
        if os.path.exists(path):
            if is_complete(path):
                log.info("checkpoint %s exists; replacing it", path)
            else:
                warnings.warn(f"replacing incomplete checkpoint directory {path}", CheckpointWarning,
                              stacklevel=2)
            if jax.process_index() == 0:
                shutil.rmtree(aside, ignore_errors=True)
                if is_complete(path):
                    os.rename(path, aside)  # until the new one is complete
                else:
                    shutil.rmtree(path)
            _barrier(f"ckpt_rm_{step}")
            _fault("superseded", step)
        meta = dict(meta, step=step)
        self._handler.step = step
        # A failed write makes orbax log its traceback, and its other pending writes print
        # 'Event loop is closed' tracebacks from their threads: the failure is reported here
        # in one line instead; a successful save's output is passed on afterwards.
        quiet, printed = _QuietWriteErrors(), io.StringIO()
        logging.getLogger("absl").addFilter(quiet)
        try:
            with contextlib.redirect_stderr(printed):
                try:
                    self._ckpt.save(path, args=ocp.args.Composite(
                        state=ocp.args.StandardSave(state),
                        meta=ocp.args.JsonSave(_jsonable(meta))))
                except Exception as e:
                    code = storage_errno(e)
                    if code is None:
                        raise
                    time.sleep(0.5)  # the other writes' callbacks print now, into `printed`
                    self._remove_temporaries(step)
                    raise StorageError(f"checkpoint {step} to", self.directory, code) from None
        except StorageError:
            raise
        except BaseException:
            sys.stderr.write(printed.getvalue())
            raise
        finally:
            logging.getLogger("absl").removeFilter(quiet)
        sys.stderr.write(printed.getvalue())
        _fault("committed", step)
        if jax.process_index() == 0:
            shutil.rmtree(aside, ignore_errors=True)
        self._gc()
        return path

    def _remove_temporaries(self, step: int) -> None:
        if jax.process_index() != 0:
            return
        for name in os.listdir(self.directory):
            if name.startswith(f"{step}.orbax-checkpoint-tmp"):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def _gc(self) -> None:
        if jax.process_index() != 0:
            return
        complete, _ = self._scan()
        for i, step in enumerate(complete[: max(0, len(complete) - self.keep)]):
            if i:
                _fault("gc", complete[-1])
            shutil.rmtree(os.path.join(self.directory, str(step)), ignore_errors=True)

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """Restore `step` (default: latest complete) into the structure/shardings of `target`.

        `target` is a pytree of arrays or `jax.ShapeDtypeStruct`s (with shardings for a
        sharded restore). Returns (state, meta, step).
        """
        ocp = _ocp()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        path = os.path.join(self.directory, str(int(step)))
        if not is_complete(path):
            raise FileNotFoundError(f"checkpoint {path} is missing or incomplete; "
                                    f"complete steps: {self.all_steps()}")
        abstract = jax.tree.map(_abstract, target)
        out = self._ckpt.restore(
            path,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return out["state"], dict(out["meta"]), int(step)

    def restore_params(self, step: int | None = None) -> tuple[dict, dict]:
        """Restore the stored pytree onto this process's first device, whatever mesh wrote
        it (no target needed; for export, eval and comparisons)."""
        ocp = _ocp()
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        path = os.path.join(self.directory, str(int(step)))
        # the item's handler reads its own metadata (StandardCheckpointer().metadata would look
        # for a _CHECKPOINT_METADATA in state/, which only the step has, and warn it is absent)
        from etils import epath

        md = ocp.StandardCheckpointHandler().metadata(epath.Path(path) / "state")
        md = getattr(md, "item_metadata", md)
        one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=one), md)
        out = self._ckpt.restore(
            path, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                          meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"])

    def close(self) -> None:
        self._ckpt.close()


def _handler():
    """orbax's composite handler; under ADA_FAULT with the fault points `tmp` (temporary
    directory made, no item written) and `items` (both items written, not committed)."""
    handler = _ocp().CompositeCheckpointHandler()
    handler.step = -1
    if os.environ.get(FAULT_ENV, "").startswith("checkpoint."):
        save = handler.save

        def save_with_faults(directory, *args, **kwargs):
            _fault("tmp", handler.step)
            out = save(directory, *args, **kwargs)
            _fault("items", handler.step)
            return out

        handler.save = save_with_faults
    return handler


def _abstract(x):
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    x = np.asarray(x)
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _jsonable(obj):
    """Make a meta dict JSON-safe (numpy scalars/arrays -> Python)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)

