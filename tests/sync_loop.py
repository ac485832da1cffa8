"""The synchronous RL loop as a reference: `ada.step.rl_step` (collect, then update) step
after step, set up as ada/run/trainer.py sets up a run. tests/test_stream.py holds the stream at
rl.max_staleness = 0 to it, bit for bit; run as a script it is one process of a multi-
process reference:

    python tests/sync_loop.py OUT.json CONFIG.py --config.a=b ...   (ADA_COORDINATOR set)
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ada import sharding as shd
from ada.metrics import is_timing
from ada.models import lora
from ada.run.build import build, prompts_and_layout
from ada.step import rl_step


def run(cfg, steps: int):
    """(metrics of each step, final params on the host) of `steps` synchronous steps."""
    s = build(cfg)
    iterator, layout = prompts_and_layout(cfg, s)
    state = s.fns.init_state(s.params)
    ref_params = jax.tree.map(jnp.copy, state.params) if cfg.loss.kl_coef > 0 else None
    base_key = jax.random.key(cfg.seed)
    rows = []
    for step in range(1, steps + 1):
        state, m, _ = rl_step(state, next(iterator), jax.random.fold_in(base_key, step),
                              rollout=s.rollout, fns=s.fns, method=cfg.method, layout=layout,
                              normalize_std=cfg.adaptive.normalize_std, ref_params=ref_params,
                              more_prompts=iterator,
                              update_diagnostics=cfg.log.update_diagnostics)
        rows.append(m)
    return rows, shd.gather_to_host(state.params)


def comparable(row: dict) -> dict:
    """A metrics row without its timings."""
    return {k: v for k, v in row.items() if not is_timing(k)}


if __name__ == "__main__":
    from ada import config as C
    from ada import distributed

    out, spec, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    cfg = C.build_config(spec, [tuple(a[len("--config."):].split("=", 1)) for a in overrides])
    distributed.cpu_only_without_accelerators()
    distributed.initialize(timeout_s=cfg.distributed.timeout_s)
    rows, params = run(cfg, cfg.train.steps)
    if lora.has_adapters(params):  # what a LoRA run's checkpoint holds: the adapters
        params = lora.split(params)[0]
    if distributed.is_main():
        np.savez(out + ".npz", *[np.asarray(x) for x in jax.tree.leaves(params)])
        with open(out, "w") as f:
            json.dump([comparable(r) for r in rows], f, default=float)
