"""Run a policy's Python code in a limited subprocess (the `python` tool without a remote sandbox).

What a run gets (docs/reliability.md, "The Python tool's sandbox", says what this does NOT
stop: it is a fence against accidents and a policy's bad habits, not a security boundary):

  - a fresh interpreter in isolated mode (`python -I -S`: no PYTHON* variables, no user site,
    no script folder on sys.path, no .pth file run; site-packages stay importable) with a
    minimal environment (PATH, HOME, LANG; no variable
    of the parent's), in an empty temporary folder removed afterwards;
  - resource limits set by a small bootstrap before the code runs: CPU seconds (RLIMIT_CPU),
    address space (RLIMIT_AS), file size (RLIMIT_FSIZE), no new processes (RLIMIT_NPROC 0;
    root is exempt from it), no core files;
  - an import allow-list (ALLOWED_IMPORTS; anything else raises ImportError in the child),
    os's (and posix's) process functions (fork, system, exec*, spawn*, kill, ...) replaced by
    ones that raise PermissionError, and `open` refusing to write outside the working folder;
  - a wall-clock limit after which the whole process group is killed (a new session per run);
  - stdout and stderr merged and read up to `max_output_bytes`: past it the run is stopped
    and the output kept so far is the result (a 10 MB print is never held in the parent).

The code goes to the child on stdin; the bootstrap comes on the command line. Exit status
3 from the bootstrap means the code tried something refused (`forbidden`), even if it
caught the error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# Modules the code may import (their own imports are not checked); sympy where installed.
ALLOWED_IMPORTS = ("math", "cmath", "fractions", "itertools", "functools", "collections",
                   "decimal", "statistics", "re", "sympy", "random", "string", "heapq",
                   "bisect", "operator")
MAX_OUTPUT_BYTES = 64 * 1024  # of stdout + stderr; the env then cuts to its token limit
MAX_CODE_BYTES = 64 * 1024
FORBIDDEN_EXIT = 3

_BOOTSTRAP = r"""
import builtins, io, json, linecache, os, resource, signal, site, sys, traceback
sys.path.extend(site.getsitepackages())  # -S: site-packages (sympy) without running .pth files
builtins.exit = builtins.quit = sys.exit
cfg = json.loads(sys.argv[1])
code = sys.stdin.read()
sys.stdin.close()
for name, soft, hard in (("CPU", cfg["cpu_s"], cfg["cpu_s"] + 1), ("AS", cfg["as_bytes"], None),
                         ("FSIZE", cfg["fsize_bytes"], None), ("NPROC", 0, 0), ("CORE", 0, 0)):
    limit = getattr(resource, "RLIMIT_" + name)
    resource.setrlimit(limit, (soft, soft if hard is None else hard))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the size limit raises instead
root, allowed, refused = os.getcwd(), frozenset(cfg["allow"]), []
real_import, real_open, _exit = builtins.__import__, builtins.open, os._exit

def refuse(what, error):
    refused.append(what)
    raise error(what + " is not allowed in this sandbox")

def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    user = sys._getframe(1).f_globals.get("__name__") == "__main__"  # the code, not a module
    if user and (level or name.partition(".")[0] not in allowed):
        refuse("import " + name + " (allowed: " + ", ".join(sorted(allowed)) + ")", ImportError)
    return real_import(name, globals, locals, fromlist, level)

def guarded_open(file, mode="r", *args, **kwargs):
    if not isinstance(file, int) and any(c in mode for c in "wax+"):
        path = os.path.realpath(os.fsdecode(file))
        if path != root and not path.startswith(root + os.sep):
            refuse("writing " + repr(file) + " (outside the working folder)", PermissionError)
    return real_open(file, mode, *args, **kwargs)

def blocked(name):
    def call(*args, **kwargs):
        refuse("os." + name, PermissionError)
    return call

for module in (os, sys.modules.get("posix")):
    for name in [n for n in dir(module) if n.startswith(("exec", "spawn", "posix_spawn", "fork"))
                 ] + ["system", "popen", "kill", "killpg"]:
        if hasattr(module, name):
            setattr(module, name, blocked(name))
builtins.open = io.open = guarded_open
builtins.__import__ = guarded_import
linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
status = 0
try:
    exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
except SystemExit as e:
    status = 0 if e.code in (None, 0) else 1
except BaseException as e:
    status = 1
    report = traceback.TracebackException(type(e), e, e.__traceback__)
    report.stack = traceback.StackSummary.from_list(  # the code's frames, not the bootstrap's
        [f for f in report.stack if f.filename != "<string>"])
    sys.stderr.write("".join(report.format()))
try:
    sys.stdout.flush()
    sys.stderr.flush()
finally:
    _exit(cfg["forbidden_exit"] if refused else status)
"""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    output: str  # stdout and stderr as written (merged), cut to the output limit
    error: str | None  # None, "timeout", "error" or "forbidden" (ada.envs.base.ERROR_KINDS)
    truncated: bool  # the output reached the limit (the run was stopped there)
    seconds: float
    returncode: int | None = None


def _minimal_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def run_python(code: str, *, timeout_s: float = 5.0, max_output_bytes: int = MAX_OUTPUT_BYTES,
               memory_mb: int = 1024, file_size_mb: int = 16,
               allow: tuple[str, ...] = ALLOWED_IMPORTS) -> SandboxResult:
    """Run `code` in a fresh limited interpreter; never raises for what the code does."""
    start = time.monotonic()
    data = code.encode("utf-8", "replace")
    if len(data) > MAX_CODE_BYTES:
        return SandboxResult(f"the code is over {MAX_CODE_BYTES} bytes", "error", False, 0.0)
    cfg = dict(cpu_s=max(1, math.ceil(timeout_s)), as_bytes=memory_mb << 20,
               fsize_bytes=file_size_mb << 20, allow=list(allow), forbidden_exit=FORBIDDEN_EXIT)
    folder = tempfile.mkdtemp(prefix="ada-sandbox-")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-u", "-X", "utf8", "-c", _BOOTSTRAP, json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=folder, env=_minimal_env(folder), start_new_session=True)
        try:
            try:
                proc.stdin.write(data)
                proc.stdin.close()
            except BrokenPipeError:  # the child died before reading: its output says why
                pass
            out, truncated, timed_out = _read(proc, start + timeout_s, max_output_bytes)
        finally:
            _kill_group(proc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rc = proc.returncode
    if timed_out or (rc in (-signal.SIGXCPU, -signal.SIGKILL) and not truncated):  # CPU limit
        error = "timeout"
    elif truncated:
        error = None  # stopped by us at the output limit
    elif rc == FORBIDDEN_EXIT:
        error = "forbidden"
    else:
        error = "error" if rc else None
    return SandboxResult(out.decode("utf-8", "replace"), error, truncated,
                         time.monotonic() - start, rc)


def _read(proc: subprocess.Popen, deadline: float, limit: int) -> tuple[bytes, bool, bool]:
    """(output, truncated, timed out): read the merged pipe until EOF and the child's exit,
    the deadline, or `limit` bytes, whichever comes first."""
    out = bytearray()
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), False, True
            if not sel.select(left):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            room = limit - len(out)
            out += chunk[:room]
            if len(chunk) > room:
                return bytes(out), True, False
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(out), False, True
    return bytes(out), False, False


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the run's whole session (the child and anything it started), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except OSError:  # stdin's unwritten bytes, when the child died before reading them
            pass
