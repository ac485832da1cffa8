"""`python -m ada.runner` (`ada-train`): train from a config, or run a sweep (`--sweep`).

Every user error (a bad config, path, data file or flag, or a resume whose config changes
what the run's checkpoints hold) ends the command with one line, `error: ...` naming the
thing and the fix, and exit code 2, before anything compiles; a start that fails leaves no
empty output directory behind. A run that cannot go on (a full disk, non-finite updates)
ends with one line and exit code 1. SIGTERM and SIGINT (Ctrl-C) before training (from the
first instant: the handler is installed before anything heavy is imported) end the command at
once with one line; during training the first says at once which step the run stops after,
and it stops there with a checkpoint and one line saying how to resume (exit 143, the
"restart me" code, and 130; a second signal: at once); exit 0 means train.steps was reached
(ada/preemption.py). `--print` validates and prints the command(s), and runs nothing.
In a multi-process run a process that fails tells the others, which stop within seconds; a
lost one ends them within distributed.timeout_s (ada/watch.py, docs/reliability.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import warnings
from collections.abc import Sequence

from ada.preemption import Preemption, exit_code  # the standard library only: installed first

TRAIN_EPILOG = """examples:
  python -m ada.runner --workdir runs/default                   # the embedded default
  python -m ada.runner --config configs/default.py:grpo --workdir runs/grpo
  python -m ada.runner --config configs/qwen25_math_7b.py:ada_balance --workdir runs/q7b \\
      --config.model.path=/models/Qwen2.5-Math-7B --config.train.steps=300
  python -m ada.runner --config configs/default.py --print_config   # see every knob
  python -m ada.runner --config configs/default.py:grpo --workdir runs/grpo --print  # dry run
  python -m ada.runner --sweep configs/sweep_methods.py:0,1 --workdir runs/sweep --print

Any config value can be overridden with --config.a.b=value. Methods (the :arg of a
config file, or --config.method): grpo, dapo, ada_pos, ada_balance, exhaustive (see
ada/methods.py). A rerun with the same --workdir resumes from its latest complete
checkpoint; it may change train.steps, eval.*, log.* and checkpoint.* (recorded in
config_history.jsonl), anything else only with --force_config.

Exit codes: 0 train.steps reached; 143 stopped by SIGTERM, checkpointed: rerun the same
command to resume (the "restart me" code); 130 stopped by Ctrl-C; 1 a crash, or a failed or
lost process of a multi-process run; 2 bad input (docs/reliability.md)."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["python", "-m", "ada.runner", *argv])
    # a signal from now until training: one line, exit 143 / 130 (`import jax` takes seconds)
    preemption = Preemption(command).install()
    try:
        return parse_and_run(argv, command, preemption)
    finally:
        if preemption.signum is None:  # after a stop, a second signal still exits at once
            preemption.uninstall()


def parse_and_run(argv: list[str], command: str, preemption: Preemption) -> int:
    from ada import config as cfglib
    from ada.config import DEFAULT_CONFIG, ConfigError, fail

    try:
        overrides, rest = cfglib.parse_override_args(argv)
        p = argparse.ArgumentParser(prog="python -m ada.runner",
                                    description="Train with Reinforce-Ada / GRPO from a config file.",
                                    epilog=TRAIN_EPILOG,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--config", default=DEFAULT_CONFIG,
                       help="configs/FILE.py[:arg] (default: configs/default.py, the embedded default)")
        p.add_argument("--workdir", help="output directory (metrics, checkpoints, plots)")
        p.add_argument("--sweep", help="configs/sweep_*.py[:arg]: run each point (or --print the "
                                        "commands)")
        p.add_argument("--print", action="store_true",
                       help="validate and print the command (with --sweep: one per point), run "
                            "nothing")
        p.add_argument("--print_config", action="store_true",
                       help="print every knob of the resolved config, one a line with what it "
                            "does, and exit")
        p.add_argument("--diff", action="store_true",
                       help="with --print_config: only the knobs that differ from "
                            "configs/common.py base()")
        p.add_argument("--force_config", action="store_true",
                       help="resume a run with settings that change its recipe or what its "
                            "checkpoints hold (recorded in config_history.jsonl)")
        args = p.parse_args(rest)
        if args.diff and not args.print_config:
            raise ConfigError("--diff only works with --print_config (--print_config --diff "
                              "lists the knobs that differ from configs/common.py base())")
        if args.sweep:
            cmds = sweep_commands(args.sweep, args.workdir, overrides)
            if args.print:
                print("\n".join(shlex.join(cmd) for cmd in cmds))
                return 0
            preemption.uninstall()  # each point handles its own signals
            return run_sweep(cmds)
        config = cfglib.build_config(args.config, overrides)
        if args.print_config:
            print(cfglib.describe(config, diff=args.diff))
            return 0
        if not args.workdir:
            raise ConfigError("no output directory; pass --workdir DIR (e.g. --workdir runs/default)")
        existed = os.path.exists(args.workdir)
        cfglib.validate(config, args.workdir)
    except ConfigError as e:
        return fail(e)
    try:
        if args.print:
            extra = ["--force_config"] if args.force_config else []
            print(shlex.join(run_command(args.config, overrides, args.workdir, extra)))
            return 0
        return run(config, args, command, preemption)
    finally:
        if not existed:
            remove_if_empty(args.workdir)


def run_command(spec: str, overrides, workdir: str, extra: Sequence[str] = ()) -> list[str]:
    """The command line that trains config `spec` with `overrides` in `workdir`."""
    from ada import config as cfglib

    return [sys.executable, "-m", "ada.runner", "--config", spec,
            *cfglib.overrides_to_args(dict(overrides)), *extra, "--workdir", workdir]


def run(config, args, command: str, preemption: Preemption) -> int:
    """Train in this process, with the signal handling, the watch of the other processes and
    the one-line stops of the module docstring."""
    from ada import distributed, quiet, watch
    from ada.checkpoint import StorageError
    from ada.config import ConfigError, fail
    from ada.loop import train
    from ada.run.trainer import RunError

    preemption.budget_s = config.checkpoint.preemption_budget_s
    preemption.watched()  # a signal now: exit at once, and tell the run's other processes
    quiet.quiet_start()  # the quiet logging every command shares, JAX on the CPU without an accelerator
    # an absurd optim.lr overflows float32 when compiled; the loop reports what follows in one line
    warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
    try:
        distributed.initialize(timeout_s=config.distributed.timeout_s)
        import jax

        jax.devices()  # the backends start (libtpu installs its signal handler) ...
        preemption.install()  # ... and ours win
        summary = train(config, args.workdir, force_config=args.force_config,
                        preemption=preemption)
    except ConfigError as e:
        code = fail(e)
        watch.fail(code, str(e))
        return code
    except StorageError as e:
        print(f"error: {e}, then rerun {command} to resume from {e.resume}", file=sys.stderr)
        # orbax's abandoned write tasks hold the same failure: asyncio would log each one
        # ("Task exception was never retrieved") when they are collected, after our line
        logging.getLogger("asyncio").disabled = True
        watch.fail(1, str(e))
        return 1
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        watch.fail(1, str(e))
        return 1
    except Exception as e:
        watch.crash(e)  # another process's failure or loss, when it was the cause, ends this one
        raise
    preemption.done()
    if summary.get("stopped"):
        if distributed.is_main():
            where = (f"checkpoint {summary['checkpoint']}" if summary["checkpoint"] else
                     "no checkpoint yet")
            print(f"{summary['stopped']}: stopped after step {summary['steps']} ({where}); "
                  f"resume with: {command}", file=sys.stderr)
        return exit_code(signal.Signals[summary["stopped"]])  # the agreed signal's
    if distributed.is_main():
        print(json.dumps(summary, default=str))
    if preemption.signum is not None:  # after the last step (the final save, the export):
        name = signal.Signals(preemption.signum).name  # the run is whole; a sweep still stops
        print(f"{name}: received after the run's last step; the run is complete",
              file=sys.stderr)
        return exit_code(preemption.signum)
    return 0


def remove_if_empty(workdir: str) -> None:
    """Remove a directory tree this command made that holds no file."""
    if os.path.isdir(workdir) and not any(files for _, _, files in os.walk(workdir)):
        shutil.rmtree(workdir, ignore_errors=True)


def sweep_name(overrides: dict) -> str:
    """A directory-safe name for one sweep point ('method=grpo,seed=1')."""
    text = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in overrides.items()) or "base"
    return "".join(c if c.isalnum() or c in "=,._-" else "_" for c in text)


def sweep_commands(spec: str, workdir: str | None, overrides) -> list[list[str]]:
    """One `python -m ada.runner` per point of sweep file `spec`, each validated."""
    from ada import config as cfglib
    from ada.config import ConfigError

    if not workdir:
        raise ConfigError("--sweep needs --workdir (each run goes to a subdirectory)")
    base, runs = cfglib.load_sweep(spec)
    cmds = []
    for r in runs:
        wd = os.path.join(workdir, sweep_name(r))
        point = [*cfglib.parse_override_args(cfglib.overrides_to_args(r))[0], *overrides]
        cfglib.validate(cfglib.build_config(base, point), wd)
        cmds.append(run_command(base, point, wd))
    return cmds


def run_sweep(cmds: list[list[str]]) -> int:
    """Run the points one after another; a point that does not end with exit 0 (130: it was
    interrupted) ends the sweep with its code."""
    # Ctrl-C reaches the run (the terminal signals the whole process group), which says and
    # does what it does alone; the sweep then stops with it, without a traceback of its own
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for cmd in cmds:
            print("+", shlex.join(cmd), flush=True)
            rc = subprocess.call(cmd, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                       signal.SIG_DFL))
            if rc:
                return rc
    finally:
        signal.signal(signal.SIGINT, previous)
    return 0
