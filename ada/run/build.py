"""The composition root: `build(config)` assembles everything a training run holds from a
validated config (MaxText's setup_train_loop, big_vision's main). It reads the config here,
builds the dataclasses the step library takes (TrainConfig, CollectConfig, the engines) and
passes them down; nothing below climbs back into the config. Everything a bad input can
break is read here, before anything compiles, and fails with a one-line ConfigError."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax

from ada.config import collect_config, env_config, train_config
from ada.data.encode import encode_records, too_long_message, unknown_tokens_message
from ada.data.iterator import PromptIterator
from ada.data.task import Task, load_task
from ada.errors import ConfigError
from ada.meshes import train_mesh
from ada.rl.batch import BatchLayout
from ada.rl.train import TrainFns, make_train_fns
from ada.rollout import Rollout
from ada.run.passrates import filter_by_pass_rate
from ada.run.policy import (
    base_ref,
    check_context_window,
    initial_params,
    load_tokenizer_for,
    model_config_for,
)
from ada.sampling.backends import eval_sampling, make_engine
from ada.templates import render_tool_prompt
from ada.tokenizer import Tokenizer
from ada.trajectory import tool_schemas, turn_ends

log = logging.getLogger(__name__)

DROPPED_WARN_SHARE = 0.1  # warn when more prompts than this are too long for the run


@dataclasses.dataclass
class Setup:
    config: Any
    task: Task
    tokenizer: Tokenizer
    model_cfg: Any
    params: Any  # the initial params
    warm_info: dict
    base: dict | None  # LoRA: the initial params' {"path", "hash"}, a checkpoint's base
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
    env = env_config(c)  # tools: every response a trajectory, a turn ending at a call
    tools = tool_schemas(env)  # listed in a chat template's system turn
    if tools and c.tokenizer.template != "plain":
        try:
            render_tool_prompt(c.tokenizer.template, "", tools)
        except ValueError as e:
            raise ConfigError(f"env.tools={env.tools!r}: {e}; or set env.tools=''") from None
    train_records, too_long = encode_records(task.train, tokenizer, c.tokenizer.template, max_len,
                                             tools=tools)
    if not train_records:
        raise ConfigError(f"no training prompt fits data.max_prompt_len={max_len} (the shortest "
                          f"has {min(too_long, default=0)} tokens); raise --config.data.max_prompt_len")
    if len(too_long) > DROPPED_WARN_SHARE * len(task.train):
        log.warning(too_long_message("training prompts", len(task.train), too_long, max_len,
                                     "--config.data.max_prompt_len"))
    eval_records, eval_too_long = encode_records(task.eval, tokenizer, c.tokenizer.template,
                                                 max_len, tools=tools)
    if eval_too_long:
        log.warning(too_long_message("held-out prompts", len(task.eval), eval_too_long, max_len,
                                     "--config.data.max_prompt_len"))
    for what, records in (("training prompts", train_records), ("held-out prompts", eval_records)):
        if message := unknown_tokens_message(what, records, tokenizer):
            log.warning(message)
    model_cfg = model_config_for(c, tokenizer)
    check_context_window(c, model_cfg)
    mesh = train_mesh(c)  # a bad split of the devices fails before the warm start
    params, warm_info = initial_params(c, model_cfg, tokenizer, task, train_records, mesh)
    base = base_ref(c, model_cfg, params, warm_info)
    s = c.sampling
    collect = collect_config(c)
    ends = turn_ends(env, tokenizer)

    def rollout(temperature, max_new_tokens):
        engine = make_engine(c, model_cfg, tokenizer, temperature=temperature,
                             max_new_tokens=max_new_tokens, turn_end_ids=ends)
        return Rollout(engine, tokenizer, collect, task.reward, env)

    train_rollout = rollout(s.temperature, s.max_new_tokens)
    if tuple(c.data.pass_rate_range) != (0.0, 1.0):
        train_records = filter_by_pass_rate(c, train_records, params, model_cfg, train_rollout,
                                            warm_info)
    own = eval_sampling(c)
    fns = make_train_fns(model_cfg, train_config(c), mesh)
    return Setup(c, task, tokenizer, model_cfg, params, warm_info, base, train_records,
                 eval_records, len(too_long), mesh, fns, train_rollout,
                 train_rollout if own is None else rollout(**own))


def prompts_and_layout(c, s: Setup) -> tuple[PromptIterator, BatchLayout]:
    """This process's prompt iterator and the train batches' layout of a run."""
    iterator = PromptIterator(s.train_records, c.data.prompts_per_step, seed=c.seed,
                              process_index=jax.process_index(),
                              process_count=jax.process_count(), shuffle=c.data.shuffle)
    layout = BatchLayout(prompt_len=s.rollout.engine.max_prompt_len,
                         response_len=c.sampling.max_new_tokens, pad_id=s.tokenizer.pad_id,
                         mini_batches=c.train.mini_batches, trim_padding=c.train.trim_padding)
    return iterator, layout
