"""The model families as one table: what tells Qwen2 from Llama 3 or Gemma 3, in one row each.

Every other place reads the row, never a family's name: `ModelConfig` (which families exist,
Gemma's block), the presets (`ada.models.presets`: a tiny model with its family's real
switches), the Hugging Face mapping (`ada.models.hf_config`: the architecture and model_type
read and written, the keys a config.json may omit, the switches ada rejects when on and
writes off) and `ada-inspect` (the family's chat templates). A new family whose block is one
of these is one row here (docs/design.md shows the diff); a new kind of block is a switch in
`ada.models.transformer` and a field here.

This module imports nothing from ada, so the config, the presets and the HF mapping all stand
on it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    rope_type = "llama3"


@dataclasses.dataclass(frozen=True)
class LinearRopeScaling:
    """Positions divided by `factor` (HF rope_type "linear"; Gemma 3's global layers)."""

    factor: float = 8.0

    rope_type = "linear"


@dataclasses.dataclass(frozen=True)
class Family:
    hf_architecture: str  # the *ForCausalLM a config.json names, read and written
    model_type: str  # the config.json model_type of that architecture
    qkv_bias: bool  # q/k/v projections carry a bias
    qk_norm: bool  # per-head RMSNorm of q and k
    # Gemma's block: (1 + w) norms, sandwich norms, GeGLU, scaled embeddings, and local
    # layers (every `layer_pattern`-th layer global, HF's default `sliding_window_pattern`)
    gemma: bool = False
    layer_pattern: int | None = None
    local_rope: bool = False  # the local layers have their own RoPE base (Gemma 3)
    # config.json keys of the family's HF config that switch on what ada does not implement
    # (extra biases, Qwen's sliding window), each with its value that switches it off: an
    # export writes that value, a load rejects any true one
    off_keys: dict = dataclasses.field(default_factory=dict)
    hf_defaults: dict = dataclasses.field(default_factory=dict)  # for keys a config.json omits
    # an HF multimodal checkpoint whose text model is this family: (architecture, model_type)
    multimodal: tuple[str, str] | None = None
    chat_templates: tuple[str, ...] = ()  # ada.templates names of the family's chat format
    # The presets' switches (ada.models.presets): the real ones, RoPE scaled early enough
    # that a tiny model's positions reach every band.
    preset: dict = dataclasses.field(default_factory=dict)
    head_dim_factor: int = 1  # presets: head_dim = hidden / heads * this (Qwen3 decouples it)
    tie_embeddings: bool = True  # presets: the input embedding is the unembedding


# transformers' Gemma2Config / Gemma3TextConfig defaults, for keys a config.json omits.
_GEMMA_HF = dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6,
                 query_pre_attn_scalar=256, sliding_window=4096, tie_word_embeddings=True,
                 hidden_activation="gelu_pytorch_tanh")

FAMILIES: dict[str, Family] = {
    "qwen2": Family("Qwen2ForCausalLM", "qwen2", qkv_bias=True, qk_norm=False,
                    off_keys=dict(use_sliding_window=False), chat_templates=("qwen25_math", "qwen_chat"),
                    preset=dict(rope_theta=1_000_000.0, rms_norm_eps=1e-6)),
    "qwen3": Family("Qwen3ForCausalLM", "qwen3", qkv_bias=False, qk_norm=True,
                    off_keys=dict(attention_bias=False, use_sliding_window=False), chat_templates=("qwen3",),
                    preset=dict(rope_theta=1_000_000.0, rms_norm_eps=1e-6), head_dim_factor=2),
    "llama": Family("LlamaForCausalLM", "llama", qkv_bias=False, qk_norm=False,
                    off_keys=dict(attention_bias=False, mlp_bias=False), chat_templates=("llama3", "llama32"),
                    preset=dict(rope_theta=500_000.0, rms_norm_eps=1e-5,
                                rope_scaling=Llama3RopeScaling(original_max_position_embeddings=64)),
                    tie_embeddings=False),
    "gemma2": Family("Gemma2ForCausalLM", "gemma2", qkv_bias=False, qk_norm=False, gemma=True,
                     layer_pattern=2, off_keys=dict(attention_bias=False), chat_templates=("gemma",),
                     hf_defaults=dict(_GEMMA_HF, vocab_size=256000, max_position_embeddings=8192,
                                      rope_theta=10000.0, final_logit_softcapping=30.0,
                                      attn_logit_softcapping=50.0),
                     preset=dict(rope_theta=10000.0, rms_norm_eps=1e-6, attn_logit_softcap=50.0,
                                 final_logit_softcap=30.0)),
    "gemma3": Family("Gemma3ForCausalLM", "gemma3_text", qkv_bias=False, qk_norm=True, gemma=True,
                     layer_pattern=6, local_rope=True, off_keys=dict(attention_bias=False),
                     multimodal=("Gemma3ForConditionalGeneration", "gemma3"),
                     chat_templates=("gemma",),
                     hf_defaults=dict(_GEMMA_HF, vocab_size=262208, max_position_embeddings=131072,
                                      rope_theta=1_000_000.0, rope_local_base_freq=10000.0,
                                      final_logit_softcapping=None, attn_logit_softcapping=None),
                     preset=dict(rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                                 rope_local_theta=10000.0, rope_scaling=LinearRopeScaling(8.0))),
}
