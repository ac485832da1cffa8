"""Decoder-only transformer (Qwen2/2.5, Qwen3, Llama 3, Gemma 2/3) as pure functions over a pytree."""

from ada.models.presets import preset
from ada.models.transformer import (
    KVCache,
    LinearRopeScaling,
    Llama3RopeScaling,
    ModelConfig,
    decode_params,
    forward,
    init_cache,
    init_params,
    param_shapes,
    positions_from_mask,
)

__all__ = [
    "preset", "KVCache", "LinearRopeScaling", "Llama3RopeScaling", "ModelConfig",
    "forward", "init_cache", "init_params", "param_shapes", "positions_from_mask",
    "decode_params",
]
