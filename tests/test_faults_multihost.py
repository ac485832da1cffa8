"""Multi-process faults, two local processes (jax.distributed, CPU, gloo): a host dies
mid-run (SIGKILL), the coordinator dies, one process raises, one gets SIGTERM, one is frozen
(SIGSTOP) and resumed. A survivor never hangs: it exits within distributed.timeout_s of a
loss, within seconds of a peer's failure, with one line naming the process; every host
stops a preemption at the same step, exit 143 (docs/reliability.md).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import free_port
from test_multihost import _cmd, _data, _env

from ada.checkpoint import complete_steps
from ada.metrics import read_jsonl

TIMEOUT_S = 5  # distributed.timeout_s of the lost-process test (the default is 300)
BOUND_S = TIMEOUT_S + TIMEOUT_S / 10 + 1  # ada/watch.py: when a survivor exits


class Pair:
    """One training run of two processes, and how to start (or resume) it."""

    def __init__(self, root, wd=None):
        self.root, self.data, self.cache = root, _data(root), str(root / "cache")
        self.wd = wd or str(root / "run")

    def start(self, fault="", **extra):
        port = free_port()
        ov = {"sampling.mesh": "(1,1)", "train.steps": 50, "checkpoint.every": 100, **extra}
        return [subprocess.Popen(
            _cmd(self.data, self.wd, self.cache, **ov),
            env=_env(1, ADA_COORDINATOR=f"localhost:{port}", ADA_NUM_PROCESSES="2",
                     ADA_PROCESS_ID=str(i),
                     **({"ADA_FAULT": fault} if i == 1 and fault else {})),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]

    def copy(self, where):
        """The same run with a copy of its directory in `where` (the caches shared)."""
        shutil.copytree(self.wd, where / "run")
        return Pair(self.root, str(where / "run"))

    def await_step(self, step, procs, timeout=240):
        """Until metrics.jsonl has `step`'s row; every process must be alive meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = read_jsonl(os.path.join(self.wd, "metrics.jsonl"))
            if rows and rows[-1]["step"] >= step:
                return
            for p in procs:
                assert p.poll() is None, p.communicate()[1][-3000:]
            time.sleep(0.02)
        raise AssertionError(f"step {step} not reached")


@pytest.fixture(scope="module")
def preempted(tmp_path_factory):
    """A two-process run of which process 1 got SIGTERM after step 1 (it also fills the
    compilation cache the later resumes share): (the run, both results)."""
    run = Pair(tmp_path_factory.mktemp("pair"))
    procs = run.start()
    try:
        run.await_step(1, procs)
        procs[1].send_signal(signal.SIGTERM)
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        _end(procs)
    return run, [(p.returncode, err) for p, err in zip(procs, errs, strict=True)]


@pytest.mark.slow
def test_sigterm_on_one_host_stops_both_at_one_step(preempted):
    """Process 0 never got the signal: both stop after the same step, with one checkpoint
    both wrote, exit 143 (restart me)."""
    run, results = preempted
    assert [rc for rc, _ in results] == [143, 143], results[0][1][-3000:] + results[1][1][-3000:]
    (stop,) = complete_steps(os.path.join(run.wd, "checkpoints"))
    (line,) = [ln for ln in results[0][1].splitlines() if ln.startswith("SIGTERM")]
    assert line.startswith(f"SIGTERM: stopped after step {stop} (checkpoint {run.wd}/checkpoints/"
                           f"{stop}); resume with: python -m ada.runner"), results[0][1][-3000:]


@pytest.mark.slow
def test_a_crash_in_one_process_ends_the_other_within_seconds(preempted, tmp_path):
    """The same commands resume; process 1 raises as its first step starts (ADA_FAULT=
    loop.raise@STEP): process 0, in that step's collectives, exits 1 within seconds at the
    default distributed.timeout_s of 300 s, with one line naming process 1 and its error."""
    run = preempted[0].copy(tmp_path)
    stop = complete_steps(os.path.join(run.wd, "checkpoints"))[-1]
    procs = run.start(f"loop.raise@{stop + 1}")
    try:
        while procs[1].poll() is None:
            assert procs[0].poll() is None, procs[0].communicate()[1][-3000:]
            time.sleep(0.02)
        raised = time.monotonic()
        _, err = procs[0].communicate(timeout=120)  # a hang fails here
        waited = time.monotonic() - raised
    finally:
        _end(procs)
    print(json.dumps({"peer_exit_after_crash_s": round(waited, 2)}))
    assert procs[1].returncode == 1 and procs[0].returncode == 1, err[-3000:]
    assert waited < 15, (waited, err[-3000:])
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: process 1 of 2 failed: RuntimeError: fault injected by "
                      f"ADA_FAULT=loop.raise@{stop + 1}; process 0 of 2 stops too; rerun the "
                      f"same command on every host to resume from step {stop} (the latest "
                      "checkpoint)"], err[-3000:]
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.slow
def test_a_lost_process_ends_the_other_within_the_timeout(preempted, tmp_path):
    """The run resumed; process 1 is SIGKILLed while process 0 is in its next step
    (collection or update): process 0 exits 1 within distributed.timeout_s (+ an interval,
    + a second) with one line naming process 1, and never hangs."""
    run = preempted[0].copy(tmp_path)
    stop = complete_steps(os.path.join(run.wd, "checkpoints"))[-1]
    procs = run.start(**{"checkpoint.every": 1, "distributed.timeout_s": TIMEOUT_S})
    try:
        run.await_step(stop + 1, procs)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, err = procs[0].communicate(timeout=120)  # a hang fails here
        waited = time.monotonic() - killed
    finally:
        _end(procs)
    print(json.dumps({"survivor_exit_s": round(waited, 2), "bound_s": BOUND_S}))
    assert procs[0].returncode == 1, err[-3000:]
    assert waited < BOUND_S + 5, (waited, err[-3000:])  # + scheduling slack on a busy CI
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: process 1 of 2 is lost"), err[-3000:]
    assert "distributed.timeout_s" in errors[0] and "rerun the same command" in errors[0]
    assert "Traceback" not in err and "stack trace" not in err, err[-3000:]


_IDLE = """
import sys, time
from ada import distributed, watch
distributed.initialize(timeout_s=float(sys.argv[1]))
assert watch._WATCH is not None, "no heartbeat watch"
print("ready", flush=True)
time.sleep(120)
"""


def _idle_pair(timeout_s):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", _IDLE, str(timeout_s)],
                              env=_env(1, ADA_COORDINATOR=f"localhost:{port}",
                                       ADA_NUM_PROCESSES="2", ADA_PROCESS_ID=str(i)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.communicate()[1][-3000:]
    return procs


def _end(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_lost_coordinator_ends_the_others_with_one_line(tmp_path):
    """Process 0 (the coordinator) SIGKILLed: jax's coordination agent in process 1 aborts it
    at once; ada's stderr filter turns its stack dump into one line naming process 0."""
    procs = _idle_pair(TIMEOUT_S)
    try:
        procs[0].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, err = procs[1].communicate(timeout=120)
        waited = time.monotonic() - killed
    finally:
        _end(procs)
    assert procs[1].returncode != 0 and waited < BOUND_S + 5, (waited, err[-3000:])
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        "error: process 0 (the coordinator) of 2 is lost (jax.distributed's coordination "
        "service reports it); process 1 of 2 stops too; rerun the same command on every host "
        "to resume from the latest checkpoint"], err[-3000:]


@pytest.mark.slow
def test_a_process_frozen_past_the_timeout_reports_its_own_stall(tmp_path):
    """SIGSTOP for 2 x timeout_s, then SIGCONT, once for process 1 and once for process 0 (the
    coordinator): the frozen one says it was stalled, never that its peer is lost; the peer
    reports it lost. A freeze shorter than the timeout is survived by both."""
    t = 3
    pairs = {frozen: _idle_pair(t) for frozen in (0, 1, "short")}
    try:
        for frozen, procs in pairs.items():
            procs[1 if frozen == "short" else frozen].send_signal(signal.SIGSTOP)
        time.sleep(0.8 * t)
        pairs["short"][1].send_signal(signal.SIGCONT)
        time.sleep(1.2 * t)
        for frozen in (0, 1):
            pairs[frozen][frozen].send_signal(signal.SIGCONT)
        errs = {frozen: [p.communicate(timeout=30)[1] for p in pairs[frozen]] for frozen in (0, 1)}
        assert all(p.poll() is None for p in pairs["short"]), pairs["short"][1].communicate()
    finally:
        for procs in pairs.values():
            _end(procs)
    for frozen in (0, 1):
        own, peer = errs[frozen][frozen], errs[frozen][1 - frozen]
        assert pairs[frozen][frozen].returncode == 1, own[-3000:]
        assert [ln for ln in own.splitlines() if ln.strip()] == [
            f"error: process {frozen} of 2 (this one) was stalled for 6 s (a frozen host, or a "
            f"long call holding the GIL), longer than distributed.timeout_s={t}: the others "
            f"count it as lost; process {frozen} of 2 stops too; rerun the same command on every "
            "host to resume from the latest checkpoint"], own[-3000:]
        assert pairs[frozen][1 - frozen].returncode == 1 and "is lost" in peer, peer[-3000:]
        assert f"process {frozen}" in peer.split("is lost")[0], peer[-3000:]


def test_the_jax_internal_the_watch_reads_is_there():
    """ada/watch.py: coordination_client reads jax._src.distributed.global_state.client, and
    the watch calls key_value_set / key_value_dir_get on it: if jax moves either, this fails
    (the watch itself would only degrade to a warning)."""
    from jax._src import distributed as jax_distributed
    from jax._src.lib import _jax

    assert hasattr(jax_distributed.global_state, "client")
    for method in ("key_value_set", "key_value_dir_get"):
        assert hasattr(_jax.DistributedRuntimeClient, method), method


def test_bad_data_on_one_host_ends_both_with_exit_2(tmp_path):
    """Process 1's copy of the data has a malformed row (a host with another file): it stops
    in setup with one line, exit 2, and its notice ends process 0 with exit 2 too."""
    good = _data(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(open(good).read() + '{"problem": "1 + 1"}\n')
    port, wd = free_port(), str(tmp_path / "run")
    procs = [subprocess.Popen(_cmd(path, wd, str(tmp_path / "cache"), **{"sampling.mesh": "(1,1)"}),
                              env=_env(1, ADA_COORDINATOR=f"localhost:{port}",
                                       ADA_NUM_PROCESSES="2", ADA_PROCESS_ID=str(i)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, path in enumerate((good, str(bad)))]
    try:
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        _end(procs)
    assert [p.returncode for p in procs] == [2, 2], errs[0][-3000:] + errs[1][-3000:]
    (own,) = [ln for ln in errs[1].splitlines() if ln.startswith("error:")]
    assert str(bad) in own, errs[1][-3000:]
    (told,) = [ln for ln in errs[0].splitlines() if ln.startswith("error:")]
    assert told.startswith(f"error: process 1 of 2 failed: {own[len('error: '):]}"), told
    assert "process 0 of 2 stops too" in told


def test_the_stderr_filter_drops_a_runtime_report_that_ada_explains():
    """The coordinator's own service logs its peers as unhealthy when it wakes from a freeze
    (CI saw it before ada's stall line); ada's line then stands alone. A report with no ada
    line after it is a passing warning, written out once the process lives on."""
    from ada.watch import _FILTER

    report = (b"E1206 17:43:06.244426    5095 coordination_service.cc:1549] [1712] Use error "
              b"polling to propagate the following error to all tasks: UNAVAILABLE: The "
              b"following tasks are unhealthy (stopped sending heartbeats):\n1\n0\nThe tasks "
              b"have crashed.\n")
    own = b"error: process 0 of 2 (this one) was stalled for 6 s\n"

    def through(*chunks):
        r, w = os.pipe()
        child = subprocess.Popen([sys.executable, "-c", _FILTER, str(w), "0", "2"],
                                 stdin=subprocess.PIPE, pass_fds=(w,))
        os.close(w)
        for c in chunks:
            child.stdin.write(c)
            child.stdin.flush()
            time.sleep(0.3)
        child.stdin.close()
        child.wait(timeout=30)
        with os.fdopen(r, "rb") as f:
            return f.read()

    assert through(b"step 3\n", report, own) == b"step 3\n" + own
    assert through(b"step 3\n", report) == b"step 3\n" + report
