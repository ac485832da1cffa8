"""From a validated config to the pieces of a run: task, tokenizer, model, mesh, samplers,
train functions. Everything a bad input can break is read here, before anything compiles,
and fails with a one-line ConfigError naming the knob to change.

`build(config)` is the one entry: the training loop, `python -m ada.evaluate` and the
difficulty filter all call it, so a run directory is rebuilt exactly as it was trained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
import os
from typing import Any

import jax
import numpy as np

from ada import methods
from ada import sharding as shd
from ada.adaptive.collect import CollectConfig
from ada.config import ConfigError
from ada.data.preprocess import DifficultyFilter, difficulty_filter
from ada.data.sources import DataError, RecordFormat, load_records
from ada.data.synthetic import make_dataset
from ada.data.tfds_source import TfdsError, load_tfds  # imports TensorFlow only when called
from ada.models import init_params, preset
from ada.models.hf import load_hf
from ada.models.hf_config import read_config
from ada.rewards.math_verifier import math_reward
from ada.rewards.score import score
from ada.rewards.tasks import arithmetic_reward, countdown_reward
from ada.rl.losses import LossConfig
from ada.rl.optimizer import OptimConfig
from ada.rl.train import TrainConfig, TrainFns, make_train_fns
from ada.rollout import Rollout
from ada.sampling.engine import Engine
from ada.sampling.samplers import SamplingConfig
from ada.templates import encode_prompt, render_prompt
from ada.tokenizer import Tokenizer, load_tokenizer, train_sentencepiece

log = logging.getLogger(__name__)

DROPPED_WARN_SHARE = 0.1  # warn when more prompts than this are too long for the run


# ----------------------------------------------------------------------------- task


@dataclasses.dataclass
class Task:
    train: list[dict]
    eval: list[dict]
    reward: Any  # reward(record, text) -> float, never raising
    response: Any  # record -> the reference response text (warm start), or None
    name: str


def load_reward(spec: str):
    """'package.module:function' -> the reward callable (reward(record, text) -> float)."""
    mod, _, fn = spec.partition(":")
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"data.reward={spec!r} cannot be imported ({e}); "
                          "write it as package.module:function") from None


def load_task(config) -> Task:
    d = config.data
    on_bad_row = d.get("on_bad_row", "raise")
    if d.source in ("arithmetic", "countdown"):
        mix = parse_mix(d.difficulty)
        train, evals = (make_dataset(d.source, num, seed=d.task_seed, difficulty_mix=mix, split=split)
                        for num, split in ((d.num_train, "train"), (d.num_eval, "test")))
        if d.source == "arithmetic":
            task = Task(train, evals, arithmetic_reward, lambda r: " " + r["answer"], d.source)
        else:
            task = Task(train, evals, countdown_reward, lambda r: " " + r["solution"], d.source)
    elif d.source in ("jsonl", "parquet", "tfds"):
        fmt = RecordFormat(problem_key=d.problem_key, answer_key=d.answer_key)

        def read(where: str, split_knob: str = "") -> list[dict]:
            """One file's or TFDS split's records; a fault is one line naming the knob."""
            try:
                if d.source != "tfds":
                    return load_records(where, fmt, on_bad_row=on_bad_row)
                try:  # every process reads the whole split; the iterator takes its share
                    return load_tfds(d.tfds_name, split=where, data_dir=d.tfds_data_dir or None,
                                     fmt=fmt, on_bad_row=on_bad_row)
                except ImportError as e:
                    raise ConfigError(f"data.source=tfds: {e}") from None
            except TfdsError as e:
                fix = {"name_or_dir": "set --config.data.tfds_name to a dataset prepared in "
                                      "--config.data.tfds_data_dir (e.g. by tfds build; nothing "
                                      "is downloaded) or to its version folder",
                       "split": f"set --config.data.{split_knob} to one of its splits, "
                                "optionally sliced like train[:90%]"}.get(
                    e.arg, f"set --config.data.{e.arg} to the feature that holds it")
                raise ConfigError(f"{e.problem}; {fix}") from None
            except DataError as e:
                raise ConfigError(f"{e.problem}; fix the data or pass --config.data.on_bad_row="
                                  "skip to skip such rows" if e.skippable else str(e)) from None

        if d.source == "tfds":
            train = read(d.tfds_split, "tfds_split")
            evals = read(d.tfds_eval_split, "tfds_eval_split") if d.tfds_eval_split else []
            name = d.tfds_name
        else:
            train = read(d.train_path)
            evals = read(d.eval_path) if d.eval_path else []
            name = os.path.basename(d.train_path)
        task = Task(train, evals[: d.num_eval or None], math_reward, None, name)
    else:
        raise ConfigError(f"data.source={d.source!r} is not one of arithmetic, countdown, "
                          "jsonl, parquet, tfds")
    if d.reward:
        task.reward = load_reward(d.reward)
    return task


def parse_mix(difficulty: str) -> dict[int, float]:
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


def encode_records(records, tokenizer: Tokenizer, template: str,
                   max_len: int) -> tuple[list[dict], list[int]]:
    """Attach `prompt_tokens` to each record; returns (the records that fit in max_len, the
    token lengths of those that do not)."""
    out, too_long = [], []
    for r in records:
        ids = encode_prompt(tokenizer, template, r["problem"])
        if len(ids) > max_len:
            too_long.append(len(ids))
            continue
        out.append(dict(r, prompt_tokens=ids))
    return out, too_long


def too_long_message(what: str, total: int, too_long: list[int], max_len: int, knob: str) -> str:
    return (f"{len(too_long)} of {total} {what} are longer than {max_len} prompt tokens (the "
            f"longest has {max(too_long)}) and are skipped; raise {knob}")


# ----------------------------------------------------------------------------- tokenizer, model


def cache_dir(config) -> str:
    return config.warmstart.cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ada")


def load_tokenizer_for(config, task: Task) -> Tokenizer:
    """The model's tokenizer, or for a synthetic task a tiny SentencePiece trained on it
    (cached by the texts it was trained on)."""
    if config.tokenizer.path:
        return load_tokenizer(config.tokenizer.path)
    if config.model.path:
        return load_tokenizer(config.model.path)
    response = task.response or (lambda r: " " + r["answer"])
    texts = [render_prompt(config.tokenizer.template, r["problem"]) + response(r)
             for r in task.train + task.eval]
    h = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]
    folder = os.path.join(cache_dir(config), "tokenizers")
    path = os.path.join(folder, f"sp-{config.tokenizer.vocab_size}-{h}.model")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        tmp = path[:-6] + f".tmp{os.getpid()}.model"
        train_sentencepiece(texts, config.tokenizer.vocab_size, tmp)
        os.replace(tmp, path)
    return load_tokenizer(path)


def model_config_for(config, tokenizer: Tokenizer):
    """The model's config: a Hugging Face directory's, or the preset sized to the tokenizer."""
    m = config.model
    if m.path:
        return read_config(m.path)[1].replace(dtype=m.dtype, param_dtype=m.param_dtype)
    overrides = {k: v for k, v in (("hidden_size", m.hidden_size), ("num_layers", m.num_layers)) if v}
    return preset(m.preset, family=m.family, vocab_size=max(tokenizer.vocab_size, 1),
                  dtype=m.dtype, param_dtype=m.param_dtype, **overrides)


def check_context_window(config, model_cfg) -> None:
    """Prompt + response must fit the model's positions (RoPE was trained that far)."""
    c = config
    longest = c.data.max_prompt_len + max(c.sampling.max_new_tokens, c.eval.max_new_tokens)
    if longest > model_cfg.max_position_embeddings:
        raise ConfigError(
            f"data.max_prompt_len + max_new_tokens = {c.data.max_prompt_len} + "
            f"{longest - c.data.max_prompt_len} = {longest} is past the model's context window "
            f"of {model_cfg.max_position_embeddings} positions; lower sampling.max_new_tokens "
            "(or eval.max_new_tokens) or data.max_prompt_len")


NEAR_MISSES = (-2, -1, 1, 2)  # what a noisy teacher answers instead of the true integer
TEACHER_COPIES = 5  # warm-start examples per record when the teacher is noisy


def warm_start_examples(records, task: Task, tokenizer: Tokenizer, noise: float, seed: int):
    """(prompt tokens, target tokens) of the warm start. With teacher noise q > 0 each
    record with an integer answer appears TEACHER_COPIES times, round(q * copies) of them
    answered by a near miss (answer -2, -1, +1 or +2). Trained on after the exact answers
    (warmstart.noise_steps), it keeps the answer as the policy's most likely reply but
    spreads mass to its neighbours: a policy whose pass@k far exceeds its pass@1, as a
    pretrained LLM's (the regime RL sharpens; docs/results.md)."""
    eos = tokenizer.eos_id
    rng = np.random.default_rng(seed)
    wrong = round(noise * TEACHER_COPIES)
    out = []
    for r in records:
        target = tokenizer.encode(task.response(r)) + [eos]
        answer = r["answer"]
        if not wrong or not answer.lstrip("-").isdigit():
            out.append((r["prompt_tokens"], target))
            continue
        out += [(r["prompt_tokens"], target)] * (TEACHER_COPIES - wrong)
        for d in rng.choice(NEAR_MISSES, size=wrong, replace=False):
            miss = task.response(dict(r, answer=str(int(answer) + int(d))))
            out.append((r["prompt_tokens"], tokenizer.encode(miss) + [eos]))
    return out


def initial_params(config, model_cfg, tokenizer: Tokenizer, task: Task, train_records):
    """(params, warm-start info): a Hugging Face checkpoint, a random init, or a random init
    with the (cached) supervised warm start on the synthetic task."""
    from ada import warmstart

    c = config
    if c.model.path:
        return load_hf(c.model.path, dtype=c.model.dtype, param_dtype=c.model.param_dtype)[0], {}
    if not c.warmstart.enabled:
        return init_params(model_cfg, jax.random.key(c.seed)), {}
    if task.response is None:
        raise ConfigError("warmstart.enabled needs a synthetic task (data.source=arithmetic|countdown)")
    w = c.warmstart
    vocab_fp = hashlib.sha256("\x00".join(
        tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)).encode()).hexdigest()
    common = dict(model_cfg=model_cfg, batch_size=w.batch_size, pad_id=tokenizer.pad_id,
                  cache_dir=os.path.join(cache_dir(c), "warmstart"))
    settings = dict(steps=w.steps, batch_size=w.batch_size, lr=w.lr)
    key = warmstart.cache_key(model_cfg, vocab_fp, train_records, task.name, settings, w.seed)
    params, info = warmstart.warm_start(
        examples=warm_start_examples(train_records, task, tokenizer, 0.0, w.seed),
        key_parts=key, steps=w.steps, lr=w.lr, seed=w.seed, **common)
    noise_steps = w.get("noise_steps", 0)  # absent from runs older than the noisy phase
    if not noise_steps:
        return params, info
    # The noisy teacher's phase continues from the exact one (both cached; keyed as a chain).
    settings.update(teacher_noise=w.teacher_noise, noise_steps=noise_steps, noise_lr=w.noise_lr)
    key = warmstart.cache_key(model_cfg, vocab_fp, train_records, task.name, settings, w.seed)
    return warmstart.warm_start(
        examples=warm_start_examples(train_records, task, tokenizer, w.teacher_noise, w.seed),
        key_parts=key, steps=noise_steps, lr=w.noise_lr, seed=w.seed + 1, init=params, **common)


# ----------------------------------------------------------------------------- training, sampling


def make_mesh(config):
    """None (plain jit) on one device; else a (data, fsdp, tensor) mesh over all devices."""
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


def train_config(config) -> TrainConfig:
    o = config.optim
    return TrainConfig(
        loss=LossConfig(eps_low=o.clip_low, eps_high=o.clip_high,
                        dual_clip_c=o.dual_clip if o.dual_clip > 1 else None,
                        agg_mode=o.loss_agg, entropy_coef=o.entropy_coef, kl_coef=o.kl_coef,
                        kl_estimator=o.get("kl_estimator", "k3")),
        optim=OptimConfig(lr=o.lr, warmup_steps=o.warmup_steps, weight_decay=o.weight_decay,
                          clip_norm=o.grad_clip if o.grad_clip > 0 else None),
        ppo_epochs=o.epochs, mini_batches=o.mini_batches, micro_batches=o.micro_batches,
        remat=config.model.remat, temperature=config.sampling.temperature or 1.0)


def collect_config(config) -> CollectConfig:
    a = config.adaptive
    return methods.collect_config(
        config.method, n=a.n, samples_per_round=a.samples_per_round, max_rounds=a.max_rounds,
        threshold=a.positive_threshold, reward_range=tuple(a.reward_range),
        scheduler=a.scheduler, max_prompt_batches=a.dapo_max_batches,
        overlap_scoring=a.get("overlap_scoring", True))  # absent from runs older than the key


def make_engine(config, model_cfg, tokenizer: Tokenizer, *, temperature: float,
                max_new_tokens: int) -> Engine:
    """A sampling engine on this process's devices (`sampling.mesh` = (data, tensor), laid
    out by ada.sharding.local_mesh): generation is process-local."""
    s = config.sampling
    prompt_len = 1 << max(0, (config.data.max_prompt_len - 1).bit_length())
    data, tensor = s.get("mesh", (1, 1))  # absent from runs older than the key: one device
    n = jax.local_device_count()
    if data == -1:
        data = n // tensor
    if data < 1 or n % (data * tensor):
        raise ConfigError(f"sampling.mesh={tuple(s.mesh)} does not divide this process's {n} "
                          f"devices; choose (data, tensor) whose product divides {n} "
                          "(data=-1: all of them)")
    if s.num_slots % data:
        raise ConfigError(f"sampling.num_slots={s.num_slots} does not split over sampling.mesh "
                          f"data={data}; use a multiple of {data}")
    mesh = shd.local_mesh(data, tensor) if jax.device_count() > 1 else None
    return Engine(model_cfg, num_slots=s.num_slots, max_prompt_len=prompt_len,
                  max_new_tokens=max_new_tokens,
                  sampling=SamplingConfig(temperature=temperature, top_k=s.top_k, top_p=s.top_p),
                  eos_ids=tuple(tokenizer.eos_ids), chunk_size=s.chunk_size, mesh=mesh,
                  slot_bucketing=s.slot_bucketing, max_prefill_rows=s.max_prefill_rows,
                  num_windows=s.get("num_windows", 4),  # absent from runs older than the key
                  min_prompt_bucket=min(16, prompt_len))


# ----------------------------------------------------------------------------- prompt difficulty


def filter_by_pass_rate(c, records: list[dict], params, rollout: Rollout, warm_info: dict):
    """The training prompts whose pass rate under the initial policy lies in
    data.pass_rate_range: the paper's easy / hard prompt sets (section 4.1), chosen by the
    policy that starts training. Pass rates come from data.pass_rate_samples draws at the
    sampling temperature with a fixed key (the same set for every RL seed) and are cached
    per policy and sampling setting, so a second run with the same start does not sample."""
    lo, hi = c.data.pass_rate_range
    k = c.data.pass_rate_samples
    policy = warm_info.get("path") or c.model.path or f"random-init-{c.seed}"
    tag = hashlib.sha256(repr((policy, k, c.sampling.temperature, c.sampling.max_new_tokens,
                               c.data.source, c.data.train_path, c.data.difficulty,
                               c.data.task_seed, c.data.num_train)).encode()).hexdigest()[:16]
    key = jax.random.key(c.warmstart.seed + 104_729)
    place = {r["id"]: i for i, r in enumerate(records)}

    def sample_fn(chunk, k):  # a record draws as its place in the split, whatever the chunk
        outs = rollout.sample(params, chunk, k, key, place[chunk[0]["id"]])
        texts = [o.text for row in outs for o in row]
        rewards, _ = score(rollout.reward, [r for r in chunk for _ in range(k)], texts)
        return rewards.reshape(len(chunk), k)

    kept, _ = difficulty_filter(records, sample_fn, DifficultyFilter(k=k, min_pass_rate=lo,
                                                                     max_pass_rate=hi),
                                os.path.join(cache_dir(c), "passrates", f"{tag}.jsonl"))
    if len(kept) < c.data.prompts_per_step:
        raise ConfigError(f"data.pass_rate_range={tuple(c.data.pass_rate_range)} keeps {len(kept)}"
                          f" of {len(records)} training prompts, fewer than data.prompts_per_step="
                          f"{c.data.prompts_per_step}; widen the range")
    log.info("pass-rate filter %s: kept %d of %d training prompts", (lo, hi), len(kept),
             len(records))
    return kept


# ----------------------------------------------------------------------------- the whole run


@dataclasses.dataclass
class Setup:
    config: Any
    task: Task
    tokenizer: Tokenizer
    model_cfg: Any
    params: Any  # the initial params (None when built with initial=False)
    warm_info: dict
    train_records: list[dict]  # with prompt_tokens; prompts too long for the run dropped
    eval_records: list[dict]
    dropped_prompts: int
    mesh: Any
    fns: TrainFns
    rollout: Rollout  # training samples
    eval_rollout: Rollout  # held-out samples (eval temperature and length)


def build(config, *, initial: bool = True) -> Setup:
    """Everything a run holds, from a validated config. `initial=False` skips the initial
    params (and the warm start) for callers that restore a checkpoint instead."""
    c = config
    task = load_task(c)
    tokenizer = load_tokenizer_for(c, task)
    max_len = c.data.max_prompt_len
    train_records, too_long = encode_records(task.train, tokenizer, c.tokenizer.template, max_len)
    if not train_records:
        raise ConfigError(f"no training prompt fits data.max_prompt_len={max_len} (the shortest "
                          f"has {min(too_long, default=0)} tokens); raise --config.data.max_prompt_len")
    if len(too_long) > DROPPED_WARN_SHARE * len(task.train):
        log.warning(too_long_message("training prompts", len(task.train), too_long, max_len,
                                     "--config.data.max_prompt_len"))
    eval_records, eval_too_long = encode_records(task.eval, tokenizer, c.tokenizer.template,
                                                 max_len)
    if eval_too_long:
        log.warning(too_long_message("held-out prompts", len(task.eval), eval_too_long, max_len,
                                     "--config.data.max_prompt_len"))
    model_cfg = model_config_for(c, tokenizer)
    check_context_window(c, model_cfg)
    params, warm_info = (initial_params(c, model_cfg, tokenizer, task, train_records)
                         if initial else (None, {}))
    mesh = make_mesh(c)
    s, e = c.sampling, c.eval

    def rollout(temperature, max_new_tokens):
        engine = make_engine(c, model_cfg, tokenizer, temperature=temperature,
                             max_new_tokens=max_new_tokens)
        return Rollout(engine, tokenizer, collect_config(c), task.reward)

    train_rollout = rollout(s.temperature, s.max_new_tokens)
    if params is not None and tuple(c.data.get("pass_rate_range", (0.0, 1.0))) != (0.0, 1.0):
        train_records = filter_by_pass_rate(c, train_records, params, train_rollout, warm_info)
    eval_new = e.max_new_tokens or s.max_new_tokens
    same = e.temperature == s.temperature and eval_new == s.max_new_tokens
    return Setup(c, task, tokenizer, model_cfg, params, warm_info, train_records, eval_records,
                 len(too_long), mesh, make_train_fns(model_cfg, train_config(c), mesh),
                 train_rollout, train_rollout if same else rollout(e.temperature, eval_new))
