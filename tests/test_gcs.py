"""A run on gs:// against a GCS server: gcp-storage-emulator on localhost
(tests/gcs_emulator.py), reached by orbax's tensorstore (TENSORSTORE_GCS_HTTP_URL), gcsfs and
google-cloud-storage (STORAGE_EMULATOR_HOST) through their endpoint settings. A training run with --workdir
gs://... is SIGKILLed (or sent SIGTERM: exit 143) mid-run and resumed, and ends with the rows
of an uninterrupted one; a
kill inside a save leaves the previous checkpoint usable (docs/reliability.md).
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from test_faults import ROOT, check_after_kills, command, kill_inside_saves, rows, run

BUCKET = "ada-test"
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator's environment for child processes (and this one, while the module runs)."""
    from helpers import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        log = open(tmp_path_factory.mktemp("emulator") / "log", "w+")  # a pipe would fill up
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "gcs_emulator.py"), str(port),
                                 BUCKET], stdout=log, stderr=subprocess.STDOUT)
    except OSError as e:
        pytest.skip(f"the GCS emulator cannot start: {e}")
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            log.seek(0)
            reason = (log.read().strip().splitlines() or ["no answer in 30 s"])[-1]
            pytest.skip(f"the GCS emulator cannot start: {reason}")
        time.sleep(0.1)
    base = tmp_path_factory.mktemp("gcs")
    env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           "FSSPEC_GCS_TOKEN": "anon", "GOOGLE_CLOUD_PROJECT": "test",
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # its gRPC bucket probe: not emulated
           # no credential lookup may leave this machine (the metadata server's address)
           "GCE_METADATA_HOST": "127.0.0.1:1", "GCE_METADATA_IP": "127.0.0.1:1",
           "GCE_METADATA_ROOT": "127.0.0.1:1", "JAX_PLATFORMS": "cpu",
           "ADA_TEST_CACHE": str(base / "ada"),  # and the session's compilation cache
           "PYTHONPATH": os.pathsep.join([HERE,
                                          os.environ.get("PYTHONPATH", "")])}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import fsspec

    fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"
    yield dict(os.environ)
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    proc.kill()
    proc.wait()
    log.close()


@pytest.mark.slow
def test_a_gs_run_killed_or_preempted_mid_run_resumes_to_the_same_rows(gcs):
    """An uninterrupted gs:// run of 9 steps beside one SIGKILLed and one sent SIGTERM once
    step 3's row is written (step 1's checkpoint is complete by then, a later one may be in
    flight; 9 steps leave room for a slow poll on 2 busy cores: with 6, a victim once
    reached its last checkpoint before its signal). The preempted one checkpoints and exits 143; each, resumed by the same command,
    ends with the same metrics rows; evaluate / serve's loader and the planner's --run read
    the run from gs://."""
    from ada.checkpoint import complete_steps
    from ada.cli.plan import observed_response_len
    from ada.metrics import read_jsonl
    from ada.run.saved import load_run

    whole, steps = f"gs://{BUCKET}/whole", 9
    stops = {f"gs://{BUCKET}/killed": signal.SIGKILL, f"gs://{BUCKET}/preempted": signal.SIGTERM}
    longer = f"--config.train.steps={steps}"
    start = lambda wd: subprocess.Popen(command(wd, gcs, longer), env=gcs, cwd=ROOT, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first, victims = start(whole), {wd: start(wd) for wd in stops}
    try:
        deadline, waiting = time.monotonic() + 240, dict(victims)
        while waiting:  # both watched at once: one must not run on while the other is awaited
            for wd, victim in list(waiting.items()):
                if [r for r in read_jsonl(f"{wd}/metrics.jsonl") if r["step"] >= 3]:
                    victim.send_signal(stops[wd])
                    del waiting[wd]
                else:
                    assert victim.poll() is None, victim.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"no step 3 in 240 s: {sorted(waiting)}"
            time.sleep(0.05)
        codes = {wd: v.wait(timeout=120) for wd, v in victims.items()}
        out, err = first.communicate(timeout=240)
        assert first.returncode == 0, err[-3000:]
    finally:
        for p in (first, *victims.values()):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == {f"gs://{BUCKET}/killed": -signal.SIGKILL, f"gs://{BUCKET}/preempted": 143}
    for wd in stops:
        assert 1 <= complete_steps(f"{wd}/checkpoints")[-1] < steps  # stopped mid-run
        r = run(wd, gcs, longer)
        assert r.returncode == 0, r.stderr[-3000:]
        assert rows(wd) == rows(whole), wd
    assert [x["step"] for x in rows(whole)] == list(range(steps + 1))
    assert complete_steps(f"{whole}/checkpoints") == [steps - 1, steps]  # keep=2
    loaded = load_run(whole)
    assert loaded.step == steps and loaded.policy == f"{whole}/checkpoints/{steps}"
    assert observed_response_len(whole) >= 1


@pytest.mark.slow
def test_a_kill_inside_a_gcs_save_leaves_the_previous_checkpoint(gcs, caplog):
    """On gs:// a step is complete only with orbax's commit_success.txt, written last: a kill
    before it leaves a step folder that is never restored and is removed at the next start."""
    kill_inside_saves(f"gs://{BUCKET}/kills", env=gcs)
    check_after_kills(f"gs://{BUCKET}/kills", caplog)
