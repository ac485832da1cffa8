"""Hugging Face `config.json` <-> ModelConfig, with no weights involved.

The supported architectures are the rows of `ada.models.families` (FAMILIES):

  Qwen2ForCausalLM (Qwen2, Qwen2.5, Qwen2.5-Math)   -> "qwen2"
  Qwen3ForCausalLM                                 -> "qwen3"
  LlamaForCausalLM (Llama 3.x with llama3 RoPE)     -> "llama"
  Gemma2ForCausalLM                                -> "gemma2"
  Gemma3ForCausalLM (gemma3_text, e.g. Gemma 3 1B)  -> "gemma3"
  Gemma3ForConditionalGeneration (4B and up)       -> "gemma3": the text model only, from
                                                      `text_config` (the vision tower's
                                                      weights are skipped by ada.models.hf)

Gemma's local/global layers (`layer_types`, or the default pattern of `sliding_window_pattern`)
become `ModelConfig.sliding_windows`; keys a Gemma config.json may omit take transformers'
defaults (the published Gemma 3 `text_config`s omit most). A model is written back as the
text-only *ForCausalLM. Anything ada does not implement (other architectures or RoPE types,
sliding windows outside Gemma, extra biases) is rejected here, before `ada.models.hf` reads a
tensor, with a `CheckpointError` that names the file and key.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ada.models.families import FAMILIES
from ada.models.model_config import (
    LinearRopeScaling,
    Llama3RopeScaling,
    ModelConfig,
    gemma_windows,
)

CONFIG_FILE = "config.json"

ROPE_TYPES = ("default", "llama3")
GEMMA_ROPE_TYPES = ("default", "linear")  # linear on the global layers (Gemma 3 4B and up)


def _names(which: int) -> dict[str, tuple[str, bool]]:
    """The rows' HF architectures (which=0) or model_types (1) -> (family, multimodal: its
    text model under text_config), read at each call so that a row is all a family needs."""
    out = {}
    for name, f in FAMILIES.items():
        out[(f.hf_architecture, f.model_type)[which]] = (name, False)
        if f.multimodal:
            out[f.multimodal[which]] = (name, True)
    return out


class CheckpointError(ValueError):
    """A checkpoint directory or config that ada cannot load; the message names the fix."""


def _get_int(cfg: dict, key: str, source: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise CheckpointError(f"{source}: missing required key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{source}: {key!r} must be an integer, got {value!r}")
    return value


def _rope_dicts(cfg: dict, source: str, layer_types: tuple[str, ...]) -> tuple[dict, dict]:
    """The RoPE settings of the global and the sliding-window layers, from either spelling:
    `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5, theta inside, per
    layer type where the layer types differ); the newer spelling wins."""
    glob: dict[str, Any] = {}
    local: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise CheckpointError(f"{source}: {key!r} must be an object, got {value!r}")
        if value and all(isinstance(v, dict) for v in value.values()):  # per-layer-type form
            unknown = sorted(set(value) - set(layer_types))
            if unknown:
                raise CheckpointError(f"{source}: {key!r} has RoPE for layer types {unknown}; "
                                      f"this architecture has only {list(layer_types)}")
            glob.update(value.get("full_attention") or {})
            local.update(value.get("sliding_attention") or {})
        else:
            glob.update(value)
    return glob, local


def _rope_fields(cfg: dict, source: str) -> tuple[float, Llama3RopeScaling | None]:
    """RoPE theta and scaling from either spelling: `rope_theta` + `rope_scaling` (transformers
    4) or `rope_parameters` (transformers 5, theta inside). The newer spelling wins."""
    rope, _ = _rope_dicts(cfg, source, ("full_attention",))
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


def _text_config(cfg: dict, source: str) -> dict:
    """A Gemma3ForConditionalGeneration config's text model: its `text_config`, with the
    outer dtype and tying where the text config does not say."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError(f"{source}: a Gemma 3 multimodal config needs a 'text_config' object")
    outer = {k: cfg[k] for k in ("dtype", "torch_dtype", "tie_word_embeddings") if k in cfg}
    return {**outer, **text}


def _gemma_rope(cfg: dict, source: str):
    """(theta, scaling, local theta) of a Gemma config, from either spelling: transformers 4's
    rope_theta / rope_scaling (global layers) / rope_local_base_freq, or transformers 5's
    rope_parameters, per layer type for Gemma 3."""
    glob, local = _rope_dicts(cfg, source, ("full_attention", "sliding_attention"))
    theta = glob.get("rope_theta", cfg.get("rope_theta"))
    local_theta = local.get("rope_theta", cfg.get("rope_local_base_freq", theta))
    for name, value in (("rope_theta", theta), ("local rope_theta", local_theta)):
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise CheckpointError(f"{source}: {name} must be a positive number, got {value!r}")
    if local.get("rope_type", "default") != "default":
        raise CheckpointError(f"{source}: RoPE type {local['rope_type']!r} on the sliding layers "
                              "is not supported (only 'default')")
    rope_type = glob.get("rope_type", glob.get("type", "default"))
    if rope_type not in GEMMA_ROPE_TYPES:
        raise CheckpointError(f"{source}: RoPE type {rope_type!r} is not supported; supported "
                              f"types: {GEMMA_ROPE_TYPES}")
    scaling = None
    if rope_type == "linear":
        factor = glob.get("factor")
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 0:
            raise CheckpointError(f"{source}: linear RoPE scaling needs a positive 'factor'")
        scaling = LinearRopeScaling(float(factor))
    return float(theta), scaling, float(local_theta)


def _gemma_fields(cfg: dict, family: str, layers: int, source: str) -> dict:
    """The ModelConfig fields only Gemma sets."""
    act = cfg.get("hidden_activation") or cfg.get("hidden_act")
    if act != "gelu_pytorch_tanh":
        raise CheckpointError(f"{source}: hidden_activation {act!r} is not supported "
                              "(only 'gelu_pytorch_tanh')")
    if cfg.get("use_bidirectional_attention"):
        raise CheckpointError(f"{source}: use_bidirectional_attention=true is not supported")
    window = _get_int(cfg, "sliding_window", source)
    layer_types = cfg.get("layer_types")
    if layer_types:
        if len(layer_types) != layers:
            raise CheckpointError(f"{source}: layer_types has {len(layer_types)} entries for "
                                  f"num_hidden_layers={layers}")
        other = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if other:
            raise CheckpointError(f"{source}: layer_types {other} not supported")
        windows = tuple(window if t == "sliding_attention" else None for t in layer_types)
    else:
        pattern = _get_int(cfg, "sliding_window_pattern", source, FAMILIES[family].layer_pattern)
        windows = gemma_windows(family, layers, window, pattern)
    theta, scaling, local_theta = _gemma_rope(cfg, source)
    caps = {}
    for key, field in (("attn_logit_softcapping", "attn_logit_softcap"),
                       ("final_logit_softcapping", "final_logit_softcap"),
                       ("query_pre_attn_scalar", "query_pre_attn_scalar")):
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise CheckpointError(f"{source}: {key!r} must be a number or null, got {value!r}")
        caps[field] = None if value is None else float(value)
    return dict(sliding_windows=windows, rope_theta=theta, rope_scaling=scaling,
                rope_local_theta=local_theta if FAMILIES[family].local_rope else None, **caps)


def config_from_hf(cfg: dict, source: str = CONFIG_FILE) -> ModelConfig:
    """Map a supported `config.json` dict (module docstring) to a ModelConfig, rejecting what
    ada does not implement (other architectures, RoPE types, sliding windows outside Gemma,
    extra biases)."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
    architectures = _names(0)
    supported = ", ".join(architectures)
    archs = cfg.get("architectures")
    model_type = cfg.get("model_type")
    if archs:
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise CheckpointError(f"{source}: 'architectures' must be a list of names, got {archs!r}")
        known = [a for a in archs if a in architectures]
        if not known:
            raise CheckpointError(
                f"{source}: unsupported architecture {archs}; supported: {supported}"
            )
        family, multimodal = architectures[known[0]]
        row = FAMILIES[family]
        expected = row.multimodal[1] if multimodal else row.model_type
        if model_type is not None and model_type != expected:
            raise CheckpointError(
                f"{source}: model_type {model_type!r} does not match architecture {known[0]} "
                f"(expected model_type {expected!r})"
            )
    elif model_type in (types := _names(1)):
        family, multimodal = types[model_type]
    else:
        raise CheckpointError(
            f"{source}: no 'architectures' and unknown model_type {model_type!r}; "
            f"supported: {supported}"
        )
    row = FAMILIES[family]
    if multimodal:
        cfg = _text_config(cfg, source)
    cfg = {**row.hf_defaults, **cfg}

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
    if act != "silu" and not row.gemma:
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
    if cfg.get("use_sliding_window"):
        raise CheckpointError(
            f"{source}: use_sliding_window=true is not supported; ada implements full attention "
            "only (set use_sliding_window=false if the model was trained without it)"
        )
    for key, off in row.off_keys.items():
        if cfg.get(key):
            raise CheckpointError(f"{source}: {key}={json.dumps(cfg[key])} is not supported for "
                                  f"{family} (ada's {family} block does not implement it; "
                                  f"{json.dumps(off)} turns it off)")
    layer_types = cfg.get("layer_types") or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    layers = _get_int(cfg, "num_hidden_layers", source)
    if row.gemma:
        gemma = _gemma_fields(cfg, family, layers, source)
    elif other:
        raise CheckpointError(f"{source}: layer_types {other} not supported (only full_attention)")
    else:
        theta, scaling = _rope_fields(cfg, source)
        gemma = dict(rope_theta=theta, rope_scaling=scaling)
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
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(eps),
            qkv_bias=row.qkv_bias,
            qk_norm=row.qk_norm,
            tie_embeddings=tie,
            max_position_embeddings=_get_int(cfg, "max_position_embeddings", source, 32768),
            dtype=dtype,
            param_dtype=dtype,
            **gemma,
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None


def config_to_hf(config: ModelConfig, dtype: str | None = None) -> dict:
    """The `config.json` dict for `config` (both RoPE spellings, so transformers 4 and 5 read it)."""
    c = config
    if c.gemma:
        return _gemma_to_hf(c, dtype)
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
        "architectures": [c.row.hf_architecture],
        "model_type": c.row.model_type,
        **_shapes(c),
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
    return out | c.row.off_keys


def _shapes(c: ModelConfig) -> dict:
    """The config.json keys of a model's sizes, the same for every family."""
    return {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim}


def _int_if_whole(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x  # transformers' Gemma configs want an int


def _gemma_to_hf(c: ModelConfig, dtype: str | None) -> dict:
    """A Gemma 2 or text-only Gemma 3 (Gemma3ForCausalLM) config.json."""
    sizes = {w for w in c.layer_windows if w is not None}
    if len(sizes) > 1:
        raise ValueError(f"sliding_windows {c.sliding_windows}: a Gemma config.json has one "
                         "sliding_window for every local layer")
    scaling = None if c.rope_scaling is None else {"rope_type": "linear",
                                                    "factor": c.rope_scaling.factor}
    if c.rope_scaling is not None and not isinstance(c.rope_scaling, LinearRopeScaling):
        raise ValueError(f"{c.family}: RoPE scaling {c.rope_scaling} has no Gemma spelling")
    rope_global = {"rope_type": "default", **(scaling or {}), "rope_theta": c.rope_theta}
    local_theta = c.rope_local_theta or c.rope_theta
    out = {
        "architectures": [c.row.hf_architecture],
        "model_type": c.row.model_type,
        **_shapes(c),
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": scaling,
        "query_pre_attn_scalar": _int_if_whole(c.query_pre_attn_scalar or c.head_dim),
        "sliding_window": sizes.pop() if sizes else 4096,
        "layer_types": ["full_attention" if w is None else "sliding_attention"
                        for w in c.layer_windows],
        "attn_logit_softcapping": c.attn_logit_softcap,
        "final_logit_softcapping": c.final_logit_softcap,
        "tie_word_embeddings": c.tie_embeddings,
        "attention_dropout": 0.0,
        "use_cache": True,
        "dtype": dtype or c.param_dtype,
        "torch_dtype": dtype or c.param_dtype,
    }
    if not c.row.local_rope:
        if c.rope_scaling is not None or c.rope_local_theta not in (None, c.rope_theta):
            raise ValueError(f"{c.family}: one RoPE for every layer (no scaling, no local base)")
        out["rope_parameters"] = rope_global
    else:
        out["rope_local_base_freq"] = local_theta
        out["rope_parameters"] = {"full_attention": rope_global, "sliding_attention": {
            "rope_type": "default", "rope_theta": local_theta}}
    return out | c.row.off_keys


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
    "CheckpointError", "check_vocab", "config_from_hf", "config_to_hf",
    "read_config",
]
