"""Hugging Face interop: read and write local HF checkpoint directories (no hub, no torch).

A checkpoint directory holds `config.json` and either `model.safetensors` or a sharded
`model.safetensors.index.json` plus its shard files. Three supported architectures map to
the families of `ada.models.transformer`:

  Qwen2ForCausalLM (Qwen2, Qwen2.5, Qwen2.5-Math)   -> "qwen2"
  Qwen3ForCausalLM                                 -> "qwen3"
  LlamaForCausalLM (Llama 3.x with llama3 RoPE)     -> "llama"

Name map (HF stores linear weights [out, in]; ada stores [in, out] stacked over layers):

  model.embed_tokens.weight [V, D]            -> embed [V, D]
  model.norm.weight                           -> final_norm
  lm_head.weight [V, D]                       -> lm_head [D, V]   (absent when tied)
  model.layers.{i}.input_layernorm.weight     -> layers/attn_norm[i]
  model.layers.{i}.post_attention_layernorm.* -> layers/mlp_norm[i]
  model.layers.{i}.self_attn.{q,k,v,o}_proj.weight -> layers/{q,k,v,o}[i] (transposed)
  model.layers.{i}.self_attn.{q,k,v}_proj.bias     -> layers/{q,k,v}_bias[i]  (qwen2)
  model.layers.{i}.self_attn.{q,k}_norm.weight     -> layers/{q,k}_norm[i]    (qwen3)
  model.layers.{i}.mlp.{gate,up,down}_proj.weight  -> layers/{gate,up,down}[i] (transposed)

Policy for bad checkpoints: everything is validated from the config and the safetensors
headers before any weight is read, and every problem raises `CheckpointError` naming the
file, key or tensor. Unknown extra tensors are an error (silently dropping e.g. an
`o_proj.bias` would give a different function), except non-parameter buffers such as
`rotary_emb.inv_freq` that old exports contain. A tied checkpoint that also stores
`lm_head.weight` is accepted only when it equals the embedding.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct as _struct
from dataclasses import dataclass
from typing import Any

import jax
import ml_dtypes
import numpy as np

from ada.models.transformer import Llama3RopeScaling, ModelConfig, Params, param_shapes
from ada.tokenizer import TOKENIZER_FILES

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}
FAMILY_ARCHITECTURE = {family: arch for arch, family in ARCHITECTURES.items()}
ROPE_TYPES = ("default", "llama3")

# Buffers some exports carry that are not parameters; safe to skip.
_IGNORED_TENSORS = re.compile(r"(^|\.)rotary_emb\.inv_freq$")

# ada leaf -> (HF name, stored transposed). Per-layer names get "model.layers.{i}." prefixed.
_TOP_NAMES = {
    "embed": ("model.embed_tokens.weight", False),
    "final_norm": ("model.norm.weight", False),
    "lm_head": ("lm_head.weight", True),
}
_LAYER_NAMES = {
    "attn_norm": ("input_layernorm.weight", False),
    "mlp_norm": ("post_attention_layernorm.weight", False),
    "q": ("self_attn.q_proj.weight", True),
    "k": ("self_attn.k_proj.weight", True),
    "v": ("self_attn.v_proj.weight", True),
    "o": ("self_attn.o_proj.weight", True),
    "q_bias": ("self_attn.q_proj.bias", False),
    "k_bias": ("self_attn.k_proj.bias", False),
    "v_bias": ("self_attn.v_proj.bias", False),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
    "gate": ("mlp.gate_proj.weight", True),
    "up": ("mlp.up_proj.weight", True),
    "down": ("mlp.down_proj.weight", True),
}

# safetensors dtype tag <-> numpy dtype
_ST_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_ST_DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
SAVE_DTYPES = ("float32", "bfloat16", "float16")


class CheckpointError(ValueError):
    """A checkpoint directory or config that ada cannot load; the message names the fix."""


# ----------------------------------------------------------------------------- config


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


# ----------------------------------------------------------------------------- tensor layout


@dataclass(frozen=True)
class TensorSpec:
    hf_name: str
    leaf: tuple[str, ...]  # path in the ada params pytree
    layer: int | None  # index on the stacked layer axis, None for top-level leaves
    hf_shape: tuple[int, ...]
    transpose: bool


def tensor_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    """Every HF tensor the config implies, derived from `param_shapes` (the one layout)."""
    shapes = param_shapes(config)
    specs = {}

    def add(hf_name, leaf, layer, ada_shape, transpose):
        hf_shape = tuple(reversed(ada_shape)) if transpose else tuple(ada_shape)
        specs[hf_name] = TensorSpec(hf_name, leaf, layer, hf_shape, transpose)

    for key, shape in shapes.items():
        if key == "layers":
            continue
        name, transpose = _TOP_NAMES[key]
        add(name, (key,), None, shape, transpose)
    for key, shape in shapes["layers"].items():
        suffix, transpose = _LAYER_NAMES[key]
        for i in range(config.num_layers):
            add(f"model.layers.{i}.{suffix}", ("layers", key), i, shape[1:], transpose)
    return specs


def read_safetensors_header(file: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (dtype tag, shape)} from a .safetensors header; reads no tensor data."""
    try:
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise CheckpointError(f"{file}: truncated safetensors file (no header)")
            (n,) = _struct.unpack("<Q", head)
            if n > 100_000_000:
                raise CheckpointError(f"{file}: not a safetensors file (header size {n})")
            header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{file}: corrupt safetensors header") from None
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"}


def weight_files(path: str | os.PathLike) -> dict[str, str]:
    """{tensor name: shard file} for a checkpoint directory (single file or sharded index)."""
    single = os.path.join(path, WEIGHTS_FILE)
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: malformed index ({e!r}); expected a 'weight_map'") from None
        files = {}
        for name, shard in weight_map.items():
            file = os.path.join(path, shard)
            if not os.path.isfile(file):
                raise CheckpointError(f"{index}: shard {shard!r} (holding {name!r}) is missing")
            files[name] = file
        return files
    if os.path.isfile(single):
        return {name: single for name in read_safetensors_header(single)}
    others = sorted(f for f in os.listdir(path) if f.endswith((".bin", ".pt", ".pth", ".h5", ".msgpack")))
    hint = f" (found {others}; re-save with safetensors)" if others else ""
    raise CheckpointError(f"{path}: no {WEIGHTS_FILE} or {INDEX_FILE}{hint}")


def read_headers(files: dict[str, str]) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """{name: (dtype tag, shape, file)} for every tensor, checking the index against the shards."""
    headers = {}
    for file in sorted(set(files.values())):
        for name, (dt, shape) in read_safetensors_header(file).items():
            if files.get(name) == file:
                headers[name] = (dt, shape, file)
    listed_but_absent = sorted(set(files) - set(headers))
    if listed_but_absent:
        name = listed_but_absent[0]
        raise CheckpointError(
            f"{files[name]}: tensor {name!r} is listed in the index but not stored in this shard"
            + (f" (and {len(listed_but_absent) - 1} more)" if len(listed_but_absent) > 1 else "")
        )
    return headers


def validate_tensors(config: ModelConfig, headers: dict, path: str = "") -> dict[str, TensorSpec]:
    """Check names and shapes of the stored tensors against the config; returns the specs."""
    specs = tensor_specs(config)
    where = f"{path}: " if path else ""
    missing = [n for n in specs if n not in headers]
    if missing:
        hint = ""
        if missing == ["lm_head.weight"]:
            hint = " (config says tie_word_embeddings=false; set it to true if the model ties)"
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointError(f"{where}missing tensor {missing[0]!r}{more}{hint}")
    for name, spec in specs.items():
        dt, shape = headers[name][0], headers[name][1]
        if tuple(shape) != spec.hf_shape:
            raise CheckpointError(
                f"{where}tensor {name!r} has shape {list(shape)}, expected {list(spec.hf_shape)} "
                "from config.json"
            )
        if dt not in _ST_DTYPE_NAMES:
            raise CheckpointError(f"{where}tensor {name!r} has dtype {dt}; expected a float type")
    extra = sorted(n for n in headers if n not in specs and not _IGNORED_TENSORS.search(n))
    if config.tie_embeddings and "lm_head.weight" in extra:
        shape = headers["lm_head.weight"][1]
        if tuple(shape) != specs["model.embed_tokens.weight"].hf_shape:
            raise CheckpointError(
                f"{where}tied embeddings but tensor 'lm_head.weight' has shape {list(shape)}, "
                f"expected {list(specs['model.embed_tokens.weight'].hf_shape)}"
            )
        extra.remove("lm_head.weight")  # checked for equality with the embedding while loading
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise CheckpointError(
            f"{where}unexpected tensor {extra[0]!r}{more}: not part of a {config.family} model "
            "with this config (wrong num_hidden_layers, or a feature ada does not implement)"
        )
    return specs


# ----------------------------------------------------------------------------- load


def _leaf_get(tree, leaf):
    for k in leaf:
        tree = tree[k]
    return tree


def _leaf_set(tree, leaf, value):
    for k in leaf[:-1]:
        tree = tree.setdefault(k, {})
    tree[leaf[-1]] = value


def load_hf(
    path: str | os.PathLike,
    dtype: str | None = None,
    param_dtype: str | None = None,
    shardings: Any = None,
) -> tuple[Params, ModelConfig]:
    """Load a local HF checkpoint into (params, config).

    Args:
      dtype: compute dtype, "float32" or "bfloat16"; default: the checkpoint's dtype
        (float16 checkpoints are upcast to float32).
      param_dtype: storage dtype of the params; default: `dtype`. The training layout is
        `dtype="bfloat16", param_dtype="float32"` (float32 master weights).
      shardings: optional pytree of `jax.sharding.Sharding` with the params' structure; each
        leaf is placed with it as soon as it is filled.

    Memory: each stacked leaf is preallocated once on the host, filled tensor by tensor from
    memory-mapped shards, moved to the device and dropped: beyond the placed params, at most
    one stacked leaf (plus the one HF tensor being copied) exists at a time, never a second
    copy of the model. All checks run on the config and the
    safetensors headers first; nothing is returned unless every tensor loaded.
    """
    from safetensors import safe_open

    path = os.fspath(path)
    _, config = read_config(path)
    dtype = dtype or config.dtype
    param_dtype = param_dtype or dtype
    for name, value in (("dtype", dtype), ("param_dtype", param_dtype)):
        if value not in ("float32", "bfloat16"):
            raise CheckpointError(f"{name}={value!r} must be 'float32' or 'bfloat16'")
    config = config.replace(dtype=dtype, param_dtype=param_dtype)
    headers = read_headers(weight_files(path))
    specs = validate_tensors(config, headers, path)
    np_dtype = np.dtype(ml_dtypes.bfloat16) if config.param_dtype == "bfloat16" else np.dtype(np.float32)

    by_leaf: dict[tuple[str, ...], list[TensorSpec]] = {}
    for spec in specs.values():
        by_leaf.setdefault(spec.leaf, []).append(spec)
    shapes = param_shapes(config)

    handles: dict[str, Any] = {}

    def read(name):
        file = headers[name][2]
        if file not in handles:
            handles[file] = safe_open(file, framework="np")
        return handles[file].get_tensor(name)

    if config.tie_embeddings and "lm_head.weight" in headers:
        head = read("lm_head.weight")
        embed = read("model.embed_tokens.weight")
        if not np.array_equal(head, embed):
            raise CheckpointError(
                f"{path}: config says tie_word_embeddings=true but 'lm_head.weight' differs from "
                "'model.embed_tokens.weight'; set tie_word_embeddings=false to load both"
            )
        del head, embed

    params: Params = {}
    for leaf, leaf_specs in by_leaf.items():
        buf = np.empty(_leaf_get(shapes, leaf), np_dtype)
        for spec in leaf_specs:
            t = read(spec.hf_name)
            t = t.T if spec.transpose else t
            if spec.layer is None:
                buf[...] = t
            else:
                buf[spec.layer] = t
            del t
        sharding = _leaf_get(shardings, leaf) if shardings is not None else None
        _leaf_set(params, leaf, jax.device_put(buf, sharding))
        del buf
    return params, config


# ----------------------------------------------------------------------------- save


def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", str(size), re.IGNORECASE)
    if not m:
        raise ValueError(f"max_shard_size={size!r}: use bytes or a string like '5GB' or '500MB'")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    return int(float(m.group(1)) * scale[unit])


def _shard_plan(specs: list[TensorSpec], itemsize: int, max_bytes: int) -> list[list[TensorSpec]]:
    shards, current, size = [], [], 0
    for spec in specs:
        n = math.prod(spec.hf_shape) * itemsize
        if current and size + n > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += n
    if current:
        shards.append(current)
    return shards


def _hf_tensor(params: Params, spec: TensorSpec, np_dtype) -> np.ndarray:
    x = _leaf_get(params, spec.leaf)
    if spec.layer is not None:
        x = x[spec.layer]
    x = np.asarray(jax.device_get(x))
    x = x.T if spec.transpose else x
    return np.ascontiguousarray(x.astype(np_dtype, copy=False))


def save_hf(
    params: Params,
    config: ModelConfig,
    path: str | os.PathLike,
    dtype: str | None = None,
    max_shard_size: int | str = "5GB",
    tokenizer_dir: str | os.PathLike | None = None,
    extra_config: dict | None = None,
) -> list[str]:
    """Write an HF checkpoint directory that `AutoModelForCausalLM.from_pretrained` loads.

    Writes config.json and model.safetensors, or shards plus model.safetensors.index.json when
    the weights exceed `max_shard_size`. One shard's tensors are on the host at a time.
    `dtype` (float32/bfloat16/float16) defaults to the params' dtype. Tokenizer files found in
    `tokenizer_dir` are copied as they are (for an ada `Tokenizer`, `ada.tokenizer.export_tokenizer`
    writes what AutoTokenizer needs, SentencePiece included). `extra_config` entries (e.g. bos/eos token ids)
    are merged into config.json. Returns the written file names.
    """
    from safetensors.numpy import save_file

    path = os.fspath(path)
    dtype = dtype or config.param_dtype
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {SAVE_DTYPES}")
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    expected = param_shapes(config)
    got = jax.tree.map(lambda x: tuple(x.shape), params)
    if got != expected:
        raise ValueError(f"params do not match the config's layout: got {got}, expected {expected}")

    os.makedirs(path, exist_ok=True)
    specs = list(tensor_specs(config).values())
    shards = _shard_plan(specs, np_dtype.itemsize, _parse_size(max_shard_size))
    written = []
    weight_map = {}
    for i, shard in enumerate(shards):
        name = WEIGHTS_FILE if len(shards) == 1 else (
            f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
        tensors = {s.hf_name: _hf_tensor(params, s, np_dtype) for s in shard}
        save_file(tensors, os.path.join(path, name), metadata={"format": "pt"})
        del tensors
        weight_map.update({s.hf_name: name for s in shard})
        written.append(name)
    if len(shards) > 1:
        total = sum(math.prod(s.hf_shape) * np_dtype.itemsize for s in specs)
        with open(os.path.join(path, INDEX_FILE), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        written.append(INDEX_FILE)
    stale = os.path.join(path, INDEX_FILE if len(shards) == 1 else WEIGHTS_FILE)
    if os.path.exists(stale):  # a previous save with another sharding must not shadow this one
        os.remove(stale)

    hf_config = config_to_hf(config, dtype)
    hf_config.update(extra_config or {})
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(hf_config, f, indent=2)
    written.append(CONFIG_FILE)

    if tokenizer_dir is not None:
        found = [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(tokenizer_dir, n))]
        if not found:
            raise CheckpointError(f"{tokenizer_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES)})")
        for n in found:
            shutil.copyfile(os.path.join(tokenizer_dir, n), os.path.join(path, n))
        written.extend(found)
    return written


# ----------------------------------------------------------------------------- checks


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
    "load_hf", "read_config", "read_headers", "save_hf", "tensor_specs", "validate_tensors",
    "weight_files",
]
