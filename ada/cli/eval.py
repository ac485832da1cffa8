"""`python -m ada.evaluate` (`ada-eval`): avg@k and pass@k of a run's checkpoint or a Hugging
Face model, on the run's held-out prompts or a benchmark file (ada/evaluation.py).

    python -m ada.evaluate --workdir runs/default [--step 40] --benchmark FILE.jsonl \
        [--samples 8] [--temperature 1.0] [--limit 100] [--max_prompt_len 256] [--json out.json]

A benchmark file is read as training reads its files: JSONL or Parquet, the columns named
by --problem_key / --answer_key (GSM8K: --problem_key question --answer_format gsm8k).
A value the command cannot honour is refused in one line (exit 2); the run's own
eval.pass_k values above --samples are dropped with a one-line warning. The summary says
the samples, temperature, pass_k and lengths it used. `--config.a.b=value` overrides any
other knob of the run's (or --config's) config.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ada import config as cfglib
from ada.cli import args as cli_args
from ada.config import DEFAULT_CONFIG, ConfigError, fail


def eval_parser() -> argparse.ArgumentParser:
    p = cli_args.Parser(prog="python -m ada.evaluate",
                                description="avg@k and pass@k of a run's checkpoint or a Hugging "
                                            "Face model on a benchmark file.",
                                epilog=f"{cli_args.ALIASES} --config.a.b=value overrides a "
                                       "knob of the config (python -m ada.runner "
                                       "--print_config lists them).")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--workdir", help="a run directory (its config.json and checkpoints/)")
    what.add_argument("--model", default="", help="a Hugging Face model directory instead of a run")
    p.add_argument("--step", type=int, default=None,
                   help="with --workdir: checkpoint step (default: the latest)")
    p.add_argument("--config", default="",
                   help="with --model: its config file (default: configs/default.py)")
    p.add_argument("--benchmark", default="",
                   help="JSONL or Parquet file of problems, scored by the math verifier "
                        "(default: the run's eval split)")
    cli_args.add_columns(p, "the run's data.problem_key / data.answer_key")
    p.add_argument("--samples", type=int, default=None,
                   help="responses per prompt (default: the run's eval.samples)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature, 0 greedy (default: the run's eval.temperature)")
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help="longest response in tokens (default: the run's eval.max_new_tokens, "
                        "else sampling.max_new_tokens)")
    p.add_argument("--max_prompt_len", type=int, default=None,
                   help="longest prompt in tokens (default: the run's data.max_prompt_len); "
                        "longer prompts are skipped and counted")
    p.add_argument("--pass_k", default="",
                   help="comma-separated k of pass@k, each at most --samples (default: the "
                        "run's eval.pass_k)")
    p.add_argument("--limit", type=int, default=0,
                   help="evaluate only the first N prompts (default 0: all)")
    p.add_argument("--json", default="", help="also write the summary to this file")
    return p


def check_args(args) -> None:
    """The values no run could honour, refused before anything loads."""
    cli_args.check_values(args, ("samples", "max_new_tokens", "max_prompt_len"))
    if args.limit < 0:
        raise ConfigError(f"--limit {args.limit} must be >= 0 (0: every prompt)")
    if args.workdir and args.config:
        raise ConfigError("--config is for --model; a run is evaluated with its own config.json "
                          "(change a knob with --config.a.b=value)")
    if args.model and args.step is not None:
        raise ConfigError("--step needs --workdir (a run's checkpoint); an HF model has none")
    if not args.benchmark and (args.problem_key or args.answer_key or
                               args.answer_format != "plain"):
        raise ConfigError("--problem_key / --answer_key / --answer_format read a --benchmark "
                          "file; pass one (the run's eval split uses its data.* columns)")


def eval_config(args, overrides=()):
    """The run's (or --config's) config with the command line's eval settings applied."""
    check_args(args)
    if args.workdir:
        config = cfglib.load_run_config(args.workdir)
    else:
        if not args.model:
            raise ConfigError("pass --workdir RUN_DIR or --model HF_DIR")
        config = cfglib.load_config(args.config or DEFAULT_CONFIG)
        config.model.path = args.model
    for key, value in overrides:
        cfglib.apply_override(config, key, value)
    e = config.eval
    e.samples = args.samples or e.samples
    e.temperature = e.temperature if args.temperature is None else args.temperature
    e.max_new_tokens = args.max_new_tokens or e.max_new_tokens
    if args.pass_k:
        try:
            e.pass_k = tuple(int(k) for k in args.pass_k.split(","))
        except ValueError:
            raise ConfigError(f"--pass_k {args.pass_k}: write comma-separated integers, "
                              "e.g. 1,4,8") from None
        if bad := [k for k in e.pass_k if not 1 <= k <= e.samples]:
            raise ConfigError(f"--pass_k {args.pass_k}: pass@k needs 1 <= k <= --samples "
                              f"({e.samples}), not {bad[0]}; raise --samples or drop that k")
    elif dropped := [k for k in e.pass_k if k > e.samples]:
        e.pass_k = tuple(k for k in e.pass_k if k <= e.samples)
        print(f"warning: the run's eval.pass_k {dropped} exceed --samples {e.samples}; "
              f"reporting pass@k for k in {list(e.pass_k)} (the summary's pass_k)",
              file=sys.stderr)
    if args.max_prompt_len:
        config.data.max_prompt_len = args.max_prompt_len
    cfglib.validate(config)
    return config


def evaluate_run(args, overrides=()) -> dict:
    from ada import setup
    from ada.evaluation import evaluate_policy
    from ada.rollout import Rollout

    config = eval_config(args, overrides)
    run = setup.load_run(args.workdir or None, args.step, config=config)
    if args.benchmark:  # a math benchmark, scored by the verifier, in the run's template
        records = cli_args.load_file("--benchmark", args.benchmark, args,
                                     config.data.problem_key, config.data.answer_key)
        reward = setup.load_reward("math")
    else:
        task = setup.load_task(config)
        records, reward = task.eval, task.reward
    max_len = config.data.max_prompt_len
    encoded, too_long = setup.encode_records(records, run.tokenizer, config.tokenizer.template,
                                             max_len)
    if too_long:
        msg = setup.too_long_message("prompts", len(records), too_long, max_len,
                                     "--max_prompt_len")
        if not encoded:
            raise ConfigError(msg.replace("are skipped", "nothing is left to evaluate"))
        print(f"warning: {msg}", file=sys.stderr)
    if message := setup.unknown_tokens_message("prompts", encoded, run.tokenizer):
        print(f"warning: {message}", file=sys.stderr)
    if args.limit:
        encoded = encoded[: args.limit]
    e = config.eval
    engine = setup.make_engine(config, run.model_cfg, run.tokenizer, temperature=e.temperature,
                               max_new_tokens=e.max_new_tokens or config.sampling.max_new_tokens)
    params = engine.prepare_params(run.params)  # from the host onto the sampler's shards, once
    out = evaluate_policy(Rollout(engine, run.tokenizer, None, reward), params, encoded,
                          samples=e.samples, pass_k=e.pass_k,
                          threshold=config.adaptive.positive_threshold, seed=config.seed)
    out.update(step=run.step or 0, num_prompts=len(encoded), dropped_prompts=len(too_long),
               samples=e.samples, temperature=e.temperature, pass_k=list(e.pass_k),
               max_new_tokens=engine.max_new_tokens, max_prompt_len=max_len)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides, rest = cfglib.parse_override_args(argv)
    except ConfigError as e:
        return fail(e)
    args = eval_parser().parse_args(rest)
    from ada import quiet

    quiet.quiet_start()
    try:
        summary = evaluate_run(args, overrides)
    except (ConfigError, FileNotFoundError) as e:
        return fail(e)
    print(json.dumps(summary, indent=2, sort_keys=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
    return 0
