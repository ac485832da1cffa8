"""Records to prompt tokens under the run's template, and the warnings a data set earns
when it does not fit the run (prompts too long, text the tokenizer cannot read)."""

from __future__ import annotations

from ada.templates import encode_prompt
from ada.tokenizer import Tokenizer

UNKNOWN_WARN_SHARE = 0.01  # warn when more of a data set's tokens than this are unknown


def encode_records(records, tokenizer: Tokenizer, template: str, max_len: int,
                   instruction: str | None = None, tools=()) -> tuple[list[dict], list[int]]:
    """Attach `prompt_tokens` to each record; returns (the records that fit in max_len, the
    token lengths of those that do not). `tools`: a tool run's schemas, listed in the
    prompt's system turn (templates.encode_prompt)."""
    out, too_long = [], []
    for r in records:
        ids = encode_prompt(tokenizer, template, r["problem"], instruction, tools=tools)
        if len(ids) > max_len:
            too_long.append(len(ids))
            continue
        out.append(dict(r, prompt_tokens=ids))
    return out, too_long


def unknown_tokens_message(what: str, records: list[dict], tokenizer: Tokenizer) -> str | None:
    """A warning when more than UNKNOWN_WARN_SHARE of the encoded `records`' prompt tokens are
    the tokenizer's unknown token (text it cannot represent, which the model cannot read:
    e.g. GSM8K under a small SentencePiece trained on arithmetic); None otherwise."""
    unk = getattr(tokenizer, "unk_id", None)
    total = sum(len(r["prompt_tokens"]) for r in records)
    n = 0 if unk is None else sum(t == unk for r in records for t in r["prompt_tokens"])
    if not total or n <= UNKNOWN_WARN_SHARE * total:
        return None
    return (f"{n / total:.0%} of the {what}' tokens ({n} of {total}) are unknown to the tokenizer "
            f"({tokenizer.id_to_piece(unk)}): it cannot represent this text, so the model cannot "
            "read it and its scores mean little; use a tokenizer that covers the data "
            "(--config.tokenizer.path, or a model's with --config.model.path)")


def too_long_message(what: str, total: int, too_long: list[int], max_len: int, knob: str) -> str:
    return (f"{len(too_long)} of {total} {what} are longer than {max_len} prompt tokens (the "
            f"longest has {max(too_long)}) and are skipped; raise {knob}")
