"""Multi-host helpers: jax.distributed from the environment, process-0 helpers, global counts.

Under multi-controller SPMD every process must issue the same computations in the same
order. Anything that decides a shape — which prompts are still active, how many rows the
next round has, which slots are refilled — must therefore be computed from *globally*
gathered values, identically on every process. `global_sum` / `allgather` do that.

Environment (any of the two spellings):
  ADA_COORDINATOR / JAX_COORDINATOR_ADDRESS   host:port of process 0's coordinator
  ADA_NUM_PROCESSES / JAX_NUM_PROCESSES       number of processes
  ADA_PROCESS_ID / JAX_PROCESS_ID             this process's index
On a Cloud TPU VM slice none is needed: `jax.distributed.initialize()` finds its peers.

A lost or failed process ends the others within seconds to `distributed.timeout_s`, with
one line naming it: heartbeats and exit notices through jax.distributed's key-value store
(ada/watch.py). Signals and exit codes: ada/preemption.py.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import numpy as np

from ada import watch

log = logging.getLogger(__name__)

_INITIALIZED = False


def _env(*names: str) -> str | None:
    for n in names:
        if os.environ.get(n):
            return os.environ[n]
    return None


def on_tpu_pod() -> bool:
    """A multi-worker Cloud TPU VM (worker hostnames list has more than one entry)."""
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return "," in hosts


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids=None,
               timeout_s: float = watch.TIMEOUT_S) -> bool:
    """Initialise jax.distributed when the environment asks for more than one process, with
    the watch of ada/watch.py (`timeout_s`: distributed.timeout_s).

    Returns True when running multi-process. Safe to call more than once.
    """
    global _INITIALIZED
    if _INITIALIZED:
        return jax.process_count() > 1
    if not timeout_s > 0:
        raise ValueError(f"distributed.timeout_s={timeout_s} must be > 0 seconds")
    coordinator = coordinator or _env("ADA_COORDINATOR", "JAX_COORDINATOR_ADDRESS")
    n = num_processes or _env("ADA_NUM_PROCESSES", "JAX_NUM_PROCESSES")
    pid = process_id if process_id is not None else _env("ADA_PROCESS_ID", "JAX_PROCESS_ID")
    timeouts = dict(heartbeat_timeout_seconds=int(2 * timeout_s) + 5,  # ours fire first
                    shutdown_timeout_seconds=int(timeout_s) + 5)
    if coordinator and n and int(n) > 1:
        if pid is None:
            raise ValueError("multi-process run: set ADA_PROCESS_ID (this process's index) "
                             f"alongside ADA_COORDINATOR={coordinator} and ADA_NUM_PROCESSES={n}")
        if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS") == "cpu":
            # CPU collectives across processes go through gloo.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=int(n), process_id=int(pid),
            local_device_ids=local_device_ids, initialization_timeout=int(max(300, timeout_s)),
            **timeouts)
        _INITIALIZED = True
    elif on_tpu_pod():
        jax.distributed.initialize(**timeouts)
        _INITIALIZED = True
    if jax.process_count() > 1:
        watch.filter_stderr()
        watch.start(timeout_s, coordinator or "the TPU slice's coordinator")
    return jax.process_count() > 1


def is_main() -> bool:
    return jax.process_index() == 0


def cpu_only_without_accelerators() -> None:
    """With JAX_PLATFORMS unset, on a machine with no TPU chip and no other JAX plugin, run
    on the CPU backend only: JAX would otherwise load an installed libtpu, which prints its
    failed start (a dozen lines) on every command and installs a signal handler that dumps a
    stack on SIGTERM. Call before JAX starts its backends; JAX_PLATFORMS (even empty) wins."""
    if "JAX_PLATFORMS" in os.environ:
        return
    try:
        import importlib.metadata
        import importlib.util

        from jax._src import hardware_utils

        chips = hardware_utils.num_available_tpu_chips_and_device_id()[0]
        plugins = list(importlib.metadata.entry_points(group="jax_plugins"))
        if chips == 0 and not plugins and importlib.util.find_spec("jax_plugins") is None:
            jax.config.update("jax_platforms", "cpu")
    except Exception as e:  # noqa: BLE001 - another jax layout: leave the default
        log.debug("cannot tell the accelerators apart (%s)", e)


# ----------------------------------------------------------------------------- collectives


def allgather(x: Any, name: str = "allgather") -> np.ndarray:
    """Stack a same-shaped host array from every process: [process_count, *x.shape]."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x[None]
    from jax.experimental import multihost_utils

    with watch.collective(name):
        return np.asarray(multihost_utils.process_allgather(x, tiled=False))


def global_sum(x: Any) -> np.ndarray:
    """Sum a same-shaped host array over processes (identical result everywhere)."""
    return allgather(x, "global_sum").sum(axis=0)


def sync(name: str) -> None:
    """Barrier across processes (no-op single-process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        with watch.collective(name):
            multihost_utils.sync_global_devices(name)
