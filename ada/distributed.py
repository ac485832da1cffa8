"""Multi-host helpers: jax.distributed from the environment, process-0 helpers, global counts,
a bounded failure when a process is lost, and preemption signals.

Under multi-controller SPMD every process must issue the same computations in the same
order. Anything that decides a shape — which prompts are still active, how many rows the
next round has, which slots are refilled — must therefore be computed from *globally*
gathered values, identically on every process. `global_sum` / `allgather` do that.

Environment (any of the two spellings):
  ADA_COORDINATOR / JAX_COORDINATOR_ADDRESS   host:port of process 0's coordinator
  ADA_NUM_PROCESSES / JAX_NUM_PROCESSES       number of processes
  ADA_PROCESS_ID / JAX_PROCESS_ID             this process's index
On a Cloud TPU VM slice none is needed: `jax.distributed.initialize()` finds its peers.

A lost process never hangs the others (`distributed.timeout_s`, `initialize(timeout_s=)`):
every process writes a heartbeat to the coordination service's key-value store every
timeout_s / 10 seconds from a thread of its own, and a watcher thread (pure Python, it never
blocks) ends this process with one line naming the lost one when a peer's heartbeat has not
changed for timeout_s, or when the coordinator (process 0) has not answered for timeout_s.
jax.distributed's own heartbeat timeout is set to twice that, as a backstop (it aborts with a
stack dump). The bound: a survivor exits within timeout_s + timeout_s / 10 (plus a second)
of the loss, whatever its main thread is doing, a blocked collective included. A collective
of ours (`allgather`, `sync`) that waits longer than timeout_s while every peer is alive is
logged once, and ends the process after COLLECTIVE_FACTOR x timeout_s (a hung peer).
When the coordinator's process dies, jax's coordination agent in each other process notices
at once and aborts it with a stack dump; a multi-process run's stderr therefore passes
through a small filter process (`_filter_stderr`) that replaces that report with one line.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import jax
import numpy as np

log = logging.getLogger(__name__)

TIMEOUT_S = 300.0  # distributed.timeout_s's default: a lost process is noticed within this
COLLECTIVE_FACTOR = 10  # a collective waiting this many timeouts for live peers: one is hung
EXIT_LOST = 1  # exit code of a process whose peer was lost
_INITIALIZED = False
_WATCH: _Watch | None = None
_KEYS = itertools.count()


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
               timeout_s: float = TIMEOUT_S) -> bool:
    """Initialise jax.distributed when the environment asks for more than one process, with
    the heartbeat watch of the module docstring (`timeout_s`: distributed.timeout_s).

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
        _filter_stderr()
        _start_watch(timeout_s, coordinator or "the TPU slice's coordinator")
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


# ----------------------------------------------------------------------------- lost processes


def _lost(line: str) -> None:
    """End this process now with one line (no atexit: jax's shutdown barrier would wait for
    the lost process, and its coordination agent would abort with a stack dump)."""
    try:  # fd 2 itself: sys.stderr may be redirected for a moment (a checkpoint save)
        os.write(2, f"\nerror: {line}\n".encode())
    finally:
        os._exit(EXIT_LOST)


_FILTER = r"""
import os, re, select, sys, time
out, pid, n = int(sys.argv[1]), sys.argv[2], sys.argv[3]
# the distributed runtime's reports; held back a while, dropped if the process then aborts
held_marks = (b"preemption_sync_manager.cc", b"coordination_service_agent.cc",
              b"/xla.coordination.CoordinationService/", b"coordination service")
fatal_marks = (b"Terminating process because the JAX distributed service",
               b"Polled an error from coordination service")
held, fatal, since = b"", False, 0.0
while True:
    wait = since + 3.0 - time.monotonic()
    if held and not fatal and (wait <= 0 or not select.select([0], [], [], wait)[0]):
        os.write(out, held)  # a passing warning: the process lives on
        held = b""
        continue
    chunk = os.read(0, 1 << 16)
    if not chunk:
        break
    if held:
        held += chunk
    else:
        hits = [chunk.find(m) for m in held_marks + fatal_marks if m in chunk]
        if not hits:
            os.write(out, chunk)
            continue
        start = chunk.rfind(b"\n", 0, min(hits)) + 1
        os.write(out, chunk[:start])
        held, since = chunk[start:], time.monotonic()
    fatal = fatal or any(m in held for m in fatal_marks)
if held and not fatal:
    os.write(out, held)
elif fatal:
    text = held.decode(errors="replace")
    lost = re.search(r"Task (\d+) heartbeat timeout|stopped sending heartbeats\):\s*(\d+)", text)
    who = (f"process {lost.group(1) or lost.group(2)} of {n} is lost" if lost else
           f"process 0 (the coordinator) of {n} is lost" if "leader" in text or "RPC to "
           "coordination service" in text else "a process of the run is lost")
    os.write(out, (f"\nerror: {who} (jax.distributed's coordination service reports it); "
                   f"process {pid} of {n} stops too; rerun the same command on every host to "
                   "resume from the latest checkpoint\n").encode())
"""


def _filter_stderr() -> None:
    """Pass this process's stderr (fd 2) through a child that forwards it unchanged until
    jax's coordination agent reports a fatal error (it then aborts this process with a
    stack dump), and prints one line naming the lost process instead of that report. The
    child is in a session of its own (Ctrl-C does not end it) and ends with the pipe."""
    import subprocess

    try:
        sys.stderr.flush()
        real = os.dup(2)
        r, w = os.pipe()
        subprocess.Popen([sys.executable, "-c", _FILTER, str(real), str(jax.process_index()),
                          str(jax.process_count())], stdin=r, pass_fds=(real,),
                         start_new_session=True)
        os.dup2(w, 2)
        for fd in (r, w, real):
            os.close(fd)
    except OSError as e:  # stderr as it was; a lost coordinator then ends with jax's report
        log.warning("cannot filter stderr (%s)", e)


class _Watch:
    """The heartbeat writer and the watcher of the module docstring."""

    def __init__(self, client, timeout_s: float, coordinator: str):
        self.client, self.timeout_s, self.coordinator = client, float(timeout_s), coordinator
        self.pid, self.n = jax.process_index(), jax.process_count()
        self.interval = min(max(self.timeout_s / 10, 0.2), 10.0)
        now = time.monotonic()
        self.last_ok = now  # the last heartbeat round the coordination service answered
        self.seen: dict[int, tuple[str | None, float]] = {p: (None, now) for p in range(self.n)
                                                          if p != self.pid}
        self.collectives: dict[int, tuple[str, float, bool]] = {}  # id -> (name, start, warned)
        self.resume_hint = "rerun the same command on every host to resume from the latest checkpoint"
        self._lock = threading.Lock()
        for target, name in ((self._beat, "ada-heartbeat"), (self._watch, "ada-watchdog")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def _beat(self) -> None:
        count = 0
        while True:
            count += 1
            try:
                self.client.key_value_set(f"ada/heartbeat/{self.pid}", str(count),
                                          allow_overwrite=True)
                entries = self.client.key_value_dir_get("ada/heartbeat/")
            except Exception:  # noqa: BLE001 - the watcher decides when this is fatal
                time.sleep(self.interval)
                continue
            now = time.monotonic()
            with self._lock:
                self.last_ok = now
                for key, value in entries:
                    p = int(key.rstrip("/").rsplit("/", 1)[-1])
                    if p in self.seen and self.seen[p][0] != value:
                        self.seen[p] = (value, now)
            time.sleep(self.interval)

    def _watch(self) -> None:
        while True:
            time.sleep(self.interval / 2)
            now = time.monotonic()
            with self._lock:
                silent = now - self.last_ok
                stale = sorted(p for p, (_, t) in self.seen.items() if now - t > self.timeout_s)
                waits = list(self.collectives.items())
            where = f"process {self.pid} of {self.n} stops too; {self.resume_hint}"
            if silent > self.timeout_s and self.pid != 0:
                _lost(f"process 0 (the coordinator, {self.coordinator}) is lost: no answer for "
                      f"{silent:.0f} s (distributed.timeout_s={self.timeout_s:g}); {where}")
            if stale:
                names = ", ".join(str(p) for p in stale)
                _lost(f"process {names} of {self.n} is lost: no heartbeat for more than "
                      f"{self.timeout_s:g} s (distributed.timeout_s); {where}")
            for key, (name, start, warned) in waits:
                waited = now - start
                if waited > COLLECTIVE_FACTOR * self.timeout_s:
                    _lost(f"'{name}' waited {waited:.0f} s for the other processes, which "
                          f"are alive but do not arrive (one is hung); {where}")
                if waited > self.timeout_s and not warned:
                    with self._lock:
                        if key in self.collectives:
                            self.collectives[key] = (name, start, True)
                    log.warning("'%s' has waited %.0f s for the other processes (alive); it "
                                "gives up after %.0f s", name, waited,
                                COLLECTIVE_FACTOR * self.timeout_s)

    def enter(self, name: str) -> int:
        key = next(_KEYS)
        with self._lock:
            self.collectives[key] = (name, time.monotonic(), False)
        return key

    def leave(self, key: int) -> None:
        with self._lock:
            self.collectives.pop(key, None)


def _start_watch(timeout_s: float, coordinator: str) -> None:
    global _WATCH
    if _WATCH is not None:
        return
    try:
        from jax._src import distributed as jax_distributed

        client = jax_distributed.global_state.client
    except Exception:  # noqa: BLE001 - another jax layout: jax's own heartbeat still bounds it
        client = None
    if client is None:
        log.warning("no jax.distributed client to write heartbeats to; a lost process is "
                    "noticed by jax.distributed's own timeout (%d s)", int(2 * timeout_s) + 5)
        return
    _WATCH = _Watch(client, timeout_s, coordinator)


def set_resume_hint(text: str) -> None:
    """What the line of a lost process says about resuming (the loop keeps it current)."""
    if _WATCH is not None:
        _WATCH.resume_hint = text


def await_verdict(error: BaseException) -> None:
    """A collective raised (e.g. gloo's 'Connection closed by peer'): give the watcher time
    to name a lost process (it ends this process); returns if every peer is still alive."""
    if _WATCH is None:
        return
    deadline = time.monotonic() + _WATCH.timeout_s + 2 * _WATCH.interval + 1
    while time.monotonic() < deadline:
        time.sleep(_WATCH.interval / 2)


class _Collective:
    def __init__(self, name: str):
        self.name, self.key = name, None

    def __enter__(self):
        if _WATCH is not None:
            self.key = _WATCH.enter(self.name)

    def __exit__(self, *exc):
        if self.key is not None:
            _WATCH.leave(self.key)


# ----------------------------------------------------------------------------- collectives


def allgather(x: Any, name: str = "allgather") -> np.ndarray:
    """Stack a same-shaped host array from every process: [process_count, *x.shape]."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x[None]
    from jax.experimental import multihost_utils

    with _Collective(name):
        return np.asarray(multihost_utils.process_allgather(x, tiled=False))


def global_sum(x: Any) -> np.ndarray:
    """Sum a same-shaped host array over processes (identical result everywhere)."""
    return allgather(x, "global_sum").sum(axis=0)


def sync(name: str) -> None:
    """Barrier across processes (no-op single-process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        with _Collective(name):
            multihost_utils.sync_global_devices(name)


# ----------------------------------------------------------------------------- preemption


class Preemption:
    """SIGTERM (a preempted VM) and SIGINT (Ctrl-C) as a request to stop.

    Before `training()` (setup, compiles) a signal ends the process at once with one line:
    nothing is lost. During training the first signal only sets `signum`; the loop finishes
    its step, checkpoints (every process joins: `requested()` agrees across processes) and
    returns; the command exits 0 after SIGTERM, 130 after SIGINT. A second signal ends the
    process at once (exit 128 + its number) with one line.

    The signals are read on a thread from `signal.set_wakeup_fd`, to which the C-level handler
    writes at once, so this holds while the main thread is inside a long compile or
    computation (a Python-level handler would only run after it). `install()` must run after
    JAX has started its backends: libtpu installs a failure-signal handler that dumps a stack
    on SIGTERM, and the handler installed last wins.
    """

    EXIT = {signal.SIGTERM: 0, signal.SIGINT: 130}

    def __init__(self, command: str = "the same command"):
        self.signum: int | None = None
        self.command = command
        self.resume = "to start"
        self.in_training = False
        self._previous: dict[int, Any] = {}
        self._fds: tuple[int, int] | None = None
        self._previous_fd = -1

    def install(self) -> Preemption:
        """Install (again: after a library replaced them) the handlers; main thread only."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for s in self.EXIT:
            previous = signal.signal(s, _ignore)
            self._previous.setdefault(s, previous)
        if self._fds is None:
            r, w = os.pipe()
            os.set_blocking(w, False)
            self._fds = (r, w)
            self._previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            threading.Thread(target=self._read, args=(r,), name="ada-signals", daemon=True).start()
        return self

    def uninstall(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        if self._fds is not None:
            signal.set_wakeup_fd(self._previous_fd)
            os.close(self._fds[1])  # the reader sees end of file and stops
            self._fds = None

    def _read(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                os.close(fd)
                return
            for signum in data:
                if signum in self.EXIT:
                    self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        if self.signum is None and self.in_training:
            self.signum = signum  # the loop stops after this step
            return
        name = signal.Signals(signum).name
        if self.signum is not None:
            line = (f"a second {name}: stopped at once, without checkpointing the current step; "
                    f"rerun {self.command} {self.resume}")
        else:
            line = f"{name}: stopped before training started, nothing lost; rerun {self.command} {self.resume}"
        try:  # fd 2 itself: sys.stderr may be redirected for a moment (a checkpoint save)
            os.write(2, f"\n{line}\n".encode())
        finally:
            os._exit(128 + signum if self.signum is not None else self.EXIT[signum])

    def training(self, resume: str) -> None:
        """From now on a first signal stops after the current step; `resume` ('to resume from
        step N') is what the line of a second one says."""
        self.resume, self.in_training = resume, True

    def requested(self) -> int | None:
        """The signal that asked to stop, agreed by every process (a collective when there
        are several: every process calls it once per step), or None."""
        if jax.process_count() == 1:
            return self.signum
        got = allgather(np.int32(self.signum or 0), "preemption")
        return int(got.max()) or None



def _ignore(signum, frame) -> None:
    """The Python-level handler: nothing (the reader thread of Preemption acts)."""
