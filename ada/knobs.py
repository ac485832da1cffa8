"""Every knob of a run config: its default, its description and its former names.

A knob is defined once, in `configs/common.py: base()`, with its default and a comment on
its line (or the comment lines right above it) that says what it is; `describe` prints a
config as plain `key = value  # description` lines from those (what --print_config shows).
`RENAMED` maps the keys of older run configs to today's (ada/config.py: load_run_config).
"""

from __future__ import annotations

import ast
import functools
import inspect
import io
import tokenize

import ml_collections

# Knobs renamed since runs started saving config.json: old key -> new key. A run directory
# written before a rename still loads (load_run_config); --config.OLD names the new key.
# (optim.dual_clip <= 1 disabled the dual clip; loss.dual_clip = 0 does.)
RENAMED = {
    **{f"optim.{k}": f"loss.{k}" for k in ("clip_low", "clip_high", "dual_clip", "loss_agg",
                                            "entropy_coef", "kl_coef", "kl_estimator")},
    **{f"optim.{k}": f"train.{k}" for k in ("epochs", "mini_batches", "micro_batches")},
    "data.difficulty": "data.level_mix",
}


def base_config() -> ml_collections.ConfigDict:
    """configs/common.py: base(), every knob with its default."""
    from configs import common  # the top-level package installed beside ada

    return common.base()


def leaves(config: ml_collections.ConfigDict, prefix: str = ""):
    """(dotted key, value) of every leaf ('adaptive.n', 4), in definition order."""
    for k, v in config.items():
        if isinstance(v, ml_collections.ConfigDict):
            yield from leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


@functools.lru_cache(maxsize=1)
def knob_notes() -> dict[str, str]:
    """{dotted knob: its one-line description}, in definition order: the comment on the
    knob's line in configs/common.py base(), else the comment lines right above it."""
    from configs import common

    source = inspect.getsource(common.base)
    lines = source.splitlines()
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            comments[row] = (tok.string.lstrip("#").strip(), not lines[row - 1][:col].strip())
    notes = {}  # in definition order
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        key = ast.unparse(node.targets[0])
        if not key.startswith("c.") or "ConfigDict" in ast.unparse(node.value):
            continue  # not a knob: a section
        text, alone = comments.get(node.end_lineno, ("", True))
        if alone:  # no comment on its line: the block right above it
            above, row = [], node.lineno - 1
            while row in comments and comments[row][1]:
                above.insert(0, comments[row][0])
                row -= 1
            text = " ".join(above)
        notes[key[2:]] = text
    return notes


def _plain(value) -> str:
    return repr(tuple(value)) if isinstance(value, list) else repr(value)


def describe(config: ml_collections.ConfigDict, *, diff: bool = False) -> str:
    """The config as plain `key = value  # what it is` lines, one knob a line, in base()'s
    order (what --print_config prints); `diff=True`: only the knobs whose value differs
    from base()."""
    base = dict(leaves(base_config()))
    notes = knob_notes()
    values = dict(leaves(config))
    out = []
    for key in [k for k in notes if k in values] + sorted(set(values) - set(notes)):
        value = values[key]
        if diff and key in base and _plain(base[key]) == _plain(value):
            continue
        note = notes.get(key)
        out.append(f"{key} = {_plain(value)}" + (f"  # {note}" if note else ""))
    return "\n".join(out)
