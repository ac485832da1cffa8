"""SIGTERM (a preempted VM) and SIGINT (Ctrl-C) as a request to stop, and the exit codes an
orchestrator acts on.

Exit codes of a training run (`python -m ada.runner`): 0 only when train.steps is reached;
143 (128 + SIGTERM) after SIGTERM: stopped, checkpointed where the budget allowed, resumable:
the "restart me" code; 130 (128 + SIGINT) after Ctrl-C; 1 for a crash, a lost or failed peer
(ada/watch.py), a full disk or non-finite updates; 2 for bad input (ada/config.py: fail).

The command line installs this first, before anything heavy is imported (this module imports
only the standard library at its top): from the first instant until `training()` (imports,
setup, compiles) a signal ends the process at once with one line: nothing is lost. During
training the first signal says at once which step the run stops after and sets `signum`; the
loop finishes that step, checkpoints and returns; every process stops after the same step
(`requested()` is an all-gather every step, as JAX's preemption sync point agrees on one step
through the coordination service). A second signal ends the process at once with one line.

After SIGTERM the VM has a notice of about 30 s: `checkpoint.preemption_budget_s` (default
25) after the signal reached this process (or its agreement did), a stop that has not
finished (the rest of the step, the final save) is abandoned with one line: the last
complete checkpoint stays the one to resume from (orbax writes a step into a temporary
directory and renames it into place only when complete; the next start removes the rest).

The signals are read on a thread from `signal.set_wakeup_fd`, to which the C-level handler
writes at once, so this holds while the main thread is inside an import, a long compile or
computation (a Python-level handler would only run after it; Python's own SIGINT handler
raised KeyboardInterrupt wherever the main thread was, even in a garbage-collection callback
that swallows it). The thread imports nothing: until `watched()` an exit is this process's
alone. `install()` must run again after JAX has started its backends: libtpu installs a
failure-signal handler that dumps a stack on SIGTERM, and the handler installed last wins.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(signum: int) -> int:
    """The exit code of a run stopped by `signum`: 143 after SIGTERM, 130 after SIGINT."""
    return 128 + signum


class Preemption:
    """The signal handling of the module docstring for one command (`command`: what its
    lines tell the user to rerun; `budget_s`: checkpoint.preemption_budget_s, set once the
    config is read)."""

    def __init__(self, command: str, budget_s: float = 25.0):
        self.signum: int | None = None
        self.command, self.budget_s = command, budget_s
        self.resume = "to start"
        self.step = None  # during training: the step in progress (a function)
        self.in_training = False
        self._watch = None
        self._budget: threading.Timer | None = None
        self._settled = threading.Lock()  # the budget's line and the finished stop's: one
        self._finished = False
        self._previous: dict[int, Any] = {}
        self._fds: tuple[int, int] | None = None
        self._reader: threading.Thread | None = None
        self._previous_fd = -1

    def install(self) -> Preemption:
        """Install (again: after a library replaced them) the handlers; main thread only."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for s in SIGNALS:
            previous = signal.signal(s, _ignore)
            self._previous.setdefault(s, previous)
        if self._fds is None:
            r, w = os.pipe()
            os.set_blocking(w, False)
            self._fds = (r, w)
            self._previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            self._reader = threading.Thread(target=self._read, args=(r,), name="ada-signals",
                                            daemon=True)
            self._reader.start()
        return self

    def uninstall(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        if self._fds is not None:
            signal.set_wakeup_fd(self._previous_fd)
            os.close(self._fds[1])  # the reader sees end of file and stops
            self._fds = None
            if self._reader is not threading.current_thread():
                # ended before the interpreter is: a daemon thread that wakes while Python
                # finalizes aborts the process ("FATAL: exception not rethrown", exit 134)
                self._reader.join(timeout=5)

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
                if signum in SIGNALS:
                    self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.signum is None and self.in_training:
            self._stop(signum)  # the loop stops after this step; a step may take minutes
            again = "press Ctrl-C again to stop" if signum == signal.SIGINT else \
                "a second SIGTERM stops"
            os.write(2, f"\n{name}: stopping after step {self.step()}; {again} now, losing "
                        "it\n".encode())
            return
        if self.signum is not None:
            what = f"a second {name}: stopped at once, without checkpointing the current step"
        else:
            what = f"{name}: stopped before training started, nothing lost"
        self._exit(exit_code(signum), f"{what}; rerun {self.command} {self._resume()}",
                   f" received {what}")

    def watched(self) -> Preemption:
        """From now on an exit tells the run's other processes (ada/watch.py). Called once
        the imports are done: the signal thread must not import (it would wait for the main
        thread's `import jax`)."""
        from ada import watch

        self._watch = watch
        return self

    def _exit(self, code: int, line: str, what: str) -> None:
        if self._watch is not None:
            self._watch.exit_now(code, line, f"{self._watch.this_process()}{what}")
        with contextlib.suppress(Exception):  # before any import: this process alone
            sys.stdout.flush()
        os.write(2, f"{line}\n".encode())
        os._exit(code)

    def _stop(self, signum: int) -> None:
        self.signum = signum
        if signum == signal.SIGTERM:
            self._budget = threading.Timer(self.budget_s, self._over_budget)
            self._budget.daemon = True
            self._budget.start()

    def _over_budget(self) -> None:
        with self._settled:  # held into the exit: a stop finishing now waits for it
            if not self._finished:
                self._abandon()

    def _abandon(self) -> None:
        what = (f"SIGTERM: the stop did not finish within checkpoint.preemption_budget_s="
                f"{self.budget_s:g} s of the signal; the step in flight or its final checkpoint "
                "is abandoned")
        self._exit(exit_code(signal.SIGTERM), f"{what}; rerun {self.command} {self._resume()}",
                   f": {what}")

    def done(self) -> None:
        """Training returned (after a stop: with its final checkpoint): the budget no longer
        runs."""
        with self._settled:  # a budget that fired just now has exited already
            self._finished = True
        if self._budget is not None:
            self._budget.cancel()

    def training(self, resume, step) -> None:
        """From now on a first signal stops after the current step (`step()`, the one its
        line names); `resume` ('to resume from step N', or a function giving it when a line
        is due: with async saves the latest complete checkpoint changes between steps) is
        what the lines of a later one say."""
        self.resume, self.step, self.in_training = resume, step, True

    def _resume(self) -> str:
        return self.resume() if callable(self.resume) else self.resume

    def requested(self) -> int | None:
        """The signal that asked to stop, agreed by every process (a collective when there
        are several: every process calls it once per step), or None."""
        import jax  # imported by now (training runs)
        import numpy as np

        from ada import distributed

        if jax.process_count() == 1:
            return self.signum
        got = int(distributed.allgather(np.int32(self.signum or 0), "preemption").max()) or None
        if got and self.signum is None:  # another process's signal: this one stops too
            self._stop(got)
        return got


def _ignore(signum, frame) -> None:
    """The Python-level handler: nothing (the reader thread of Preemption acts)."""
