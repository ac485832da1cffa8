"""The policy's own pass rates on a prompt file, through the sampling engine (paper §4.1).

`engine_sample_fn(...)` is the `sample_fn(records, k) -> rewards [P, k]` that
`ada.data.preprocess.difficulty_filter` needs: it renders each record's prompt with
`ada.templates`, asks the continuous-batching `Driver` for k responses per prompt and
scores each with `reward_fn(record, text)` (a raising or non-finite reward scores 0).

Randomness: the request (prompt, sample j) draws with fold_in(step_key, prompt_id, j),
where prompt_id is a hash of the record's id, not its position in the chunk. So a
prompt's k responses do not depend on which chunk or run sampled it: a run resumed from
the pass-rate cache gives the same rates as an uninterrupted one (up to float rounding
across batch shapes).

Prompt length: the sampler refuses (ValueError naming the record id) a prompt longer than
`max_prompt_tokens` rather than dropping it silently; callers length-filter first with
`ada.templates.filter_by_length`, as the CLI does (and counts).

CLI:

    python -m ada.data.difficulty --input train.jsonl --output hard.jsonl \
        (--model HF_DIR | --workdir RUN_DIR [--step S]) --k 16 --preset hard \
        [--min-pass-rate R] [--max-pass-rate R] [--[no-]require-one-correct] \
        [--template qwen25_math] [--max-new-tokens N] [--temperature 1.0] [--cache PATH]

runs length filter -> dedup -> unparseable gold -> difficulty filter, appends every
prompt's result to --cache (default OUTPUT.passrates.jsonl) chunk by chunk, so a killed
run restarted with the same arguments samples only the prompts not done yet (a rerun with
another pass-rate range re-filters without sampling; one with another policy, template,
sampling setting, reward or seed is refused: CACHE.settings.json records them), writes the
kept records (with `pass_rate`) as JSONL and prints the counts as JSON:
input = too_long + duplicates + unparseable + filtered + kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ada.data.sources import Record
from ada.rewards.score import score

log = logging.getLogger(__name__)

RewardFn = Callable[[Record, str], float]


def prompt_id_for(record: Record) -> int:
    """A record's stable 32-bit prompt id (its PRNG stream), from its unique `id`."""
    return int.from_bytes(hashlib.sha256(str(record["id"]).encode()).digest()[:4], "little")


class EngineSampler:
    """sample_fn(records, k) -> float64 rewards [P, k] from the engine; see the module doc.

    Attributes for callers and tests: `calls` (sample_fn calls), `prompts_sampled`,
    `reward_failures` (raising or non-finite rewards, scored 0) and `last_completions`
    ([P][k] driver Completions of the latest call).
    """

    def __init__(self, engine, params, tokenizer, template: str, reward_fn: RewardFn, *,
                 max_prompt_tokens: int, step_key: Any = 0, instruction: str | None = None):
        from ada.sampling.driver import Driver
        from ada.templates import check_template_tokens, get_template

        get_template(template)
        if not isinstance(max_prompt_tokens, int) or max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be a positive int, got {max_prompt_tokens!r}")
        if max_prompt_tokens > engine.max_prompt_len:
            raise ValueError(
                f"max_prompt_tokens={max_prompt_tokens} exceeds the engine's largest prompt "
                f"bucket {engine.max_prompt_len}; build the Engine with max_prompt_len >= it")
        if tokenizer.vocab_size > engine.config.vocab_size:
            raise ValueError(
                f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} tokens but the model "
                f"only {engine.config.vocab_size}; use the model's own tokenizer")
        check_template_tokens(tokenizer, template)
        self.engine = engine
        self.tokenizer = tokenizer
        self.template = template
        self.instruction = instruction
        self.reward_fn = reward_fn
        self.max_prompt_tokens = max_prompt_tokens
        self.driver = Driver(engine, params, tokenizer=tokenizer,
                             step_key=step_key)
        self.calls = 0
        self.prompts_sampled = 0
        self.reward_failures = 0
        self.last_completions: list[list] = []

    def encode(self, record: Record) -> list[int]:
        """The record's prompt tokens; refuses one longer than max_prompt_tokens."""
        from ada.templates import encode_prompt

        ids = encode_prompt(self.tokenizer, self.template, record["problem"], self.instruction)
        if len(ids) > self.max_prompt_tokens:
            raise ValueError(
                f"record {record['id']!r}: its {self.template!r} prompt has {len(ids)} tokens, "
                f"more than max_prompt_tokens={self.max_prompt_tokens}; drop such records first "
                "with ada.templates.filter_by_length (or raise the limit)")
        return ids

    def __call__(self, records: Sequence[Record], k: int) -> np.ndarray:
        from ada.sampling.driver import Request

        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} samples per prompt must be a positive int")
        prompts = [self.encode(r) for r in records]
        pids = [prompt_id_for(r) for r in records]
        reqs = [Request(prompt_tokens=toks, prompt_id=pid, sample_idx=j)
                for toks, pid in zip(prompts, pids, strict=True) for j in range(k)]
        outs = self.driver.generate_all(reqs)
        self.calls += 1
        self.prompts_sampled += len(records)
        for n, c in enumerate(outs):
            if c.finish_reason == "error":
                raise ValueError(f"record {records[n // k]['id']!r}: the engine refused its "
                                 f"request: {c.error}")
        rewards, failed = score(self.reward_fn, [r for r in records for _ in range(k)],
                                [c.text for c in outs])
        self.reward_failures += int(failed.sum())
        self.last_completions = [outs[p * k:(p + 1) * k] for p in range(len(records))]
        return rewards.reshape(len(records), k)


def engine_sample_fn(engine, params, tokenizer, template: str, reward_fn: RewardFn, *,
                     max_prompt_tokens: int, step_key: Any = 0,
                     instruction: str | None = None) -> EngineSampler:
    """A preprocess `sample_fn` backed by `engine` (see EngineSampler and the module doc).

    Args:
      engine: an ada.sampling.engine.Engine for the model (its SamplingConfig, EOS ids and
        max_new_tokens cap set how responses are drawn).
      params: the model params; tokenizer: the model's ada.tokenizer.Tokenizer.
      template: an ada.templates name; instruction: overrides the template's default.
      reward_fn: reward(record, text) -> float.
      max_prompt_tokens: longer prompts are refused (ValueError naming the record id).
      step_key: PRNG key (or int seed) of the sampling; same key, same rewards.
    """
    return EngineSampler(engine, params, tokenizer, template, reward_fn,
                         max_prompt_tokens=max_prompt_tokens, step_key=step_key,
                         instruction=instruction)


def make_engine(model_cfg, tokenizer, *, max_prompt_tokens: int, max_new_tokens: int,
                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                num_slots: int = 64, chunk_size: int = 8):
    """A single-device Engine for pass-rate sampling (stops at the tokenizer's EOS ids)."""
    from ada.sampling.engine import Engine
    from ada.sampling.samplers import SamplingConfig

    return Engine(model_cfg, num_slots=num_slots, max_prompt_len=max_prompt_tokens,
                  max_new_tokens=max_new_tokens,
                  sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p),
                  eos_ids=tuple(tokenizer.eos_ids), chunk_size=chunk_size,
                  max_prefill_rows=min(8, num_slots), min_prompt_bucket=min(16, max_prompt_tokens))


# ----------------------------------------------------------------------------- CLI


@dataclasses.dataclass
class Policy:
    params: Any
    model_cfg: Any
    tokenizer: Any
    template: str
    max_prompt_tokens: int
    max_new_tokens: int
    source: str  # what was loaded, for the summary


DEFAULT_TEMPLATE = "qwen25_math"
DEFAULT_MAX_PROMPT_TOKENS = 1024  # the paper's prompt budget
DEFAULT_MAX_NEW_TOKENS = 1024


def load_policy(args) -> Policy:
    """--model HF_DIR (weights + tokenizer) or --workdir RUN_DIR (the run's checkpoint)."""
    if args.model:
        from ada.models.hf import load_hf
        from ada.models.hf_config import check_vocab
        from ada.tokenizer import load_tokenizer

        if not os.path.isdir(args.model):
            raise FileNotFoundError(f"--model {args.model}: no such directory; pass a local "
                                    "Hugging Face model directory (config.json, *.safetensors, "
                                    "tokenizer)")
        tokenizer = load_tokenizer(args.model)
        params, model_cfg = load_hf(args.model, dtype=args.dtype or None)
        check_vocab(model_cfg, tokenizer.vocab_size)
        return Policy(params, model_cfg, tokenizer, args.template or DEFAULT_TEMPLATE,
                      args.max_prompt_tokens or DEFAULT_MAX_PROMPT_TOKENS,
                      args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS, f"model {args.model}")
    # A run directory: rebuild it as `python -m ada.evaluate --workdir` does (ada.setup
    # from its config.json), then take the params of its latest (or --step) checkpoint.
    from ada import setup
    from ada.checkpoint import Checkpointer
    from ada.config import load_run_config

    config = load_run_config(args.workdir)
    ckpt = Checkpointer(os.path.join(args.workdir, "checkpoints"))
    step = ckpt.pick_step(args.step)
    run = setup.build(config, initial=step is None)  # a checkpoint replaces the initial params
    if step is None:
        log.warning("%s has no checkpoint; sampling with the run's initial params", args.workdir)
        params = run.params
    else:
        tree, _ = ckpt.restore_params(step)
        params = tree["params"]
    ckpt.close()
    return Policy(params, run.model_cfg, run.tokenizer, args.template or config.tokenizer.template,
                  args.max_prompt_tokens or int(config.data.max_prompt_len),
                  args.max_new_tokens or int(config.sampling.max_new_tokens),
                  f"run {args.workdir} step {step if step is not None else 'init'}")


def load_reward_fn(spec: str) -> RewardFn:
    """'math' | 'arithmetic' | 'countdown', or 'package.module:function'."""
    if ":" in spec:
        from ada.setup import load_reward

        return load_reward(spec)
    from ada.rewards import get_reward_fn

    return get_reward_fn(spec)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ada.data.difficulty",
        description="Filter a prompt file by the policy's own pass rate (dedup, unparseable "
                    "gold and difficulty, as in the paper); resumable through --cache.")
    p.add_argument("--input", required=True, help="JSONL or Parquet file of problems")
    p.add_argument("--output", required=True, help="JSONL file for the kept records")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", default="", help="a local Hugging Face model directory")
    src.add_argument("--workdir", default="", help="a run directory (its latest checkpoint)")
    p.add_argument("--step", type=int, default=None, help="with --workdir: checkpoint step")
    p.add_argument("--dtype", default="", help="with --model: float32 | bfloat16")
    p.add_argument("--k", type=int, default=16, help="samples per prompt (paper: 16)")
    p.add_argument("--preset", choices=("hard", "easy"), default="hard",
                   help="hard: solved once, pass rate <= 0.125; easy: solved once, <= 0.3125")
    p.add_argument("--min-pass-rate", type=float, default=None)
    p.add_argument("--max-pass-rate", type=float, default=None)
    p.add_argument("--require-one-correct", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--template", default="", help=f"ada.templates name (--model default: "
                   f"{DEFAULT_TEMPLATE}; --workdir: the run's)")
    p.add_argument("--instruction", default=None, help="replaces the template's instruction")
    p.add_argument("--max-prompt-tokens", type=int, default=0,
                   help=f"longer prompts are dropped (default {DEFAULT_MAX_PROMPT_TOKENS}, "
                        "or the run's data.max_prompt_len)")
    p.add_argument("--max-new-tokens", type=int, default=0,
                   help=f"default {DEFAULT_MAX_NEW_TOKENS}, or the run's sampling.max_new_tokens")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--reward", default="math",
                   help="math | arithmetic | countdown | package.module:function")
    p.add_argument("--cache", default="", help="pass-rate cache (default OUTPUT.passrates.jsonl)")
    p.add_argument("--problem-key", default="problem")
    p.add_argument("--answer-key", default="answer")
    p.add_argument("--answer-format", choices=("plain", "gsm8k"), default="plain")
    p.add_argument("--num-slots", type=int, default=64, help="engine decode slots")
    p.add_argument("--chunk-size", type=int, default=64,
                   help="prompts per engine call and per cache flush")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the step key)")
    return p


def _check_args(args) -> None:
    """Cheap checks first, so a typo fails before a model is loaded."""
    for name in ("k", "num_slots", "chunk_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    for name in ("max_prompt_tokens", "max_new_tokens"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    if not os.path.isfile(args.input):
        raise FileNotFoundError(f"--input {args.input}: no such file")
    if args.workdir and not os.path.isdir(args.workdir):
        raise FileNotFoundError(f"--workdir {args.workdir}: no such directory")


def _check_cache_settings(cache: str, settings: dict) -> None:
    """The pass-rate cache is keyed by prompt and k only; a sidecar CACHE.settings.json holds
    what else made the rates (policy, template, sampling, reward, seed), so a rerun with other
    settings is refused instead of mixing two policies' rates."""
    from ada.data.sources import DataError

    side = cache + ".settings.json"
    if os.path.exists(side):
        with open(side) as f:
            old = json.load(f)
        diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
        if diff:
            what = ", ".join(f"{k}: {a!r} then, {b!r} now" for k, (a, b) in diff.items())
            raise DataError(f"pass-rate cache {cache} was made with other settings ({what}); "
                            "pass another --cache or delete it")
        return
    if os.path.exists(cache) and os.path.getsize(cache):
        log.warning("%s has no %s; assuming it was made with these settings", cache, side)
    os.makedirs(os.path.dirname(os.path.abspath(side)), exist_ok=True)
    with open(side, "w") as f:
        json.dump(settings, f, indent=2, sort_keys=True)


def run_cli(args) -> dict:
    """The CLI's work; returns the summary it prints."""
    from ada.data.preprocess import EASY_FILTER, HARD_FILTER, preprocess
    from ada.data.sources import DataError, RecordFormat, load_records, write_jsonl
    from ada.templates import filter_by_length

    _check_args(args)
    cfg = HARD_FILTER if args.preset == "hard" else EASY_FILTER
    over = {"k": args.k, "chunk_size": args.chunk_size}
    for name in ("min_pass_rate", "max_pass_rate", "require_one_correct"):
        if getattr(args, name) is not None:
            over[name] = getattr(args, name)
    cfg = dataclasses.replace(cfg, **over)
    reward_fn = load_reward_fn(args.reward)
    records = load_records(args.input, RecordFormat(problem_key=args.problem_key,
                                                    answer_key=args.answer_key,
                                                    answer_format=args.answer_format))
    policy = load_policy(args)
    records_fit, too_long = filter_by_length(records, policy.tokenizer, policy.template,
                                             policy.max_prompt_tokens, args.instruction)
    if not records_fit:
        raise DataError(f"{args.input}: none of {len(records)} prompts fits "
                        f"--max-prompt-tokens {policy.max_prompt_tokens}")
    engine = make_engine(policy.model_cfg, policy.tokenizer,
                         max_prompt_tokens=policy.max_prompt_tokens,
                         max_new_tokens=policy.max_new_tokens, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, num_slots=args.num_slots)
    sampler = engine_sample_fn(engine, policy.params, policy.tokenizer, policy.template,
                               reward_fn, max_prompt_tokens=policy.max_prompt_tokens,
                               step_key=args.seed, instruction=args.instruction)
    cache = args.cache or args.output + ".passrates.jsonl"
    _check_cache_settings(cache, {
        "policy": policy.source, "template": policy.template, "instruction": args.instruction,
        "max_prompt_tokens": policy.max_prompt_tokens, "max_new_tokens": policy.max_new_tokens,
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
        "reward": args.reward, "seed": args.seed})
    kept, counts = preprocess(records_fit, sample_fn=sampler, difficulty=cfg, cache_path=cache)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    write_jsonl(kept, args.output)
    return {"input": len(records), "too_long": too_long, "duplicates": counts.duplicates,
            "unparseable": counts.unparseable, "filtered": counts.filtered, "kept": counts.kept,
            "prompts_sampled": sampler.prompts_sampled,
            "reward_failures": sampler.reward_failures, "k": cfg.k,
            "pass_rate_range": [cfg.min_pass_rate, cfg.max_pass_rate],
            "require_one_correct": cfg.require_one_correct, "policy": policy.source,
            "output": args.output, "cache": cache}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from ada.config import ConfigError

    try:
        summary = run_cli(args)
    except (ValueError, FileNotFoundError, ConfigError) as e:  # DataError, CheckpointError too
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
