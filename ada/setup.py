"""From a validated config to the pieces of a run: task, tokenizer, model, mesh, samplers,
train functions. Everything a bad input can break is read here, before anything compiles,
and fails with a one-line ConfigError naming the knob to change.

`build(config)` builds a training run. The other commands rebuild a run's pieces from its
directory with the same functions: `load_run` (config, tokenizer, model and the params of a
checkpoint) and `make_engine` (the one sampler factory), so evaluation, serving, the pass-rate
filter and the planner sample exactly as training does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
import os
from typing import Any

import jax

from ada import paths, warmstart
from ada.checkpoint import Checkpointer
from ada.config import ConfigError, collect_config, load_run_config, train_config
from ada.data.preprocess import DifficultyFilter, difficulty_filter
from ada.data.sources import DataError, RecordFormat, load_records
from ada.data.synthetic import make_dataset
from ada.data.tfds_source import TfdsError, load_tfds  # imports TensorFlow only when called
from ada.evaluation import pass_rates
from ada.meshes import sampling_mesh, train_mesh
from ada.models import init_params, preset
from ada.models.hf import load_hf
from ada.models.hf_config import read_config
from ada.rewards import REWARD_NAMES, get_reward_fn
from ada.rl.train import TrainFns, make_train_fns
from ada.rollout import Rollout
from ada.sampling.engine import Engine
from ada.sampling.paged import PagedEngine
from ada.sampling.paged_config import kernel_problem
from ada.sampling.samplers import SamplingConfig
from ada.templates import encode_prompt, render_prompt
from ada.tokenizer import Tokenizer, load_tokenizer, train_sentencepiece

log = logging.getLogger(__name__)

DROPPED_WARN_SHARE = 0.1  # warn when more prompts than this are too long for the run
UNKNOWN_WARN_SHARE = 0.01  # warn when more of a data set's tokens than this are unknown


# ----------------------------------------------------------------------------- task


@dataclasses.dataclass
class Task:
    train: list[dict]
    eval: list[dict]
    reward: Any  # reward(record, text) -> float, never raising
    response: Any  # record -> the reference response text (warm start), or None
    name: str


def reward_spec(config) -> str:
    """The run's reward: data.reward, else its task's own (arithmetic, countdown, math)."""
    d = config.data
    return d.reward or (d.source if d.source in ("arithmetic", "countdown") else "math")


def load_reward(spec: str, knob: str = "data.reward"):
    """A reward name (math, arithmetic, countdown) or 'package.module:function' -> the reward
    callable (reward(record, text) -> float)."""
    if spec in REWARD_NAMES:
        return get_reward_fn(spec)
    mod, _, fn = spec.partition(":")
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{knob}={spec!r} cannot be imported ({e}); write it as "
                          f"package.module:function or one of {', '.join(REWARD_NAMES)}") from None


def load_task(config) -> Task:
    d = config.data
    on_bad_row = d.on_bad_row
    if d.source in ("arithmetic", "countdown"):
        mix = parse_mix(d.level_mix)
        train, evals = (make_dataset(d.source, num, seed=d.task_seed, difficulty_mix=mix, split=split)
                        for num, split in ((d.num_train, "train"), (d.num_eval, "test")))
        if d.source == "arithmetic":
            task = Task(train, evals, None, lambda r: " " + r["answer"], d.source)
        else:
            task = Task(train, evals, None, lambda r: " " + r["solution"], d.source)
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
                fix = ("fix the data" if not e.key else
                       f"set --config.data.{e.key} to the column that holds it")
                skip = ", or pass --config.data.on_bad_row=skip to skip such rows"
                raise ConfigError(f"{e.problem}; {fix}{skip if e.skippable else ''}"
                                  if e.skippable or e.key else str(e)) from None

        if d.source == "tfds":
            train = read(d.tfds_split, "tfds_split")
            evals = read(d.tfds_eval_split, "tfds_eval_split") if d.tfds_eval_split else []
            name = d.tfds_name
        else:
            train = read(d.train_path)
            evals = read(d.eval_path) if d.eval_path else []
            name = os.path.basename(d.train_path)
        task = Task(train, evals[: d.num_eval or None], None, None, name)
    else:
        raise ConfigError(f"data.source={d.source!r} is not one of arithmetic, countdown, "
                          "jsonl, parquet, tfds")
    task.reward = load_reward(reward_spec(config))
    return task


def parse_mix(level_mix: str) -> dict[int, float]:
    """'1:0.3,2:0.5,3:0.2' -> {1: 0.3, 2: 0.5, 3: 0.2}; a bare level has weight 1."""
    out = {}
    for part in str(level_mix).split(","):
        if not part.strip():
            continue
        level, _, weight = part.partition(":")
        try:
            out[int(level)] = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError(f"data.level_mix={level_mix!r}: write level:weight pairs, "
                              "e.g. '1:0.3,2:0.5,3:0.2'") from None
    return out


def encode_records(records, tokenizer: Tokenizer, template: str, max_len: int,
                   instruction: str | None = None) -> tuple[list[dict], list[int]]:
    """Attach `prompt_tokens` to each record; returns (the records that fit in max_len, the
    token lengths of those that do not)."""
    out, too_long = [], []
    for r in records:
        ids = encode_prompt(tokenizer, template, r["problem"], instruction)
        if len(ids) > max_len:
            too_long.append(len(ids))
            continue
        out.append(dict(r, prompt_tokens=ids))
    return out, too_long


def unknown_tokens_message(what: str, records: list[dict], tokenizer: Tokenizer) -> str | None:
    """A warning when more than UNKNOWN_WARN_SHARE of the encoded `records`' prompt tokens are
    the tokenizer's unknown token (text it cannot represent, which the model cannot read:
    e.g. GSM8K under a small SentencePiece trained on arithmetic); None otherwise."""
    unk = getattr(tokenizer, "unk_id", None)
    total = sum(len(r["prompt_tokens"]) for r in records)
    n = 0 if unk is None else sum(t == unk for r in records for t in r["prompt_tokens"])
    if not total or n <= UNKNOWN_WARN_SHARE * total:
        return None
    return (f"{n / total:.0%} of the {what}' tokens ({n} of {total}) are unknown to the tokenizer "
            f"({tokenizer.id_to_piece(unk)}): it cannot represent this text, so the model cannot "
            "read it and its scores mean little; use a tokenizer that covers the data "
            "(--config.tokenizer.path, or a model's with --config.model.path)")


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


def initial_params(config, model_cfg, tokenizer: Tokenizer, task: Task, train_records):
    """(params, warm-start info): a Hugging Face checkpoint, a random init, or a random init
    with the (cached) supervised warm start on the synthetic task."""
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
        examples=warmstart.examples(train_records, task, tokenizer, 0.0, w.seed),
        key_parts=key, steps=w.steps, lr=w.lr, seed=w.seed, **common)
    noise_steps = w.noise_steps
    if not noise_steps:
        return params, info
    # The noisy teacher's phase continues from the exact one (both cached; keyed as a chain).
    settings.update(teacher_noise=w.teacher_noise, noise_steps=noise_steps, noise_lr=w.noise_lr)
    key = warmstart.cache_key(model_cfg, vocab_fp, train_records, task.name, settings, w.seed)
    return warmstart.warm_start(
        examples=warmstart.examples(train_records, task, tokenizer, w.teacher_noise, w.seed),
        key_parts=key, steps=noise_steps, lr=w.noise_lr, seed=w.seed + 1, init=params, **common)


# ----------------------------------------------------------------------------- training, sampling


def make_engine(config, model_cfg, tokenizer: Tokenizer | None, mesh=None, *,
                temperature: float | None = None, max_new_tokens: int | None = None,
                num_slots: int | None = None) -> Engine | PagedEngine:
    """The one sampler factory (training, evaluation, pass rates, serving, the planner): the
    engine `config.sampling` describes, for prompts of data.max_prompt_len tokens. `mesh`:
    default this process's `sampling_mesh`; the planner passes abstract TPU chips. Without a
    tokenizer it stops at no EOS id (the planner: no compiled shape depends on them).
    temperature, max_new_tokens and num_slots default to the sampling section's.
    sampling.kv_cache=paged gives a paged.PagedEngine, which the Driver runs with the same
    contract (docs/paged.md); on TPU its decode attention is the Pallas kernel
    (sampling.paged_attention=auto)."""
    s = config.sampling
    mesh = sampling_mesh(config) if mesh is None else mesh
    num_slots = s.num_slots if num_slots is None else num_slots
    data = 1 if mesh is None else mesh.shape["data"]
    if num_slots < 1 or num_slots % data:
        raise ConfigError(f"sampling.num_slots={num_slots} does not split over sampling.mesh "
                          f"data={data}; use a positive multiple of {data}")
    prompt_len = 1 << max(0, (config.data.max_prompt_len - 1).bit_length())
    temperature = s.temperature if temperature is None else temperature
    common = dict(
        num_slots=num_slots, max_prompt_len=prompt_len,
        max_new_tokens=s.max_new_tokens if max_new_tokens is None else max_new_tokens,
        sampling=SamplingConfig(temperature=temperature, top_k=s.top_k, top_p=s.top_p),
        eos_ids=tuple(tokenizer.eos_ids) if tokenizer is not None else (),
        chunk_size=s.chunk_size, mesh=mesh, max_prefill_rows=s.max_prefill_rows,
        num_windows=s.num_windows, min_prompt_bucket=min(16, prompt_len))
    if s.kv_cache != "paged":
        return Engine(model_cfg, slot_bucketing=s.slot_bucketing, **common)
    platform = (jax.local_devices()[0] if mesh is None else mesh.devices.flat[0]).platform
    if why := kernel_problem(s.paged_attention, platform, model_cfg):
        raise ConfigError(why)
    try:
        return PagedEngine(model_cfg, page_size=s.page_size, num_pages=s.num_pages,
                           attention=s.paged_attention, **common)
    except ValueError as e:  # the pool's size (eval.max_new_tokens may exceed sampling's)
        raise ConfigError(f"sampling.num_pages: {e}; raise --config.sampling.num_pages "
                          "(0 = every slot's worst case)") from None


# ----------------------------------------------------------------------------- pass rates


PASS_RATE_SEED = 0  # one key for every pass rate: the same easy / hard set for every RL seed


def pass_rate_settings(config, policy: str, k: int, instruction: str | None = None,
                       seed: int = PASS_RATE_SEED) -> dict:
    """Everything that changes a policy's pass rates, in one place: the cache key of the
    run's `data.pass_rate_range` and of `python -m ada.data.difficulty`."""
    s = config.sampling
    return {"policy": policy, "template": config.tokenizer.template, "instruction": instruction,
            "reward": reward_spec(config), "threshold": config.adaptive.positive_threshold,
            "k": k, "seed": seed, "temperature": s.temperature, "top_p": s.top_p,
            "top_k": s.top_k, "max_new_tokens": s.max_new_tokens,
            "max_prompt_len": config.data.max_prompt_len}


def initial_policy(config, model_cfg, warm_info: dict) -> str:
    """What the run's initial params are, for cache keys: the HF checkpoint, the cached warm
    start, or the seeded random init of this model."""
    if config.model.path:
        return os.path.abspath(config.model.path)
    shape = hashlib.sha256(repr(model_cfg).encode()).hexdigest()[:12]
    return warm_info.get("path") or f"random-init-{shape}-seed{config.seed}"


def filter_by_pass_rate(c, records: list[dict], params, model_cfg, rollout: Rollout,
                        warm_info: dict):
    """The training prompts whose pass rate under the initial policy lies in
    data.pass_rate_range: the paper's easy / hard prompt sets (section 4.1), chosen by the
    policy that starts training. Pass rates are data.pass_rate_samples draws
    (`ada.evaluation.pass_rates`), cached by `pass_rate_settings` and the records, so a
    second run with the same start does not sample."""
    lo, hi = c.data.pass_rate_range
    settings = pass_rate_settings(c, initial_policy(c, model_cfg, warm_info),
                                  c.data.pass_rate_samples)
    data_id = hashlib.sha256("\x00".join(f"{r['id']}\x01{r['problem']}\x01{r['answer']}"
                                         for r in records).encode()).hexdigest()
    tag = hashlib.sha256(repr((sorted(settings.items()), data_id)).encode()).hexdigest()[:16]
    rates, _ = pass_rates(records, rollout, params, k=c.data.pass_rate_samples,
                          seed=PASS_RATE_SEED, threshold=c.adaptive.positive_threshold,
                          cache_path=os.path.join(cache_dir(c), "passrates", f"{tag}.jsonl"),
                          settings=settings)
    kept, _ = difficulty_filter(records, rates, DifficultyFilter(
        k=c.data.pass_rate_samples, min_pass_rate=lo, max_pass_rate=hi))
    if len(kept) < c.data.prompts_per_step:
        raise ConfigError(f"data.pass_rate_range={tuple(c.data.pass_rate_range)} keeps {len(kept)}"
                          f" of {len(records)} training prompts, fewer than data.prompts_per_step="
                          f"{c.data.prompts_per_step}; widen the range")
    log.info("pass-rate filter %s: kept %d of %d training prompts", (lo, hi), len(kept),
             len(records))
    return kept


# ----------------------------------------------------------------------------- a saved run


@dataclasses.dataclass
class LoadedRun:
    config: Any
    model_cfg: Any
    tokenizer: Tokenizer
    params: Any
    step: int | None  # the checkpoint's step; None: the run's initial params
    policy: str  # what the params are, for labels and cache keys


def load_run(workdir: str | None, step: int | None = None, *, config=None) -> LoadedRun:
    """A run directory's config, tokenizer, model config and the params of its checkpoint
    `step` (default the latest; the run's initial params when it has none yet). With no
    workdir, `config`'s own initial params: a Hugging Face model directory (model.path), a
    seeded init or the cached warm start. `config` with a workdir: the saved config with a
    command's overrides (prompt template, sampling) for the caller to sample with; the
    tokenizer, model and params are always the run's own (default: the saved config). The one loader of evaluation,
    serving and the pass-rate filter; data files are read only when the tokenizer or the warm
    start needs them."""
    ckpt, built = None, config  # what the params were made with (the run's own tokenizer)
    if workdir is not None:
        built = load_run_config(workdir)
        config = built if config is None else config
        ckpt = Checkpointer(paths.join(workdir, "checkpoints"))
        step = ckpt.pick_step(step)
    task = None if built.tokenizer.path or built.model.path else load_task(built)
    tokenizer = load_tokenizer_for(built, task)
    model_cfg = model_config_for(built, tokenizer)
    if step is not None:
        params = ckpt.restore_params(step, host=True)[0]["params"]  # placed by the sampler
        policy = paths.join(ckpt.directory, str(step))
    else:
        if task is None and built.warmstart.enabled:
            task = load_task(built)
        train = encode_records(task.train, tokenizer, built.tokenizer.template,
                               built.data.max_prompt_len)[0] if task else []
        params, warm_info = initial_params(built, model_cfg, tokenizer, task, train)
        policy = initial_policy(built, model_cfg, warm_info)
    if ckpt is not None:
        ckpt.close()
    return LoadedRun(config, model_cfg, tokenizer, params, step, policy)


# ----------------------------------------------------------------------------- the whole run


@dataclasses.dataclass
class Setup:
    config: Any
    task: Task
    tokenizer: Tokenizer
    model_cfg: Any
    params: Any  # the initial params
    warm_info: dict
    train_records: list[dict]  # with prompt_tokens; prompts too long for the run dropped
    eval_records: list[dict]
    dropped_prompts: int
    mesh: Any
    fns: TrainFns
    rollout: Rollout  # training samples
    eval_rollout: Rollout  # held-out samples (eval temperature and length)


def build(config) -> Setup:
    """Everything a training run holds, from a validated config."""
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
    for what, records in (("training prompts", train_records), ("held-out prompts", eval_records)):
        if message := unknown_tokens_message(what, records, tokenizer):
            log.warning(message)
    model_cfg = model_config_for(c, tokenizer)
    check_context_window(c, model_cfg)
    mesh = train_mesh(c)  # a bad split of the devices fails before the warm start
    params, warm_info = initial_params(c, model_cfg, tokenizer, task, train_records)
    s, e = c.sampling, c.eval

    def rollout(temperature, max_new_tokens):
        engine = make_engine(c, model_cfg, tokenizer, temperature=temperature,
                             max_new_tokens=max_new_tokens)
        return Rollout(engine, tokenizer, collect_config(c), task.reward)

    train_rollout = rollout(s.temperature, s.max_new_tokens)
    if tuple(c.data.pass_rate_range) != (0.0, 1.0):
        train_records = filter_by_pass_rate(c, train_records, params, model_cfg, train_rollout,
                                            warm_info)
    eval_new = e.max_new_tokens or s.max_new_tokens
    same = e.temperature == s.temperature and eval_new == s.max_new_tokens
    return Setup(c, task, tokenizer, model_cfg, params, warm_info, train_records, eval_records,
                 len(too_long), mesh, make_train_fns(model_cfg, train_config(c), mesh),
                 train_rollout, train_rollout if same else rollout(e.temperature, eval_new))
