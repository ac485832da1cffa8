"""How the processes of a multi-process run end together: heartbeats, exit notices, stalls.

A lost process never hangs the others (`distributed.timeout_s`): every process writes a
heartbeat to jax.distributed's key-value store every `interval` (timeout_s / 10, at most
POLL_S) from a thread of its own, and reads back every key under `ada/`; a watcher thread
(pure Python, it never blocks) ends this process with one line naming the lost one when a
peer's heartbeat has not changed for timeout_s, or when the coordinator (process 0) has not
answered for timeout_s. jax.distributed's own heartbeat timeout is twice that, as a backstop
(it aborts with a stack dump). A collective of ours (`collective`) that waits longer than
timeout_s while every peer is alive is logged once, and ends the process after
COLLECTIVE_FACTOR x timeout_s (a hung peer).

A process that ends for a reason of its own (it raised, it lost a peer, its preemption budget
ran out) first writes an exit notice, `ada/exit/<process>` = "CODE WHAT", to the same store;
the others read it within `interval` and end with the same exit code and one line naming the
process and WHAT. So a crash in one process ends every process in seconds, not timeouts. The
store lives in process 0: process 0 ends only once every live peer has read the notices
(`ada/ack/<process>`), or after 2 x interval + 1 s. A process that raised first asks its
peers whether they are alive (`ada/ping/<process>`, answered by each heartbeat thread): an
error that a dead peer caused (a collective's "connection reset") is then reported as that
peer's loss by the watcher, not as this process's own failure.

A process's own stall (SIGSTOP, a host hiccup, a long C call holding the GIL) is no peer's
silence: the watcher measures a peer's silence in the time it was itself awake (a watcher
tick that comes late credits every peer with the delay). A stall longer than timeout_s is
reported as this process's own: the others count it as lost by the same rule.

When the coordinator's process dies, jax's coordination agent in each other process notices
at once and aborts it with a stack dump; a multi-process run's stderr therefore passes
through a small filter process (`filter_stderr`) that replaces that report with one line.

The one dependence on JAX internals is `coordination_client` (tests/test_faults_multihost.py
fails when its hook moves).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import sys
import threading
import time
import traceback

import jax

log = logging.getLogger(__name__)

TIMEOUT_S = 300.0  # distributed.timeout_s's default: a lost process is noticed within this
POLL_S = 1.0  # the longest heartbeat / notice interval: a notice is read within this
COLLECTIVE_FACTOR = 10  # a collective waiting this many timeouts for live peers: one is hung
EXIT_FAILED = 1  # exit code of a process that raised, or whose peer failed or was lost
_WATCH: _Watch | None = None
_ENDING = threading.Lock()  # held by the one thread that ends this process
_KEYS = itertools.count()


def coordination_client():
    """jax.distributed's key-value client (JAX internals: the one place ada reads them), or
    None when this jax keeps it elsewhere."""
    try:
        from jax._src import distributed as jax_distributed

        return jax_distributed.global_state.client
    except Exception:  # noqa: BLE001 - another jax layout: jax's own heartbeat still bounds it
        return None


def exit_now(code: int, line: str | None, what: str | None = None, *, tell: bool = True) -> None:
    """End this process at once: `line` on fd 2 (sys.stderr may be redirected for a moment:
    a checkpoint save), then, in a watched run with `tell`, the exit notice `what` (None: this
    process ends on another's notice and acknowledges it). No atexit: jax's shutdown barrier
    would wait for the others."""
    if not _ENDING.acquire(blocking=False):  # another thread is ending this process
        while True:
            time.sleep(60)
    try:
        with contextlib.suppress(Exception):  # a closed or broken stdout: the line still goes
            sys.stdout.flush()
        if line:
            os.write(2, f"\n{line}\n".encode())
        if _WATCH is not None and tell:
            _WATCH.tell(code, what)
            _WATCH.await_readers()
    finally:
        os._exit(code)


_FILTER = r"""
import os, re, select, sys, time
out, pid, n = int(sys.argv[1]), sys.argv[2], sys.argv[3]
# the distributed runtime's reports; held back a while, dropped if the process then aborts
held_marks = (b"preemption_sync_manager.cc", b"coordination_service_agent.cc",
              b"coordination_service.cc", b"/xla.coordination.CoordinationService/",
              b"coordination service")
fatal_marks = (b"Terminating process because the JAX distributed service",
               b"Polled an error from coordination service")
held, fatal, since, explained = b"", False, 0.0, False
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
        own = re.search(rb"(?m)^error: ", chunk)
        if own:  # ada's own line explains the end: the runtime's report held before it is dropped
            os.write(out, chunk[own.start():])
            held, explained = b"", True
            continue
        held += chunk
    else:
        hits = [chunk.find(m) for m in held_marks + fatal_marks if m in chunk]
        if not hits:
            os.write(out, chunk)
            explained = explained or b"\nerror: " in chunk  # ada's own last line
            continue
        start = chunk.rfind(b"\n", 0, min(hits)) + 1
        os.write(out, chunk[:start])
        explained = explained or b"\nerror: " in chunk[:start]
        held, since = chunk[start:], time.monotonic()
    fatal = fatal or any(m in held for m in fatal_marks)
if held and not fatal:
    os.write(out, held)
elif fatal and not explained:
    text = held.decode(errors="replace")
    lost = re.search(r"Task (\d+) heartbeat timeout|stopped sending heartbeats\):\s*(\d+)", text)
    who = (f"process {lost.group(1) or lost.group(2)} of {n} is lost" if lost else
           f"process 0 (the coordinator) of {n} is lost" if "leader" in text or "RPC to "
           "coordination service" in text else "a process of the run is lost")
    os.write(out, (f"\nerror: {who} (jax.distributed's coordination service reports it); "
                   f"process {pid} of {n} stops too; rerun the same command on every host to "
                   "resume from the latest checkpoint\n").encode())
"""


def filter_stderr() -> None:
    """Pass this process's stderr (fd 2) through a child that forwards it unchanged until
    jax's coordination agent reports a fatal error (it then aborts this process with a
    stack dump), and prints one line naming the lost process instead of that report (none
    when ada's own `error:` line came first). The child is in a session of its own (Ctrl-C
    does not end it) and ends with the pipe."""
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
    """The heartbeat writer, the notice reader and the watcher of the module docstring."""

    def __init__(self, client, timeout_s: float, coordinator: str):
        self.client, self.timeout_s, self.coordinator = client, float(timeout_s), coordinator
        self.pid, self.n = jax.process_index(), jax.process_count()
        self.interval = min(max(self.timeout_s / 10, 0.2), POLL_S)
        now = time.monotonic()
        self.last_ok = now  # the last heartbeat round the coordination service answered
        self.seen: dict[int, tuple[str | None, float]] = {p: (None, now) for p in range(self.n)
                                                          if p != self.pid}
        self.notices: dict[int, str] = {}  # process -> "CODE WHAT" of its exit notice
        self.acks: set[int] = set()  # processes that ended on a notice
        self.pongs: dict[int, str] = {}  # process -> the last question of ours it answered
        self.answered: dict[int, str] = {}  # process -> the last question of its we answered
        self.collectives: dict[int, tuple[str, float, bool]] = {}  # id -> (name, start, warned)
        self.resume_hint = "rerun the same command on every host to resume from the latest checkpoint"
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=target, name=name, daemon=True)
                         for target, name in ((self._beat, "ada-heartbeat"),
                                              (self._watch, "ada-watchdog"))]
        for thread in self._threads:
            thread.start()
        # a daemon thread still inside a coordination-service call when the interpreter
        # finalizes is unwound through C++ frames, which aborts the process (exit -6)
        atexit.register(self.stop)

    def stop(self) -> None:
        """At a normal exit: end both threads between two calls (a call runs at most a
        coordination-service timeout; a thread still in one after that is left)."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(self.interval + 5)

    def _beat(self) -> None:
        count = 0
        while not self._stopping.is_set():
            count += 1
            try:
                self.client.key_value_set(f"ada/heartbeat/{self.pid}", str(count),
                                          allow_overwrite=True)
                entries = self.client.key_value_dir_get("ada/")
            except Exception:  # noqa: BLE001 - the watcher decides when this is fatal
                self._stopping.wait(self.interval)
                continue
            now, pings = time.monotonic(), {}
            with self._lock:
                self.last_ok = now
                for key, value in entries:
                    kind, p, *to = key.rstrip("/").split("/")[1:]
                    p = int(p)
                    if kind == "heartbeat" and p in self.seen and self.seen[p][0] != value:
                        self.seen[p] = (value, now)
                    elif kind == "exit" and p != self.pid:
                        self.notices[p] = value
                    elif kind == "ack":
                        self.acks.add(p)
                    elif kind == "ping" and p != self.pid and self.answered.get(p) != value:
                        pings[p] = value
                    elif kind == "pong" and to == [str(self.pid)]:
                        self.pongs[p] = value
            for p, token in pings.items():  # alive: answer each new question once
                self._set(f"ada/pong/{self.pid}/{p}", token)
                self.answered[p] = token
            self._stopping.wait(self.interval)

    def _watch(self) -> None:
        tick = time.monotonic()
        while not self._stopping.wait(self.interval / 2):
            now = time.monotonic()
            late, tick = now - tick - self.interval / 2, now
            if late > self.timeout_s:  # the others have given this process up: nobody to tell
                self.end(f"process {self.pid} of {self.n} (this one) was stalled for {late:.0f} s "
                         f"(a frozen host, or a long call holding the GIL), longer than "
                         f"distributed.timeout_s={self.timeout_s:g}: the others count it as lost",
                         tell=False)
            with self._lock:
                if late > self.interval / 2:  # our own stall: no peer was silent meanwhile
                    self.last_ok = min(self.last_ok + late, now)
                    self.seen = {p: (v, min(t + late, now)) for p, (v, t) in self.seen.items()}
                    self.collectives = {k: (name, start + late, warned) for k, (name, start, warned)
                                        in self.collectives.items()}
                silent = now - self.last_ok
                stale = sorted(p for p, (_, t) in self.seen.items() if now - t > self.timeout_s)
                notice = min(self.notices.items(), default=None)
                waits = list(self.collectives.items())
            if notice is not None:
                code, what = notice[1].split(" ", 1)
                self.end(what, int(code), notice=False)
            if silent > self.timeout_s and self.pid != 0:
                self.end(f"process 0 (the coordinator, {self.coordinator}) is lost: no answer "
                         f"for {silent:.0f} s (distributed.timeout_s={self.timeout_s:g})")
            if stale:
                names = ", ".join(str(p) for p in stale)
                self.end(f"process {names} of {self.n} is lost: no heartbeat for more than "
                         f"{self.timeout_s:g} s (distributed.timeout_s)")
            for key, (name, start, warned) in waits:
                waited = now - start
                if waited > COLLECTIVE_FACTOR * self.timeout_s:
                    self.end(f"'{name}' waited {waited:.0f} s for the other processes, which "
                             f"are alive but do not arrive (one is hung)")
                if waited > self.timeout_s and not warned:
                    with self._lock:
                        if key in self.collectives:
                            self.collectives[key] = (name, start, True)
                    log.warning("'%s' has waited %.0f s for the other processes (alive); it "
                                "gives up after %.0f s", name, waited,
                                COLLECTIVE_FACTOR * self.timeout_s)

    def end(self, what: str, code: int = EXIT_FAILED, *, notice: bool = True,
            tell: bool = True) -> None:
        """End this process with one line: `what`, then what it means here; `notice`: the
        others learn `what` from this process (else it only acknowledges another's)."""
        exit_now(code, f"error: {what}; process {self.pid} of {self.n} stops too; "
                       f"{self.resume_hint}", what if notice else None, tell=tell)

    def tell(self, code: int, what: str | None) -> None:
        """Write this process's exit notice (or its acknowledgement of another's); a
        coordinator that does not answer within a second is not waited for."""
        key, value = ((f"ada/exit/{self.pid}", f"{code} {what}") if what is not None else
                      (f"ada/ack/{self.pid}", "1"))
        t = threading.Thread(target=self._set, args=(key, value), daemon=True)
        t.start()
        t.join(self.interval + 1)

    def _set(self, key: str, value: str) -> None:
        try:
            self.client.key_value_set(key, value, allow_overwrite=True)
        except Exception as e:  # noqa: BLE001 - the others then notice by the heartbeats
            log.debug("cannot write %s (%s)", key, e)

    def await_readers(self) -> None:
        """On process 0, whose coordination service holds the notices: wait until every
        live peer has read them (it acknowledged, or wrote a notice of its own)."""
        if self.pid != 0:
            return
        deadline = time.monotonic() + 2 * self.interval + 1
        while time.monotonic() < deadline:
            now = time.monotonic()
            with self._lock:
                if all(p in self.acks or p in self.notices or now - t > self.timeout_s
                       for p, (_, t) in self.seen.items()):
                    return
            time.sleep(self.interval / 4)

    def enter(self, name: str) -> int:
        key = next(_KEYS)
        with self._lock:
            self.collectives[key] = (name, time.monotonic(), False)
        return key

    def leave(self, key: int) -> None:
        with self._lock:
            self.collectives.pop(key, None)

    def await_verdict(self) -> None:
        """After this process raised: ask every peer whether it is alive (`ada/ping/<us>`, a
        new token; each answers from its heartbeat thread). Return once all have answered
        (the error is this process's own); a peer's notice, or the watcher's verdict on a
        peer that never answers (the error was a collective losing it), ends this process
        first, within the lost-process bound."""
        token = str(time.time_ns())
        self._set(f"ada/ping/{self.pid}", token)
        deadline = time.monotonic() + self.timeout_s + 2 * self.interval + 1
        while time.monotonic() < deadline:
            time.sleep(self.interval / 4)
            with self._lock:
                if not self.notices and all(self.pongs.get(p) == token for p in self.seen):
                    return


def start(timeout_s: float, coordinator: str) -> None:
    """Start the watch of this multi-process run (once)."""
    global _WATCH
    if _WATCH is not None:
        return
    client = coordination_client()
    if client is None:
        log.warning("no jax.distributed client to write heartbeats to; a lost process is "
                    "noticed by jax.distributed's own timeout (%d s)", int(2 * timeout_s) + 5)
        return
    _WATCH = _Watch(client, timeout_s, coordinator)


def set_resume_hint(text: str) -> None:
    """What the line of a process that ends says about resuming (the loop keeps it current)."""
    if _WATCH is not None:
        _WATCH.resume_hint = text


def this_process() -> str:
    """'process P of N' in a watched run (no JAX call: safe before its backends start)."""
    return f"process {_WATCH.pid} of {_WATCH.n}" if _WATCH is not None else "this process"


def fail(code: int, what: str) -> None:
    """This process stops for `what` (its one line already printed): in a watched run, tell
    the others and end now; a single process returns (the command exits with `code`)."""
    if _WATCH is not None:
        exit_now(code, None, f"{this_process()} failed: {what}")


def crash(error: BaseException) -> None:
    """This process raised `error`. Single process: returns (the caller re-raises). In a
    watched run a peer's notice or loss, when that was the cause, ends this process with its
    line; otherwise the traceback is printed, the others are told, and the process ends (1)."""
    if _WATCH is None:
        return
    _WATCH.await_verdict()
    traceback.print_exception(error)
    sys.stderr.flush()
    first = (str(error).strip().splitlines() or [""])[0][:300]
    fail(EXIT_FAILED, f"{type(error).__name__}: {first}".rstrip(": "))


class collective:  # noqa: N801 - a context manager, named as the call it wraps
    """`with collective(name):` around a cross-process wait, for the hung-peer bound."""

    def __init__(self, name: str):
        self.name, self.key = name, None

    def __enter__(self):
        if _WATCH is not None:
            self.key = _WATCH.enter(self.name)

    def __exit__(self, *exc):
        if self.key is not None:
            _WATCH.leave(self.key)
