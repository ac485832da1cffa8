"""Tiny random Hugging Face models that match ada presets (a test helper, needs torch).

The HF config is built with transformers' own config classes from the preset's numbers,
not with `ada.models.hf_config.config_to_hf`, so a test that loads it checks ada's mapping against
what transformers really writes. Weights are deliberately non-trivial: normal(0, 0.1)
matrices, norms 1 + normal(0, 0.1), biases normal(0, 0.1), so a swapped, untransposed or
dropped tensor changes the logits.
"""

from __future__ import annotations

import os

import torch
import transformers

from ada.models.presets import preset as ada_preset
from ada.models.transformer import ModelConfig

HF_CLASSES = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
}


def hf_config_for(config: ModelConfig):
    """A transformers config object with the same numbers as an ada ModelConfig."""
    config_cls, _ = HF_CLASSES[config.family]
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        s = config.rope_scaling
        rope = dict(
            rope_type="llama3", rope_theta=config.rope_theta, factor=s.factor,
            low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
            original_max_position_embeddings=s.original_max_position_embeddings,
        )
    kwargs = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_embeddings,
        rope_parameters=rope,
    )
    hf_config = config_cls(**kwargs)
    hf_config.architectures = [HF_CLASSES[config.family][1].__name__]
    return hf_config


def make_tiny_hf(
    family: str,
    path: str | os.PathLike,
    preset: str = "tiny",
    vocab_size: int | None = None,
    seed: int = 0,
    tie: bool | None = None,
    dtype: torch.dtype = torch.float32,
):
    """Build a random transformers model matching `preset(family)`, save it to `path`
    (safetensors) and return (hf_model in eval mode, the matching ada ModelConfig).

    `tie` overrides the preset's tied embeddings; `dtype` is the saved (and returned) dtype.
    """
    dtype_name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    overrides = {} if tie is None else {"tie_embeddings": tie}
    config = ada_preset(preset, family=family, vocab_size=vocab_size, **overrides)
    config = config.replace(dtype=dtype_name, param_dtype=dtype_name)
    _, model_cls = HF_CLASSES[family]
    torch.manual_seed(seed)
    model = model_cls(hf_config_for(config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    model = model.to(dtype)
    model.save_pretrained(os.fspath(path))
    return model, config
