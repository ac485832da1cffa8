"""Every knob of a run config: its default, its description and its former names.

A knob is defined once, in `configs/common.py: base()`, with its default and a comment on
its line (or the comment lines right above it) that says what it is; `describe` prints a
config as plain `key = value  # description` lines from those (what --print_config shows).
`RENAMED` maps the keys of older run configs to today's (ada/config.py: load_run_config).
`resume_changes` sorts what a resumed run's config changes from the run's saved one: what
may change (SAFE_ON_RESUME: length, evaluation, logging, checkpoint cadence) and what may not
without --force_config (everything else: HELD_BY_CHECKPOINT, what the checkpoint holds or
what gives its counters their meaning, and the rest of the training recipe).
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


# Knobs (a key, or a section ending in '.') a resume may change: recorded, never refused.
# (env.sandbox_url: where the python tool's code runs, which a restarted pod may move.)
SAFE_ON_RESUME = ("train.steps", "eval.", "log.", "checkpoint.", "distributed.",
                  "warmstart.cache_dir", "data.eval_path", "data.num_eval",
                  "optim.max_skipped_in_row", "env.sandbox_url")
# Knobs whose change makes the checkpoint mean something else (its params' shapes and
# vocabulary, the optimizer state's tree, the data-iterator position): refused on resume.
HELD_BY_CHECKPOINT = ("seed", "method", "model.", "tokenizer.", "optim.", "data.", "warmstart.",
                      "mesh.")


def _matches(key: str, patterns) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in patterns)


def resume_changes(saved: ml_collections.ConfigDict, new: ml_collections.ConfigDict):
    """(refused, allowed): the knobs `new` changes from `saved`, as (key, saved value, new
    value) in base()'s order; allowed are SAFE_ON_RESUME's, refused all others, the ones
    HELD_BY_CHECKPOINT first."""
    old, now = dict(leaves(saved)), dict(leaves(new))
    diff = [(k, old.get(k), now.get(k)) for k in list(now) + [k for k in old if k not in now]
            if _plain(old.get(k)) != _plain(now.get(k))]
    allowed = [d for d in diff if _matches(d[0], SAFE_ON_RESUME)]
    refused = [d for d in diff if d not in allowed]
    refused.sort(key=lambda d: not _matches(d[0], HELD_BY_CHECKPOINT))
    return refused, allowed


def refusal(workdir: str, refused) -> str:
    """One line: what differs, why it matters, and the two ways on."""
    key, old, new = refused[0]
    more = f" (and {len(refused) - 1} more: {', '.join(k for k, _, _ in refused[1:4])})" \
        if len(refused) > 1 else ""
    why = ("changes what its checkpoints hold" if _matches(key, HELD_BY_CHECKPOINT) else
           "changes how it trains")
    return (f"{workdir} was trained with {key}={_plain(old)}; this command has {key}="
            f"{_plain(new)}{more}, which {why}. Start a new run with another --workdir, or pass "
            "--force_config to resume with the new settings anyway (recorded in "
            "config_history.jsonl)")


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
