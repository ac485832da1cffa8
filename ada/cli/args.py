"""What the command lines share: one flag style (`--max_new_tokens`; `Parser` keeps the
`--max-new-tokens` spelling as an alias), the column options of a prompt file
(evaluate and the difficulty filter read the files training reads), and a data fault as one
line naming the flag that fixes it."""

from __future__ import annotations

import argparse
import os
import sys

from ada.config import ConfigError

ALIASES = "Flags are written --a_b; --a-b is the same flag."


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that takes `--a-b` for `--a_b` and back where only the other
    spelling is a flag (the dashes were difficulty's and plan's style, underscores the rest's)."""

    def parse_known_args(self, args=None, namespace=None):
        known = {s for a in self._actions for s in a.option_strings}
        out = []
        for arg in sys.argv[1:] if args is None else args:
            flag, eq, value = arg.partition("=")
            if flag.startswith("--") and flag not in known:
                flag = next((f"--{other}" for other in (flag[2:].replace("-", "_"),
                                                        flag[2:].replace("_", "-"))
                             if f"--{other}" in known), flag)
            out.append(flag + eq + value)
        return super().parse_known_args(out, namespace)


def check_values(args, counts: tuple[str, ...]) -> None:
    """The numbers no command honours, refused before anything loads: a count (`counts`,
    the flags' dests) below 1, a negative --temperature."""
    for name in counts:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name} must be >= 1 (got {value})")
    temperature = getattr(args, "temperature", None)
    if temperature is not None and temperature < 0:
        raise ConfigError(f"--temperature {temperature} must be >= 0 (0: greedy)")


def add_columns(parser: argparse.ArgumentParser, default: str) -> None:
    """--problem_key / --answer_key / --answer_format: data.problem_key and friends."""
    parser.add_argument("--problem_key", default=None,
                        help=f"the column holding the problem (default: {default}, else 'problem')")
    parser.add_argument("--answer_key", default=None,
                        help=f"the column holding the reference answer (default: {default}, "
                             "else 'answer')")
    parser.add_argument("--answer_format", choices=("plain", "gsm8k"), default="plain",
                        help="gsm8k: the answer is the text after the last '####' (GSM8K's "
                             "'question'/'answer' files: --problem_key question "
                             "--answer_format gsm8k)")


def load_file(flag: str, path: str, args, problem_key: str = "problem",
              answer_key: str = "answer") -> list[dict]:
    """The records of a prompt file by the command line's columns (`add_columns`; the keys
    given here where a flag is unset); a fault is one line naming the flag that fixes it."""
    from ada.data.sources import DataError, RecordFormat, load_records

    fmt = RecordFormat(problem_key=args.problem_key or problem_key,
                       answer_key=args.answer_key or answer_key,
                       answer_format=args.answer_format)
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path}: no such file")
    try:
        return load_records(path, fmt)
    except DataError as e:
        fix = f"pass --{e.key} with the column that holds it" if e.key else "fix the file"
        raise ConfigError(f"{flag} {e.problem}; {fix}") from None
