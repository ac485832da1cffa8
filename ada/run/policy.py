"""The run's policy before its first step: the tokenizer (the model's, or a small
SentencePiece trained on a synthetic task), the model config, and the initial params (a
Hugging Face checkpoint, a seeded init, or the cached supervised warm start), with the name
cache keys give them (`initial_policy`)."""

from __future__ import annotations

import hashlib
import os

import jax

from ada import sharding as shd
from ada import warmstart
from ada.config import env_config
from ada.data.task import Task
from ada.envs.tokens import markers
from ada.errors import ConfigError
from ada.models import init_params, lora, preset
from ada.models.hf import load_hf
from ada.models.hf_config import read_config
from ada.models.transformer import param_shapes
from ada.templates import render_prompt
from ada.tokenizer import Tokenizer, load_tokenizer, synthetic_tokenizer


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
    env = env_config(config)  # a tool run: its call format's markers are one piece each
    return synthetic_tokenizer(texts, config.tokenizer.vocab_size,
                               os.path.join(cache_dir(config), "tokenizers"),
                               markers=() if env is None else markers(env.tool_format))


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


def initial_params(config, model_cfg, tokenizer: Tokenizer, task: Task, train_records,
                   mesh=None):
    """(params, warm-start info): a Hugging Face checkpoint, a random init, or a random init
    with the (cached) supervised warm start on the synthetic task.

    A checkpoint is placed leaf by leaf on the train `mesh`'s parameter shardings as it is
    read: loaded whole onto one chip first, the 7B preset's float32 master (28 GiB) would not
    fit a v5e chip's 16 GiB before the trainer shards it."""
    c = config
    if c.model.path:
        shardings = None if mesh is None else shd.param_shardings(param_shapes(model_cfg), mesh)
        return load_hf(c.model.path, dtype=c.model.dtype, param_dtype=c.model.param_dtype,
                       shardings=shardings)[0], {}
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
    env = env_config(c)
    if env is None:
        examples = warmstart.examples(train_records, task, tokenizer, 0.0, w.seed)
    else:  # a tool run: traces that teach the call format (warmstart.ToolTraces)
        traces = warmstart.ToolTraces(env, w.tool_traces, w.tool_call_share,
                                      w.tool_wrong_copy_share)
        settings.update(traces.settings())
        examples = warmstart.tool_examples(train_records, tokenizer, traces, w.seed)
    key = warmstart.cache_key(model_cfg, vocab_fp, train_records, task.name, settings, w.seed)
    params, info = warmstart.warm_start(examples=examples, key_parts=key, steps=w.steps,
                                        lr=w.lr, seed=w.seed, **common)
    noise_steps = w.noise_steps
    if not noise_steps:
        return params, info
    # The noisy teacher's phase continues from the exact one (both cached; keyed as a chain).
    settings.update(teacher_noise=w.teacher_noise, noise_steps=noise_steps, noise_lr=w.noise_lr)
    key = warmstart.cache_key(model_cfg, vocab_fp, train_records, task.name, settings, w.seed)
    return warmstart.warm_start(
        examples=warmstart.examples(train_records, task, tokenizer, w.teacher_noise, w.seed),
        key_parts=key, steps=noise_steps, lr=w.noise_lr, seed=w.seed + 1, init=params, **common)


def initial_policy(config, model_cfg, warm_info: dict) -> str:
    """What the run's initial params are, for cache keys: the HF checkpoint, the cached warm
    start with its content hash (retrained on another CPU, the same path holds other
    params), or the seeded random init of this model."""
    if config.model.path:
        return os.path.abspath(config.model.path)
    if warm_info.get("path"):
        return f"{warm_info['path']}@sha256:{warm_info['sha256']}"
    shape = hashlib.sha256(repr(model_cfg).encode()).hexdigest()[:12]
    return f"random-init-{shape}-seed{config.seed}"


def base_ref(config, model_cfg, params, warm_info: dict) -> dict | None:
    """A LoRA run's reference to its frozen base, which its checkpoints do not hold: the
    initial policy's name and its params' content hash (None without LoRA)."""
    if not config.model.lora.rank:
        return None
    return {"path": initial_policy(config, model_cfg, warm_info),
            "hash": lora.fingerprint(params)}
