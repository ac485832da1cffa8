"""Metric writers: JSONL content, resume truncation, TensorBoard events, plots, process 0 only."""

import json
import os

import numpy as np
import pytest

from ada.metrics import (
    ONE_ROUND,
    PLOT_KEYS,
    PLOT_TITLES,
    MetricsWriter,
    Progress,
    plot_run,
    read_jsonl,
    run_figure,
    series,
)


def test_jsonl_and_resume_truncation(tmp_path):
    w = MetricsWriter(str(tmp_path), tensorboard=True)
    for s in range(1, 6):
        w.write(s, {"reward_mean": np.float32(s / 10), "zero_variance_share": 0.5,
                    "active_per_round": [8, 4, 2], "nan_metric": float("nan")})
    w.close()
    rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert abs(rows[2]["reward_mean"] - 0.3) < 1e-7 and rows[0]["active_per_round"] == [8, 4, 2]
    assert rows[0]["nan_metric"] is None
    # a torn last line (kill mid-write) is dropped on read
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "rew')
    assert len(read_jsonl(str(tmp_path / "metrics.jsonl"))) == 5
    # resuming at step 3 cuts back to steps 1..3 and appends after them
    w = MetricsWriter(str(tmp_path), tensorboard=True, resume_step=3)
    w.write(4, {"reward_mean": 0.9})
    w.close()
    rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["reward_mean"] == 0.9
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "tb"))
    xs, ys = series(rows, "reward_mean")
    assert list(xs) == [1, 2, 3, 4]
    png = plot_run(str(tmp_path))
    assert png and os.path.getsize(png) > 1000


def _read_events(tb_dir):
    """Parse TFRecord event files with tensorboardX's protos (no tensorboard needed)."""
    import struct

    from tensorboardX.proto import event_pb2

    out = []
    for name in sorted(os.listdir(tb_dir)):
        data = open(os.path.join(tb_dir, name), "rb").read()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in ev.summary.value:
                out.append((v.tag, ev.step, v.simple_value))
    return out


def test_tensorboard_scalars_readable(tmp_path):
    w = MetricsWriter(str(tmp_path))
    w.write(1, {"reward_mean": 0.25, "per_round": [3, 1]})
    w.write(2, {"reward_mean": 0.5})
    w.close()
    ev = _read_events(str(tmp_path / "tb"))
    assert [(s, v) for t, s, v in ev if t == "reward_mean"] == [(1, 0.25), (2, 0.5)]
    assert ("per_round/1", 1, 1.0) in ev


def test_disabled_writer_writes_nothing(tmp_path):
    w = MetricsWriter(str(tmp_path / "x"), enabled=False)
    w.write(1, {"a": 1})
    w.close()
    assert not os.path.exists(tmp_path / "x")
    p = Progress(10, enabled=False)
    p.update({"reward_mean": 1.0})
    p.close()


def test_progress_bar_shows_eta_and_the_policys_accuracy(capsys):
    """The bar leads with the first round's reward (the policy's accuracy) and held-out
    accuracy; the kept-group reward (about 1/2 by construction under balance) is not shown."""
    p = Progress(4, enabled=True)
    p.update({"eval_accuracy": 0.25}, n=0)  # the step-0 eval, before any step
    for s in range(4):
        p.update({"reward_round0_mean": 0.1 * s, "reward_mean": 0.5,
                  "eval_accuracy": 0.5 if s == 2 else None})
    p.close()
    err = capsys.readouterr().err
    assert "4/4" in err and "acc=0.300" in err and "eval=0.500" in err
    assert "R=" not in err


def test_plot_panels_policy_accuracy_first_and_titled(tmp_path):
    assert PLOT_KEYS[0] == "reward_round0_mean"
    assert all(k in PLOT_TITLES for k in PLOT_KEYS)  # every default panel has a plain title
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    for s in range(1, 4):  # all five default panels (two rows) plus a key with no title
        w.write(s, {k: 0.1 * s for k in PLOT_KEYS} | {"other": s})
    w.close()
    png = plot_run(str(tmp_path), keys=PLOT_KEYS + ("other",), out=str(tmp_path / "p.png"))
    assert png == str(tmp_path / "p.png") and os.path.getsize(png) > 1000
    assert plot_run(str(tmp_path), keys=("missing",)) is None


def test_bar_off_prints_one_line_every_n_steps_with_the_bars_numbers(capsys):
    """log.progress=false: a line at every `every`-th step and at the last, carrying acc,
    eval, zero_var, draws/p and stale once it is not 0 (breaking it: nothing printed, as
    before, or a line per step); off process 0 or with every=0, nothing."""
    p = Progress(5, enabled=True, bar=False, every=2)
    p.update({"eval_accuracy": 0.25}, n=0)
    for s in range(5):
        p.update({"reward_round0_mean": 0.1 * s, "zero_variance_share": 0.5,
                  "samples_per_prompt": 8.0, "staleness_mean": 0.0 if s < 3 else 0.5})
    p.close()
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert out.out == "" and [x.split()[2] for x in lines] == ["2/5", "4/5", "5/5"], lines
    assert lines[0].endswith("acc=0.100 eval=0.250 zero_var=0.500 draws/p=8.000")
    assert lines[1].endswith("acc=0.300 eval=0.250 zero_var=0.500 draws/p=8.000 stale=0.500")
    assert all(" eta " in x and "s/step" in x for x in lines)
    for quiet in (Progress(5, enabled=False, bar=False, every=1),
                  Progress(5, enabled=True, bar=False, every=0)):
        quiet.update({"reward_round0_mean": 1.0})
    assert capsys.readouterr().err == ""


def _fake_run(path, method):
    from ada.metrics import METRICS_FILE

    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"method": method, "model": {}}, f)
    with open(os.path.join(path, METRICS_FILE), "w") as f:
        for s in range(1, 4):
            f.write(json.dumps({"step": s, **{k: 0.1 * s for k in PLOT_KEYS}}) + "\n")
    return str(path)


def test_one_round_methods_are_the_tables_methods_without_rounds():
    """The plot's words for GRPO-like methods cover exactly the methods that draw one round
    of n (breaking it: a method added to ada/methods.py without deciding its panel words)."""
    from ada.methods import METHODS

    assert set(ONE_ROUND) == {name for name, m in METHODS.items() if not m.adaptive_rounds}


@pytest.mark.slow
def test_plot_is_titled_with_method_and_workdir_in_the_methods_words(tmp_path):
    """metrics.png's figure: the suptitle names the method and the workdir; a one-round
    method's panels say nothing of rounds or balanced selection, an adaptive method's
    kept-group reward says why it sits near 0.5 (breaking it: the Ada-balance words on a
    GRPO run, as before)."""
    import matplotlib.pyplot as plt

    from ada.methods import METHODS

    for name, m in METHODS.items():
        wd = _fake_run(tmp_path / name, name)
        fig = run_figure(wd)
        titles = {ax.get_ylabel(): ax.get_title().replace("\n", " ") for ax in fig.axes
                  if ax.get_visible()}
        assert fig._suptitle.get_text() == f"{name}: {wd}"
        assert set(titles) == set(PLOT_KEYS)
        text = " ".join(titles.values())
        if m.adaptive_rounds:
            assert "first round" in titles["lacking_pos_share_round0"]
            assert "balanced selection" in titles["reward_mean"]
        else:
            assert "round" not in text and "balance" not in text, titles
            assert "n draws" in titles["reward_round0_mean"]
        plt.close(fig)
    assert run_figure(str(tmp_path / "none")) is None
