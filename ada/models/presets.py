"""Tiny model presets for tests, benchmarks and the embedded default run.

`preset(name, family=..., vocab_size=...)` returns a ModelConfig. The family switches are
the real ones (qwen2 q/k/v bias, qwen3 q/k norm with a decoupled head_dim, llama3 RoPE
scaling, Gemma's local/global layers, soft-caps and local RoPE base), so a tiny model
exercises exactly the code path of its full-size sibling. (A Gemma preset keeps at least one
global layer: the tiny one's two layers are one local, one global.)
"""

from __future__ import annotations

from ada.models.model_config import (
    FAMILIES,
    GEMMA_PATTERN,
    LinearRopeScaling,
    Llama3RopeScaling,
    ModelConfig,
    gemma_windows,
)

# name -> (hidden, intermediate, layers, heads, kv_heads, head_dim, default vocab)
_SIZES = {
    "tiny": (64, 128, 2, 4, 2, 16, 512),  # ~0.15M parameters
    "small": (384, 1024, 8, 6, 2, 64, 8192),  # ~19M parameters
}


_WINDOW = 32  # the Gemma presets' sliding window: prompts of the tiny runs reach past it


def family_switches(family: str) -> dict:
    """The per-family defaults that distinguish Qwen2, Qwen3 and Llama 3."""
    if family == "qwen2":
        return dict(qkv_bias=True, qk_norm=False, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
    if family == "qwen3":
        return dict(qkv_bias=False, qk_norm=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
    if family == "llama":
        return dict(
            qkv_bias=False,
            qk_norm=False,
            rope_theta=500_000.0,
            rms_norm_eps=1e-5,
            rope_scaling=Llama3RopeScaling(
                factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=64,  # small so tiny tests hit every band
            ),
        )
    if family == "gemma2":
        return dict(qkv_bias=False, qk_norm=False, rope_theta=10000.0, rms_norm_eps=1e-6,
                    attn_logit_softcap=50.0, final_logit_softcap=30.0)
    if family == "gemma3":
        return dict(qkv_bias=False, qk_norm=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                    rope_local_theta=10000.0, rope_scaling=LinearRopeScaling(8.0))
    raise ValueError(f"unknown family {family!r}; choose one of {FAMILIES}")


def preset(name: str, family: str = "qwen2", vocab_size: int | None = None, **overrides) -> ModelConfig:
    if name not in _SIZES:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(_SIZES)}")
    hidden, inter, layers, heads, kv_heads, head_dim, vocab = _SIZES[name]
    if family == "qwen3":
        head_dim = head_dim * 2  # Qwen3 decouples head_dim from hidden / heads
    fields = dict(
        family=family,
        vocab_size=vocab_size or vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        tie_embeddings=family != "llama",  # Gemma ties too
        max_position_embeddings=4096,
    )
    fields.update(family_switches(family))
    fields.update(overrides)
    if family in GEMMA_PATTERN:
        fields.setdefault("query_pre_attn_scalar", float(fields["head_dim"]))
        pattern = min(GEMMA_PATTERN[family], fields["num_layers"])
        fields.setdefault("sliding_windows",
                          gemma_windows(family, fields["num_layers"], _WINDOW, pattern))
    return ModelConfig(**fields)

