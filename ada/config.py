"""Config files, command-line overrides and whole-config validation.

A config file is a Python file with `get_config(arg=None) -> ml_collections.ConfigDict`
(big_vision style). It is named on the command line as `path/to/file.py` or
`path/to/file.py:arg`; fields are overridden with `--config.a.b=value`.

Everything a run needs is checked here, before any compile: an unknown override key, a
file with a syntax error, a missing model path or an unwritable output directory each stop
the run with a one-line `ConfigError` that names the thing and the fix.

Every knob is defined once, with its default and a one-line comment, in
`configs/common.py: base()` (ada/knobs.py reads both; `describe` prints a config with them).
The sections `loss`, `optim`, `adaptive`, `sampling` (temperature, top_k, top_p) and `env`
build `LossConfig`, `OptimConfig`, `CollectConfig`, `SamplingConfig` and `EnvConfig` field
for field, and `train`'s epochs / mini_batches / micro_batches are `TrainConfig`'s: a knob
has one name from the command line to the code. Each dataclass
checks its own fields; `validate` builds them, names the knob of their errors, and adds only
the checks that span sections or have no dataclass. A run's saved `config.json` is read back
by `load_run_config` alone (merged onto base(), old keys renamed by ada.knobs.RENAMED), so
no code reads a config key with a fallback default.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import json
import logging
import os
import re
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

import ml_collections

from ada import methods, paths
from ada.adaptive.allocation import AllocConfig
from ada.adaptive.collect import CollectConfig
from ada.data.sources import BAD_ROW_POLICIES
from ada.envs import EnvConfig
from ada.errors import ConfigError, fail  # noqa: F401 (fail: for the commands)
from ada.knobs import RENAMED, base_config, describe, leaves  # noqa: F401 (describe: for the CLI)
from ada.methods import METHODS
from ada.rl.losses import LossConfig
from ada.rl.optimizer import OptimConfig
from ada.rl.train import LoraConfig, TrainConfig, split_problem
from ada.sampling.paged_config import kv_cache_problems
from ada.sampling.samplers import SamplingConfig
from ada.tracking import TrackingError
from ada.tracking import check_installed as check_wandb

log = logging.getLogger(__name__)

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "default.py")

WANDB_MODES = ("", "online", "offline", "disabled")


# ----------------------------------------------------------------------------- loading


def _load_module(path: str):
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist; pass a path like configs/default.py")
    name = "_ada_config_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigError(f"syntax error in config file {e.filename or path}, line "
                          f"{e.lineno}: {e.msg}") from None
    except Exception as e:  # an error while importing the file: point at its line
        raise ConfigError(f"config file {path}{_line_in(path, e)} raised "
                          f"{type(e).__name__}: {e}") from None
    return module


def _line_in(path: str, exc: BaseException) -> str:
    real = os.path.realpath(path)
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if os.path.realpath(frame.filename) == real:
            return f", line {frame.lineno}"
    return ""


def split_spec(spec: str) -> tuple[str, str | None]:
    """'configs/x.py:arg' -> ('configs/x.py', 'arg'); the arg is optional."""
    if ":" in spec and not os.path.exists(spec):
        path, arg = spec.rsplit(":", 1)
        return path, (arg or None)
    return spec, None


def _call(fn, name: str, arg: str | None, path: str):
    """`fn(arg)` (`fn()` without one), the `name` function of a config or sweep file; what it
    raises is one line naming the call and its line."""
    try:
        return fn(arg) if arg is not None else fn()
    except Exception as e:
        raise ConfigError(f"{name}({arg!r}) in {path}{_line_in(path, e)} raised "
                          f"{type(e).__name__}: {e}") from None


def load_config(spec: str) -> ml_collections.ConfigDict:
    """Load `file.py[:arg]` by calling its `get_config(arg)`."""
    path, arg = split_spec(spec)
    module = _load_module(path)
    fn = getattr(module, "get_config", None)
    if fn is None:
        raise ConfigError(f"config file {path} has no get_config(arg=None) function")
    config = _call(fn, "get_config", arg, path)
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"get_config in {path} returned {type(config).__name__}, not a ConfigDict")
    return config


# ----------------------------------------------------------------------------- overrides


def flat_keys(config: ml_collections.ConfigDict) -> list[str]:
    """Every leaf key as a dotted path ('adaptive.n', ...)."""
    return [k for k, _ in leaves(config)]


def _closest(key: str, keys: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
    if not close:  # match on the last component too ('lr' -> 'optim.lr')
        lasts = {k: k.rsplit(".", 1)[-1] for k in keys}
        last = key.rsplit(".", 1)[-1]
        near = set(difflib.get_close_matches(last, sorted(set(lasts.values())), n=3, cutoff=0.6))
        close = [k for k in keys if lasts[k] == last] + [k for k in keys if lasts[k] in near - {last}]
        close = close[:3]
    return ", ".join(close) if close else "(none close; run with --print_config to list keys)"


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _parse_value(key: str, text: str, current: Any) -> Any:
    """Convert an override string to the type of the field it replaces."""
    low = text.strip().lower()
    if isinstance(current, bool):
        if low in _TRUE + _FALSE:
            return low in _TRUE
        raise ConfigError(f"--config.{key}={text}: expected a boolean (true/false)")
    if low == "none":
        return None
    if current is None and low in ("true", "false"):  # an optional flag (None = default)
        return low == "true"
    if isinstance(current, int):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--config.{key}={text}: expected an integer") from None
    if isinstance(current, float):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--config.{key}={text}: expected a number") from None
    if isinstance(current, str):
        return text
    if isinstance(current, (tuple, list)):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = tuple(x for x in text.split(",") if x)
        if not isinstance(value, (tuple, list)):
            value = (value,)
        return type(current)(value)
    try:  # None or another type: a Python literal, else the raw string
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_override(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    """Set `key` (dotted) from its string form; unknown keys name the closest valid ones."""
    keys = flat_keys(config)
    if key not in keys:
        parts = key.split(".")
        node = config
        for p in parts:
            if isinstance(node, ml_collections.ConfigDict) and p in node:
                node = node[p]
            else:
                node = None
                break
        if isinstance(node, ml_collections.ConfigDict):
            raise ConfigError(f"--config.{key} is a group, not a field; set one of its fields, e.g. "
                              f"{', '.join(k for k in keys if k.startswith(key + '.'))[:200]}")
        if key in RENAMED:
            raise ConfigError(f"config key {key!r} is now {RENAMED[key]!r}; pass --config."
                              f"{RENAMED[key]}={text}")
        raise ConfigError(f"unknown config key {key!r}; closest valid keys: {_closest(key, keys)}")
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
        node = node[p]
    value = _parse_value(key, text, node[leaf])
    with node.unlocked():
        try:
            node[leaf] = value
        except TypeError as e:
            raise ConfigError(f"--config.{key}={text}: {e}") from None


def parse_override_args(argv: Iterable[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Split `--config.a.b=v` / `--config.a.b v` pairs from the other arguments."""
    argv = list(argv)
    overrides, rest = [], []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--config."):
            body = a[len("--config."):]
            if "=" in body:
                key, value = body.split("=", 1)
            elif i + 1 < len(argv):
                key, value = body, argv[i + 1]
                i += 1
            else:
                raise ConfigError(f"{a} has no value; write {a}=VALUE")
            overrides.append((key, value))
        else:
            rest.append(a)
        i += 1
    return overrides, rest


def _at(config: ml_collections.ConfigDict, key: str):
    for p in key.split(".") if key else ():
        config = config[p]
    return config


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
    """The resolved config a run saved in its directory (`WORKDIR/config.json`), merged onto
    base(): keys renamed since (ada.knobs.RENAMED) take their new names, knobs added since
    their defaults, and a key this version no longer has is dropped with a warning. The one
    place a saved config is read."""
    path = paths.path(workdir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; is {workdir} a run directory?")
    saved = json.loads(paths.read_bytes(path))

    def flat(d, prefix=""):
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    config = base_config()
    known = set(flat_keys(config))
    for key, value in flat(saved):
        if key == "optim.dual_clip" and value is not None and value <= 1:
            value = 0.0  # the old convention's "off"
        key = RENAMED.get(key, key)
        if key not in known:
            log.warning("%s: key %s is not a knob of this version; ignored", path, key)
            continue
        section, _, leaf = key.rpartition(".")
        try:
            _at(config, section)[leaf] = value
        except TypeError as e:
            raise ConfigError(f"{path}: {key}={value!r}: {e}") from None
    return config


def build_config(spec: str, overrides: Sequence[tuple[str, str]] = ()) -> ml_collections.ConfigDict:
    """Load a config file and apply overrides (in order)."""
    config = load_config(spec)
    for key, value in overrides:
        apply_override(config, key, value)
    return config


def overrides_to_args(overrides: dict[str, Any]) -> list[str]:
    """{'adaptive.n': 8} -> ['--config.adaptive.n=8'] (tuples written as literals)."""
    return [f"--config.{k}={v!r}" if isinstance(v, (tuple, list)) else f"--config.{k}={v}"
            for k, v in overrides.items()]


# ----------------------------------------------------------------------------- sweeps


def load_sweep(path: str) -> tuple[str, list[dict[str, Any]]]:
    """A sweep file (`file.py[:arg]`) defines BASE (a config spec) and get_sweep(arg=None) ->
    [override dicts]."""
    path, arg = split_spec(path)
    module = _load_module(path)
    if not hasattr(module, "get_sweep") or not hasattr(module, "BASE"):
        raise ConfigError(f"sweep file {path} must define BASE = 'configs/x.py[:arg]' and get_sweep(arg=None)")
    runs = _call(module.get_sweep, "get_sweep", arg, path)
    if not isinstance(runs, Iterable) or isinstance(runs, (str, dict)):
        raise ConfigError(f"get_sweep in {path} returned {type(runs).__name__}, not a list of "
                          "override dicts")
    runs = list(runs)
    for i, r in enumerate(runs):
        if not isinstance(r, dict):
            raise ConfigError(f"sweep file {path}: entry {i} is {type(r).__name__}, not a dict of overrides")
    return module.BASE, runs


# ----------------------------------------------------------------------------- validation


def check_workdir(workdir: str) -> None:
    """The output directory (local or gs://) must exist or be creatable, and be writable;
    checked before any compile (ada.paths.workdir_problem)."""
    if not workdir:
        raise ConfigError("no output directory; pass --workdir DIR")
    problem = paths.workdir_problem(workdir)
    if problem:
        raise ConfigError(problem)


def _dataclass_problems(section: str, cls, error: ValueError, keys) -> list[str]:
    """A dataclass's own ValueError ('invalid LossConfig: clip_low=1.5 must be ...; ...') as
    one problem per field, each naming its knob: 'loss.clip_low=1.5 must be ...'. A problem
    starts with a field's name ('threshold' may stand for 'positive_threshold')."""
    text = str(error)
    if text.startswith(f"invalid {cls.__name__}: "):
        text = text.split(": ", 1)[1]
    def named(name, among):  # the exact name, else one ending in _name
        return name if name in among else next((k for k in among if k.endswith("_" + name)), None)

    fields = [f.name for f in dataclasses.fields(cls)]
    out = []
    for part in text.split("; "):
        name = re.match(r"\w*", part).group()
        if out and not (name and named(name, fields)):  # the fix of the problem before
            out[-1] += "; " + part
        elif knob := name and named(name, keys):
            out.append(f"{section}.{knob}{part[len(name):]}")
        else:
            out.append(f"{section}: {part}")
    return out


def validate(config: ml_collections.ConfigDict, workdir: str | None = None) -> None:
    """Check the whole config (and the output dir) before anything is compiled.

    Builds the dataclasses the config's sections become (each checks its own fields) and
    checks what spans sections. Raises ConfigError with one line that names the setting and
    what to change.
    """
    problems: list[str] = []

    def need(cond, msg):
        if not cond:
            problems.append(msg)

    def build(section: str, cls, make):
        try:
            return make()
        except ValueError as e:
            problems.extend(_dataclass_problems(section, cls, e, list(config[section])))
            return None

    method = config.method
    need(method in METHODS, f"method={method!r} is not one of {', '.join(METHODS)}")
    need(config.log.wandb_mode in WANDB_MODES, f"log.wandb_mode={config.log.wandb_mode!r} is "
         f"not one of {WANDB_MODES}")
    if config.log.wandb:  # before anything runs: a missing package is one line
        try:
            check_wandb()
        except TrackingError as e:
            need(False, str(e))
    t, d, a = config.train, config.data, config.adaptive
    if method in METHODS and build("adaptive", CollectConfig, lambda: collect_config(config)):
        # the method sets the rounds (grpo: one round of n), then the budget split
        alloc = build("adaptive", AllocConfig, lambda: alloc_config(config))
        problems += methods.allocation_problems(method, a.allocation, a.half_life, alloc,
                                                a.budget, d.prompts_per_step)
    build("loss", LossConfig, lambda: LossConfig(**config.loss))
    build("optim", OptimConfig, lambda: OptimConfig(**config.optim))
    build("model.lora", LoraConfig, lambda: LoraConfig(**_fields(config.model.lora, LoraConfig)))
    build("sampling", SamplingConfig,
          lambda: SamplingConfig(**_fields(config.sampling, SamplingConfig)))
    if build("train", TrainConfig, lambda: TrainConfig(**_fields(t, TrainConfig))):
        problem = split_problem(d.prompts_per_step, a.n, t.mini_batches, t.micro_batches)
        need(problem is None, f"train.{problem}")
    need(t.steps >= 1, f"train.steps={t.steps} must be >= 1")
    k = config.rl.max_staleness
    need(isinstance(k, int) and k >= 0, f"rl.max_staleness={k!r} must be an integer >= 0 "
         "(0 = the synchronous loop)")
    nd = config.rl.sampler_devices
    need(isinstance(nd, int) and nd >= 0, f"rl.sampler_devices={nd!r} must be an integer >= 0 "
         "(0 = sampler and trainer colocated)")
    need(not (k and method in METHODS and methods.get(method).draws_more_prompts),
         f"rl.max_staleness={k} with method={method}: DAPO's dynamic sampling draws extra "
         "prompts in the middle of a step, which a stream cannot checkpoint; use "
         "rl.max_staleness=0 or another method")
    need(a.normalize_std in (None, True, False),
         f"adaptive.normalize_std={a.normalize_std!r} must be None (the method's own), true or false")

    need(d.prompts_per_step >= 1, f"data.prompts_per_step={d.prompts_per_step} must be >= 1")
    lo, hi = tuple(d.pass_rate_range)
    need(0.0 <= lo <= hi <= 1.0 and d.pass_rate_samples >= 1,
         f"data.pass_rate_range={(lo, hi)} needs 0 <= lo <= hi <= 1 and data.pass_rate_samples="
         f"{d.pass_rate_samples} >= 1")
    need(d.on_bad_row in BAD_ROW_POLICIES,
         f"data.on_bad_row={d.on_bad_row!r} is not one of {BAD_ROW_POLICIES}")
    if d.source == "tfds":
        need(d.tfds_name, "data.source=tfds needs a dataset: pass --config.data.tfds_name="
                          "NAME (prepared in data.tfds_data_dir) or its version folder")
        need(d.tfds_split, "data.source=tfds needs a training split: pass "
                           "--config.data.tfds_split=train")
    w = config.warmstart
    # (a warm start on a non-synthetic source is refused at setup, with its own message)
    need(0.0 <= w.teacher_noise < 1.0 and not (w.teacher_noise and w.enabled
                                               and d.source == "countdown"),
         f"warmstart.teacher_noise={w.teacher_noise} must be in [0, 1), and > 0 only for "
         "data.source=arithmetic (near misses of an integer answer)")
    need(w.noise_steps >= 0 and (w.teacher_noise > 0) == (w.noise_steps > 0),
         f"warmstart.teacher_noise={w.teacher_noise} and warmstart.noise_steps={w.noise_steps}: "
         "the noisy teacher needs both (> 0), or neither (0) for exact answers only")
    s = config.sampling
    need(s.max_new_tokens >= 1, f"sampling.max_new_tokens={s.max_new_tokens} must be >= 1")
    need(s.num_slots >= 1 and s.chunk_size >= 1,
         f"sampling.num_slots={s.num_slots} and sampling.chunk_size={s.chunk_size} must be >= 1 "
         "(decode slots; decode steps per jitted chunk)")
    need(s.num_windows >= 1,
         f"sampling.num_windows={s.num_windows} must be >= 1 (1 = attend to the whole cache)")
    need(len(s.mesh) == 2 and s.mesh[1] >= 1 and (s.mesh[0] >= 1 or s.mesh[0] == -1),
         f"sampling.mesh={tuple(s.mesh)} must be (data, tensor) with tensor >= 1 and data "
         ">= 1 or -1 (all of this process's devices)")
    if isinstance(nd, int) and nd > 0 and len(s.mesh) == 2 and s.mesh[1] >= 1:
        data, tensor = s.mesh
        used = (nd // tensor if data == -1 else data) * tensor
        need(used == nd, f"rl.sampler_devices={nd} with sampling.mesh={tuple(s.mesh)}: the "
             f"sampling mesh spans {used} devices, not the sampler's {nd}; make sampling.mesh's "
             f"data x tensor = {nd} (data=-1: all of them)"
             + (f" or rl.sampler_devices={used}" if 0 < used < nd else ""))
    problems.extend(kv_cache_problems(config))
    build("env", EnvConfig, lambda: env_config(config))
    e = config.eval
    need(e.samples >= 1, f"eval.samples={e.samples} must be >= 1")
    for k in e.pass_k:
        need(1 <= k <= e.samples, f"eval.pass_k contains {k}; each k must be in [1, eval.samples={e.samples}]")
    need(config.checkpoint.keep >= 1, f"checkpoint.keep={config.checkpoint.keep} must be >= 1")
    fmt = config.checkpoint.export_format
    need(fmt in ("merged", "peft"), f"checkpoint.export_format={fmt!r} must be merged or peft")
    need(fmt != "peft" or config.model.lora.rank > 0, "checkpoint.export_format=peft writes "
         "a LoRA run's adapters; set model.lora.rank > 0 or checkpoint.export_format=merged")
    for k, v in (("distributed.timeout_s", config.distributed.timeout_s),
                 ("checkpoint.preemption_budget_s", config.checkpoint.preemption_budget_s)):
        need(v > 0, f"{k}={v} must be > 0 seconds")
    if problems:
        raise ConfigError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))

    for key in ("model.path", "tokenizer.path", "data.train_path", "data.eval_path",
                "data.tfds_data_dir"):
        value = _at(config, key)
        if value and not str(value).startswith("gs://") and not os.path.exists(value):
            raise ConfigError(f"{key}={value!r} does not exist; fix the path or pass --config.{key}=''"
                              if key != "model.path" else
                              f"model path {value!r} does not exist; pass an existing Hugging Face "
                              "model directory with --config.model.path=DIR")
    if workdir is not None:
        check_workdir(workdir)


# ----------------------------------------------------------------------------- the dataclasses


def _fields(section: ml_collections.ConfigDict, cls) -> dict[str, Any]:
    """The knobs of `section` that are fields of the dataclass `cls` (same names)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in section.items() if k in names}


def train_config(config: ml_collections.ConfigDict) -> TrainConfig:
    """The policy update of a run: sections loss and optim, and train's epochs,
    mini_batches and micro_batches; remat and the sampling temperature ride along."""
    return TrainConfig(loss=LossConfig(**config.loss), optim=OptimConfig(**config.optim),
                       **_fields(config.train, TrainConfig), remat=config.model.remat,
                       temperature=config.sampling.temperature or 1.0,
                       lora=LoraConfig(**_fields(config.model.lora, LoraConfig), seed=config.seed))


def env_config(config: ml_collections.ConfigDict) -> EnvConfig | None:
    """The run's tools (ada/envs), or None: env.tools = '', one turn per response."""
    env = EnvConfig(**_fields(config.env, EnvConfig))
    return env if env.tool_names else None


def alloc_config(config: ml_collections.ConfigDict) -> AllocConfig:
    """The budget split of a run: the adaptive section's knobs (`methods.alloc_config`)."""
    return methods.alloc_config(config.method, config.data.prompts_per_step,
                                collect_config(config), **_fields(config.adaptive, AllocConfig))


def collect_config(config: ml_collections.ConfigDict) -> CollectConfig:
    """The collection of a run: the adaptive section (normalize_std aside: the advantage's)
    with the rounds and exit rule its method sets."""
    return methods.collect_config(config.method, **_fields(config.adaptive, CollectConfig))
