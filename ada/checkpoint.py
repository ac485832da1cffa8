"""Training checkpoints on orbax's CheckpointManager: async saves, keep-last-k, resume from
the latest complete step, on a local disk or gs://.

A checkpoint directory holds one sub-directory per step, `<checkpoints>/<step>/`, with two
items:

  state/  the array pytree: params, optimizer state, RNG key data (any pytree)
  meta/   JSON: step, data-iterator state, adaptive sampler state, config fingerprint

orbax does the writing (ada keeps only what a checkpoint holds, the resume rule and the fault
hooks): `save` returns once the arrays are copied off the device and the write finishes on a
thread while training goes on; one save is in flight at a time (the next waits for it); old
steps are deleted only after the new one is complete (max_to_keep). A step is *complete* when
orbax finalized it (locally: renamed into place from its temporary directory; on gs://,
where a rename is a copy: its `commit_success.txt` marker, written last) and its
`_CHECKPOINT_METADATA` is there. Anything else, such as the leftovers of a killed save, is
never restored: training's start removes it with a warning (`clean_partial`).

A write that fails for want of space or permission (ENOSPC, EDQUOT, EFBIG, EACCES, EPERM,
EROFS) raises `StorageError` at the next `save` or `wait_until_finished`, with a one-line
message naming the path, the errno and the fix; that write's leftovers are removed and no
earlier step is touched.

Tests choose the moment of a real SIGKILL inside a save with ADA_FAULT=checkpoint.POINT@STEP
(`_fault`): start (nothing written), write (the save handed to orbax's thread, training goes
on: the write may or may not have finished), items (every item written, not committed).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import sys
import warnings
from typing import Any

import jax
import numpy as np

from ada import paths

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^\d+$")
_LEFTOVER_RE = re.compile(r"^(\d+)(\.orbax-checkpoint-tmp.*)?$")
ITEMS = ("state", "meta")
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


class _QuietOrbaxErrors(logging.Filter):
    """orbax logs a failed write's traceback (absl, ERROR) from its threads before the error
    reaches `save` / `wait_until_finished`; ada reports a full disk or a permission error
    there in one line instead."""

    def filter(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        return record.levelno < logging.ERROR or exc is None or storage_errno(exc) is None


def _quiet_closed_loop(hook):
    """sys.unraisablehook without the 'Event loop is closed' echoes of a failed write: the
    other pending writes' callbacks, which find orbax's event loop already closed."""

    def quiet(u):
        if not (isinstance(u.exc_value, RuntimeError) and "Event loop is closed" in str(u.exc_value)):
            hook(u)

    quiet.ada = True
    return quiet


def _quiet_write_errors() -> None:
    if _QUIET not in logging.getLogger("absl").filters:
        logging.getLogger("absl").addFilter(_QUIET)
    if not getattr(sys.unraisablehook, "ada", False):
        sys.unraisablehook = _quiet_closed_loop(sys.unraisablehook)


_QUIET = _QuietOrbaxErrors()


def _ocp():
    import orbax.checkpoint as ocp

    return ocp


def is_complete(step_dir) -> bool:
    """True when orbax finalized this step (renamed into place, or on gs:// its commit
    marker written) and its _CHECKPOINT_METADATA is there (not a half-copied folder)."""
    p = paths.path(step_dir)
    return (p.is_dir() and _ocp().path.step.is_checkpoint_finalized(p)
            and (p / "_CHECKPOINT_METADATA").exists())


def complete_steps(directory) -> list[int]:
    """The complete steps under `directory`, ascending; creates and warns about nothing."""
    d = paths.path(directory)
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if _STEP_RE.match(p.name) and is_complete(p))


def stored_tree(step_dir):
    """The array tree a complete step stores, as orbax metadata (each array's shape and
    dtype; nothing read). The item's handler reads its own metadata (StandardCheckpointer's
    would look for a _CHECKPOINT_METADATA in state/, which only the step has, and warn)."""
    md = _ocp().StandardCheckpointHandler().metadata(paths.path(step_dir) / "state")
    return getattr(md, "item_metadata", md)


class Checkpointer:
    """Save / restore (array pytree, JSON meta) per step under one directory (local or gs://).

    All processes call `save`, `wait_until_finished` and `restore` (orbax coordinates the
    per-process writes of sharded arrays, and deletes old steps from process 0). Call
    `wait_until_finished` (or `close`) before reporting a step as saved.
    """

    def __init__(self, directory, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep={keep} must be >= 1")
        self.directory = paths.path(directory)
        self.keep = keep
        self.directory.mkdir(parents=True, exist_ok=True)
        _quiet_write_errors()
        self._mgr = None
        self._pending: int | None = None  # the step whose write is in flight
        self.last_complete: int | None = None  # as of the latest wait for a save
        self._warned: set[str] = set()

    def _manager(self):
        """orbax's CheckpointManager, made on first use (after `clean_partial`, which it
        would otherwise count leftovers with)."""
        if self._mgr is None:
            ocp = _ocp()
            hook = os.environ.get(FAULT_ENV, "")
            after_items = None
            if hook.startswith("checkpoint.items@"):
                after_items = lambda: _fault("items", self._pending)  # noqa: E731
            self._mgr = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
                max_to_keep=self.keep, create=False, enable_async_checkpointing=True,
                async_options=ocp.AsyncOptions(post_finalization_callback=after_items)))
        return self._mgr

    # -------------------------------------------------------------------- listing

    def _entries(self) -> list:
        """What the directory holds (on gs:// an empty folder does not exist)."""
        return list(self.directory.iterdir()) if self.directory.is_dir() else []

    def _scan(self) -> tuple[list[int], list[str]]:
        complete, incomplete = [], []
        for p in self._entries():
            if _STEP_RE.match(p.name) and is_complete(p):
                complete.append(int(p.name))
            elif p.is_dir() or _STEP_RE.match(p.name):
                incomplete.append(p.name)
        return sorted(complete), sorted(incomplete)

    def all_steps(self) -> list[int]:
        """Complete steps, ascending; warns once about each incomplete entry that is not the
        save in flight. Another thread (the preemption budget's line) may list while a save
        finishes or starts: the step in flight is read before and after the scan, so a listing
        that saw its temporary directory does not call it a leftover."""
        before = self._pending
        complete, incomplete = self._scan()
        in_flight = {before, self._pending}
        for name in incomplete:
            m = _LEFTOVER_RE.match(name)
            if name not in self._warned and not (m and int(m.group(1)) in in_flight):
                self._warned.add(name)
                msg = (f"ignoring incomplete checkpoint {self.directory / name} "
                       "(half-written or not an orbax step); resuming from the latest complete one")
                warnings.warn(msg, CheckpointWarning, stacklevel=2)
                log.warning(msg)
        return complete

    def clean_partial(self) -> None:
        """Training's start: remove every incomplete leftover of an orbax write (a temporary
        directory, or on gs:// a step without its commit marker), with a warning; other
        entries are left alone. Process 0 deletes; every process calls it."""
        if jax.process_index() == 0:
            for p in sorted(self._entries()):
                if _LEFTOVER_RE.match(p.name) and not is_complete(p):
                    self._warned.add(p.name)
                    log.warning("ignoring incomplete checkpoint %s (a save was interrupted) and "
                                "removing it; resuming from the latest complete one", p)
                    p.rmtree() if p.is_dir() else p.unlink()
        _barrier("ckpt_clean")
        if self._mgr is not None:
            self._mgr.reload()

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
        """Start writing `step`: returns once the arrays are copied off the device, after
        waiting for the previous save (so at most one is in flight). Old steps beyond `keep`
        are deleted once it is complete. A full disk or a permission error raises
        StorageError here or at the next `save` / `wait_until_finished`."""
        ocp = _ocp()
        step = int(step)
        self.wait_until_finished()
        _fault("start", step)
        self._pending = step
        try:
            self._manager().save(step, force=True, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                meta=ocp.args.JsonSave(_jsonable(dict(meta, step=step)))))
        except Exception as e:  # noqa: BLE001 - mapped to StorageError when it is one
            self._failed(e)
        _fault("write", step)
        return str(self.directory / str(step))

    def wait_until_finished(self) -> int | None:
        """Block until the save in flight (if any) is complete; returns the latest step known
        complete (None if none). The call a final preemption save ends with."""
        if self._pending is not None:
            try:
                self._mgr.wait_until_finished()
            except Exception as e:  # noqa: BLE001
                self._failed(e)
            self._pending = None
        self.last_complete = self.latest_step()
        return self.last_complete

    def _failed(self, e: Exception):
        """The save of `self._pending` failed: its leftovers removed, a StorageError for a
        full disk or a permission error, other errors as they are."""
        step, self._pending = self._pending, None
        if jax.process_index() == 0:
            for p in self._entries():
                m = _LEFTOVER_RE.match(p.name)
                if m and int(m.group(1)) == step and not is_complete(p):
                    p.rmtree() if p.is_dir() else p.unlink()
        code = storage_errno(e)
        if code is None:
            raise e
        raise StorageError(f"checkpoint {step} to", str(self.directory), code) from None

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """Restore `step` (default: latest complete) into the structure/shardings of `target`.

        `target` is a pytree of arrays or `jax.ShapeDtypeStruct`s (with shardings for a
        sharded restore). Returns (state, meta, step).
        """
        step = self._complete(step)
        state, meta = self._restore(step, jax.tree.map(_abstract, target))
        return state, meta, step

    def restore_params(self, step: int | None = None, *, host: bool = False) -> tuple[dict, dict]:
        """Restore the stored pytree onto this process's first device, whatever mesh wrote
        it (no target needed; for export, eval and comparisons). host: as numpy arrays,
        on no device (the sampler places them shard by shard: Engine.prepare_params)."""
        step = self._complete(step)
        md = stored_tree(self.directory / str(step))
        one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda m: np.empty(tuple(m.shape), m.dtype) if host else
                              jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=one), md)
        return self._restore(step, target)

    def read_meta(self, step: int | None = None) -> dict:
        """The JSON meta of `step` (default: the latest complete) alone: no array read."""
        step = self._complete(step)
        mgr = self._manager()
        mgr.reload()
        return dict(mgr.restore(step, args=_ocp().args.Composite(
            meta=_ocp().args.JsonRestore()))["meta"])

    def _complete(self, step: int | None) -> int:
        """`step` (default: the latest), once the save in flight is done; FileNotFoundError
        when it is not complete."""
        self.wait_until_finished()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        if not is_complete(self.directory / str(int(step))):
            raise FileNotFoundError(f"checkpoint {self.directory / str(int(step))} is missing or "
                                    f"incomplete; complete steps: {self.all_steps()}")
        return int(step)

    def _restore(self, step: int, target) -> tuple[Any, dict]:
        ocp = _ocp()
        mgr = self._manager()
        mgr.reload()  # steps written since it was made (by another process or command)
        out = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                        meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"])

    def close(self) -> int | None:
        """Finish the save in flight (StorageError if it failed) and release orbax's threads;
        returns the latest complete step."""
        try:
            return self.wait_until_finished()
        finally:
            if self._mgr is not None:
                self._mgr.close()
                self._mgr = None


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

