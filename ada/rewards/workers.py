"""A process pool where every call has a hard wall-clock limit.

Why not `multiprocessing.Pool` or `concurrent.futures`: neither can stop one task that is
stuck inside C code (a huge sympy power, a catastrophic regex). Here each worker owns one
pipe; the parent hands out one task at a time, waits with a deadline, and a worker that
passes its deadline is killed (SIGKILL) and replaced. A worker that dies under a task (the
OOM killer, a segfault in a C extension, a kill) is replaced and its task retried once on
the new worker; a task that loses its worker twice is an error. A task's outcome is one of
`("ok", value)`, `("timeout", None)` or `("error", message)`; `map` itself never raises
for a task's sake. A task's clock starts when a ready worker takes it: start-up
(imports, and the re-import of the parent's `__main__` that spawn/forkserver do) is not
charged to it.

Start method: 'forkserver' where the platform has it, else 'spawn'. Never plain 'fork':
the parent usually has JAX (multithreaded) loaded, and forking a multithreaded process
can deadlock the child. The fork server is a fresh single-threaded process that imports
the `preload` modules once, so replacing a killed worker costs a fork (milliseconds), not a
fresh interpreter plus a sympy import (about a second). Like any spawn/forkserver use, a
script that builds a pool must keep its top level behind `if __name__ == "__main__":`.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

START_TIMEOUT_S = 120.0  # a worker that is not ready by then is replaced
Outcome = tuple[str, Any]  # ("ok", value) | ("timeout", None) | ("error", message)


def _worker_main(conn, fn: Callable) -> None:
    """Say "ready" (imports done), then loop: receive (index, args), send (index,
    outcome); exit on None or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business.
    try:
        conn.send(("ready", os.getpid()))
    except (EOFError, OSError, BrokenPipeError):
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        index, args = msg
        try:
            outcome = ("ok", fn(*args))
        except BaseException as e:  # noqa: BLE001 - a task may fail in any way; report it.
            outcome = ("error", f"{type(e).__name__}: {str(e)[:200]}")
        try:
            conn.send((index, outcome))
        except (EOFError, OSError, BrokenPipeError):
            return


@dataclasses.dataclass
class _Worker:
    process: Any
    conn: Any
    started: float  # time.monotonic() at start; start-up does not count against tasks
    ready: bool = False
    task: int | None = None  # index of the task it is running
    deadline: float = 0.0


@dataclasses.dataclass
class WorkerStats:
    """Counters since the pool was made. `busy_s` is wall time spent inside `map`."""

    tasks: int = 0
    timeouts: int = 0
    errors: int = 0
    restarts: int = 0
    retries: int = 0  # tasks whose worker died under them, run again on a fresh one
    busy_s: float = 0.0

def _default_context():
    methods = mp.get_all_start_methods()
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")


class HardTimeoutPool:
    """`num_workers` processes running `fn(*args)`, each call killed after `timeout_s`.

    `fn` must be importable at module level (it is pickled by reference). `preload` names
    modules the fork server imports once, so workers (and their replacements) start warm.
    Use as a context manager, or call `close()`; workers also exit when the parent's end of
    their pipe closes.
    """

    def __init__(
        self,
        fn: Callable,
        num_workers: int | None = None,
        timeout_s: float = 5.0,
        preload: Sequence[str] = (),
        context: str | None = None,
    ):
        if num_workers is None:
            num_workers = max(1, min(4, os.cpu_count() or 1))
        if int(num_workers) < 1:
            raise ValueError(f"num_workers={num_workers} must be >= 1")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0 (seconds per call)")
        self._fn = fn
        self.num_workers = int(num_workers)
        self.timeout_s = float(timeout_s)
        self._ctx = mp.get_context(context) if context else _default_context()
        if self._ctx.get_start_method() == "fork":
            raise ValueError(
                "context='fork' is unsafe here (JAX threads in the parent); "
                "use 'forkserver' or 'spawn'"
            )
        if self._ctx.get_start_method() == "forkserver" and preload:
            # Only takes effect if this process's fork server is not running yet.
            self._ctx.set_forkserver_preload(list(preload))
        self.stats = WorkerStats()
        self._failed_starts = 0
        self._workers: list[_Worker] = []
        self._closed = False
        for _ in range(self.num_workers):
            self._workers.append(self._start_worker())

    # -- lifecycle -----------------------------------------------------------------------
    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main, args=(child_conn, self._fn), daemon=True,
            name="ada-verifier-worker",
        )
        process.start()
        child_conn.close()
        return _Worker(process=process, conn=parent_conn, started=time.monotonic())

    def _kill(self, worker: _Worker) -> None:
        try:
            worker.conn.close()
        except OSError:
            pass
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5.0)

    def _replace(self, worker: _Worker) -> None:
        self._kill(worker)
        self._workers[self._workers.index(worker)] = self._start_worker()
        self.stats.restarts += 1

    def _start_failed(self, worker: _Worker, why: str) -> None:
        self._failed_starts += 1
        if self._failed_starts > 3 * self.num_workers:
            raise RuntimeError(
                f"HardTimeoutPool: workers keep failing to start ({why}); check that "
                f"{getattr(self._fn, '__module__', '?')} imports in a fresh interpreter"
            )
        self._replace(worker)

    def close(self) -> None:
        """Ask workers to exit, then kill any that do not within a second."""
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 1.0
        for w in self._workers:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            self._kill(w)
        self._workers = []

    def __enter__(self) -> HardTimeoutPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing useful to do.
            pass

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    # -- work ----------------------------------------------------------------------------
    def map(self, args_list: Sequence[tuple]) -> list[Outcome]:
        """Run `fn(*args)` for every args tuple; outcomes in input order."""
        if self._closed:
            raise RuntimeError("HardTimeoutPool is closed; make a new one")
        t0 = time.monotonic()
        try:
            outcomes = self._run(args_list)
        except BaseException:
            # Interrupted (e.g. Ctrl-C): in-flight answers would reach the next call.
            for w in list(self._workers):
                if w.task is not None:
                    w.task = None
                    self._replace(w)
            raise
        finally:
            self.stats.busy_s += time.monotonic() - t0
        self.stats.tasks += len(args_list)
        return outcomes

    def _run(self, args_list: Sequence[tuple]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(args_list)
        todo = collections.deque(range(len(args_list)))
        lost = [0] * len(args_list)  # times a task's worker died under it
        while todo or any(w.task is not None for w in self._workers):
            for w in list(self._workers):  # hand out work to ready, idle workers
                if w.ready and w.task is None and todo:
                    i = todo.popleft()
                    try:
                        w.conn.send((i, args_list[i]))
                    except (OSError, BrokenPipeError):
                        todo.appendleft(i)  # worker died while idle: replace and retry
                        self._replace(w)
                        continue
                    w.task, w.deadline = i, time.monotonic() + self.timeout_s
            busy = [w for w in self._workers if w.task is not None]
            starting = [w for w in self._workers if not w.ready]
            deadlines = [w.deadline for w in busy] + [w.started + START_TIMEOUT_S for w in starting]
            wait_s = max(0.0, min(deadlines) - time.monotonic())
            ready = set(mp_connection.wait([w.conn for w in busy + starting], timeout=wait_s))
            now = time.monotonic()
            for w in starting:
                if w.conn in ready:
                    try:
                        w.conn.recv()  # ("ready", pid)
                        w.ready, self._failed_starts = True, 0
                    except (EOFError, OSError):
                        self._start_failed(w, "a worker exited while starting")
                elif now >= w.started + START_TIMEOUT_S:
                    self._start_failed(w, f"not ready after {START_TIMEOUT_S:.0f}s")
            for w in busy:
                if w.conn in ready:
                    try:
                        index, outcome = w.conn.recv()
                    except (EOFError, OSError):  # the worker died (e.g. out of memory)
                        i, w.task = w.task, None
                        self._replace(w)
                        lost[i] += 1
                        if lost[i] == 1:  # once more, on the fresh worker
                            self.stats.retries += 1
                            todo.appendleft(i)
                        else:
                            outcomes[i] = ("error", f"worker process died ({lost[i]} times)")
                            self.stats.errors += 1
                        continue
                    outcomes[index] = outcome
                    self.stats.errors += outcome[0] == "error"
                    w.task = None
                elif now >= w.deadline:
                    outcomes[w.task] = ("timeout", None)
                    self.stats.timeouts += 1
                    w.task = None
                    self._replace(w)
        return outcomes  # type: ignore[return-value]
