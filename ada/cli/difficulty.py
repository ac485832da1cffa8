"""`python -m ada.data.difficulty`: filter a prompt file by the policy's own pass rate (paper
§4.1), as a run's `data.pass_rate_range` does, with the same sampler and cache key.

    python -m ada.data.difficulty --input train.jsonl --output hard.jsonl \
        (--model HF_DIR | --workdir RUN_DIR [--step S]) --k 16 --preset hard \
        [--min_pass_rate R] [--max_pass_rate R] [--[no-]require_one_correct] \
        [--template qwen25_math] [--max_new_tokens N] [--temperature 1.0] [--cache PATH] \
        [--problem_key question --answer_format gsm8k]

Flags are written --a_b as in the other commands; the --a-b spellings still work.

Runs length filter -> dedup -> unparseable gold -> pass rates -> keep. Pass rates come from
`ada.evaluation.pass_rates`: k draws per prompt through the run's engine (`ada.sampling.backends.make_engine`),
record r drawing as prompt `prompt_id_for(r)` (a hash of its id), scored by the run's reward
(or --reward). Every prompt's result is appended to --cache (default
OUTPUT.passrates.jsonl) chunk by chunk, so a killed run restarted with the same arguments
samples only the prompts not done yet; a rerun with another pass-rate range re-filters
without sampling; one with another policy, template, sampling setting, reward or seed is
refused (CACHE.settings.json records them: `ada.run.passrates.pass_rate_settings`). It writes the kept
records (with `pass_rate`) as JSONL and prints the counts as JSON:
input = too_long + duplicates + unparseable + filtered + kept.

--workdir uses the run's config (template, sampling, reward, prompt length), each
overridable by a flag; --model starts from the defaults below.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence

from ada import config as cfglib
from ada import paths
from ada.cli import args as cli_args
from ada.config import DEFAULT_CONFIG, ConfigError, fail

MODEL_DEFAULTS = {"template": "qwen25_math", "max_prompt_tokens": 1024, "max_new_tokens": 1024}


def build_parser() -> argparse.ArgumentParser:
    p = cli_args.Parser(
        prog="python -m ada.data.difficulty",
        description="Filter a prompt file by the policy's own pass rate (dedup, unparseable "
                    "gold and difficulty, as in the paper); resumable through --cache.",
        epilog=cli_args.ALIASES)
    p.add_argument("--input", required=True, help="JSONL or Parquet file of problems")
    p.add_argument("--output", required=True, help="JSONL file for the kept records")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", default="", help="a local Hugging Face model directory")
    src.add_argument("--workdir", default="", help="a run directory (its latest checkpoint)")
    p.add_argument("--step", type=int, default=None, help="with --workdir: checkpoint step")
    p.add_argument("--dtype", default="", help="with --model: float32 | bfloat16 (default: "
                   "the config's model.dtype)")
    p.add_argument("--k", type=int, default=16, help="samples per prompt (paper: 16)")
    p.add_argument("--preset", choices=("hard", "easy"), default="hard",
                   help="hard: solved once, pass rate <= 0.125; easy: solved once, <= 0.3125")
    p.add_argument("--min_pass_rate", type=float, default=None,
                   help="keep prompts whose pass rate is at least this (default: the preset's)")
    p.add_argument("--max_pass_rate", type=float, default=None,
                   help="keep prompts whose pass rate is at most this (default: the preset's)")
    p.add_argument("--require_one_correct", "--require-one-correct",
                   action=argparse.BooleanOptionalAction, default=None,
                   help="keep only prompts solved at least once (default: the preset's, yes)")
    p.add_argument("--template", default=None, help="ada.templates name (--model default: "
                   f"{MODEL_DEFAULTS['template']}; --workdir: the run's)")
    p.add_argument("--instruction", default=None, help="replaces the template's instruction")
    p.add_argument("--max_prompt_tokens", type=int, default=None,
                   help=f"longer prompts are dropped (--model default "
                        f"{MODEL_DEFAULTS['max_prompt_tokens']}; --workdir: data.max_prompt_len)")
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help=f"--model default {MODEL_DEFAULTS['max_new_tokens']}; --workdir: "
                        "sampling.max_new_tokens")
    p.add_argument("--temperature", type=float, default=None, help="default 1.0 / the run's")
    p.add_argument("--top_k", type=int, default=None, help="default 0 (off) / the run's")
    p.add_argument("--top_p", type=float, default=None, help="default 1.0 / the run's")
    p.add_argument("--reward", default=None,
                   help="math | arithmetic | countdown | package.module:function (--model "
                        "default math; --workdir: the run's)")
    p.add_argument("--cache", default="", help="pass-rate cache (default OUTPUT.passrates.jsonl)")
    cli_args.add_columns(p, "the run's data.problem_key / data.answer_key")
    p.add_argument("--num_slots", type=int, default=None,
                   help="engine decode slots (default 64 / the run's sampling.num_slots)")
    p.add_argument("--prompts_per_call", type=int, default=64,
                   help="prompts per sampling call and per cache flush")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the step key)")
    return p


def _check_args(args) -> None:
    """Cheap checks first, so a typo fails before a model is loaded."""
    cli_args.check_values(args, ("k", "num_slots", "prompts_per_call", "max_prompt_tokens",
                                 "max_new_tokens"))
    if args.top_k is not None and args.top_k < 0:
        raise ConfigError(f"--top_k {args.top_k} must be >= 0 (0: off)")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ConfigError(f"--top_p {args.top_p} must be in (0, 1] (1: off)")
    if args.model and args.step is not None:
        raise ConfigError("--step needs --workdir (a run's checkpoint); an HF model has none")
    if args.workdir and args.dtype:
        raise ConfigError("--dtype is for --model; a run samples in its own model.dtype")
    if args.workdir and not paths.path(args.workdir).joinpath("config.json").is_file():
        raise ConfigError(f"--workdir {args.workdir} is not a run directory (no config.json)")
    if args.model and not os.path.isdir(args.model):
        raise ConfigError(f"--model {args.model}: no such directory; pass a local Hugging Face "
                          "model directory (config.json, *.safetensors, tokenizer)")


def policy_config(args):
    """The run's config (--workdir) or the defaults for an HF model (--model), with the
    command line's sampling settings applied: what makes the pass rates."""
    if args.workdir:
        config = cfglib.load_run_config(args.workdir)
    else:
        config = cfglib.load_config(DEFAULT_CONFIG)
        config.model.path = args.model
        config.model.dtype = args.dtype or config.model.dtype
        config.data.source = "jsonl"  # a real model: math prompts, the math verifier
        config.warmstart.enabled = False
        config.sampling.num_slots = 64
        config.tokenizer.template = MODEL_DEFAULTS["template"]
        config.data.max_prompt_len = MODEL_DEFAULTS["max_prompt_tokens"]
        config.sampling.max_new_tokens = MODEL_DEFAULTS["max_new_tokens"]
        config.sampling.top_k, config.sampling.top_p, config.sampling.temperature = 0, 1.0, 1.0
    for knob, value in (("tokenizer.template", args.template),
                        ("data.max_prompt_len", args.max_prompt_tokens),
                        ("sampling.max_new_tokens", args.max_new_tokens),
                        ("sampling.temperature", args.temperature),
                        ("sampling.top_k", args.top_k), ("sampling.top_p", args.top_p),
                        ("sampling.num_slots", args.num_slots), ("data.reward", args.reward)):
        if value is not None:
            section, field = knob.split(".")
            config[section][field] = value
    return config


def run(args) -> dict:
    """The command's work; returns the summary it prints."""
    from ada.data.encode import encode_records
    from ada.data.preprocess import EASY_FILTER, HARD_FILTER, preprocess
    from ada.data.sources import DataError, write_jsonl
    from ada.data.task import load_reward, reward_spec
    from ada.evaluation import pass_rates
    from ada.models.hf_config import check_vocab
    from ada.rollout import Rollout
    from ada.run.passrates import pass_rate_settings
    from ada.run.saved import load_run
    from ada.sampling.backends import make_engine
    from ada.templates import check_template_tokens, get_template

    _check_args(args)
    cfg = HARD_FILTER if args.preset == "hard" else EASY_FILTER
    over = {"k": args.k}
    for name in ("min_pass_rate", "max_pass_rate", "require_one_correct"):
        if getattr(args, name) is not None:
            over[name] = getattr(args, name)
    try:
        cfg = dataclasses.replace(cfg, **over)
    except ValueError as e:
        raise ConfigError(f"--min_pass_rate / --max_pass_rate: {e}") from None
    config = policy_config(args)
    try:
        get_template(config.tokenizer.template)
    except ValueError as e:
        raise ConfigError(f"--template: {e}") from None
    reward = load_reward(reward_spec(config), "--reward")
    records = cli_args.load_file("--input", args.input, args, config.data.problem_key,
                                 config.data.answer_key)
    policy = load_run(args.workdir or None, args.step, config=config)
    try:
        check_template_tokens(policy.tokenizer, config.tokenizer.template)
        check_vocab(policy.model_cfg, policy.tokenizer.vocab_size)
    except ValueError as e:
        raise ConfigError(f"--template / the model's tokenizer: {e}") from None
    max_len = config.data.max_prompt_len
    records_fit, too_long = encode_records(records, policy.tokenizer,
                                                 config.tokenizer.template, max_len,
                                                 args.instruction)
    if not records_fit:
        raise DataError(f"{args.input}: none of {len(records)} prompts fits "
                        f"--max_prompt_tokens {max_len}")
    engine = make_engine(config, policy.model_cfg, policy.tokenizer)
    rollout = Rollout(engine, policy.tokenizer, None, reward)
    params = engine.prepare_params(policy.params)  # onto the sampler's shards, once
    cache = args.cache or args.output + ".passrates.jsonl"
    settings = pass_rate_settings(config, policy.policy, cfg.k, args.instruction, args.seed)
    counts = {}

    def rates(recs):
        out, c = pass_rates(recs, rollout, params, k=cfg.k, seed=args.seed,
                            threshold=config.adaptive.positive_threshold, cache_path=cache,
                            settings=settings, prompts_per_call=args.prompts_per_call)
        counts.update(c)
        return out

    kept, pre = preprocess(records_fit, pass_rates_fn=rates, difficulty=cfg)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    write_jsonl(kept, args.output)
    step = policy.step if policy.step is not None else "init"
    return {"input": len(records), "too_long": len(too_long), "duplicates": pre.duplicates,
            "unparseable": pre.unparseable, "filtered": pre.filtered, "kept": pre.kept,
            "prompts_sampled": counts.get("prompts_sampled", 0),
            "reward_failures": counts.get("reward_failures", 0), "k": cfg.k,
            "pass_rate_range": [cfg.min_pass_rate, cfg.max_pass_rate],
            "require_one_correct": cfg.require_one_correct,
            "policy": f"run {args.workdir} step {step}" if args.workdir else f"model {args.model}",
            "output": args.output, "cache": cache}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ada import quiet

    quiet.quiet_start()
    try:
        summary = run(args)
    except (ValueError, FileNotFoundError) as e:  # ConfigError, DataError, CheckpointError
        return fail(e)
    print(json.dumps(summary, sort_keys=True))
    return 0
