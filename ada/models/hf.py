"""Hugging Face weights: read and write local HF checkpoint directories (no hub, no torch).

A checkpoint directory holds `config.json` (mapped by `ada.models.hf_config`) and either
`model.safetensors` or a sharded `model.safetensors.index.json` plus its shard files.

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

Gemma (2 and 3) instead: post_attention_layernorm -> layers/post_attn_norm (after attention),
pre_feedforward_layernorm -> layers/mlp_norm, post_feedforward_layernorm ->
layers/post_mlp_norm. A Gemma3ForConditionalGeneration checkpoint keeps the text model under
`language_model.model.` (as published) or `model.language_model.` (as transformers 5 saves
it) instead of `model.`; its vision tower and projector tensors are skipped.

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
import struct as _struct
from dataclasses import dataclass
from typing import Any

import jax
import ml_dtypes
import numpy as np

from ada.models.hf_config import CONFIG_FILE, CheckpointError, config_to_hf, read_config
from ada.models.lora import merge
from ada.models.transformer import ModelConfig, Params, param_shapes

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# Buffers some exports carry that are not parameters; safe to skip.
_IGNORED_TENSORS = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
# Where the text model's tensors live: a *ForCausalLM, then the two spellings of Gemma 3's
# multimodal checkpoint (whose vision tensors are then skipped).
TEXT_PREFIXES = ("model.", "language_model.model.", "model.language_model.")
_VISION_TENSORS = re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\.")

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

_GEMMA_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attn_norm": ("post_attention_layernorm.weight", False),
    "mlp_norm": ("pre_feedforward_layernorm.weight", False),
    "post_mlp_norm": ("post_feedforward_layernorm.weight", False),
}

# safetensors dtype tags ada loads
_ST_DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
SAVE_DTYPES = ("float32", "bfloat16", "float16")


# ----------------------------------------------------------------------------- tensor layout


@dataclass(frozen=True)
class TensorSpec:
    hf_name: str
    leaf: tuple[str, ...]  # path in the ada params pytree
    layer: int | None  # index on the stacked layer axis, None for top-level leaves
    hf_shape: tuple[int, ...]
    transpose: bool


def _head_name(prefix: str) -> str:
    return "language_model.lm_head.weight" if prefix == "language_model.model." else "lm_head.weight"


def text_prefix(headers) -> str:
    """The prefix of the text model's tensors in a checkpoint (TEXT_PREFIXES)."""
    return next((p for p in TEXT_PREFIXES if f"{p}embed_tokens.weight" in headers), "model.")


def tensor_specs(config: ModelConfig, prefix: str = "model.") -> dict[str, TensorSpec]:
    """Every HF tensor the config implies, derived from `param_shapes` (the one layout), with
    the text model under `prefix`."""
    shapes = param_shapes(config)
    layer_names = _GEMMA_LAYER_NAMES if config.gemma else _LAYER_NAMES
    top_names = {"embed": f"{prefix}embed_tokens.weight", "final_norm": f"{prefix}norm.weight",
                 "lm_head": _head_name(prefix)}
    specs = {}

    def add(hf_name, leaf, layer, ada_shape, transpose):
        hf_shape = tuple(reversed(ada_shape)) if transpose else tuple(ada_shape)
        specs[hf_name] = TensorSpec(hf_name, leaf, layer, hf_shape, transpose)

    for key, shape in shapes.items():
        if key == "layers":
            continue
        add(top_names[key], (key,), None, shape, _TOP_NAMES[key][1])
    for key, shape in shapes["layers"].items():
        suffix, transpose = layer_names[key]
        for i in range(config.num_layers):
            add(f"{prefix}layers.{i}.{suffix}", ("layers", key), i, shape[1:], transpose)
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
    prefix = text_prefix(headers)
    specs = tensor_specs(config, prefix)
    head, embed = _head_name(prefix), f"{prefix}embed_tokens.weight"
    where = f"{path}: " if path else ""
    missing = [n for n in specs if n not in headers]
    if missing:
        hint = ""
        if missing == [head]:
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
    extra = sorted(n for n in headers if n not in specs and not _IGNORED_TENSORS.search(n)
                   and not (prefix != "model." and _VISION_TENSORS.match(n)))
    if config.tie_embeddings and head in extra:
        shape = headers[head][1]
        if tuple(shape) != specs[embed].hf_shape:
            raise CheckpointError(
                f"{where}tied embeddings but tensor {head!r} has shape {list(shape)}, "
                f"expected {list(specs[embed].hf_shape)}"
            )
        extra.remove(head)  # checked for equality with the embedding while loading
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

    prefix = text_prefix(headers)
    head_name, embed_name = _head_name(prefix), f"{prefix}embed_tokens.weight"
    if config.tie_embeddings and head_name in headers:
        head = read(head_name)
        embed = read(embed_name)
        if not np.array_equal(head, embed):
            raise CheckpointError(
                f"{path}: config says tie_word_embeddings=true but {head_name!r} differs from "
                f"{embed_name!r}; set tie_word_embeddings=false to load both"
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


def _usual_mode(path: str) -> None:
    """Give a file the mode a plain open() would (0666 less the umask, 0644 usually), so
    other users of a shared disk can read the weights."""
    try:  # Linux says it without changing it (os.umask would, for every thread, a moment)
        with open("/proc/self/status") as f:
            umask = next(int(ln.split()[1], 8) for ln in f if ln.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0o022)
        os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def save_hf(
    params: Params,
    config: ModelConfig,
    path: str | os.PathLike,
    dtype: str | None = None,
    max_shard_size: int | str = "5GB",
    extra_config: dict | None = None,
) -> list[str]:
    """Write an HF checkpoint directory that `AutoModelForCausalLM.from_pretrained` loads.

    Writes config.json and model.safetensors, or shards plus model.safetensors.index.json when
    the weights exceed `max_shard_size`. One shard's tensors are on the host at a time.
    `dtype` (float32/bfloat16/float16) defaults to the params' dtype. `extra_config` entries
    (e.g. bos/eos token ids) are merged into config.json. Weights only: `ada.export.export_hf`
    adds the tokenizer. Returns the written file names. LoRA adapters are merged in
    (`lora.merge`): a LoRA run exports as a plain model.
    """
    from safetensors.numpy import save_file

    params = merge(params)
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
        _usual_mode(os.path.join(path, name))  # safetensors writes 0600
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
    return written


__all__ = [
    "TEXT_PREFIXES", "load_hf", "read_headers", "read_safetensors_header", "save_hf",
    "tensor_specs", "text_prefix",
    "validate_tensors", "weight_files",
]
