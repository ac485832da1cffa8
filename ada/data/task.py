"""A run's task: its training and held-out records, its reward and, for the synthetic tasks,
the reference response the warm start imitates. `load_task(config)` reads the data section
(synthetic, JSONL, Parquet or TFDS); every fault is one ConfigError naming the knob."""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any

from ada.data.sources import DataError, RecordFormat, load_records
from ada.data.synthetic import make_dataset
from ada.data.tfds_source import TfdsError, load_tfds  # imports TensorFlow only when called
from ada.errors import ConfigError
from ada.rewards import REWARD_NAMES, get_reward_fn


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
