"""Tiny model presets for tests, benchmarks and the embedded default run.

`preset(name, family=..., vocab_size=...)` returns a ModelConfig. The family switches are
its row's in ada.models.families, the real ones (qwen2 q/k/v bias, qwen3 q/k norm with a
decoupled head_dim, llama3 RoPE scaling, Gemma's local/global layers, soft-caps and local
RoPE base), so a tiny model exercises exactly the code path of its full-size sibling. (A Gemma preset keeps at least one
global layer: the tiny one's two layers are one local, one global.)
"""

from __future__ import annotations

from ada.models.families import FAMILIES
from ada.models.model_config import ModelConfig, gemma_windows

# name -> (hidden, intermediate, layers, heads, kv_heads, head_dim, default vocab)
_SIZES = {
    "tiny": (64, 128, 2, 4, 2, 16, 512),  # ~0.15M parameters
    "small": (384, 1024, 8, 6, 2, 64, 8192),  # ~19M parameters
}


_WINDOW = 32  # the Gemma presets' sliding window: prompts of the tiny runs reach past it


def preset(name: str, family: str = "qwen2", vocab_size: int | None = None, **overrides) -> ModelConfig:
    if name not in _SIZES:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(_SIZES)}")
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {tuple(FAMILIES)}")
    row = FAMILIES[family]
    hidden, inter, layers, heads, kv_heads, head_dim, vocab = _SIZES[name]
    fields = dict(
        family=family,
        vocab_size=vocab_size or vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim * row.head_dim_factor,
        qkv_bias=row.qkv_bias,
        qk_norm=row.qk_norm,
        tie_embeddings=row.tie_embeddings,
        max_position_embeddings=4096,
        **row.preset,
    )
    fields.update(overrides)
    if row.layer_pattern:
        fields.setdefault("query_pre_attn_scalar", float(fields["head_dim"]))
        pattern = min(row.layer_pattern, fields["num_layers"])
        fields.setdefault("sliding_windows",
                          gemma_windows(family, fields["num_layers"], _WINDOW, pattern))
    return ModelConfig(**fields)

