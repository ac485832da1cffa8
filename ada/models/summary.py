"""Describe a local Hugging Face checkpoint without reading its weights (`ada-inspect`).

Reads config.json and the safetensors headers only, so it is instant on a 7B checkpoint.
Reports family, architecture, parameter count, dtype, shape numbers, tying, shard count,
and whether ada can load it (the same header checks `load_hf` runs first).
"""

from __future__ import annotations

import json
import math
import os

from ada.models.hf import read_headers, validate_tensors, weight_files
from ada.models.hf_config import CheckpointError, config_from_hf, read_config

_DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def inspect_checkpoint(path: str | os.PathLike) -> dict:
    """A summary dict of the checkpoint at `path`; raises CheckpointError if it is unreadable.

    An unsupported but readable checkpoint gives `loadable: False` and the reason in `problem`.
    """
    path = os.fspath(path)
    raw, _ = _read_raw(path)
    files = weight_files(path)
    headers = read_headers(files)
    dtypes = sorted({_DTYPE_NAMES.get(dt, dt) for dt, _, _ in headers.values()})
    info = {
        "path": os.path.abspath(path),
        "architecture": (raw.get("architectures") or [None])[0],
        "model_type": raw.get("model_type"),
        "num_parameters": sum(math.prod(shape) for _, shape, _ in headers.values()),
        "num_tensors": len(headers),
        "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
        "num_shards": len(set(files.values())),
        "size_bytes": sum(os.path.getsize(f) for f in set(files.values())),
    }
    try:
        config = config_from_hf(raw)
        validate_tensors(config, headers)
    except CheckpointError as e:
        info.update(loadable=False, problem=str(e))
        return info
    info.update(loadable=True, **model_info(config))
    return info


def model_info(config) -> dict:
    """The shape numbers of a ModelConfig that `format_info` prints (an HF checkpoint's, or
    a run's: ada/cli/inspect_model.py)."""
    return dict(
        family=config.family,
        num_layers=config.num_layers,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        vocab_size=config.vocab_size,
        tied_embeddings=config.tie_embeddings,
        rope_theta=config.rope_theta,
        rope_scaling=config.rope_scaling.rope_type if config.rope_scaling else None,
        chat_templates=", ".join(config.row.chat_templates),  # for tokenizer.template
    )


def _read_raw(path):
    """config.json as a dict; unsupported configs still get described (the error comes later)."""
    try:
        return read_config(path)
    except CheckpointError as e:
        file = os.path.join(path, "config.json")
        if not os.path.isfile(file) or "malformed JSON" in str(e):
            raise
        with open(file) as f:
            return json.load(f), None


def _human(n: float) -> str:
    for unit in ("", "K", "M", "B"):
        if abs(n) < 1000:
            return f"{n:.3g}{unit}"
        n /= 1000
    return f"{n:.3g}T"


def format_info(info: dict) -> str:
    lines = [f"{'path':<18} {info['path']}"]
    order = ("method", "step", "checkpoint", "family", "architecture", "model_type", "num_parameters", "dtype", "num_layers",
             "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
             "vocab_size", "tied_embeddings", "rope_theta", "rope_scaling", "chat_templates", "num_tensors",
             "num_shards", "size_bytes", "loadable", "problem", "hf")
    for key in order:
        if key not in info:
            continue
        value = info[key]
        if key == "num_parameters":
            value = f"{value:,} ({_human(value)})"
        elif key == "size_bytes":
            value = f"{value:,} ({_human(value)}B)"
        lines.append(f"{key:<18} {value}")
    return "\n".join(lines)
