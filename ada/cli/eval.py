"""`python -m ada.evaluate` (`ada-eval`): avg@k and pass@k of a run's checkpoint or a Hugging
Face model, on the run's held-out prompts, a benchmark file or a suite of benchmarks
(ada/evaluation.py).

    python -m ada.evaluate --workdir runs/default [--step 40] --benchmark FILE.jsonl \
        [--samples 8] [--temperature 1.0] [--limit 100] [--max_prompt_len 256] [--json out.json]
    python -m ada.evaluate --workdir RUN --suite paper [--data_dir shared/data/benchmarks] \
        [--samples 32] [--limit 10] --json paper.json

`--suite paper` is the Reinforce-Ada paper's evaluation (ada/data/benchmarks.py says where
each setting comes from): a table with one row per benchmark and the count-weighted
average, as the paper's Table 1; --json is written after each benchmark and resumed from.

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
import os
import sys
from collections.abc import Sequence

from ada import config as cfglib
from ada.cli import args as cli_args
from ada.config import DEFAULT_CONFIG, ConfigError, fail
from ada.data.benchmarks import SUITES, Suite, load_suite, source_of
from ada.data.sources import DataError


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
    p.add_argument("--suite", default="",
                   help=f"evaluate a benchmark suite instead ({', '.join(SUITES)}: the "
                        "Reinforce-Ada paper's Table 1 protocol); prints a table, resumes "
                        "from --json (default: none)")
    p.add_argument("--data_dir", default="",
                   help="with --suite: the folder of its {problem, answer} JSONL files, one "
                        "per benchmark (e.g. shared/data/benchmarks); default: load them by "
                        "name from the Hugging Face Hub (needs the datasets package)")
    cli_args.add_columns(p, "the run's data.problem_key / data.answer_key")
    p.add_argument("--samples", type=int, default=None,
                   help="responses per prompt, the k of avg@k (default: the run's "
                        "eval.samples; --suite: the suite's, 32 for paper)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature, 0 greedy (default: the run's eval.temperature; "
                        "--suite: the suite's, 1.0 for paper)")
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help="longest response in tokens (default: the run's eval.max_new_tokens, "
                        "else sampling.max_new_tokens; --suite: each benchmark's own, 4096 "
                        "for paper)")
    p.add_argument("--max_prompt_len", type=int, default=None,
                   help="longest prompt in tokens (default: the run's data.max_prompt_len); "
                        "longer prompts are skipped and counted")
    p.add_argument("--pass_k", default="",
                   help="comma-separated k of pass@k, each at most --samples (default: the "
                        "run's eval.pass_k)")
    p.add_argument("--limit", type=int, default=0,
                   help="evaluate only the first N prompts (of each benchmark with --suite; "
                        "default 0: all)")
    p.add_argument("--tools", default=None,
                   help="comma-separated tools the policy may call mid-answer (calculator, "
                        "python), each response then a whole trajectory scored on its final "
                        "answer; 'none': no tools (default: the run's env.tools)")
    p.add_argument("--json", default="",
                   help="also write the summary to this file (--suite: after each benchmark; "
                        "the same command with the same --json resumes an interrupted suite)")
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
    if args.suite and args.suite not in SUITES:
        raise ConfigError(f"--suite {args.suite}: no such suite; known suites: {list(SUITES)}")
    if args.suite and args.benchmark:
        raise ConfigError("--suite and --benchmark each name what to evaluate; pass one")
    if args.data_dir and not args.suite:
        raise ConfigError("--data_dir holds a --suite's files; pass --suite (one file: "
                          "--benchmark FILE)")
    if not args.benchmark and (args.problem_key or args.answer_key or
                               args.answer_format != "plain"):
        raise ConfigError("--problem_key / --answer_key / --answer_format read a --benchmark "
                          "file; pass one (the run's eval split uses its data.* columns, a "
                          "suite's files have problem and answer)")


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
    if args.tools is not None:
        config.env.tools = "" if args.tools == "none" else args.tools
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


def encode_eval(records, run, config, limit: int, what: str = "prompts") -> tuple[list, list]:
    """(the first `limit` records that fit data.max_prompt_len, with prompt_tokens in the
    run's template; the lengths of those too long): too long ones are skipped and said (all
    of them: refused), a text the tokenizer cannot read is warned about."""
    from ada.data.encode import encode_records, too_long_message, unknown_tokens_message

    max_len = config.data.max_prompt_len
    from ada.trajectory import tool_schemas

    encoded, too_long = encode_records(records, run.tokenizer, config.tokenizer.template,
                                       max_len, tools=tool_schemas(cfglib.env_config(config)))
    if too_long:
        msg = too_long_message(what, len(records), too_long, max_len, "--max_prompt_len")
        if not encoded:
            raise ConfigError(msg.replace("are skipped", "nothing is left to evaluate"))
        print(f"warning: {msg}", file=sys.stderr)
    if message := unknown_tokens_message(what, encoded, run.tokenizer):
        print(f"warning: {message}", file=sys.stderr)
    return (encoded[:limit] if limit else encoded), too_long


def sample_eval(config, run, max_new_tokens: int):
    """The eval engine for responses of up to `max_new_tokens`, and the run's params on it."""
    from ada.sampling.backends import make_engine

    from ada.trajectory import turn_ends

    engine = make_engine(config, run.model_cfg, run.tokenizer,
                         temperature=config.eval.temperature, max_new_tokens=max_new_tokens,
                         turn_end_ids=turn_ends(cfglib.env_config(config), run.tokenizer))
    return engine, engine.prepare_params(run.params)  # from the host onto its shards, once


def score_eval(config, run, engine, params, encoded, reward) -> dict:
    """evaluation.evaluate_policy at the config's eval settings."""
    from ada.evaluation import evaluate_policy
    from ada.rollout import Rollout

    e = config.eval
    rollout = Rollout(engine, run.tokenizer, None, reward, cfglib.env_config(config))
    return evaluate_policy(rollout, params, encoded,
                           samples=e.samples, pass_k=e.pass_k,
                           threshold=config.adaptive.positive_threshold, seed=config.seed)


def evaluate_run(args, overrides=()) -> dict:
    from ada.data.task import load_reward, load_task
    from ada.run.saved import load_run

    config = eval_config(args, overrides)
    run = load_run(args.workdir or None, args.step, config=config)
    if args.benchmark:  # a math benchmark, scored by the verifier, in the run's template
        records = cli_args.load_file("--benchmark", args.benchmark, args,
                                     config.data.problem_key, config.data.answer_key)
        reward = load_reward("math")
    else:
        task = load_task(config)
        records, reward = task.eval, task.reward
    encoded, too_long = encode_eval(records, run, config, args.limit)
    e = config.eval
    engine, params = sample_eval(config, run, e.max_new_tokens or config.sampling.max_new_tokens)
    out = score_eval(config, run, engine, params, encoded, reward)
    out.update(step=run.step or 0, num_prompts=len(encoded), dropped_prompts=len(too_long),
               samples=e.samples, temperature=e.temperature, pass_k=list(e.pass_k),
               max_new_tokens=engine.max_new_tokens, max_prompt_len=config.data.max_prompt_len)
    return out


# ----------------------------------------------------------------------------- --suite
# Every benchmark is read (a missing file or an unreachable Hub refused in one line) before
# the model loads; each is then sampled and scored as --benchmark FILE is, at the suite's k,
# temperature and per-benchmark length unless the command line says otherwise. --json FILE
# is rewritten after every benchmark, {"benchmarks": {name: {"avg_at_k", "n", "k", ...}},
# "weighted_avg", "settings"} (weighted_avg null until every benchmark is done); the same
# command with the same --json skips the benchmarks it holds, so an interrupted suite
# resumes; a file made with other settings (policy, k, lengths, limit, files) is refused.


def evaluate_suite(args, overrides=()) -> dict:
    """The suite's results, each benchmark's written to --json as soon as it is done."""
    from ada.data.task import load_reward
    from ada.run.saved import load_run
    from ada.evaluation import weighted_average

    check_args(args)  # an unknown --suite before the suite's defaults are read
    suite = SUITES[args.suite]
    args.samples = args.samples or suite.samples
    args.temperature = suite.temperature if args.temperature is None else args.temperature
    config = eval_config(args, overrides)
    records = load_suite(suite, args.data_dir)  # every file, before the model loads
    run = load_run(args.workdir or None, args.step, config=config)
    e, s = config.eval, config.sampling
    lengths = {b.name: args.max_new_tokens or b.max_new_tokens for b in suite.benchmarks}
    settings = dict(
        suite=suite.name, policy=run.policy, template=config.tokenizer.template,
        prompt_suffix=suite.prompt_suffix, samples=e.samples, temperature=e.temperature,
        top_k=s.top_k, top_p=s.top_p, pass_k=list(e.pass_k), max_new_tokens=lengths,
        max_prompt_len=config.data.max_prompt_len, limit=args.limit, seed=config.seed,
        threshold=config.adaptive.positive_threshold,
        sources={b.name: source_of(b, args.data_dir) for b in suite.benchmarks})
    out = saved_results(args.json, settings)
    write_results(args.json, out)  # an unwritable --json is found now, not after hours
    done = out["benchmarks"]
    if done:
        print(f"resuming from {args.json}: {', '.join(done)} done", file=sys.stderr)
    reward = load_reward("math")
    engines = {}  # one engine (and one copy of the params on it) per response length
    for b in suite.benchmarks:
        if b.name in done:
            continue
        prompts = [dict(r, problem=f"{r['problem']} {suite.prompt_suffix}")
                   for r in records[b.name]]
        encoded, too_long = encode_eval(prompts, run, config, args.limit, f"{b.title} prompts")
        if lengths[b.name] not in engines:
            engines[lengths[b.name]] = sample_eval(config, run, lengths[b.name])
        m = score_eval(config, run, *engines[lengths[b.name]], encoded, reward)
        done[b.name] = {"avg_at_k": m[f"eval_avg@{e.samples}"], "n": len(encoded),
                        "k": e.samples, "dropped": len(too_long),
                        "max_new_tokens": lengths[b.name],
                        **{k.removeprefix("eval_"): v for k, v in m.items()
                           if k.startswith("eval_pass@")},
                        "time_eval_s": m["time_eval_s"]}
        if len(done) == len(suite.benchmarks):
            out["weighted_avg"] = weighted_average(done)
        write_results(args.json, out)
    return out


def saved_results(path: str, settings: dict) -> dict:
    """The results an interrupted run of the same settings left in `path`, else none."""
    from ada.evaluation import settings_diff

    if not path or not os.path.exists(path):
        return {"benchmarks": {}, "weighted_avg": None, "settings": settings}
    try:
        with open(path) as f:
            saved = json.load(f)
        what = settings_diff(saved["settings"], settings)
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"--json {path} exists and holds no suite's results; pass another "
                          "--json or delete it") from None
    if what:
        raise ConfigError(f"--json {path} holds results made with other settings ({what}); "
                          "pass another --json or delete it")
    return saved


def write_results(path: str, out: dict) -> None:
    """The whole file, renamed into place: a kill leaves the last complete one."""
    if not path:
        return
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(out, f, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        raise ConfigError(f"--json {path}: cannot write it ({e.strerror}); pass a path in a "
                          "writable directory") from None


def table(suite: Suite, out: dict) -> str:
    """One row per benchmark (avg@k in percent, as the paper prints it) and the weighted
    average over the benchmarks' problems."""
    res = out["benchmarks"]
    k = next(iter(res.values()))["k"]
    width = max(len(b.title) for b in suite.benchmarks)
    rows = [f"{'benchmark':<{width}}  {'n':>5}  {f'avg@{k}':>7}"]
    rows += [f"{b.title:<{width}}  {res[b.name]['n']:>5}  {100 * res[b.name]['avg_at_k']:>7.1f}"
             for b in suite.benchmarks]
    n = sum(r["n"] for r in res.values())
    rows.append(f"{'weighted avg':<{width}}  {n:>5}  {100 * out['weighted_avg']:>7.1f}")
    return "\n".join(rows)


def main_suite(args, overrides) -> int:
    """evaluate_suite, then the table on stdout; Ctrl-C is one line saying how to resume."""
    try:
        out = evaluate_suite(args, overrides)
    except KeyboardInterrupt:
        where = (f"the benchmarks done are in {args.json}; the same command resumes"
                 if args.json else "pass --json FILE to keep finished benchmarks")
        print(f"interrupted: {where}", file=sys.stderr)
        return 130  # 128 + SIGINT, as ada/preemption.py's exit codes
    print(table(SUITES[args.suite], out))
    return 0


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
        if args.suite:
            return main_suite(args, overrides)
        summary = evaluate_run(args, overrides)
    except (ConfigError, DataError, FileNotFoundError) as e:
        return fail(e)
    print(json.dumps(summary, indent=2, sort_keys=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
    return 0
