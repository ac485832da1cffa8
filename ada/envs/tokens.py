"""A call format's markers as tokens: which strings a tokenizer must hold as one piece each,
and the token ids that end a policy turn.

The sampler ends a policy turn on one token id (the engine's `turn_end_ids`, decided on the
device beside EOS), so each of the format's `stops` must be exactly one token. A Qwen
tokenizer holds <tool_call> and </tool_call> as added tokens; the tiny SentencePiece of a
synthetic task holds a format's `markers` as user-defined symbols only in a run with tools
(ada.tokenizer.synthetic_tokenizer), so a run without tools keeps its tokenizer byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence

from ada.envs.parsers import TagFormat, make_format
from ada.envs.tools import TOOLS
from ada.errors import ConfigError


def run_format(tool_format: str):
    """The format called `tool_format` over every registered tool (what ToolEnv parses with)."""
    return make_format(tool_format, {t.tag: (t.name, t.main_arg) for t in TOOLS.values()})


def markers(tool_format: str) -> tuple[str, ...]:
    """The strings a tokenizer trained for `tool_format` holds as single pieces: each tool's
    opening and closing tag and the observation's <out> </out> (tags), or <tool_call> and
    </tool_call> (qwen). Every `stops` string of the format is one of them."""
    fmt = run_format(tool_format)
    if isinstance(fmt, TagFormat):
        return tuple(m for tag in fmt.tags for m in (f"<{tag}>", f"</{tag}>")) + fmt.out
    return (fmt.open, fmt.close)


def turn_end_ids(tokenizer, stops: Sequence[str], tool_format: str = "") -> tuple[int, ...]:
    """The token id of each of `stops` (a format's strings that end a turn at a call), in
    order. ConfigError, one line naming env.tool_format, when one is not exactly one token
    of `tokenizer` (a vocabulary piece, or a string that encodes to one id)."""
    ids = []
    for stop in stops:
        token_id = tokenizer.token_to_id(stop)
        if token_id is None:
            encoded = tokenizer.encode(stop)
            if len(encoded) != 1:
                pieces = " ".join(tokenizer.id_to_piece(i) for i in encoded)
                raise ConfigError(
                    f"env.tool_format={tool_format!r}: its turn-end marker {stop!r} is "
                    f"{len(encoded)} tokens of the tokenizer {tokenizer.path} ({pieces}), and a "
                    "turn ends on one token; use a tokenizer that holds it as one piece (a "
                    "synthetic task's own gets the markers when env.tools is set) or another "
                    "env.tool_format")
            token_id = encoded[0]
        ids.append(token_id)
    return tuple(ids)


__all__ = ["markers", "run_format", "turn_end_ids"]
