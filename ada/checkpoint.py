"""Training checkpoints with orbax: atomic, keep-last-k, resume from the latest complete.

A checkpoint directory holds one sub-directory per step, `<workdir>/checkpoints/<step>/`,
written by orbax's Checkpointer (it writes into a temporary directory and renames it
into place only when every process has finished, so a kill mid-write leaves no `<step>`
directory). Each step has two items:

  state/  the array pytree: params, optimizer state, RNG key data (any pytree)
  meta/   JSON: step, data-iterator state, adaptive sampler state, config fingerprint

A step directory is *complete* when orbax's commit markers and both items are present.
Anything else in the directory — orbax temporaries, a half-copied step — is ignored with
a warning, never restored and never counted against keep-last-k.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import warnings
from typing import Any

import jax
import numpy as np

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^\d+$")
_REQUIRED = ("_CHECKPOINT_METADATA", "state", "meta")


class CheckpointWarning(UserWarning):
    """A step directory that is not a complete checkpoint was skipped."""


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
        self._ckpt = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
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
        """Write step atomically, then keep only the last `keep` complete steps."""
        ocp = _ocp()
        path = os.path.join(self.directory, str(int(step)))
        if os.path.exists(path):
            if is_complete(path):
                log.info("checkpoint %s exists; overwriting", path)
            else:
                warnings.warn(f"replacing incomplete checkpoint directory {path}", CheckpointWarning,
                              stacklevel=2)
            if jax.process_index() == 0:
                shutil.rmtree(path)
            _barrier(f"ckpt_rm_{step}")
        meta = dict(meta, step=int(step))
        self._ckpt.save(
            path,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                meta=ocp.args.JsonSave(_jsonable(meta)),
            ),
        )
        self._gc()
        return path

    def _gc(self) -> None:
        if jax.process_index() != 0:
            return
        complete, _ = self._scan()
        for step in complete[: max(0, len(complete) - self.keep)]:
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
        md = ocp.StandardCheckpointer().metadata(os.path.join(path, "state"))
        md = getattr(md, "item_metadata", md)
        one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=one), md)
        out = self._ckpt.restore(
            path, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                          meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"])

    def close(self) -> None:
        self._ckpt.close()


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

