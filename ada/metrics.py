"""Metric writers: metrics.jsonl, TensorBoard (tensorboardX), progress (a tqdm bar, or a line
every few steps for a cluster log), plots.

Only process 0 writes; other processes get writers that do nothing, so the loop calls
them unconditionally. `metrics.jsonl` holds one JSON object per step. On resume the file
is cut back to the restored step, so a killed-and-resumed run ends with exactly the lines
of an uninterrupted one (timings aside). A write that fails for want of space or permission
raises ada.checkpoint.StorageError (one line: the path, the errno, the fix); a line torn by
it is dropped on the next start.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ada import paths

METRICS_FILE = "metrics.jsonl"
# Keys of a row that measure time: two runs of the same steps differ in them (the rest of a
# killed-and-resumed run's rows equal an uninterrupted run's)
TIMINGS = ("setup_s", "warmstart_cached", "sampler_idle_share", "trainer_idle_share")


def is_timing(key: str) -> bool:
    return key.startswith("time_") or key in TIMINGS


def _is_main() -> bool:
    try:
        import jax

        return jax.process_index() == 0
    except Exception:  # jax not initialised / not importable: single process
        return True


def _scalar(v: Any):
    """A JSON-safe scalar, or None for values that are not numbers."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if hasattr(v, "shape") and getattr(v, "shape", None) == ():
        return _scalar(np.asarray(v).item())
    return None


def _clean(record: dict) -> dict:
    out = {}
    for k, v in record.items():
        if isinstance(v, (list, tuple)):
            out[k] = [_scalar(x) if _scalar(x) is not None else x for x in v]
        elif isinstance(v, str):
            out[k] = v
        elif isinstance(v, dict):
            out[k] = _clean(v)
        elif isinstance(v, (int, float, np.number, np.bool_)) or getattr(v, "shape", None) == ():
            out[k] = _scalar(v)  # non-finite numbers become null
        else:
            out[k] = None if v is None else str(v)
    return out


def read_jsonl(path: str) -> list[dict]:
    """Every complete line of a metrics file, local or gs:// (a torn last line is skipped)."""
    p = paths.path(path)
    if not p.exists():
        return []
    rows = []
    for line in paths.read_bytes(p).decode("utf-8").splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def truncate_jsonl(path: str, last_step: int) -> int:
    """Keep only records with step <= last_step (and no torn line); returns how many kept."""
    rows = [r for r in read_jsonl(path) if int(r.get("step", -1)) <= last_step]
    paths.write_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return len(rows)


def _storage(e: OSError, path: str):
    """A space / permission OSError as ada.checkpoint.StorageError; other errors as they are."""
    from ada.checkpoint import StorageError, storage_errno

    code = storage_errno(e)
    return e if code is None else StorageError("metrics", path, code)


class MetricsWriter:
    """JSONL (always) + TensorBoard (optional) writer; a no-op off process 0. A local file
    is appended to and fsynced each step; a gs:// one is rewritten whole (no appends there)."""

    def __init__(self, workdir: str, tensorboard: bool = True, resume_step: int | None = None,
                 enabled: bool | None = None, tracker=None):
        """`tracker`: an ada.tracking.WandbLogger that gets every step too, and the plots
        (plot_run) on eval steps."""
        self.enabled = _is_main() if enabled is None else enabled
        self.workdir, self._tracker = workdir, tracker
        self.path = paths.join(workdir, METRICS_FILE)
        self._tb = None
        self._f = None
        self._text = None  # a gs:// file's lines so far
        if not self.enabled:
            return
        try:
            paths.path(workdir).mkdir(parents=True, exist_ok=True)
            if resume_step is not None:
                truncate_jsonl(self.path, resume_step)
            elif paths.path(self.path).exists():
                truncate_jsonl(self.path, -1)  # a fresh run starts a fresh file
            if paths.is_remote(self.path):
                self._text = (paths.read_bytes(self.path).decode("utf-8")
                              if resume_step is not None else "")
            else:
                self._f = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise _storage(e, self.path) from None
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._tb = SummaryWriter(paths.join(workdir, "tb"), purge_step=purge)

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        record = _clean({"step": int(step), **metrics})
        line = json.dumps(record, sort_keys=True) + "\n"
        try:
            if self._f is None:
                self._text += line
                paths.write_atomic(self.path, self._text)
            else:
                self._f.write(line)
                self._f.flush()
                os.fsync(self._f.fileno())
        except OSError as e:
            raise _storage(e, self.path) from None
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k.replace("@", "_at_"), v, int(step))
                elif isinstance(v, list):
                    for i, x in enumerate(v):
                        if isinstance(x, (int, float)) and not isinstance(x, bool):
                            self._tb.add_scalar(f"{k.replace('@', '_at_')}/{i}", x, int(step))
            self._tb.flush()
        if self._tracker is not None:
            plot = plot_run(self.workdir) if record.get("eval_accuracy") is not None else None
            self._tracker.log(int(step), record, images=[plot] if plot else [])

    def close(self) -> None:
        if self._f is not None:
            f, self._f = self._f, None
            try:
                f.close()
            except OSError as e:
                raise _storage(e, self.path) from None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._tracker is not None:
            self._tracker.close()
            self._tracker = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Progress:
    """Training progress on stderr, process 0 only: a tqdm bar with ETA (`bar`), or with the
    bar off (log.progress=false: a cluster log) one text line every `every` steps and at the
    last (log.every; 0: none), with the bar's numbers, the mean seconds per step since the
    first step of this invocation and the ETA at that pace. The numbers: acc = the policy's accuracy on the step's prompts
    (first round), eval = held-out accuracy (last eval), zero_var = share of kept groups with
    no signal, draws/p = responses drawn per prompt, stale = the trained tokens' mean lag in
    policy versions (a stream, rl.max_staleness > 0; shown once it is not 0). The kept-group
    reward is left out: under balanced selection it sits near 1/2 whatever the policy does."""

    SHORT = {"reward_round0_mean": "acc", "eval_accuracy": "eval",
             "zero_variance_share": "zero_var", "samples_per_prompt": "draws/p",
             "staleness_mean": "stale"}

    def __init__(self, total: int, initial: int = 0, enabled: bool | None = None, desc: str = "train",
                 bar: bool = True, every: int = 10):
        self.enabled = _is_main() if enabled is None else enabled
        self._bar = None
        self._last: dict = {}
        self._total, self._step, self._start, self._desc = total, initial, initial, desc
        self._every = max(every, 0) if self.enabled and not bar else 0
        self._t0 = time.perf_counter()
        if self.enabled and bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True,
                             smoothing=0.1)

    def update(self, metrics: dict, n: int = 1) -> None:
        if self._bar is None and not self._every:
            return
        for k in self.SHORT:
            if metrics.get(k) is not None and (k != "staleness_mean" or metrics[k] or k in self._last):
                self._last[k] = metrics[k]
        shown = {self.SHORT[k]: f"{self._last[k]:.3f}" for k in self.SHORT if k in self._last}
        if not n and self._step == self._start:  # the step-0 eval: time the steps only
            self._t0 = time.perf_counter()
        self._step += n
        if self._bar is not None:
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(n)
        elif n and (self._step % self._every == 0 or self._step >= self._total):
            per = (time.perf_counter() - self._t0) / max(self._step - self._start, 1)
            eta = _clock(per * max(self._total - self._step, 0))
            print(f"{self._desc} step {self._step}/{self._total} {per:.2f}s/step eta {eta} "
                  + " ".join(f"{k}={v}" for k, v in shown.items()), file=sys.stderr, flush=True)

    def write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _clock(seconds: float) -> str:
    """H:MM:SS."""
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}"


# ----------------------------------------------------------------------------- plots


def series(rows: Sequence[dict], key: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    pts = [(r[x], r[key]) for r in rows if r.get(key) is not None and r.get(x) is not None]
    if not pts:
        return np.zeros(0), np.zeros(0)
    xs, ys = zip(*pts, strict=True)
    return np.asarray(xs, float), np.asarray(ys, float)


PLOT_KEYS = ("reward_round0_mean", "eval_accuracy", "reward_mean", "zero_variance_share",
             "samples_per_prompt", "lacking_pos_share_round0", "lacking_neg_share_round0",
             "entropy", "grad_norm", "clip_frac", "update_kl", "adv_pos_mean", "adv_neg_mean",
             "logp_change_pos", "logp_change_neg")

# Panel titles in plain words (the metric's own name is the panel's y label). A key without
# an entry is titled by its name. `panel_titles` words some per method.
PLOT_TITLES = {
    "reward_round0_mean": "policy accuracy on the batch (first round)",
    "reward_mean": "kept-group reward (pulled towards 0.5 by balanced selection)",
    "pool_reward_mean": "share of correct responses among all drawn",
    "eval_accuracy": "held-out eval accuracy",
    "zero_variance_share": "share of prompts whose kept group has no learning signal "
                           "(all rewards equal)",
    "samples_per_prompt": "responses drawn per prompt (sampling cost)",
    "lacking_pos_share_round0": "share of prompts short of n/2 correct after the first round",
    "lacking_neg_share_round0": "share of prompts short of n/2 wrong after the first round",
    "entropy": "policy entropy per response token (nats)",
    "grad_norm": "gradient norm before clipping",
    "clip_frac": "share of tokens whose PPO ratio is clipped",
    "update_kl": "KL(old || new) per token across the update, on its own samples",
    "adv_pos_mean": "mean advantage of positive-advantage responses",
    "adv_neg_mean": "mean advantage of negative-advantage responses",
    "logp_change_pos": "log-prob change of positive-advantage responses across the update",
    "logp_change_neg": "log-prob change of negative-advantage responses across the update",
}
# The methods that draw one round of n per prompt and keep it whole (ada/methods.py, those
# without adaptive_rounds; tests/test_metrics.py holds the two lists equal): no rounds, no
# exit rule, no selection pulling the kept reward to 0.5.
ONE_ROUND = {
    "grpo": {"reward_mean": "mean reward of the n responses drawn per prompt"},
    "dapo": {"reward_mean": "mean reward of the kept groups (uniform groups dropped and "
                            "replaced by new prompts)"},
    "grpo_knapsack": {  # each prompt draws its cap at once (ada/run/allocator.py), n kept
        "reward_mean": "mean reward of the n kept of each prompt's capped draws",
        "reward_round0_mean": "policy accuracy on the batch (its capped, not n draws per prompt)",
        "lacking_pos_share_round0": "share of prompts with fewer than n/2 correct of their draws",
        "lacking_neg_share_round0": "share of prompts with fewer than n/2 wrong of their draws"},
}
_ONE_ROUND_TITLES = {
    "reward_round0_mean": "policy accuracy on the batch (its n draws per prompt)",
    "lacking_pos_share_round0": "share of prompts with fewer than n/2 correct of their n draws",
    "lacking_neg_share_round0": "share of prompts with fewer than n/2 wrong of their n draws",
}


def panel_titles(method: str | None) -> dict:
    """PLOT_TITLES in the words of `method` (None or an unknown name: the adaptive ones')."""
    if method not in ONE_ROUND:
        return PLOT_TITLES
    return PLOT_TITLES | _ONE_ROUND_TITLES | ONE_ROUND[method]


def _run_method(workdir: str) -> str | None:
    """The method a run directory's config.json names (None when it has none)."""
    try:
        return json.loads(paths.read_bytes(paths.join(workdir, "config.json"))).get("method")
    except (OSError, ValueError, AttributeError):
        return None


def plot_run(workdir: str, keys: Iterable[str] = PLOT_KEYS, out: str | None = None) -> str | None:
    """One PNG of `run_figure` (default WORKDIR/metrics.png); returns its path (None if no
    data)."""
    fig = run_figure(workdir, keys)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    out = out or paths.join(workdir, "metrics.png")
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    paths.write_atomic(out, png.getvalue())
    return out


def run_figure(workdir: str, keys: Iterable[str] = PLOT_KEYS):
    """A matplotlib figure titled with the run's method and workdir, a panel per metric
    against training steps, up to three panels a row, each in its method's words
    (`panel_titles`); None if no key has data."""
    rows = read_jsonl(paths.join(workdir, METRICS_FILE))
    keys = [k for k in keys if len(series(rows, k)[0])]
    if not keys:
        return None
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    method = _run_method(workdir)
    titles = panel_titles(method)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False)
    fig.suptitle(f"{method or 'method unknown (no config.json)'}: {workdir}", fontsize=12)
    for ax, k in zip(axes.flat, keys, strict=False):
        xs, ys = series(rows, k)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3)
        ax.set_title(textwrap.fill(titles.get(k, k), 48), fontsize=10)
        ax.set_ylabel(k, fontsize=8, color="0.4")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig
