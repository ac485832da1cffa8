"""Config files, command-line overrides and whole-config validation.

A config file is a Python file with `get_config(arg=None) -> ml_collections.ConfigDict`
(big_vision style). It is named on the command line as `path/to/file.py` or
`path/to/file.py:arg`; fields are overridden with `--config.a.b=value`.

Everything a run needs is checked here, before any compile or training time is spent:
an unknown override key, a file with a syntax error, a model path that does not exist
and an output directory that is not writable each stop the run with a one-line
`ConfigError` that names the thing and the fix.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

import ml_collections

from ada.adaptive.collect import SCHEDULERS, threshold_problem
from ada.data.sources import BAD_ROW_POLICIES
from ada.methods import METHODS
from ada.rl.losses import AGG_MODES, KL_ESTIMATORS


class ConfigError(ValueError):
    """A bad config, override or path; its message is one line meant for the user."""


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
        raise ConfigError(
            f"syntax error in config file {e.filename or path}, line {e.lineno}: {e.msg}"
        ) from None
    except Exception as e:  # an error while importing the file: point at its line
        line = _line_in(path, e)
        raise ConfigError(
            f"config file {path}{line} raised {type(e).__name__}: {e}"
        ) from None
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


def load_config(spec: str) -> ml_collections.ConfigDict:
    """Load `file.py[:arg]` by calling its `get_config(arg)`."""
    path, arg = split_spec(spec)
    module = _load_module(path)
    fn = getattr(module, "get_config", None)
    if fn is None:
        raise ConfigError(f"config file {path} has no get_config(arg=None) function")
    try:
        config = fn(arg) if arg is not None else fn()
    except Exception as e:
        raise ConfigError(
            f"get_config({arg!r}) in {path}{_line_in(path, e)} raised {type(e).__name__}: {e}"
        ) from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"get_config in {path} returned {type(config).__name__}, not a ConfigDict")
    return config


# ----------------------------------------------------------------------------- overrides


def flat_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    """Every leaf key as a dotted path ('adaptive.n', ...)."""
    keys = []
    for k, v in config.items():
        path = f"{prefix}{k}"
        if isinstance(v, ml_collections.ConfigDict):
            keys.extend(flat_keys(v, path + "."))
        else:
            keys.append(path)
    return keys


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
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
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


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
    """The resolved config a run saved in its directory (`WORKDIR/config.json`)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found; is {workdir} a run directory?")
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f))


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
    """A sweep file defines BASE (a config spec) and get_sweep(arg=None) -> [override dicts]."""
    path, arg = split_spec(path)
    module = _load_module(path)
    if not hasattr(module, "get_sweep") or not hasattr(module, "BASE"):
        raise ConfigError(f"sweep file {path} must define BASE = 'configs/x.py[:arg]' and get_sweep(arg=None)")
    runs = module.get_sweep(arg) if arg is not None else module.get_sweep()
    runs = list(runs)
    for i, r in enumerate(runs):
        if not isinstance(r, dict):
            raise ConfigError(f"sweep file {path}: entry {i} is {type(r).__name__}, not a dict of overrides")
    return module.BASE, runs


def sweep_name(overrides: dict[str, Any]) -> str:
    """A directory-safe name for one sweep point ('method=grpo,seed=1')."""
    text = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in overrides.items()) or "base"
    return "".join(c if c.isalnum() or c in "=,._-" else "_" for c in text)


# ----------------------------------------------------------------------------- validation


def check_workdir(workdir: str) -> None:
    """The output directory must exist or be creatable, and be writable."""
    if not workdir:
        raise ConfigError("no output directory; pass --workdir DIR")
    path = os.path.abspath(workdir)
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"output directory {workdir!r} exists and is not a directory; pick another --workdir")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"output directory {workdir!r} is not writable ({probe} denies writes); "
                          "pick another --workdir or fix its permissions")
    try:  # the run creates it anyway; try it now so the error comes before any compile
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write_test"):
            pass
    except OSError as e:
        raise ConfigError(f"output directory {workdir!r} is not writable ({e.strerror}); "
                          "pick another --workdir") from None


def _get(config, key, default=None):
    node = config
    for p in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or p not in node:
            return default
        node = node[p]
    return node


def validate(config: ml_collections.ConfigDict, workdir: str | None = None) -> None:
    """Check the whole config (and the output dir) before anything is compiled.

    Raises ConfigError with one line that names the setting and what to change.
    """
    problems: list[str] = []

    def need(cond, msg):
        if not cond:
            problems.append(msg)

    method = _get(config, "method")
    need(method in METHODS, f"method={method!r} is not one of {', '.join(METHODS)}")
    a = config.adaptive
    need(a.n >= 2, f"adaptive.n={a.n} must be >= 2 (a group of one has no baseline)")
    need(a.samples_per_round >= 1, f"adaptive.samples_per_round={a.samples_per_round} must be >= 1")
    need(a.max_rounds >= 1, f"adaptive.max_rounds={a.max_rounds} must be >= 1")
    if method in METHODS and METHODS[method].adaptive_rounds:
        need(a.samples_per_round * a.max_rounds >= a.n,
             f"adaptive.samples_per_round*max_rounds={a.samples_per_round * a.max_rounds} < n={a.n}; "
             "raise samples_per_round or max_rounds")
    need(a.scheduler in SCHEDULERS, f"adaptive.scheduler={a.scheduler!r} is not one of {SCHEDULERS}")
    problem = threshold_problem(a.positive_threshold, a.reward_range)
    need(problem is None, "adaptive." + str(problem).replace("threshold=", "positive_threshold=", 1))
    need(a.normalize_std in (None, True, False),
         f"adaptive.normalize_std={a.normalize_std!r} must be None (the method's own), true or false")
    d = config.data
    need(d.prompts_per_step >= 1, f"data.prompts_per_step={d.prompts_per_step} must be >= 1")
    lo, hi = tuple(d.get("pass_rate_range", (0.0, 1.0)))  # absent from older runs
    need(0.0 <= lo <= hi <= 1.0 and d.get("pass_rate_samples", 16) >= 1,
         f"data.pass_rate_range={(lo, hi)} needs 0 <= lo <= hi <= 1 and data.pass_rate_samples="
         f"{d.get('pass_rate_samples', 16)} >= 1")
    w = config.warmstart
    noise, noise_steps = w.get("teacher_noise", 0.0), w.get("noise_steps", 0)
    # (a warm start on a non-synthetic source is refused at setup, with its own message)
    need(0.0 <= noise < 1.0 and not (noise and w.enabled and d.source == "countdown"),
         f"warmstart.teacher_noise={noise} must be in [0, 1), and > 0 only for "
         "data.source=arithmetic (near misses of an integer answer)")
    need(noise_steps >= 0 and (noise > 0) == (noise_steps > 0),
         f"warmstart.teacher_noise={noise} and warmstart.noise_steps={noise_steps}: the noisy "
         "teacher needs both (> 0), or neither (0) for exact answers only")
    on_bad_row = d.get("on_bad_row", "raise")  # absent from runs older than the key
    need(on_bad_row in BAD_ROW_POLICIES,
         f"data.on_bad_row={on_bad_row!r} is not one of {BAD_ROW_POLICIES}")
    if d.source == "tfds":
        need(d.get("tfds_name"), "data.source=tfds needs a dataset: pass --config.data.tfds_name="
                                 "NAME (prepared in data.tfds_data_dir) or its version folder")
        need(d.get("tfds_split"), "data.source=tfds needs a training split: pass "
                                  "--config.data.tfds_split=train")
    o = config.optim
    need(o.lr > 0, f"optim.lr={o.lr} must be > 0")
    need(o.warmup_steps >= 0, f"optim.warmup_steps={o.warmup_steps} must be >= 0")
    need(0 <= o.clip_low < 1 and o.clip_high >= 0,
         f"optim.clip_low/clip_high={o.clip_low}/{o.clip_high}: need 0 <= clip_low < 1, clip_high >= 0")
    need(o.loss_agg in AGG_MODES, f"optim.loss_agg={o.loss_agg!r} is not one of {AGG_MODES}")
    need(o.kl_coef >= 0, f"optim.kl_coef={o.kl_coef} must be >= 0 (0 disables the KL term)")
    kl_estimator = o.get("kl_estimator", "k3")
    need(kl_estimator in KL_ESTIMATORS,
         f"optim.kl_estimator={kl_estimator!r} is not one of {KL_ESTIMATORS}")
    splits = o.mini_batches * o.micro_batches
    need(o.mini_batches >= 1 and o.micro_batches >= 1 and d.prompts_per_step * a.n % splits == 0,
         f"optim.mini_batches*micro_batches={splits} must divide prompts_per_step*n="
         f"{d.prompts_per_step * a.n}")
    need(o.mini_batches < 1 or d.prompts_per_step % o.mini_batches == 0,
         f"optim.mini_batches={o.mini_batches} must divide data.prompts_per_step="
         f"{d.prompts_per_step} (each mini-batch holds whole prompts)")
    need(config.train.steps >= 1, f"train.steps={config.train.steps} must be >= 1")
    s = config.sampling
    need(s.temperature >= 0, f"sampling.temperature={s.temperature} must be >= 0")
    need(s.max_new_tokens >= 1, f"sampling.max_new_tokens={s.max_new_tokens} must be >= 1")
    need(s.num_slots >= 1 and s.chunk_size >= 1,
         f"sampling.num_slots={s.num_slots} and sampling.chunk_size={s.chunk_size} must be >= 1 "
         "(decode slots; decode steps per jitted chunk)")
    need(0 < s.top_p <= 1, f"sampling.top_p={s.top_p} must be in (0, 1]")
    if "num_windows" in s:  # absent from the config.json of runs older than the key
        need(s.num_windows >= 1,
             f"sampling.num_windows={s.num_windows} must be >= 1 (1 = attend to the whole cache)")
    if "mesh" in s:  # absent from the config.json of runs older than the key
        need(len(s.mesh) == 2 and s.mesh[1] >= 1 and (s.mesh[0] >= 1 or s.mesh[0] == -1),
             f"sampling.mesh={tuple(s.mesh)} must be (data, tensor) with tensor >= 1 and data "
             ">= 1 or -1 (all of this process's devices)")
    e = config.eval
    need(e.samples >= 1, f"eval.samples={e.samples} must be >= 1")
    for k in e.pass_k:
        need(1 <= k <= e.samples, f"eval.pass_k contains {k}; each k must be in [1, eval.samples={e.samples}]")
    need(config.checkpoint.keep >= 1, f"checkpoint.keep={config.checkpoint.keep} must be >= 1")
    if problems:
        raise ConfigError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))

    for key in ("model.path", "tokenizer.path", "data.train_path", "data.eval_path",
                "data.tfds_data_dir"):
        value = _get(config, key)
        if value and not str(value).startswith("gs://") and not os.path.exists(value):
            raise ConfigError(f"{key}={value!r} does not exist; fix the path or pass --config.{key}=''"
                              if key != "model.path" else
                              f"model path {value!r} does not exist; pass an existing Hugging Face "
                              "model directory with --config.model.path=DIR")
    if workdir is not None:
        check_workdir(workdir)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m ada.config CONFIG [--config.x=v]` prints the resolved config."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides, rest = parse_override_args(argv)
        if len(rest) != 1:
            print("usage: python -m ada.config configs/x.py[:arg] [--config.a.b=v ...]", file=sys.stderr)
            return 2
        print(build_config(rest[0], overrides))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
