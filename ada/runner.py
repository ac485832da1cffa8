"""The experiment runner: config -> (warm start) -> RL loop -> metrics, evals, checkpoints.

    python -m ada.runner --config configs/default.py[:arg] [--config.a.b=v ...] --workdir DIR
    python -m ada.runner --sweep configs/sweep_methods.py --workdir DIR [--print]

One training step:

  data batch (PromptIterator, this process's shard)
    -> adaptive collection (ada.adaptive.collect.Collector over the sampling driver)
    -> selection to [P, n] and advantages from the pool statistics
    -> old-logp recompute (when off-policy) + PPO-clip update (ada.rl.train)
    -> metrics (metrics.jsonl, TensorBoard, progress bar)
    -> held-out eval every `eval.every` steps -> checkpoint every `checkpoint.every` steps

Everything random in a step derives from fold_in(key(seed), step), and the data iterator's
position is checkpointed, so a run killed at any point and restarted from its latest
checkpoint ends with the same parameters and metrics as an uninterrupted one.

Multi-host: each process collects its own shard of the prompts on its local devices (no
collective inside generation, so processes whose prompts exit after different numbers of
rounds cannot hang each other); the per-prompt counts behind every logged statistic are
summed over processes (ada.distributed), and the update is one SPMD train step over a
global mesh with the fixed [P, n] batch shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ada import config as cfglib
from ada.config import ConfigError

log = logging.getLogger("ada.runner")


# ----------------------------------------------------------------------------- setup


@dataclasses.dataclass
class Task:
    train: list[dict]
    eval: list[dict]
    reward: Any  # reward(record, text) -> float
    response: Any  # record -> the reference response text (warm start), or None
    name: str


def load_reward(spec: str):
    """'package.module:function' -> the reward callable (reward(record, text) -> float)."""
    import importlib

    mod, _, fn = spec.partition(":")
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"data.reward={spec!r} cannot be imported ({e}); "
                          "write it as package.module:function") from None


def load_task(config) -> Task:
    task = _load_task(config)
    if config.data.reward:
        task.reward = load_reward(config.data.reward)
    return task


def _load_task(config) -> Task:
    d = config.data
    if d.source in ("arithmetic", "countdown"):
        from ada.rewards import tasks

        mix = {int(k): float(v) for k, v in _mix(d.difficulty).items()}
        train = tasks.make_dataset(d.source, d.num_train, seed=d.task_seed, difficulty_mix=mix,
                                   split="train")
        evals = tasks.make_dataset(d.source, d.num_eval, seed=d.task_seed, difficulty_mix=mix,
                                   split="test")
        reward = tasks.arithmetic_reward if d.source == "arithmetic" else tasks.countdown_reward
        if d.source == "arithmetic":
            response = lambda r: " " + r["answer"]  # noqa: E731
        else:
            response = lambda r: " " + r["solution"]  # noqa: E731
        return Task(train, evals, reward, response, d.source)
    if d.source in ("jsonl", "parquet"):
        from ada.data.sources import RecordFormat, load_records
        from ada.rewards.math_verifier import math_reward

        fmt = RecordFormat(problem_key=d.problem_key, answer_key=d.answer_key)
        train = load_records(d.train_path, fmt)
        evals = load_records(d.eval_path, fmt) if d.eval_path else []
        if d.num_eval and len(evals) > d.num_eval:
            evals = evals[: d.num_eval]
        return Task(train, evals, math_reward, None, os.path.basename(d.train_path))
    raise ConfigError(f"data.source={d.source!r} is not one of arithmetic, countdown, jsonl, parquet")


def _mix(difficulty: str) -> dict:
    """'1:0.3,2:0.5,3:0.2' -> {1: 0.3, 2: 0.5, 3: 0.2}; a bare level has weight 1."""
    out = {}
    for part in str(difficulty).split(","):
        if not part.strip():
            continue
        level, _, weight = part.partition(":")
        try:
            out[int(level)] = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError(f"data.difficulty={difficulty!r}: write level:weight pairs, "
                              "e.g. '1:0.3,2:0.5,3:0.2'") from None
    return out


def load_tokenizer_for(config, task: Task, cache_dir: str):
    """The model's tokenizer, or for a synthetic task a tiny SentencePiece trained on it."""
    from ada.templates import render_prompt
    from ada.tokenizer import load_tokenizer, train_sentencepiece

    if config.tokenizer.path:
        return load_tokenizer(config.tokenizer.path)
    if config.model.path:
        return load_tokenizer(config.model.path)
    response = task.response or (lambda r: " " + r["answer"])
    texts = [render_prompt(config.tokenizer.template, r["problem"]) + response(r)
             for r in task.train + task.eval]
    h = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]
    path = os.path.join(cache_dir, f"sp-{config.tokenizer.vocab_size}-{h}.model")
    if os.path.exists(path):
        return load_tokenizer(path)
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path[:-6] + f".tmp{os.getpid()}.model"
    train_sentencepiece(texts, config.tokenizer.vocab_size, tmp)
    os.replace(tmp, path)
    return load_tokenizer(path)


def _cache_dir(config) -> str:
    return config.warmstart.cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ada")


def model_config_for(config, tokenizer):
    from ada.models import preset

    m = config.model
    overrides = {}
    if m.hidden_size:
        overrides["hidden_size"] = m.hidden_size
    if m.num_layers:
        overrides["num_layers"] = m.num_layers
    vocab = max(tokenizer.vocab_size, 1)
    return preset(m.preset, family=m.family, vocab_size=vocab, dtype=m.dtype,
                  param_dtype=m.param_dtype, **overrides)


def encode_records(records, tokenizer, template: str, max_len: int) -> tuple[list[dict], int]:
    """Attach `prompt_tokens` to each record; drop (and count) prompts longer than max_len."""
    from ada.templates import encode_prompt

    out, dropped = [], 0
    for r in records:
        ids = encode_prompt(tokenizer, template, r["problem"])
        if len(ids) > max_len:
            dropped += 1
            continue
        out.append(dict(r, prompt_tokens=ids))
    return out, dropped


def make_mesh(config):
    """None (plain jit) on one device; else a (data, fsdp, tensor) mesh over all devices."""
    import jax

    from ada import sharding as shd

    n = jax.device_count()
    data, fsdp, tensor = config.mesh.data, config.mesh.fsdp, config.mesh.tensor
    if data == -1:
        if n % (fsdp * tensor):
            raise ConfigError(f"mesh fsdp*tensor={fsdp * tensor} does not divide the {n} devices; "
                              "change mesh.fsdp / mesh.tensor")
        data = n // (fsdp * tensor)
    if data * fsdp * tensor == 1:
        return None
    return shd.make_mesh((data, fsdp, tensor))


# ----------------------------------------------------------------------------- batches


def minibatch_row_order(P: int, n: int, mini_batches: int) -> np.ndarray:
    """Row order under which the train step's strided split (row i -> mini-batch i % K) gives
    every mini-batch whole prompts: all n responses of a prompt update together, as in verl.

    Without it, prompt-major rows put member j of every prompt into mini-batch j when K = n,
    and selection lists positives first, so each optimizer update would see one sign only.
    """
    K = mini_batches
    if K <= 1:
        return np.arange(P * n)
    if P % K:
        raise ConfigError(f"{P} prompts per process do not split into optim.mini_batches={K} "
                          "mini-batches of whole prompts; make data.prompts_per_step / processes "
                          "a multiple of optim.mini_batches")
    per_mini = [[p * n + j for p in range(k, P, K) for j in range(n)] for k in range(K)]
    return np.array([per_mini[i % K][i // K] for i in range(P * n)])


def build_train_batch(collected, prompt_len: int, response_len: int, pad_id: int,
                      advantages_PxN, mini_batches: int = 1) -> dict[str, np.ndarray]:
    """[P, n] selected responses -> a [P*n, T] batch (prompt left-padded, response right),
    rows ordered so that each PPO mini-batch holds whole prompts (`minibatch_row_order`)."""
    from ada.models.transformer import positions_from_mask

    P, n = collected.group_valid.shape
    T = prompt_len + response_len
    B = P * n
    tokens = np.full((B, T), pad_id, np.int32)
    mask = np.zeros((B, T), bool)
    rmask = np.zeros((B, T), np.float32)
    adv = np.zeros((B,), np.float32)
    for p in range(P):
        prompt = collected.prompts[p]["prompt_tokens"]
        for j in range(n):
            b = p * n + j
            tokens[b, prompt_len - len(prompt): prompt_len] = prompt
            mask[b, prompt_len - len(prompt): prompt_len] = True
            c = collected.completions[p][j]
            if not collected.group_valid[p, j] or c is None:
                continue
            resp = list(c.token_ids)[:response_len]
            tokens[b, prompt_len: prompt_len + len(resp)] = resp
            mask[b, prompt_len: prompt_len + len(resp)] = True
            rmask[b, prompt_len: prompt_len + len(resp)] = 1.0
            adv[b] = advantages_PxN[p, j]
    positions = np.asarray(positions_from_mask(mask)).astype(np.int32)
    order = minibatch_row_order(P, n, mini_batches)
    batch = {"tokens": tokens, "positions": positions, "mask": mask, "response_mask": rmask,
             "advantages": adv}
    return {k: v[order] for k, v in batch.items()}


# ----------------------------------------------------------------------------- the run


class Run:
    """Everything a run holds; built once from a validated config."""

    def __init__(self, config, workdir: str):
        import jax

        from ada import distributed

        self.config = config
        self.workdir = os.path.abspath(workdir)
        self.main = distributed.is_main()
        self.pidx, self.pcount = jax.process_index(), jax.process_count()
        c = config
        os.makedirs(self.workdir, exist_ok=True)
        self.timings: dict[str, float] = {}
        t0 = time.perf_counter()

        self.task = load_task(c)
        cache = _cache_dir(c)
        self.tokenizer = load_tokenizer_for(c, self.task, os.path.join(cache, "tokenizers"))
        self.template = c.tokenizer.template
        self.train_records, dropped = encode_records(self.task.train, self.tokenizer, self.template,
                                                     c.data.max_prompt_len)
        self.eval_records, _ = encode_records(self.task.eval, self.tokenizer, self.template,
                                              c.data.max_prompt_len)
        self.dropped_prompts = dropped
        if not self.train_records:
            raise ConfigError(f"no training prompt fits data.max_prompt_len={c.data.max_prompt_len}; raise it")
        self.params, self.model_cfg, self.warm_info = self._init_params()
        self.timings["setup_s"] = time.perf_counter() - t0

        from ada.data.sources import PromptIterator

        self.iterator = PromptIterator(self.train_records, c.data.prompts_per_step, seed=c.seed,
                                       process_index=self.pidx, process_count=self.pcount,
                                       shuffle=c.data.shuffle)
        self.mesh = make_mesh(c)
        self._build_fns()

    # -- model ---------------------------------------------------------------

    def _init_params(self):
        import jax

        from ada.models import init_params

        c = self.config
        if c.model.path:
            from ada.models.hf import load_hf

            params, model_cfg = load_hf(c.model.path, dtype=None)
            model_cfg = model_cfg.replace(dtype=c.model.dtype)
            return params, model_cfg, {}
        model_cfg = model_config_for(c, self.tokenizer)
        if not c.warmstart.enabled:
            return init_params(model_cfg, jax.random.key(c.seed)), model_cfg, {}
        from ada import warmstart

        if self.task.response is None:
            raise ConfigError("warmstart.enabled needs a synthetic task (data.source=arithmetic|countdown)")
        eos = self.tokenizer.eos_id
        examples = [(r["prompt_tokens"], self.tokenizer.encode(self.task.response(r)) + [eos])
                    for r in self.train_records]
        settings = dict(steps=c.warmstart.steps, batch_size=c.warmstart.batch_size, lr=c.warmstart.lr)
        vocab_fp = hashlib.sha256(
            "\x00".join(self.tokenizer.id_to_piece(i) for i in range(self.tokenizer.vocab_size)).encode()
        ).hexdigest()
        key = warmstart.cache_key(model_cfg, vocab_fp, self.train_records, self.task.name, settings,
                                  c.warmstart.seed)
        params, info = warmstart.warm_start(
            model_cfg, examples, key_parts=key, steps=c.warmstart.steps,
            batch_size=c.warmstart.batch_size, lr=c.warmstart.lr, seed=c.warmstart.seed,
            pad_id=self.tokenizer.pad_id, cache_dir=os.path.join(_cache_dir(c), "warmstart"))
        return params, model_cfg, info

    def _build_fns(self):
        from ada.adaptive.collect import Collector, method_config
        from ada.rl.losses import LossConfig
        from ada.rl.optimizer import OptimConfig
        from ada.rl.train import TrainConfig, make_train_fns
        from ada.sampling.engine import Engine
        from ada.sampling.samplers import SamplingConfig

        c = self.config
        o = c.optim
        self.train_cfg = TrainConfig(
            loss=LossConfig(eps_low=o.clip_low, eps_high=o.clip_high,
                            dual_clip_c=o.dual_clip if o.dual_clip > 1 else None,
                            agg_mode=o.loss_agg, entropy_coef=o.entropy_coef, kl_coef=o.kl_coef),
            optim=OptimConfig(lr=o.lr, warmup_steps=o.warmup_steps, weight_decay=o.weight_decay,
                              clip_norm=o.grad_clip if o.grad_clip > 0 else None),
            ppo_epochs=o.epochs, mini_batches=o.mini_batches,
            micro_batches=o.micro_batches, remat=c.model.remat,
        )
        self.fns = make_train_fns(self.model_cfg, self.train_cfg, self.mesh)
        a = c.adaptive
        method = c.method
        self.collect_cfg = method_config(
            method, n=a.n, samples_per_round=a.samples_per_round, max_rounds=a.max_rounds,
            threshold=a.positive_threshold, reward_range=tuple(a.reward_range),
            **({"scheduler": a.scheduler} if method.startswith("ada") else {}),
            **({"max_prompt_batches": a.dapo_max_batches} if method == "dapo" else {}),
        )
        s = c.sampling
        eos = tuple(self.tokenizer.eos_ids)
        self.prompt_len = 1 << max(0, (c.data.max_prompt_len - 1).bit_length())
        # Generation is process-local: under a training mesh the engine gets a one-device
        # mesh over this process's first device (its default placement is jax.devices()[0],
        # which another process may own), the same on 1 or many processes.
        local_mesh = None
        if self.mesh is not None:
            import jax

            from ada import sharding as shd

            local_mesh = shd.make_mesh((1, 1, 1), devices=jax.local_devices()[:1])
        prompt_len = self.prompt_len

        def make_engine(temperature: float, max_new_tokens: int) -> Engine:
            return Engine(self.model_cfg, num_slots=s.num_slots, max_prompt_len=prompt_len,
                          max_new_tokens=max_new_tokens,
                          sampling=SamplingConfig(temperature=temperature, top_k=s.top_k,
                                                  top_p=s.top_p),
                          eos_ids=eos, chunk_size=s.chunk_size, mesh=local_mesh,
                          slot_bucketing=s.slot_bucketing, max_prefill_rows=s.max_prefill_rows,
                          num_windows=s.get("num_windows", 4),  # runs older than the key
                          min_prompt_bucket=min(16, prompt_len))

        self.engine = make_engine(s.temperature, s.max_new_tokens)
        self.prompt_len = prompt_len = self.engine.max_prompt_len  # the eval engine's too
        e = c.eval
        eval_new = e.max_new_tokens or s.max_new_tokens
        if e.temperature == s.temperature and eval_new == s.max_new_tokens:
            self.eval_engine = self.engine
        else:
            self.eval_engine = make_engine(e.temperature, eval_new)
        self.Collector = Collector

    def local_params(self, state):
        """This process's full copy of the (replicated) params, for its local engine."""
        import jax

        if self.mesh is None:
            return state.params
        return jax.tree.map(lambda x: x.addressable_data(0) if x.is_fully_replicated
                            else jax.device_put(_gather_host(x)), state.params)

    # -- sampling --------------------------------------------------------------

    def _driver(self, engine, params, key):
        import jax

        from ada.sampling.driver import Driver

        # the engine folds raw uint32 keys
        return Driver(engine, params, tokenizer=self.tokenizer,
                      step_key=jax.random.key_data(key))

    def collect(self, state, prompts, key):
        """One adaptive collection on this process's prompts."""
        import jax


        with jax.default_device(jax.local_devices()[0]):  # generation is process-local
            return self._collect(state, prompts, key)

    def _collect(self, state, prompts, key):
        import itertools

        import jax

        from ada.sampling.driver import Request

        driver = self._driver(self.engine, self.local_params(state), jax.random.fold_in(key, 0))
        # Engine-facing prompt ids are global (this process's first prompt is pidx * P), so
        # sampling keys differ across processes; the collector maps completions back to rows.
        collector = self.Collector(
            self.collect_cfg, self.task.reward, driver=driver,
            make_request=lambda r: Request(prompt_tokens=r.prompt["prompt_tokens"],
                                           prompt_id=r.prompt_id, sample_idx=r.sample_idx),
            prompt_id_offset=self.pidx * len(prompts))
        # DAPO draws further prompts one by one from the batch iterator.
        more = itertools.chain.from_iterable(self.iterator) if self.config.method == "dapo" else None
        return collector.collect(prompts, jax.random.fold_in(key, 1), more_prompts=more)

    def evaluate(self, state, step: int) -> dict:
        """avg@k / pass@k on the held-out split (each process scores its shard)."""
        import jax

        with jax.default_device(jax.local_devices()[0]):
            return self._evaluate(state, step)

    def _evaluate(self, state, step: int) -> dict:
        import jax

        from ada import distributed
        from ada.evaluate import pass_at_k
        from ada.sampling.driver import Request

        c = self.config
        recs = self.eval_records
        if not recs:
            return {}
        per = math.ceil(len(recs) / self.pcount)
        mine = recs[self.pidx * per:(self.pidx + 1) * per]
        S = c.eval.samples
        key = jax.random.fold_in(jax.random.key(c.seed + 1_000_003), 0)  # same draws every eval
        driver = self._driver(self.eval_engine, self.local_params(state), key)
        reqs = [Request(prompt_tokens=r["prompt_tokens"], prompt_id=self.pidx * per + i, sample_idx=j)
                for i, r in enumerate(mine) for j in range(S)]
        outs = driver.generate_all(reqs)
        correct = np.zeros((len(recs),), np.int64)  # global, by prompt
        diff_tot = {}
        thr = c.adaptive.positive_threshold
        for req, out in zip(reqs, outs, strict=True):
            rec = recs[req.prompt_id]
            try:
                r = float(self.task.reward(rec, out.text))
            except Exception:  # noqa: BLE001
                r = 0.0
            correct[req.prompt_id] += int(r > thr)
        correct = distributed.global_sum(correct)
        m = {f"eval_avg@{S}": float(correct.sum() / (len(recs) * S)),
             "eval_accuracy": float(correct.sum() / (len(recs) * S))}
        for k in c.eval.pass_k:
            m[f"eval_pass@{k}"] = float(np.mean([pass_at_k(S, int(x), k) for x in correct]))
        levels = sorted({r.get("difficulty") for r in recs if r.get("difficulty") is not None})
        for lv in levels:
            idx = [i for i, r in enumerate(recs) if r.get("difficulty") == lv]
            diff_tot[f"eval_accuracy_level{lv}"] = float(correct[idx].sum() / (len(idx) * S))
        m.update(diff_tot)
        return m

    # -- state -----------------------------------------------------------------

    def init_state(self):
        return self.fns.init_state(self.params)

    def state_tree(self, state, rng_data):
        import jax

        return {"params": state.params, "opt_state": state.opt_state, "step": state.step,
                "updates": state.updates, "skipped": state.skipped,
                "rng": np.asarray(jax.device_get(rng_data))}  # host value, same on every process

    def from_tree(self, tree, like):
        return like.replace(params=tree["params"], opt_state=tree["opt_state"], step=tree["step"],
                            updates=tree["updates"], skipped=tree["skipped"])


def _gather_host(x):
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(x, tiled=True)


def _to_global(batch, mesh):
    """Stack this process's rows into a global batch sharded over data x fsdp."""
    import jax

    from ada import sharding as shd

    if jax.process_count() == 1:
        return shd.shard_batch({k: np.asarray(v) for k, v in batch.items()}, mesh)
    return {k: jax.make_array_from_process_local_data(shd.batch_sharding(mesh, np.ndim(v)), np.asarray(v))
            for k, v in batch.items()}


def step_metrics(collected, train_m: dict, pcount: int) -> dict:
    """Per-step statistics, with counts summed over processes so every process agrees."""
    from ada import distributed

    P, n = collected.group_valid.shape
    kept_r = np.where(collected.group_valid, collected.rewards, 0.0)
    zero_var = (~collected.mixed).astype(np.int64)
    rounds = collected.rounds
    R = 64  # rounds recorded per step (a collection has max_rounds, DAPO a few batches of them)
    active = np.zeros(R, np.int64)
    for rd in rounds:
        if rd.get("round", 0) < R:
            active[rd["round"]] += rd["active_prompts"]
    lengths = [len(c.token_ids) for row in collected.completions for c in row if c is not None]
    local = np.concatenate([
        [P, kept_r.sum(), collected.group_valid.sum(), zero_var.sum(), collected.samples.sum(),
         collected.done.sum(), sum(lengths), len(lengths),
         collected.metrics.get("reward_failures", 0), collected.pool.pos.sum(),
         (collected.pool.pos + collected.pool.neg).sum()], active]).astype(np.float64)
    rounds_per_process = distributed.allgather(np.int64(len(rounds)))
    g = distributed.global_sum(local)
    (Pg, rsum, nvalid, zv, samples, done, toks, nresp, fails, pos, seen) = g[:11]
    act = g[11:]
    m = {
        "reward_mean": rsum / max(nvalid, 1),  # over the selected [P, n] responses
        "pool_reward_mean": pos / max(seen, 1),  # share positive over every response drawn
        "zero_variance_share": zv / Pg,
        "samples_per_prompt": samples / Pg,
        "samples": samples,
        "exited_share": done / Pg,
        "response_tokens_mean": toks / max(nresp, 1),
        "reward_failures": fails,
        "rounds_per_process": [int(x) for x in rounds_per_process],
        "active_prompts_per_round": [int(a) for a in act[: max(1, int(np.max(np.nonzero(act)[0]) + 1)
                                                            if act.any() else 1)]],
    }
    for k, v in train_m.items():
        m[k] = float(v)
    return m


def train(config, workdir: str, *, stop_after: int | None = None) -> dict:
    """Run (or resume) training; returns the final summary dict."""
    import jax

    from ada import distributed
    from ada.checkpoint import Checkpointer
    from ada.metrics import MetricsWriter, Progress, plot_run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    c = config
    run = Run(c, workdir)
    main = run.main
    if main:
        with open(os.path.join(run.workdir, "config.json"), "w") as f:
            json.dump(c.to_dict(), f, indent=2, sort_keys=True, default=str)
    ckpt = Checkpointer(os.path.join(run.workdir, "checkpoints"), keep=c.checkpoint.keep)
    state = run.init_state()
    base_key = jax.random.key(c.seed)
    start = 0
    sampler_state = {"samples_total": 0, "prompts_total": 0}
    latest = ckpt.latest_step()
    if latest is not None:
        tree, meta, start = ckpt.restore(run.state_tree(state, jax.random.key_data(base_key)))
        state = run.from_tree(tree, state)
        base_key = jax.random.wrap_key_data(np.asarray(tree["rng"]))
        run.iterator.set_state(meta["data"])
        sampler_state = meta.get("sampler", sampler_state)
        log.info("resumed from step %d (%s)", start, ckpt.directory)
    writer = MetricsWriter(run.workdir, tensorboard=c.log.tensorboard,
                           resume_step=start if latest is not None else None, enabled=main)
    bar = Progress(c.train.steps, initial=start, enabled=main and c.log.progress)
    if main and latest is None:
        writer.write(0, {"warmstart_loss": run.warm_info.get("loss"),
                         "warmstart_cached": run.warm_info.get("cached"),
                         "dropped_prompts": run.dropped_prompts, "setup_s": run.timings["setup_s"],
                         **_maybe_eval(run, state, 0)})
    elif latest is None:
        _maybe_eval(run, state, 0)

    step = start
    t_run = time.perf_counter()
    while step < c.train.steps:
        step += 1
        key = jax.random.fold_in(base_key, step)
        t0 = time.perf_counter()
        prompts = next(run.iterator)
        collected = run.collect(state, prompts, key)
        t1 = time.perf_counter()
        adv = np.asarray(collected.advantages(
            stats_from="pool" if c.method.startswith("ada") else "group",
            norm_by_std=c.adaptive.normalize_std))
        batch = build_train_batch(collected, run.prompt_len, c.sampling.max_new_tokens,
                                  run.tokenizer.pad_id, adv, c.optim.mini_batches)
        batch = run.fns.shard_batch(batch) if run.mesh is None else _to_global(batch, run.mesh)
        if not run.train_cfg.on_policy:
            batch = run.fns.recompute_old_logp(state, batch)
        state, tm = run.fns.train_step(state, batch)
        tm = jax.device_get(tm)
        t2 = time.perf_counter()
        m = step_metrics(collected, tm, run.pcount)
        sampler_state = {"samples_total": int(sampler_state["samples_total"] + m["samples"]),
                         "prompts_total": int(sampler_state["prompts_total"]
                                              + c.data.prompts_per_step)}
        m["samples_total"] = sampler_state["samples_total"]
        m["time_collect_s"] = t1 - t0
        m["time_update_s"] = t2 - t1
        if c.eval.every and (step % c.eval.every == 0 or step == c.train.steps):
            t3 = time.perf_counter()
            m.update(run.evaluate(state, step))
            m["time_eval_s"] = time.perf_counter() - t3
        writer.write(step, m)
        bar.update(m)
        if step % c.checkpoint.every == 0 or step == c.train.steps:
            t4 = time.perf_counter()
            ckpt.save(step, run.state_tree(state, jax.random.key_data(base_key)),
                      {"data": run.iterator.get_state(), "sampler": sampler_state,
                       "method": c.method})
            if main:
                log.debug("checkpoint %d in %.2fs", step, time.perf_counter() - t4)
        if stop_after is not None and step >= stop_after:
            break
    bar.close()
    writer.close()
    summary = {"steps": step, "seconds": time.perf_counter() - t_run,
               "samples_total": sampler_state["samples_total"], "method": c.method,
               "compiles": run.engine.compiles() if hasattr(run.engine, "compiles") else {}}
    if main:
        from ada.metrics import read_jsonl

        rows = read_jsonl(os.path.join(run.workdir, "metrics.jsonl"))
        evals = [r for r in rows if r.get("eval_accuracy") is not None]
        if evals:
            summary["eval_accuracy_first"] = evals[0]["eval_accuracy"]
            summary["eval_accuracy_final"] = evals[-1]["eval_accuracy"]
        if c.log.plots:
            summary["plot"] = plot_run(run.workdir)
        if c.checkpoint.export_hf and step >= c.train.steps:
            from ada.models.hf import save_hf

            save_hf(jax.device_get(run.local_params(state)), run.model_cfg,
                    os.path.join(run.workdir, "hf"))
            if getattr(run.tokenizer, "path", "") and os.path.isfile(run.tokenizer.path):
                import shutil

                shutil.copy(run.tokenizer.path, os.path.join(run.workdir, "hf", "tokenizer.model"))
        with open(os.path.join(run.workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True, default=str)
    distributed.sync("train_end")
    return summary


def _maybe_eval(run, state, step) -> dict:
    if not run.config.eval.every:
        return {}
    t = time.perf_counter()
    m = run.evaluate(state, step)
    m["time_eval_s"] = time.perf_counter() - t
    return m


# ----------------------------------------------------------------------------- evaluate CLI


def evaluate_cli(args) -> dict:
    """Backs `python -m ada.evaluate` (see ada/evaluate.py)."""
    import jax

    from ada.checkpoint import Checkpointer

    if args.workdir:
        config = cfglib.load_run_config(args.workdir)
    else:
        config = cfglib.load_config(args.config or "configs/default.py")
        if not args.model:
            raise ConfigError("pass --workdir RUN_DIR or --model HF_DIR")
        config.model.path = args.model
        cfglib.validate(config)
    if args.samples:
        config.eval.samples = args.samples
    if args.temperature is not None:
        config.eval.temperature = args.temperature
    if args.max_new_tokens:
        config.eval.max_new_tokens = args.max_new_tokens
    if args.pass_k:
        config.eval.pass_k = tuple(int(k) for k in args.pass_k.split(","))
    config.eval.pass_k = tuple(k for k in config.eval.pass_k if k <= config.eval.samples)
    if args.benchmark:
        config.data.eval_path = args.benchmark
    run = Run(config, args.workdir or os.path.dirname(os.path.abspath(args.json or ".")) )
    if args.benchmark:
        from ada.data.sources import RecordFormat, load_records
        from ada.rewards.math_verifier import math_reward

        recs = load_records(args.benchmark, RecordFormat(problem_key=config.data.problem_key,
                                                         answer_key=config.data.answer_key))
        run.eval_records, _ = encode_records(recs, run.tokenizer, run.template, config.data.max_prompt_len)
        run.task.reward = math_reward  # benchmark files are math problems with gold answers
    if args.limit:
        run.eval_records = run.eval_records[: args.limit]
    state = run.init_state()
    step = 0
    if args.workdir:
        ckpt = Checkpointer(os.path.join(args.workdir, "checkpoints"))
        if ckpt.latest_step() is not None:
            tree, _, step = ckpt.restore(run.state_tree(state, jax.random.key_data(jax.random.key(0))),
                                         step=args.step)
            state = run.from_tree(tree, state)
    out = run.evaluate(state, step)
    out["step"] = step
    out["num_prompts"] = len(run.eval_records)
    return out


# ----------------------------------------------------------------------------- CLI


DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "default.py")

EPILOG = """examples:
  python -m ada.runner --workdir runs/default                   # the embedded default
  python -m ada.runner --config configs/default.py:grpo --workdir runs/grpo
  python -m ada.runner --config configs/qwen25_math_7b.py:ada_balance --workdir runs/q7b \\
      --config.model.path=/models/Qwen2.5-Math-7B --config.train.steps=300
  python -m ada.runner --config configs/default.py --print_config   # see every knob
  python -m ada.runner --sweep configs/sweep_methods.py --workdir runs/sweep --print

Any config value can be overridden with --config.a.b=value. Methods (the :arg of a
config file): grpo, dapo, ada_pos, ada_balance. A rerun with the same --workdir resumes
from its latest complete checkpoint."""


def parse_args(argv: Sequence[str]):
    overrides, rest = cfglib.parse_override_args(argv)
    p = argparse.ArgumentParser(prog="python -m ada.runner",
                                description="Train with Reinforce-Ada / GRPO from a config file.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help="configs/FILE.py[:arg] (default: configs/default.py, the embedded default)")
    p.add_argument("--workdir", help="output directory (metrics, checkpoints, plots)")
    p.add_argument("--sweep", help="configs/sweep_*.py: run each point (or --print the commands)")
    p.add_argument("--print", action="store_true", help="with --sweep: print commands, run nothing")
    p.add_argument("--print_config", action="store_true", help="print the resolved config and exit")
    args = p.parse_args(rest)
    return args, overrides


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, overrides = parse_args(argv)
        if args.sweep:
            return _sweep(args, overrides)
        if not args.config:
            raise ConfigError("no config; pass --config configs/default.py")
        config = cfglib.build_config(args.config, overrides)
        if args.print_config:
            print(config)
            return 0
        if not args.workdir:
            raise ConfigError("no output directory; pass --workdir DIR (e.g. --workdir runs/default)")
        cfglib.validate(config, args.workdir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from ada import distributed

    distributed.initialize()
    try:
        summary = train(config, args.workdir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if distributed.is_main():
        print(json.dumps({k: v for k, v in summary.items() if k != "compiles"}, default=str))
    return 0


def _sweep(args, overrides) -> int:
    if not args.workdir:
        raise ConfigError("--sweep needs --workdir (each run goes to a subdirectory)")
    base, runs = cfglib.load_sweep(args.sweep)
    extra = cfglib.overrides_to_args(dict(overrides))
    cmds = []
    for r in runs:
        wd = os.path.join(args.workdir, cfglib.sweep_name(r))
        cmd = [sys.executable, "-m", "ada.runner", "--config", base, *cfglib.overrides_to_args(r),
               *extra, "--workdir", wd]
        # validate each point before anything runs
        cfg = cfglib.build_config(base, [*((k, str(v) if not isinstance(v, (tuple, list)) else repr(v))
                                           for k, v in r.items()), *overrides])
        cfglib.validate(cfg, wd)
        cmds.append(cmd)
    import shlex

    if args.print:
        for cmd in cmds:
            print(shlex.join(cmd))
        return 0
    for cmd in cmds:
        print("+", shlex.join(cmd), flush=True)
        rc = subprocess.call(cmd)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
