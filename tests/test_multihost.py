"""Two local processes (jax.distributed, CPU, gloo) of 4 devices each run the same loop as
one process.

Process 0's prompts are 'easy' (every one exits in round 1 under the pos rule); process
1's are 'hard' (they keep sampling for more rounds). Generation is process-local, on an
engine over each process's 4 devices (sampling.mesh (4, 1)) that receives the trained
params from the 8-device train mesh without a host round trip, so the different round
counts cannot hang the collectives; the update is one SPMD step over both processes'
devices. The result must equal a single process with two devices sampling on one.

Selection keys are global prompt ids, so the responses kept do not depend on the split.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import free_port
from tolerances import assert_same_adam_update

from ada.metrics import read_jsonl

pytestmark = pytest.mark.numerics  # CI runs it again under another CPU's kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")


def _data(tmp_path):
    rows = []
    for step in range(2):  # global batches of 4: rows 0-1 go to process 0, 2-3 to process 1
        for k in range(4):
            kind = "easy" if k < 2 else "hard"
            rows.append({"id": f"r{step}{k}", "problem": f"{kind} {step} {k} + {k}", "answer": str(k)})
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _cmd(data, workdir, cache, **extra):
    ov = {
        "method": "ada_pos", "data.source": "jsonl", "data.train_path": data, "data.eval_path": "",
        "data.num_eval": 0, "data.shuffle": False, "data.prompts_per_step": 4,
        "data.reward": "multihost_reward:reward", "data.max_prompt_len": 32,
        "adaptive.samples_per_round": 4, "adaptive.max_rounds": 2,
        "loss.entropy_coef": 0.0, "loss.loss_agg": "seq-mean-token-sum", "sampling.num_slots": 16,
        "sampling.slot_bucketing": False, "sampling.max_prefill_rows": 1,
        "sampling.num_windows": 1,
        "sampling.max_new_tokens": 4, "train.steps": 2, "eval.every": 0, "checkpoint.every": 1,
        "warmstart.enabled": False, "warmstart.cache_dir": cache, "log.progress": False,
        "log.plots": False, "log.tensorboard": False, "optim.lr": 1e-2, "optim.warmup_steps": 1,
        "mesh.data": -1, "tokenizer.vocab_size": 48, **extra,
    }
    return [sys.executable, "-m", "ada.runner", "--config", DEFAULT,
            *[f"--config.{k}={v}" for k, v in ov.items()], "--workdir", workdir]


def _env(devices, **extra):
    """The processes' environment: `devices` CPU devices each, the rest of XLA_FLAGS kept
    (CI's second instruction set reaches the processes too)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count=")]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=" ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]),
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def test_two_processes_match_one(tmp_path):
    """Under a budget split too (knapsack at a budget of M x N per prompt: the collection
    of no caps): the processes gather every draw into one success memory, so the split's
    predictions are the one process's (a memory of a process's own draws alone gives
    another predicted_signal_share at step 2)."""
    data, cache = _data(tmp_path), str(tmp_path / "cache")
    single = str(tmp_path / "single")
    split = {"adaptive.allocation": "knapsack", "adaptive.budget": 32}
    r = subprocess.run(_cmd(data, single, cache, **split), env=_env(2), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]

    multi = str(tmp_path / "multi")
    port = free_port()
    procs = [subprocess.Popen(_cmd(data, multi, cache, **{"sampling.mesh": "(4,1)"}, **split),
                              env=_env(4, ADA_COORDINATOR=f"localhost:{port}", ADA_NUM_PROCESSES="2",
                                       ADA_PROCESS_ID=str(i)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300))  # a hang fails here, not forever
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs, strict=False):
        assert p.returncode == 0, err[-3000:]

    rows_s = read_jsonl(os.path.join(single, "metrics.jsonl"))
    rows_m = read_jsonl(os.path.join(multi, "metrics.jsonl"))
    assert [r["step"] for r in rows_m] == [0, 1, 2]
    # step 1: process 0's easy prompts all exited in round 1; process 1 kept sampling
    assert rows_m[1]["rounds_per_process"][0] == 1 and rows_m[1]["rounds_per_process"][1] > 1
    assert rows_s[1]["rounds_per_process"] == [max(rows_m[1]["rounds_per_process"])]
    for a, b in zip(rows_s[1:], rows_m[1:], strict=False):
        for k in ("reward_round0_mean", "reward_mean", "response_tokens_mean",
                  "zero_variance_share", "samples_per_prompt", "samples",
                  "active_prompts_per_round", "exited_share", "budget_used", "cap_max",
                  "predicted_signal_share"):
            assert a[k] == b[k], (k, a[k], b[k])
        for k in ("loss", "grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k
    assert_same_adam_steps(single, multi)


def _leaves(tree, name):
    """The leaves of the first subtree called `name` (Adam's nu in a restored opt_state)."""
    import jax

    if isinstance(tree, dict):
        if name in tree:
            return jax.tree.leaves(tree[name])
        for v in tree.values():
            if (found := _leaves(v, name)) is not None:
                return found
    if isinstance(tree, (list, tuple)):
        for v in tree:
            if (found := _leaves(v, name)) is not None:
                return found
    return None


def assert_same_adam_steps(single, multi):
    """The two runs took the same Adam steps from the same start: what equal batches and
    samples must give, with bounds that follow from lr and eps, not from one CPU's rounding
    (tolerances.assert_same_adam_update: each step's own bound, and the whole update as a
    vector). Besides, the first step, taken from equal parameters: Adam moves a parameter by
    lr * g / (|g| + eps), and the runs' other summation order changes g by some dg, so the
    move by lr * dg * eps / (|g| + eps)**2. (a) Where |g| >= 1e3 eps that is < 1e-3 lr unless
    the rounding is as large as g itself.
    """
    import jax

    from ada.checkpoint import Checkpointer
    from ada.config import load_run_config
    from ada.rl.optimizer import OptimConfig
    from ada.run.saved import load_run

    cfg = load_run_config(single)
    optim, steps = OptimConfig(**cfg.optim), cfg.train.steps
    assert optim.warmup_steps <= 1  # every step at the full lr

    def flat(leaves):
        return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in leaves])

    start = load_run(None, config=cfg).params
    params, grad = {}, None  # (run, step) -> params; |g| of step 1
    for run, workdir in (("single", single), ("multi", multi)):
        ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
        for step in (1, steps):
            state, _ = ckpt.restore_params(step)
            params[run, step] = state["params"]
            if step == 1 and grad is None:  # nu after one step is (1 - b2) g**2
                grad = np.sqrt(flat(_leaves(state["opt_state"], "nu")) / (1 - optim.b2))
        ckpt.close()
    diff = np.abs(flat(jax.tree.leaves(params["multi", 1]))
                  - flat(jax.tree.leaves(params["single", 1])))
    far = grad >= 1e3 * optim.eps
    assert far.mean() > 0.5, far.mean()  # most parameters have a gradient well above eps
    assert diff[far].max() <= 1e-3 * optim.lr, (diff[far].max(), optim.lr)  # (a)
    for step in (1, steps):
        assert_same_adam_update(start, params["multi", step], params["single", step],
                                lr=optim.lr, updates=step, b1=optim.b1, b2=optim.b2)
