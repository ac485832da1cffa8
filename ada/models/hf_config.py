"""Hugging Face `config.json` <-> ModelConfig, with no weights involved.

Three supported architectures map to the families of `ada.models.transformer`:

  Qwen2ForCausalLM (Qwen2, Qwen2.5, Qwen2.5-Math)   -> "qwen2"
  Qwen3ForCausalLM                                 -> "qwen3"
  LlamaForCausalLM (Llama 3.x with llama3 RoPE)     -> "llama"

Anything ada does not implement (other architectures or RoPE types, sliding windows, extra
biases) is rejected here, before `ada.models.hf` reads a tensor, with a `CheckpointError` that
names the file and key.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ada.models.transformer import Llama3RopeScaling, ModelConfig

CONFIG_FILE = "config.json"

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}
FAMILY_ARCHITECTURE = {family: arch for arch, family in ARCHITECTURES.items()}
ROPE_TYPES = ("default", "llama3")


class CheckpointError(ValueError):
    """A checkpoint directory or config that ada cannot load; the message names the fix."""


def _get_int(cfg: dict, key: str, source: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise CheckpointError(f"{source}: missing required key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{source}: {key!r} must be an integer, got {value!r}")
    return value


def _rope_fields(cfg: dict, source: str) -> tuple[float, Llama3RopeScaling | None]:
    """RoPE theta and scaling from either spelling: `rope_theta` + `rope_scaling` (transformers
    4) or `rope_parameters` (transformers 5, theta inside). The newer spelling wins."""
    rope: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise CheckpointError(f"{source}: {key!r} must be an object, got {value!r}")
        if value and all(isinstance(v, dict) for v in value.values()):  # per-layer-type form
            if set(value) != {"full_attention"}:
                raise CheckpointError(
                    f"{source}: {key!r} has per-layer-type RoPE {sorted(value)}; only "
                    "'full_attention' is supported"
                )
            value = value["full_attention"]
        rope.update(value)
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise CheckpointError(f"{source}: rope_theta must be a positive number, got {theta!r}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise CheckpointError(
            f"{source}: RoPE type {rope_type!r} is not supported; supported types: {ROPE_TYPES}"
        )
    fields = {}
    for name in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if name not in rope:
            raise CheckpointError(f"{source}: llama3 RoPE scaling is missing {name!r}")
        fields[name] = rope[name]
    fields["original_max_position_embeddings"] = int(fields["original_max_position_embeddings"])
    return float(theta), Llama3RopeScaling(**{k: v if k.startswith("orig") else float(v)
                                               for k, v in fields.items()})


def _checkpoint_dtype(cfg: dict, source: str) -> str:
    """ada param dtype for the config's `dtype`/`torch_dtype`; float16 is upcast to float32."""
    name = cfg.get("dtype", cfg.get("torch_dtype"))
    if name is None:
        return "float32"
    name = str(name).removeprefix("torch.")
    if name in ("float32", "float16", "float"):
        return "float32"
    if name == "bfloat16":
        return "bfloat16"
    raise CheckpointError(f"{source}: dtype {name!r} is not supported (float32, bfloat16, float16)")


def config_from_hf(cfg: dict, source: str = CONFIG_FILE) -> ModelConfig:
    """Map a Qwen2/Qwen3/Llama `config.json` dict to a ModelConfig, rejecting what ada does not
    implement (other architectures, RoPE types, sliding windows, extra biases)."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
    supported = ", ".join(ARCHITECTURES)
    archs = cfg.get("architectures")
    model_type = cfg.get("model_type")
    if archs:
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise CheckpointError(f"{source}: 'architectures' must be a list of names, got {archs!r}")
        known = [a for a in archs if a in ARCHITECTURES]
        if not known:
            raise CheckpointError(
                f"{source}: unsupported architecture {archs}; supported: {supported}"
            )
        family = ARCHITECTURES[known[0]]
        if model_type is not None and model_type != family:
            raise CheckpointError(
                f"{source}: model_type {model_type!r} does not match architecture {known[0]} "
                f"(expected model_type {family!r})"
            )
    elif model_type in FAMILY_ARCHITECTURE:
        family = model_type
    else:
        raise CheckpointError(
            f"{source}: no 'architectures' and unknown model_type {model_type!r}; "
            f"supported: {supported}"
        )

    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads")
    missing = [k for k in required if cfg.get(k) is None]
    if missing:
        raise CheckpointError(f"{source}: missing required key(s) {missing}")
    hidden = _get_int(cfg, "hidden_size", source)
    heads = _get_int(cfg, "num_attention_heads", source)
    kv_heads = _get_int(cfg, "num_key_value_heads", source, default=heads)
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise CheckpointError(
                f"{source}: no 'head_dim' and hidden_size={hidden} is not divisible by "
                f"num_attention_heads={heads}"
            )
        head_dim = hidden // heads
    head_dim = _get_int({"head_dim": head_dim}, "head_dim", source)

    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
    if family in ("qwen3", "llama") and cfg.get("attention_bias"):
        raise CheckpointError(
            f"{source}: attention_bias=true is not supported for {family} (ada has no q/k/v/o "
            "bias for this family)"
        )
    if family == "llama" and cfg.get("mlp_bias"):
        raise CheckpointError(f"{source}: mlp_bias=true is not supported (ada's MLP has no bias)")
    if cfg.get("use_sliding_window"):
        raise CheckpointError(
            f"{source}: use_sliding_window=true is not supported; ada implements full attention "
            "only (set use_sliding_window=false if the model was trained without it)"
        )
    layer_types = cfg.get("layer_types") or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise CheckpointError(f"{source}: layer_types {other} not supported (only full_attention)")

    theta, scaling = _rope_fields(cfg, source)
    eps = cfg.get("rms_norm_eps", 1e-6)
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise CheckpointError(f"{source}: tie_word_embeddings must be true or false, got {tie!r}")
    dtype = _checkpoint_dtype(cfg, source)
    try:
        return ModelConfig(
            family=family,
            vocab_size=_get_int(cfg, "vocab_size", source),
            hidden_size=hidden,
            intermediate_size=_get_int(cfg, "intermediate_size", source),
            num_layers=_get_int(cfg, "num_hidden_layers", source),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=float(eps),
            qkv_bias=family == "qwen2",
            qk_norm=family == "qwen3",
            tie_embeddings=tie,
            max_position_embeddings=_get_int(cfg, "max_position_embeddings", source, 32768),
            dtype=dtype,
            param_dtype=dtype,
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None


def config_to_hf(config: ModelConfig, dtype: str | None = None) -> dict:
    """The `config.json` dict for `config` (both RoPE spellings, so transformers 4 and 5 read it)."""
    c = config
    rope_params: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
    legacy_scaling = None
    if c.rope_scaling is not None:
        s = c.rope_scaling
        legacy_scaling = {
            "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
        rope_params = {**legacy_scaling, "rope_theta": c.rope_theta}
    out = {
        "architectures": [FAMILY_ARCHITECTURE[c.family]],
        "model_type": c.family,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": legacy_scaling,
        "rope_parameters": rope_params,
        "tie_word_embeddings": c.tie_embeddings,
        "attention_dropout": 0.0,
        "use_cache": True,
        "dtype": dtype or c.param_dtype,
        "torch_dtype": dtype or c.param_dtype,
    }
    if c.family in ("qwen3", "llama"):
        out["attention_bias"] = False
    if c.family == "llama":
        out["mlp_bias"] = False
    else:
        out["use_sliding_window"] = False
    return out


def read_config(path: str | os.PathLike) -> tuple[dict, ModelConfig]:
    """The raw config.json dict of a checkpoint directory and its ModelConfig."""
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory (expected a Hugging Face checkpoint dir)")
    if not os.path.isfile(file):
        raise CheckpointError(f"{file}: missing; a checkpoint directory needs config.json")
    try:
        with open(file) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    return raw, config_from_hf(raw, source=file)


def check_vocab(config: ModelConfig, tokenizer_vocab_size: int) -> None:
    """Raise if the tokenizer can emit ids past the embedding. Fewer tokens than embedding rows
    is fine (Qwen pads its vocabulary to a multiple of 128)."""
    if tokenizer_vocab_size > config.vocab_size:
        raise CheckpointError(
            f"tokenizer has {tokenizer_vocab_size} tokens but the model's embedding has "
            f"{config.vocab_size} rows; ids >= {config.vocab_size} would index past it. Use the "
            "tokenizer that belongs to this checkpoint (or a model with vocab_size >= "
            f"{tokenizer_vocab_size})"
        )


__all__ = [
    "ARCHITECTURES", "CheckpointError", "check_vocab", "config_from_hf", "config_to_hf",
    "read_config",
]
