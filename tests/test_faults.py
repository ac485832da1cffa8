"""Faults and misuse, injected for real (docs/reliability.md): signals to a training process,
SIGKILL inside a checkpoint save, os.kill of a reward worker, a full (tmpfs) or size-limited
file system, a non-finite update, a changed config on resume, bad data, too-long prompts.
Each test asserts what survived: metrics rows equal to an uninterrupted run where resume is
promised, exit codes and one-line messages where a stop is promised.

The runs are the tiny default model, 4 steps, no warm start, sharing one JAX compilation
cache (the first run compiles; the others load). The dead-host case is in
tests/test_faults_multihost.py.
"""

import errno
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ada.metrics import is_timing, read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
STEPS = 4
NOISE = ("Traceback", "stack trace", "KeyboardInterrupt", "Metadata file does not exist")


def flaky_reward(record, text):
    """The arithmetic reward, except that it raises on about one response in five (by a hash
    of the text, the same in every process): a raising reward must never stop a run."""
    from ada.rewards import get_reward_fn

    if hashlib.sha256(text.encode()).digest()[0] % 5 == 0:
        raise RuntimeError("flaky reward")
    return get_reward_fn("arithmetic")(record, text)


def _slow(seconds, value, marks):
    """A reward-worker task: says it started (a file named after it and its worker's pid),
    then takes `seconds`."""
    open(os.path.join(marks, f"{value}.{os.getpid()}"), "w").close()
    time.sleep(seconds)
    return value


def _started(marks, value, count, timeout=60):
    """The pids of the workers that started `value`, once `count` have."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [int(n.split(".")[1]) for n in os.listdir(marks) if n.startswith(f"{value}.")]
        if len(pids) >= count:
            return pids
        time.sleep(0.01)
    raise AssertionError(f"{value} was not started {count} times")


# ----------------------------------------------------------------------------- the runs


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("faults")
    # the session's compilation cache (conftest): a run loads what an earlier one compiled
    return dict(os.environ, JAX_PLATFORMS="cpu", ADA_TEST_CACHE=str(base / "ada"),
                PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))


def command(workdir, env, *extra):
    ov = {"train.steps": STEPS, "warmstart.enabled": "false",
          "warmstart.cache_dir": env["ADA_TEST_CACHE"], "data.num_train": 200,
          "data.num_eval": 8, "data.prompts_per_step": 4, "adaptive.samples_per_round": 4,
          "adaptive.max_rounds": 2, "sampling.num_slots": 16, "sampling.max_new_tokens": 6,
          "eval.every": 0, "checkpoint.every": 1,
          "checkpoint.keep": 2, "log.progress": "false", "log.plots": "false",
          "log.tensorboard": "false", "data.reward": "test_faults:flaky_reward",
          "optim.lr": "1e-3", "optim.warmup_steps": 1}
    return [sys.executable, "-m", "ada.runner", "--config", DEFAULT,
            *[f"--config.{k}={v}" for k, v in ov.items()], *extra, "--workdir", str(workdir)]


def run(workdir, env, *extra, timeout=300, **kw):
    return subprocess.run(command(workdir, env, *extra), env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, **kw)


def lines(text):
    return [ln for ln in text.strip().splitlines() if ln.strip()]


def rows(workdir):
    return [{k: v for k, v in r.items() if not is_timing(k)}
            for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


def signalled(workdir, env, signals, after_step=1, *extra, group=False):
    """Start a run, send `signals` (0.1 s apart: two pending signals of a kind would be one)
    once metrics.jsonl has `after_step`'s row; returns (process result, seconds from the last
    signal to the exit). `group`: the run in a session of its own, each signal sent to its
    process group, as a terminal sends Ctrl-C (the reward workers get it too)."""
    proc = subprocess.Popen(command(workdir, env, *extra), env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=group)
    send = (lambda s: os.killpg(proc.pid, s)) if group else proc.send_signal
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            got = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
            if got and got[-1]["step"] >= after_step:
                break
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.02)
        for i, s in enumerate(signals):
            time.sleep(0.1 * bool(i))
            send(s)
        t = time.monotonic()
        out, err = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), \
            time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, env):
    """The uninterrupted run (it also fills the compilation cache)."""
    wd = tmp_path_factory.mktemp("reference") / "run"
    r = run(wd, env)
    assert r.returncode == 0, r.stderr[-3000:]
    return rows(wd)


@pytest.fixture(scope="module")
def preempted(tmp_path_factory, env, reference):
    """A run stopped by SIGTERM after step 1, as a CPU user starts it (JAX_PLATFORMS unset,
    libtpu installed): (its result, its directory)."""
    wd = tmp_path_factory.mktemp("preempted") / "run"
    r, _ = signalled(wd, {k: v for k, v in env.items() if k != "JAX_PLATFORMS"}, [signal.SIGTERM])
    return r, wd


def tree_hash(path):
    h = hashlib.sha256()
    for d, _, files in sorted(os.walk(path)):
        for f in sorted(files):
            h.update(os.path.relpath(os.path.join(d, f), path).encode())
            h.update(open(os.path.join(d, f), "rb").read())
    return h.hexdigest()


# ----------------------------------------------------------------------------- 1: signals


@pytest.mark.slow
def test_a_raising_reward_never_stops_the_run(reference):
    assert [r["step"] for r in reference] == list(range(STEPS + 1))
    assert sum(r["reward_failures"] for r in reference[1:]) > 0  # raised, counted, survived


@pytest.mark.slow
def test_sigterm_checkpoints_and_says_how_to_resume(preempted):
    r, wd = preempted
    assert r.returncode == 143, r.stderr[-3000:]  # the "restart me" code
    notice, line = lines(r.stderr)
    step = read_jsonl(os.path.join(wd, "metrics.jsonl"))[-1]["step"]
    assert notice == f"SIGTERM: stopping after step {step}; a second SIGTERM stops now, losing it"
    assert line.startswith(f"SIGTERM: stopped after step {step} (checkpoint {wd}/checkpoints/")
    assert "resume with: python -m ada.runner" in line and f"--workdir {wd}" in line
    assert step < STEPS and str(step) in os.listdir(wd / "checkpoints")


@pytest.mark.slow
def test_sigterm_past_the_budget_keeps_the_last_complete_checkpoint(tmp_path, env, reference):
    """checkpoint.preemption_budget_s shorter than what is left of the step and its save: the
    stop is abandoned with one line, exit 143; the checkpoint the line names is the latest
    complete one, and the same command resumes to the uninterrupted run's rows."""
    from ada.checkpoint import complete_steps

    wd = tmp_path / "run"
    budget = "--config.checkpoint.preemption_budget_s=0.01"
    # after step 3's row: step 2's save waited for step 1's, so one checkpoint is complete
    # (a save is asynchronous: step 2's may still be in flight when the budget runs out)
    r, seconds = signalled(wd, env, [signal.SIGTERM], 3, budget)
    assert r.returncode == 143 and seconds < 5, r.stderr[-3000:]
    assert len(lines(r.stderr)) == 2, r.stderr[-3000:]
    notice, line = lines(r.stderr)
    assert notice.startswith("SIGTERM: stopping after step ")
    assert line.startswith("SIGTERM: the stop did not finish within checkpoint."
                           "preemption_budget_s=0.01 s of the signal"), line
    assert "rerun python -m ada.runner" in line and "to resume from step" in line
    # complete when the line was written; a save in flight may complete before the exit
    assert 1 <= int(line.split("to resume from step ")[1].split()[0]) <= \
        complete_steps(str(wd / "checkpoints"))[-1]
    assert not any(n in r.stderr for n in NOISE)
    r = run(wd, env, budget)
    assert r.returncode == 0, r.stderr[-3000:]
    assert rows(wd) == reference


def _handles(pid, signum):
    """Whether process `pid` has a handler of its own for `signum` (/proc: SigCgt). Python
    catches SIGINT from its start, SIGTERM only once ada's handler is installed."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(ln for ln in f if ln.startswith("SigCgt:")).split()[1]
    return bool(int(mask, 16) >> (signum - 1) & 1)


def _jax_loaded(pid):
    with open(f"/proc/{pid}/maps") as f:
        return "jaxlib" in f.read()


def _await(what, timeout=120):
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _child(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = f.read().split()
    return int(kids[0]) if kids else None


@pytest.mark.parametrize("window, delay, signum", [
    ("handler", 0.0, signal.SIGINT), ("handler", 0.3, signal.SIGTERM),
    ("handler", 1.0, signal.SIGINT), ("jax", 1.5, signal.SIGINT)])
def test_a_signal_before_training_is_one_line_and_trains_nothing(tmp_path, env, window, delay,
                                                                 signum):
    """A terminal's Ctrl-C (to the process group) or a SIGTERM the instant ada's handler is in
    (SIGTERM caught; only the interpreter's own start, ~40 ms, comes first; jaxlib not yet
    loaded: asserted), `delay` s after that, and `delay` s after jaxlib is loaded (the config's
    checks, the set-up): exit 130 / 143, one line, no training and no output directory. It
    used to be lost in the first ~1.5 s (the run trained to the end, exit 0) or a
    KeyboardInterrupt traceback; without the early handler the first window fails (the
    handler came after `import jax`)."""
    wd = tmp_path / "run"
    proc = subprocess.Popen(command(wd, env), env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _await(lambda: _handles(proc.pid, signal.SIGTERM) if window == "handler" else
               _jax_loaded(proc.pid))
        time.sleep(delay)
        before_jax = not _jax_loaded(proc.pid)
        os.killpg(proc.pid, signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, err[-3000:]
    name = signal.Signals(signum).name
    assert lines(err) == [f"{name}: stopped before training started, nothing lost; rerun "
                          f"{shlex.join(['python', *command(wd, env)[1:]])} to start"], err
    assert out == "" and not wd.exists()
    assert before_jax or delay > 0


def test_the_signal_reader_has_ended_when_uninstall_returns():
    """A run that ends normally leaves no signal-reader thread behind: one still waking as
    the interpreter finalizes aborted the quick start's run after its summary ("FATAL:
    exception not rethrown", exit 134, three runs in three). Breaking it: uninstall returns
    before the reader has seen its pipe close."""
    from ada.preemption import Preemption

    before = set(threading.enumerate())
    p = Preemption("python -m ada.runner").install()
    reader = [t for t in set(threading.enumerate()) - before if t.name == "ada-signals"]
    assert len(reader) == 1
    p.uninstall()
    assert not reader[0].is_alive()


def test_a_sweep_stops_when_its_run_is_interrupted(tmp_path, env):
    """Ctrl-C (to the process group: the sweep and its run) as the sweep's first run starts:
    that run says so in one line and exits 130, and so does the sweep, without starting the
    next point (a run that lost the signal used to train on, exit 0, and the sweep went on)."""
    sweep = tmp_path / "sweep.py"
    sweep.write_text(f"BASE = {DEFAULT!r}\n\n\ndef get_sweep(arg=None):\n"
                     "    return [{'seed': 0}, {'seed': 1}]\n")
    cmd = command(tmp_path / "runs", env)
    cmd[cmd.index("--config"):cmd.index("--config") + 2] = ["--sweep", str(sweep)]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _await(lambda: _child(proc.pid) and _handles(_child(proc.pid), signal.SIGTERM))
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    (line,) = lines(err)
    assert line.startswith("SIGINT: stopped before training started, nothing lost; rerun ")
    assert "seed=0" in line and len(lines(out)) == 1 and "seed=0" in out
    assert not (tmp_path / "runs" / "seed=1").exists()


@pytest.mark.slow
@pytest.mark.parametrize("every", [1, 2])
def test_ctrl_c_says_at_once_which_step_it_stops_after_and_exits_130(tmp_path, env, reference,
                                                                    every):
    """Ctrl-C from a terminal (to the process group) during a step (checkpoint.every=1: the
    save of the step before runs beside it) and just as a save starts (every=2: the signal
    comes with step 2's row, which is saved next): at once one line naming the step the run
    stops after (it used to say nothing until the step ended: minutes on a paper preset),
    then the stop's line; that step is checkpointed, exit 130."""
    from ada.checkpoint import complete_steps

    r, _ = signalled(tmp_path / "run", env, [signal.SIGINT], every, "--config.checkpoint.every="
                     f"{every}", group=True)
    assert r.returncode == 130, r.stderr[-3000:]
    notice, line = lines(r.stderr)
    step = read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))[-1]["step"]
    assert notice == f"SIGINT: stopping after step {step}; press Ctrl-C again to stop now, " \
        "losing it"
    assert line.startswith(f"SIGINT: stopped after step {step} (checkpoint ") and \
        "resume with:" in line
    assert not any(n in r.stderr for n in NOISE)
    assert complete_steps(str(tmp_path / "run" / "checkpoints"))[-1] == step  # saved


@pytest.mark.slow
def test_a_second_ctrl_c_stops_now(tmp_path, env, reference):
    """The second press (to the process group) during the step the first one named: at once,
    exit 130, with the line that says so; the run did not finish."""
    r, seconds = signalled(tmp_path / "run", env, [signal.SIGINT, signal.SIGINT], group=True)
    assert r.returncode == 130 and seconds < 5, r.stderr[-3000:]
    notice, line = lines(r.stderr)
    assert notice.startswith("SIGINT: stopping after step "), notice
    assert line.startswith("a second SIGINT: stopped at once, without checkpointing the "
                           "current step; rerun python -m ada.runner"), line
    assert not any(n in r.stderr for n in NOISE)
    assert read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))[-1]["step"] < STEPS


@pytest.mark.slow
def test_a_second_signal_exits_at_once(tmp_path, env, reference):
    """With libtpu loaded (JAX_PLATFORMS='' lets JAX start it on a CPU), whose failure-signal
    handler would dump a stack on SIGTERM: ada's handlers win. The signals come as the first
    step starts (after the row of the initial evaluation), in its compile."""
    r, seconds = signalled(tmp_path / "run", dict(env, JAX_PLATFORMS=""),
                           [signal.SIGTERM, signal.SIGTERM], 0)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr[-3000:]
    assert seconds < 5
    ours = [ln for ln in lines(r.stderr) if "SIGTERM" in ln  # libtpu prints its failed start
            # a first signal within row 0's fsync stops before step 1, and says so first
            and not ln.startswith("SIGTERM: stopped after step 0 (no checkpoint yet)")]
    assert len(ours) == 2 and ours[0].startswith("SIGTERM: stopping after step "), r.stderr
    assert ours[1].startswith("a second SIGTERM: stopped at once"), r.stderr
    assert "python -m ada.runner" in ours[1]
    assert not any(n in r.stderr for n in (*NOISE, "FailureSignalHandler", "received by PID"))


# ----------------------------------------------------------------------------- 5: a full disk


def _small_fs(path, size):
    """A tmpfs of `size` at `path` (True), or False where mounting is not allowed."""
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True)
    return r.returncode == 0


def _fill(path, leave):
    """Fill the file system of `path` until about `leave` bytes are free."""
    with open(path / "filler", "wb") as f:
        while True:
            free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
            if free <= leave:
                break
            try:
                f.write(b"\0" * min(1 << 20, free - leave))
                f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break


@pytest.mark.slow
def test_full_disk_stops_with_one_line_and_a_restart_resumes(tmp_path, env, reference, preempted):
    """The preempted run resumes on a full disk: the next checkpoint cannot be written (a real
    ENOSPC from a small tmpfs; where mounting is not allowed, a real EFBIG from RLIMIT_FSIZE).
    One line, exit 1, the earlier checkpoints untouched; with space freed the same command
    resumes and ends with the uninterrupted run's rows (and a safe change, log.plots, is
    recorded in config_history.jsonl, not written over config.json)."""
    _, src = preempted
    mnt = tmp_path / "disk"
    mounted = _small_fs(mnt, "6m")
    try:
        wd = mnt / "run"
        shutil.copytree(src, wd)
        before = tree_hash(wd / "checkpoints")
        config = (wd / "config.json").read_bytes()
        kw = {}
        if mounted:
            _fill(mnt, leave=200_000)  # room for metrics lines, not for a ~1 MB checkpoint
        else:
            import resource

            def limit():  # files over 256 KiB fail with EFBIG (a checkpoint's data file)
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))

            kw = {"preexec_fn": limit}
        r = run(wd, env, **kw)
        assert r.returncode == 1, r.stderr[-3000:]
        msg = [ln for ln in lines(r.stderr) if "ada.loop" not in ln]  # the 'resumed from' log
        # the file that meets the full disk first: the checkpoint, or (when the async write
        # of the checkpoint has filled the disk before the next step's line) metrics.jsonl
        assert len(msg) == 1 and msg[0].startswith(("error: cannot write checkpoint",
                                                     "error: cannot write metrics")), r.stderr
        code = "ENOSPC" if mounted else "EFBIG"
        assert str(wd) in msg[0] and code in msg[0] and "free space" in msg[0]
        assert "then rerun python -m ada.runner" in msg[0] and "to resume from step" in msg[0]
        assert not any(n in r.stderr for n in NOISE)
        assert tree_hash(wd / "checkpoints") == before  # the earlier checkpoints, untouched
        if mounted:
            os.remove(mnt / "filler")  # space freed
        r = run(wd, env, "--config.log.plots=true")
        assert r.returncode == 0, r.stderr[-3000:]
        assert "Metadata file does not exist" not in r.stderr
        assert rows(wd) == reference
        assert (wd / "config.json").read_bytes() == config
        history = read_jsonl(str(wd / "config_history.jsonl"))
        assert [h["changes"] for h in history] == [{"log.plots": [False, True]}]
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_a_read_only_workdir_stops_with_one_line(tmp_path, env, preempted):
    """EROFS (a read-only mount; root writes anywhere else): refused before any compile."""
    _, src = preempted
    mnt = tmp_path / "ro"
    if not _small_fs(mnt, "8m"):
        pytest.skip("mounting a tmpfs is not allowed here (the full-disk test uses RLIMIT_FSIZE)")
    try:
        shutil.copytree(src, mnt / "run")
        before = tree_hash(mnt / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        r = run(mnt / "run", env)
        assert r.returncode == 2, r.stderr[-3000:]
        (line,) = lines(r.stderr)
        assert f"{mnt / 'run'}" in line and "EROFS" in line and "--workdir" in line
        assert tree_hash(mnt / "run") == before
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_metrics_write_on_a_full_disk_is_one_line(tmp_path):
    """A metrics line that cannot be written (a full tmpfs: ENOSPC) is a StorageError naming
    the file, the errno and the fix; the lines written before stay readable."""
    from ada.checkpoint import StorageError
    from ada.metrics import MetricsWriter

    mnt = tmp_path / "disk"
    if not _small_fs(mnt, "64k"):
        pytest.skip("mounting a tmpfs is not allowed here")
    try:
        writer = MetricsWriter(str(mnt), tensorboard=False, enabled=True)
        writer.write(0, {"x": 1.0})
        _fill(mnt, leave=0)
        with pytest.raises(StorageError) as e:
            for step in range(1, 10_000):  # the page the file has left fills first
                writer.write(step, {"x": 1.0, "pad": "p" * 200})
        assert str(e.value).startswith(f"cannot write metrics {mnt}/metrics.jsonl: ")
        assert "ENOSPC" in str(e.value) and "free space" in str(e.value)
        assert read_jsonl(str(mnt / "metrics.jsonl"))[0] == {"step": 0, "x": 1.0}
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# ----------------------------------------------------------------------------- 3: checkpoint kills

_SAVER = """
import sys
import numpy as np
from ada.checkpoint import Checkpointer
d = sys.argv[1]
for spec in sys.argv[2:]:
    step, keep, value = (int(x) for x in spec.split(":"))
    ck = Checkpointer(d, keep=keep)
    ck.save(step, {"w": np.full((64, 64), float(value))}, {"v": value})
    ck.close()
print("not killed")
"""

# point -> (saves as step:keep:value, ADA_FAULT step, complete steps after, latest's value)
KILLS = {
    "start": (["1:2:1", "2:2:2", "3:2:3"], 3, [[1, 2]], 2),  # nothing of step 3 written
    "write": (["1:2:1", "2:2:2", "3:2:3"], 3, [[1, 2], [2, 3]], None),  # in flight on its thread
    "items": (["1:2:1", "2:2:2", "3:2:3"], 3, [[1, 2]], 2),  # every item written, not committed
    "keep": (["1:3:1", "2:3:2", "3:1:3"], 3, [[1, 2]], 2),  # keep=1: nothing deleted before
}


def kill_inside_saves(root, kills=KILLS, env=None):
    """Run the saves of each KILLS row in a process SIGKILLed at its point (side by side)."""
    procs = {}
    for point, (saves, at, _, _) in kills.items():
        fault = f"checkpoint.{'items' if point == 'keep' else point}@{at}"
        procs[point] = subprocess.Popen(
            [sys.executable, "-c", _SAVER, f"{root}/{point}", *saves],
            env=dict(env or os.environ, JAX_PLATFORMS="cpu", ADA_FAULT=fault), cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for point, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, (point, out, err[-2000:])


def check_after_kills(root, caplog, kills=KILLS):
    """The next start resumes from the newest complete checkpoint (the kill never left one
    that looks complete and is not), a partial one is removed with a warning, and keep-last-k
    never left fewer complete steps than before."""
    import logging

    import jax.numpy as jnp

    from ada.checkpoint import Checkpointer, complete_steps

    for point, (_, at, after, value) in kills.items():
        d = f"{root}/{point}"
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ada.checkpoint"):
            ck = Checkpointer(d)
            ck.clean_partial()  # what training does when it starts
        assert complete_steps(d) in after, (point, complete_steps(d))
        state, meta, step = ck.restore({"w": jnp.zeros((64, 64))})
        assert float(state["w"][0, 0]) == meta["v"] == (value or step), point
        left = sorted(p.name for p in ck.directory.iterdir())
        assert left == [str(s) for s in complete_steps(d)], (point, left)  # cleaned
        said = " ".join(r.getMessage() for r in caplog.records)
        if point in ("items", "keep"):
            assert "ignoring incomplete checkpoint" in said and f"/{at}" in said, point


@pytest.mark.slow
def test_a_kill_inside_a_checkpoint_save_loses_nothing(tmp_path, caplog):
    """SIGKILL at each point of a save (ADA_FAULT picks the moment; the kill is real)."""
    kill_inside_saves(tmp_path)
    check_after_kills(tmp_path, caplog)


# ----------------------------------------------------------------------------- 4: reward workers


@pytest.mark.slow
def test_a_killed_reward_worker_is_replaced_and_its_item_retried(tmp_path):
    from ada.rewards.math_verifier import MathVerifier
    from ada.rewards.workers import HardTimeoutPool

    marks = str(tmp_path)
    with HardTimeoutPool(_slow, num_workers=1, timeout_s=30) as pool:
        pool.map([(0.0, "warm", marks)])  # started

        def killer():  # item a: killed once (retried); item b: killed on both attempts
            killed = set()
            for value, times in (("a", 1), ("b", 2)):
                for n in range(1, times + 1):
                    pid = next(p for p in _started(marks, value, n) if p not in killed)
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        out = pool.map([(1.0, "a", marks), (1.0, "b", marks), (0.0, "c", marks)])
        t.join(10)
        assert out[0] == ("ok", "a") and out[2] == ("ok", "c")
        assert out[1][0] == "error" and "died" in out[1][1]
        assert (pool.stats.retries, pool.stats.restarts, pool.stats.errors) == (2, 3, 1)
        assert pool.map([(0.0, "d", marks)]) == [("ok", "d")]  # the restarted worker works

    n = 400  # about 2 s of checks on one worker; the kill comes 0.1 s in
    records = [{"answer": str(i)} for i in range(n)]
    texts = [f"\\boxed{{{i if i % 3 else i + 1}}}" for i in range(n)]
    with MathVerifier(num_workers=1) as v:
        v.score_pairs(["1"], ["1"])  # started
        threading.Timer(0.1, os.kill, (v._pool.pids[0], signal.SIGKILL)).start()
        got = v.score(records, texts, failed=float("nan"))
        assert v.stats.restarts == 1 and v.stats.errors == 0
    np.testing.assert_array_equal(got, [float(i % 3 != 0) for i in range(n)])


# ----------------------------------------------------------------------------- 6: non-finite


@pytest.mark.slow
def test_non_finite_steps_stop_the_run_and_are_never_checkpointed(tmp_path, env, reference):
    """lr 1e30: step 1's update is finite (huge weights), every later loss is NaN, so its
    updates are skipped; lr 1e39 overflows float32: step 1 makes the weights inf. (The two
    runs go side by side: each compiles a train step of its own.)"""
    import jax

    from ada.checkpoint import Checkpointer, complete_steps

    skips, inf = tmp_path / "skips", tmp_path / "inf"
    procs = [subprocess.Popen(command(wd, env, *extra), env=env, cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for wd, extra in ((skips, ("--config.optim.lr=1e30", "--config.train.steps=6",
                                        "--config.optim.max_skipped_in_row=2")),
                               (inf, ("--config.optim.lr=1e39",)))]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    r_skips, r_inf = [(p.returncode, err) for p, err in zip(procs, errs, strict=True)]

    assert r_skips[0] == 1, r_skips[1][-3000:]
    (line,) = lines(r_skips[1])
    assert line.startswith("error: steps 2-3: 2 RL steps in a row") and \
        "optim.max_skipped_in_row=2" in line
    assert [x.get("skipped_steps") for x in read_jsonl(str(skips / "metrics.jsonl"))] == \
        [None, 0, 1, 2]
    ck = Checkpointer(str(skips / "checkpoints"))
    for step in ck.all_steps():
        params = ck.restore_params(step)[0]["params"]
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))

    assert r_inf[0] == 1, r_inf[1][-3000:]
    (line,) = lines(r_inf[1])
    assert line.startswith("error: step 1 left non-finite parameters") and "optim.lr" in line
    assert complete_steps(str(inf / "checkpoints")) == []


# ----------------------------------------------------------------------------- 7: the run folder


@pytest.mark.slow
def test_resuming_with_another_model_is_refused_before_writing(tmp_path, env, preempted):
    from ada.run.saved import load_run

    _, src = preempted
    wd = tmp_path / "run"
    shutil.copytree(src, wd)
    before = tree_hash(wd)
    r = run(wd, env, "--config.model.preset=small")
    assert r.returncode == 2, r.stderr[-3000:]
    (line,) = lines(r.stderr)
    assert line.startswith(f"error: {wd} was trained with model.preset='tiny'; this command has "
                           "model.preset='small'")
    assert "--force_config" in line and "another --workdir" in line
    assert tree_hash(wd) == before  # nothing written: config.json, metrics, checkpoints
    run_ = load_run(str(wd))  # what ada.evaluate and ada-serve load still loads
    assert run_.step is not None and run_.model_cfg.hidden_size == 64


def test_bad_data_is_one_line_naming_the_knob_and_leaves_no_workdir(tmp_path, env):
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "What is 1+1?", "solution": "2"}\n')
    wd = tmp_path / "new" / "run"
    r = subprocess.run([sys.executable, "-m", "ada.runner", "--config.data.source=jsonl",
                        f"--config.data.train_path={data}", "--config.warmstart.enabled=false",
                        "--workdir", str(wd)], env=env, capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 2, r.stderr[-3000:]
    (line,) = lines(r.stderr)
    assert "missing column 'answer'" in line and "--config.data.answer_key" in line
    assert "RecordFormat" not in line
    assert not (tmp_path / "new").exists()


# ----------------------------------------------------------------------------- 8: misuse


def test_hf_export_files_are_readable_by_others(tmp_path):
    import jax

    from ada.export import export_hf
    from ada.models import init_params, preset
    from ada.tokenizer import load_tokenizer, train_sentencepiece

    train_sentencepiece([f"What is {i} + {i}? {2 * i}" for i in range(200)], 40,
                        str(tmp_path / "sp.model"))
    tok = load_tokenizer(str(tmp_path / "sp.model"))
    cfg = preset("tiny", vocab_size=tok.vocab_size)
    umask = os.umask(0o022)
    try:
        export_hf(init_params(cfg, jax.random.key(0)), cfg, tok, tmp_path / "hf")
    finally:
        os.umask(umask)
    modes = {f: oct(os.stat(tmp_path / "hf" / f).st_mode & 0o777)
             for f in os.listdir(tmp_path / "hf")}
    assert modes["model.safetensors"] == "0o644" and set(modes.values()) == {"0o644"}, modes


class _Chars:
    eos_ids, pad_id, bos_id = (511,), 0, None

    def encode(self, text):
        return [1 + ord(c) % 26 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + (i - 1) % 26) for i in ids)


def test_serve_refuses_a_too_long_prompt_naming_the_limit():
    import grpc
    import jax
    from jetstream.core.proto import jetstream_pb2 as pb
    from jetstream.core.proto import jetstream_pb2_grpc as rpc
    from helpers import free_port

    from ada.models import init_params, preset
    from ada.sampling.engine import Engine
    from ada.sampling.samplers import SamplingConfig
    from ada.sampling.serving import serve

    config = preset("tiny")
    engine = Engine(config, num_slots=2, max_prompt_len=16, max_new_tokens=4,
                    sampling=SamplingConfig(temperature=0.0), eos_ids=(511,),
                    slot_bucketing=False, max_prefill_rows=1)
    port = free_port()
    server = serve(engine, init_params(config, jax.random.key(0)), _Chars(), "127.0.0.1", port)
    try:
        stub = rpc.OrchestratorStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        for req in (pb.DecodeRequest(text_content=pb.DecodeRequest.TextContent(text="x" * 40),
                                     max_tokens=4),
                    pb.DecodeRequest(token_content=pb.DecodeRequest.TokenContent(
                        token_ids=list(range(1, 31))), max_tokens=4)):
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Decode(req, timeout=60))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "at most 16" in e.value.details() and "--truncate=left" in e.value.details()
    finally:
        server.stop()


@pytest.mark.slow
def test_checkpoint_loads_print_no_orbax_warning(preempted, caplog):
    import logging

    from ada.checkpoint import Checkpointer

    _, wd = preempted
    with caplog.at_level(logging.WARNING):
        Checkpointer(str(wd / "checkpoints")).restore_params()
    assert not [r for r in caplog.records if "Metadata file" in r.getMessage()]


@pytest.mark.slow
def test_text_the_tokenizer_cannot_read_is_warned_once(tmp_path, preempted, capsys, caplog):
    import logging

    from ada import config as C
    from ada.cli import eval as eval_cli
    from ada.run.build import build
    from ada.run.saved import load_run

    _, wd = preempted
    gsm = "Natalia sold clips to 48 of her friends in April, and then she sold half as many."
    bench = tmp_path / "gsm.jsonl"
    bench.write_text("".join(json.dumps({"id": f"g{i}", "problem": gsm, "answer": "72"}) + "\n"
                             for i in range(3)))
    assert eval_cli.main(["--workdir", str(wd), "--benchmark", str(bench), "--samples", "1",
                          "--pass_k", "1", "--max_prompt_len", "128"]) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "unknown to the tokenizer" in ln]
    assert len(warned) == 1 and warned[0].startswith("warning: ") and "%" in warned[0]

    # training: held-out prompts from the benchmark, with the run's own tokenizer
    cfg = C.load_run_config(str(wd))
    tok = load_run(str(wd)).tokenizer
    cfg.tokenizer.path = tok.path
    cfg.data.source, cfg.data.train_path, cfg.data.eval_path = "jsonl", str(bench), str(bench)
    cfg.data.max_prompt_len, cfg.data.prompts_per_step = 128, 2
    with caplog.at_level(logging.WARNING, logger="ada.run.build"):
        build(cfg)
    said = [r.getMessage() for r in caplog.records if "unknown to the tokenizer" in r.getMessage()]
    assert len(said) == 2 and "training prompts" in said[0] and "held-out prompts" in said[1]
