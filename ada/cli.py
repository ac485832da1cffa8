"""The command lines: train (`python -m ada.runner`, `ada-train`), sweep (`--sweep`) and
evaluate (`python -m ada.evaluate`, `ada-eval`).

Every user error (a bad config, path, data file or flag) ends the command with one line,
`error: ...` naming the thing and the fix, and exit code 2, before anything compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence

from ada import config as cfglib
from ada.config import ConfigError

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "default.py")

TRAIN_EPILOG = """examples:
  python -m ada.runner --workdir runs/default                   # the embedded default
  python -m ada.runner --config configs/default.py:grpo --workdir runs/grpo
  python -m ada.runner --config configs/qwen25_math_7b.py:ada_balance --workdir runs/q7b \\
      --config.model.path=/models/Qwen2.5-Math-7B --config.train.steps=300
  python -m ada.runner --config configs/default.py --print_config   # see every knob
  python -m ada.runner --sweep configs/sweep_methods.py --workdir runs/sweep --print

Any config value can be overridden with --config.a.b=value. Methods (the :arg of a
config file, or --config.method): grpo, dapo, ada_pos, ada_balance, exhaustive (see
ada/methods.py). A rerun with the same --workdir resumes from its latest complete
checkpoint."""


def fail(e: Exception) -> int:
    """The one way a command line reports a user error: one line, exit code 2."""
    print(f"error: {e}", file=sys.stderr)
    return 2


# ----------------------------------------------------------------------------- train, sweep


def train_main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides, rest = cfglib.parse_override_args(argv)
        p = argparse.ArgumentParser(prog="python -m ada.runner",
                                    description="Train with Reinforce-Ada / GRPO from a config file.",
                                    epilog=TRAIN_EPILOG,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--config", default=DEFAULT_CONFIG,
                       help="configs/FILE.py[:arg] (default: configs/default.py, the embedded default)")
        p.add_argument("--workdir", help="output directory (metrics, checkpoints, plots)")
        p.add_argument("--sweep", help="configs/sweep_*.py: run each point (or --print the commands)")
        p.add_argument("--print", action="store_true", help="with --sweep: print commands, run nothing")
        p.add_argument("--print_config", action="store_true", help="print the resolved config and exit")
        args = p.parse_args(rest)
        if args.sweep:
            return sweep(args.sweep, args.workdir, overrides, print_only=args.print)
        config = cfglib.build_config(args.config, overrides)
        if args.print_config:
            print(config)
            return 0
        if not args.workdir:
            raise ConfigError("no output directory; pass --workdir DIR (e.g. --workdir runs/default)")
        cfglib.validate(config, args.workdir)
    except ConfigError as e:
        return fail(e)
    from ada import distributed
    from ada.loop import train

    distributed.initialize()
    try:
        summary = train(config, args.workdir)
    except ConfigError as e:
        return fail(e)
    if distributed.is_main():
        print(json.dumps(summary, default=str))
    return 0


def sweep(spec: str, workdir: str | None, overrides, *, print_only: bool) -> int:
    """Run (or print) one `python -m ada.runner` per sweep point, each validated first."""
    if not workdir:
        raise ConfigError("--sweep needs --workdir (each run goes to a subdirectory)")
    base, runs = cfglib.load_sweep(spec)
    cmds = []
    for r in runs:
        wd = os.path.join(workdir, cfglib.sweep_name(r))
        point = cfglib.overrides_to_args(r)
        cfg = cfglib.build_config(base, [*cfglib.parse_override_args(point)[0], *overrides])
        cfglib.validate(cfg, wd)
        cmds.append([sys.executable, "-m", "ada.runner", "--config", base, *point,
                     *cfglib.overrides_to_args(dict(overrides)), "--workdir", wd])
    for cmd in cmds:
        if print_only:
            print(shlex.join(cmd))
            continue
        print("+", shlex.join(cmd), flush=True)
        rc = subprocess.call(cmd)
        if rc:
            return rc
    return 0


# ----------------------------------------------------------------------------- evaluate


def eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ada.evaluate",
                                description="avg@k and pass@k of a run's checkpoint or a Hugging "
                                            "Face model on a benchmark file.")
    p.add_argument("--workdir", help="a run directory (its config.json and checkpoints/)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--model", default="", help="a Hugging Face model directory instead of a run")
    p.add_argument("--config", default="", help="config for --model (default configs/default.py)")
    p.add_argument("--benchmark", default="",
                   help="JSONL with problem/answer rows (default: the run's eval split)")
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--max_new_tokens", type=int, default=None)
    p.add_argument("--max_prompt_len", type=int, default=None,
                   help="longest prompt in tokens (default: the run's data.max_prompt_len); "
                        "longer prompts are skipped and counted")
    p.add_argument("--pass_k", default="", help="comma-separated k values")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N prompts")
    p.add_argument("--json", default="", help="write the summary here")
    return p


def eval_config(args):
    """The run's (or --config's) config with the command line's eval settings applied."""
    if args.workdir:
        config = cfglib.load_run_config(args.workdir)
    else:
        if not args.model:
            raise ConfigError("pass --workdir RUN_DIR or --model HF_DIR")
        config = cfglib.load_config(args.config or DEFAULT_CONFIG)
        config.model.path = args.model
    e = config.eval
    e.samples = args.samples or e.samples
    e.temperature = e.temperature if args.temperature is None else args.temperature
    e.max_new_tokens = args.max_new_tokens or e.max_new_tokens
    if args.pass_k:
        e.pass_k = tuple(int(k) for k in args.pass_k.split(","))
    e.pass_k = tuple(k for k in e.pass_k if k <= e.samples)
    if args.max_prompt_len:
        config.data.max_prompt_len = args.max_prompt_len
    cfglib.validate(config)
    return config


def benchmark_records(path: str, config) -> list[dict]:
    from ada.data.sources import DataError, RecordFormat, load_records

    fmt = RecordFormat(problem_key=config.data.problem_key, answer_key=config.data.answer_key)
    try:
        return load_records(path, fmt)
    except DataError as e:
        raise ConfigError(f"--benchmark {path}: {e.problem}; fix the file") from None


def evaluate_run(args) -> dict:
    import dataclasses

    import jax

    from ada import setup
    from ada.checkpoint import Checkpointer
    from ada.loop import evaluate_held_out
    from ada.rewards.math_verifier import math_reward

    config = eval_config(args)
    step, ckpt = None, None
    if args.workdir:
        ckpt = Checkpointer(os.path.join(args.workdir, "checkpoints"))
        step = ckpt.pick_step(args.step)
    s = setup.build(config, initial=step is None)
    if args.benchmark:  # a math benchmark, scored by the verifier, in the run's template
        s.task = dataclasses.replace(s.task, eval=benchmark_records(args.benchmark, config),
                                     reward=math_reward)
    max_len = config.data.max_prompt_len
    s.eval_records, too_long = setup.encode_records(s.task.eval, s.tokenizer,
                                                    config.tokenizer.template, max_len)
    if too_long:
        msg = setup.too_long_message("prompts", len(s.task.eval), too_long, max_len,
                                     "--max_prompt_len")
        if not s.eval_records:
            raise ConfigError(msg.replace("are skipped", "nothing is left to evaluate"))
        print(f"warning: {msg}", file=sys.stderr)
    if args.limit:
        s.eval_records = s.eval_records[: args.limit]
    params = s.params if step is None else ckpt.restore_params(step)[0]["params"]
    out = evaluate_held_out(s, jax.device_put(params), config.seed)
    out.update(step=step or 0, num_prompts=len(s.eval_records), dropped_prompts=len(too_long))
    return out


def eval_main(argv: Sequence[str] | None = None) -> int:
    args = eval_parser().parse_args(argv)
    try:
        summary = evaluate_run(args)
    except (ConfigError, FileNotFoundError) as e:
        return fail(e)
    print(json.dumps(summary, indent=2, sort_keys=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
    return 0
