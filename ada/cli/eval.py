"""`python -m ada.evaluate` (`ada-eval`): avg@k and pass@k of a run's checkpoint or a Hugging
Face model, on the run's held-out prompts or a benchmark file (ada/evaluation.py).

    python -m ada.evaluate --workdir runs/default [--step 40] --benchmark FILE.jsonl \
        [--samples 8] [--temperature 1.0] [--limit 100] [--max_prompt_len 256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ada import config as cfglib
from ada.config import DEFAULT_CONFIG, ConfigError, fail


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
    import jax

    from ada import setup
    from ada.evaluation import evaluate_policy
    from ada.rollout import Rollout

    config = eval_config(args)
    run = setup.load_run(args.workdir or None, args.step, config=config)
    if args.benchmark:  # a math benchmark, scored by the verifier, in the run's template
        records, reward = benchmark_records(args.benchmark, config), setup.load_reward("math")
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
    out = evaluate_policy(Rollout(engine, run.tokenizer, None, reward), jax.device_put(run.params),
                          encoded, samples=e.samples, pass_k=e.pass_k,
                          threshold=config.adaptive.positive_threshold, seed=config.seed)
    out.update(step=run.step or 0, num_prompts=len(encoded), dropped_prompts=len(too_long))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = eval_parser().parse_args(argv)
    from ada import distributed

    distributed.cpu_only_without_accelerators()  # no libtpu start-up noise on a CPU
    try:
        summary = evaluate_run(args)
    except (ConfigError, FileNotFoundError) as e:
        return fail(e)
    print(json.dumps(summary, indent=2, sort_keys=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
    return 0
