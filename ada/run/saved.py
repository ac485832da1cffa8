"""A saved run's policy: `load_run(workdir, step)`, the one "run directory -> config +
checkpoint -> params" that evaluation, serving and the pass-rate filter share, so each
samples the params with the tokenizer and model they were trained with."""

from __future__ import annotations

import dataclasses
from typing import Any

from ada import paths
from ada.checkpoint import Checkpointer
from ada.config import load_run_config, train_config
from ada.data.encode import encode_records
from ada.data.task import load_task
from ada.models import lora
from ada.run.policy import (
    base_ref,
    initial_params,
    initial_policy,
    load_tokenizer_for,
    model_config_for,
)
from ada.run.state import check_base
from ada.tokenizer import Tokenizer


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
    tokenizer, model and params are always the run's own (default: the saved config). The
    one loader of evaluation, serving and the pass-rate filter; data files are read only when
    the tokenizer or the warm start needs them."""
    ckpt, built = None, config  # what the params were made with (the run's own tokenizer)
    if workdir is not None:
        built = load_run_config(workdir)
        config = built if config is None else config
        ckpt = Checkpointer(paths.join(workdir, "checkpoints"))
    try:  # the checkpointer's threads end whatever the load raises
        if ckpt is not None:
            step = ckpt.pick_step(step)
        task = None if built.tokenizer.path or built.model.path else load_task(built)
        tokenizer = load_tokenizer_for(built, task)
        model_cfg = model_config_for(built, tokenizer)
        if step is not None:
            tree, meta = ckpt.restore_params(step, host=True)  # placed by the sampler
            params, policy = tree["params"], paths.join(ckpt.directory, str(step))
            if "base" in meta:  # LoRA: the adapters alone; the base is rebuilt as the run did
                base, warm_info = _initial(built, model_cfg, tokenizer, task)
                check_base(meta, base_ref(built, model_cfg, base, warm_info), ckpt.directory)
                attached = lora.attach(base, train_config(built).lora, model_cfg.compute_dtype)
                params = lora.join(params, lora.split(attached)[1])
        else:
            params, warm_info = _initial(built, model_cfg, tokenizer, task)
            policy = initial_policy(built, model_cfg, warm_info)
    finally:
        if ckpt is not None:
            ckpt.close()
    return LoadedRun(config, model_cfg, tokenizer, params, step, policy)


def _initial(built, model_cfg, tokenizer, task):
    """The run's initial params and warm-start info (its task read if the warm start needs it)."""
    if task is None and built.warmstart.enabled:
        task = load_task(built)
    train = encode_records(task.train, tokenizer, built.tokenizer.template,
                           built.data.max_prompt_len)[0] if task else []
    return initial_params(built, model_cfg, tokenizer, task, train)
