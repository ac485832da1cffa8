"""Checkpoints: round trip of every item, keep-last-k, half-written steps ignored."""

import os
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ada.checkpoint import Checkpointer, CheckpointWarning, is_complete


def _state(seed):
    k = jax.random.key(seed)
    params = {"w": jax.random.normal(k, (3, 4)), "b": jnp.arange(4.0)}
    opt = optax.adamw(1e-2).init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt = optax.adamw(1e-2).update(grads, opt, params)
    return {"params": params, "opt_state": opt, "rng": jax.random.key_data(jax.random.key(seed + 7))}


def _equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=False))


def test_round_trip_and_keep_last_k(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"), keep=2)
    states = {s: _state(s) for s in (1, 2, 3)}
    for s, st in states.items():
        ck.save(s, st, {"data": {"epoch": 0, "position": 10 * s}, "sampler": {"rounds": [s, 1]}})
    assert ck.wait_until_finished() == 3 and ck.all_steps() == [2, 3]
    got, meta, step = ck.restore(_state(0))
    assert step == 3 and _equal(got, states[3])
    assert type(got["opt_state"][0]).__name__ == "ScaleByAdamState"
    assert int(got["opt_state"][0].count) == 1
    assert meta["data"] == {"epoch": 0, "position": 30} and meta["sampler"] == {"rounds": [3, 1]}
    got2, meta2, _ = ck.restore(_state(0), step=2)
    assert _equal(got2, states[2]) and meta2["step"] == 2


def test_half_written_step_ignored_with_warning(tmp_path):
    d = tmp_path / "ck"
    ck = Checkpointer(str(d), keep=3)
    ck.save(4, _state(4), {})
    ck.close()
    # a half-written step: a copy of step 4 missing orbax's metadata, under a later number
    shutil.copytree(d / "4", d / "9")
    os.remove(d / "9" / "_CHECKPOINT_METADATA")
    (d / "12").mkdir()  # an empty step dir
    (d / "13.orbax-checkpoint-tmp-1234").mkdir()  # orbax temporary of a killed write
    ck2 = Checkpointer(str(d), keep=3)
    with pytest.warns(CheckpointWarning, match="incomplete checkpoint"):
        assert ck2.latest_step() == 4
    assert not is_complete(str(d / "9"))
    got, meta, step = ck2.restore(_state(0))
    assert step == 4 and _equal(got, _state(4))
    # training's start removes the junk; it never counts against keep-last-k
    ck2.clean_partial()
    assert sorted(os.listdir(d)) == ["4"]
    for s in (9, 10, 11):
        ck2.save(s, _state(s), {})
    assert ck2.close() == 11 and ck2.all_steps() == [9, 10, 11]


def test_a_save_finishing_during_a_listing_is_not_a_leftover(tmp_path):
    """The preemption budget's line lists checkpoints on its own thread while the main thread
    may be waiting for a save: a scan that saw step 2's temporary directory, finished just
    after it (the save is then no longer in flight), must not warn about it."""
    d = tmp_path / "ck"
    ck = Checkpointer(str(d), keep=3)
    ck.save(1, _state(1), {})
    ck.wait_until_finished()
    (d / "2.orbax-checkpoint-tmp-99").mkdir()
    ck._pending = 2
    scan = ck._scan

    def scan_then_finish():
        listed = scan()
        ck._pending = None  # the main thread's wait returned meanwhile
        return listed

    ck._scan = scan_then_finish
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        assert ck.latest_step() == 1
    ck._scan = scan
    with pytest.warns(CheckpointWarning, match="incomplete checkpoint"):  # a true leftover
        assert ck.latest_step() == 1


def test_restore_missing(tmp_path):
    ck = Checkpointer(str(tmp_path / "empty"))
    assert ck.latest_step() is None
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        ck.restore(_state(0))

