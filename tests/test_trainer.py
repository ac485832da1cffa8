"""The Trainer (ada/run/trainer.py), the seam the loop and the tools use, and the one
RunState a checkpoint holds (ada/run/state.py). Finiteness is read one step late; these
tests hold that a non-finite state still stops the run and is never checkpointed."""

import jax
import numpy as np
import pytest
from test_stream import _config as stream_config

from ada.checkpoint import complete_steps
from ada.run.build import build
from ada.run.trainer import RunError, Trainer


def _config(tmp_path, cache, lr):
    """test_stream's tiny run, 3 steps, a checkpoint every 2."""
    return stream_config(tmp_path, cache, 3, 0, **{"checkpoint.every": "2", "optim.lr": lr})


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def test_a_nan_found_a_step_late_still_stops_the_run_with_no_checkpoint(tmp_path, cache):
    """lr 1e39 overflows float32: step 1 leaves inf weights. Step 1 is no checkpoint step
    (every 2), so nothing reads its flag until step 2 has run: the run must still stop
    there, naming step 1, with no checkpoint written. Breaks if the late read is dropped
    (the run would train on and save step 2's inf weights) or names the wrong step."""
    from ada.loop import train

    cfg = _config(tmp_path, cache, "1e39")
    with pytest.raises(RunError, match=r"^step 1 left non-finite parameters"):
        train(cfg, str(tmp_path / "run"))
    assert complete_steps(str(tmp_path / "run" / "checkpoints")) == []
    rows = [line for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert len(rows) == 2  # step 0 and step 1: step 2's metrics are never written


def test_save_and_evaluate_read_the_current_step_first(tmp_path, cache):
    """Driven through the seam: `save` and `evaluate` of a non-finite state raise at once
    (they read this step's flag, not the last one's), so a bad state is never evaluated
    or checkpointed. Breaks if either skips the check."""
    cfg = _config(tmp_path, cache, "1e39")
    trainer = Trainer(cfg, str(tmp_path / "run"), build(cfg))
    try:
        assert trainer.restore() is False
        trainer.step()  # its own flag is not read yet: no sync
        with pytest.raises(RunError, match="^step 1 left non-finite"):
            trainer.evaluate()
        with pytest.raises(RunError, match="^step 1 left non-finite"):
            trainer.save()
    finally:
        trainer.close(failed=True)
    assert complete_steps(str(tmp_path / "run" / "checkpoints")) == []


def test_run_state_is_saved_and_restored_whole(tmp_path, cache):
    """A Trainer saved after 2 steps and a fresh one restored from it hold the same
    RunState: params, optimizer state, key, step, data position, counters, guard. Breaks
    if any part is left out of the checkpoint or of the restore."""
    cfg = _config(tmp_path, cache, "1e-3")
    workdir = str(tmp_path / "run")
    a = Trainer(cfg, workdir, build(cfg))
    a.restore()
    a.step()
    a.step()
    a.save()
    assert a.close() == 2
    b = Trainer(cfg, workdir, build(cfg))
    try:
        assert b.restore() is True and b.saved == 2
        for x, y in ((a.state.train, b.state.train),
                     (jax.random.key_data(a.state.key), jax.random.key_data(b.state.key))):
            for u, v in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True):
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
        for f in ("step", "data", "counters", "guard"):
            assert getattr(a.state, f) == getattr(b.state, f), f
        assert b.state.counters["samples_total"] > 0 and b.state.data["position"] > 0
    finally:
        b.close()
