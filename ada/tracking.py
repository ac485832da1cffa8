"""Weights & Biases, optional: the same per-step metrics as metrics.jsonl, the run's config,
and the plots on eval steps (`log.wandb=true`; the extra `pip install -e '.[wandb]'`).

Only process 0 logs. The run id is kept in the run directory (`wandb.json`), so a resumed
run continues the same W&B run, and W&B gets exactly the rows of metrics.jsonl: after a
preemption (SIGTERM: the loop checkpoints the step it finished) each step once. After a
SIGKILL the steps since the last checkpoint are recomputed (identically: resume is exact)
and sent again; W&B's own writer may or may not have flushed the first copies before the
kill, so ada cannot skip them, and W&B keeps the first of two rows for a step.
`WANDB_MODE=offline` (or `log.wandb_mode=offline`) works with no network; `wandb sync`
uploads later. wandb is imported only here, only when enabled.
"""

from __future__ import annotations

import io
import json
import math
import uuid
from collections.abc import Sequence

from ada import paths

STATE_FILE = "wandb.json"


class TrackingError(ValueError):
    """W&B cannot start (package missing, login or init failed); one line for the user."""


def _numbers(metrics: dict) -> dict:
    """The numeric metrics, lists spread as key/i (per-round counts), non-finite dropped."""
    out = {}
    for k, v in metrics.items():
        values = [(f"{k}/{i}", x) for i, x in enumerate(v)] if isinstance(v, (list, tuple)) \
            else [(k, v)]
        for key, x in values:
            if isinstance(x, bool) or x is None:
                continue
            try:
                f = float(x)
            except (TypeError, ValueError):
                continue
            if math.isfinite(f):
                out[key] = f
    return out


MISSING = ("log.wandb=true needs the wandb package, which is not installed; pip install -e "
           "'.[wandb]', or pass --config.log.wandb=false")


def check_installed() -> None:
    """Raise TrackingError (one line) when wandb cannot be imported: checked with the config,
    before anything runs."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise TrackingError(MISSING) from None


class WandbLogger:
    """One W&B run per run directory (its id in WORKDIR/wandb.json)."""

    def __init__(self, workdir: str, config: dict, *, project: str, entity: str = "",
                 mode: str = "", name: str = ""):
        check_installed()
        import wandb

        self.workdir, self._wandb = workdir, wandb
        self._state_path = paths.join(workdir, STATE_FILE)
        state = {}
        if paths.path(self._state_path).exists():
            state = json.loads(paths.read_bytes(self._state_path))
        self.run_id = state.get("run_id") or uuid.uuid4().hex[:12]
        try:
            self.run = wandb.init(
                project=project, entity=entity or None, id=self.run_id, resume="allow",
                dir=None if paths.is_remote(workdir) else workdir,  # W&B's own files: local
                config=config, mode=mode or None, name=name or paths.path(workdir).name,
                settings=wandb.Settings(silent=True, console="off"))
        except Exception as e:  # a failed login, a bad entity, no network in online mode
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrackingError(f"W&B did not start ({first}); run `wandb login`, set "
                                "WANDB_MODE=offline (or --config.log.wandb_mode=offline), or "
                                "pass --config.log.wandb=false") from None
        self._save()

    def _save(self) -> None:
        paths.write_atomic(self._state_path, json.dumps({"run_id": self.run_id}))

    def log(self, step: int, metrics: dict, images: Sequence[str] = ()) -> None:
        """Send step's numeric metrics (and PNG files as images)."""
        data = _numbers(metrics)
        for path in images:
            image = path
            if paths.is_remote(path):  # wandb.Image reads local files
                from PIL import Image

                image = Image.open(io.BytesIO(paths.read_bytes(path)))
            data[paths.path(path).stem] = self._wandb.Image(image)
        self.run.log(data, step=step)

    def close(self) -> None:
        self.run.finish()
