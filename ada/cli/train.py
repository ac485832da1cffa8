"""`python -m ada.runner` (`ada-train`): train from a config, or run a sweep (`--sweep`).

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
from ada.config import DEFAULT_CONFIG, ConfigError, fail

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


def main(argv: Sequence[str] | None = None) -> int:
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
        p.add_argument("--print_config", action="store_true",
                       help="print every knob of the resolved config, one a line with what it "
                            "does, and exit")
        p.add_argument("--diff", action="store_true",
                       help="with --print_config: only the knobs that differ from "
                            "configs/common.py base()")
        args = p.parse_args(rest)
        if args.sweep:
            return sweep(args.sweep, args.workdir, overrides, print_only=args.print)
        config = cfglib.build_config(args.config, overrides)
        if args.print_config:
            print(cfglib.describe(config, diff=args.diff))
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
