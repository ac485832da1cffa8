"""Full-size configs of the models the paper trains, for planning (memory, FLOPs), not tests.

Numbers are those of each model's Hugging Face `config.json`. The training layout is
float32 master weights with bfloat16 compute (`param_dtype="float32"`, `dtype="bfloat16"`);
use `.replace(param_dtype="bfloat16")` for a bf16-weights plan. Look a model up by name with
`known("qwen2.5-math-7b")`.
"""

from __future__ import annotations

from ada.models.model_config import (
    LinearRopeScaling,
    Llama3RopeScaling,
    ModelConfig,
    gemma_windows,
)

_TRAIN_DTYPES = dict(dtype="bfloat16", param_dtype="float32")

# Qwen/Qwen2.5-Math-1.5B: Qwen2 architecture (q/k/v bias), tied embeddings, 4k context.
QWEN25_MATH_1_5B = ModelConfig(
    family="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
    num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128, rope_theta=10000.0,
    rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=True, max_position_embeddings=4096,
    **_TRAIN_DTYPES,
)

# Qwen/Qwen2.5-Math-7B: untied lm_head, vocabulary padded to 152064.
QWEN25_MATH_7B = ModelConfig(
    family="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
    num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=10000.0,
    rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=False, max_position_embeddings=4096,
    **_TRAIN_DTYPES,
)

# meta-llama/Llama-3.2-3B(-Instruct): llama3 RoPE scaling, tied embeddings.
LLAMA32_3B = ModelConfig(
    family="llama", vocab_size=128256, hidden_size=3072, intermediate_size=8192,
    num_layers=28, num_heads=24, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
    rope_scaling=Llama3RopeScaling(
        factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    ),
    rms_norm_eps=1e-5, qkv_bias=False, tie_embeddings=True, max_position_embeddings=131072,
    **_TRAIN_DTYPES,
)

# Qwen/Qwen3-4B (base/thinking): per-head q/k RMSNorm, head_dim 128 decoupled from hidden.
QWEN3_4B = ModelConfig(
    family="qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728,
    num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, qk_norm=True, tie_embeddings=True, max_position_embeddings=40960,
    **_TRAIN_DTYPES,
)

# Qwen/Qwen3-4B-Instruct-2507: same shapes, larger RoPE base and 256k context.
QWEN3_4B_INSTRUCT_2507 = QWEN3_4B.replace(rope_theta=5_000_000.0, max_position_embeddings=262144)

# Gemma: written from the published config.json files as remembered (no download here):
# google/gemma-2-2b, gemma-2-9b, gemma-3-1b-pt and gemma-3-4b-pt (its `text_config`, with
# Gemma3TextConfig's defaults for the keys it omits). Every Gemma ties its embeddings and
# scales scores by query_pre_attn_scalar**-0.5 (256 here).
_GEMMA2 = dict(family="gemma2", vocab_size=256000, head_dim=256, rope_theta=10000.0,
               rms_norm_eps=1e-6, tie_embeddings=True, max_position_embeddings=8192,
               query_pre_attn_scalar=256.0, attn_logit_softcap=50.0, final_logit_softcap=30.0)

# google/gemma-2-2b: local (window 4096) and global layers alternate, local first.
GEMMA2_2B = ModelConfig(
    hidden_size=2304, intermediate_size=9216, num_layers=26, num_heads=8, num_kv_heads=4,
    sliding_windows=gemma_windows("gemma2", 26, 4096), **_GEMMA2, **_TRAIN_DTYPES,
)

# google/gemma-2-9b
GEMMA2_9B = ModelConfig(
    hidden_size=3584, intermediate_size=14336, num_layers=42, num_heads=16, num_kv_heads=8,
    sliding_windows=gemma_windows("gemma2", 42, 4096), **_GEMMA2, **_TRAIN_DTYPES,
)

_GEMMA3 = dict(family="gemma3", head_dim=256, rope_theta=1_000_000.0, rope_local_theta=10000.0,
               rms_norm_eps=1e-6, qk_norm=True, tie_embeddings=True, query_pre_attn_scalar=256.0)

# google/gemma-3-1b: five local layers (window 512) to one global; one KV head; 32k context.
GEMMA3_1B = ModelConfig(
    vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_layers=26, num_heads=4,
    num_kv_heads=1, max_position_embeddings=32768,
    sliding_windows=gemma_windows("gemma3", 26, 512), **_GEMMA3, **_TRAIN_DTYPES,
)

# google/gemma-3-4b (the text model of Gemma3ForConditionalGeneration): window 1024, linear
# RoPE scaling x8 on the global layers, 128k context.
GEMMA3_4B = ModelConfig(
    vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_layers=34, num_heads=8,
    num_kv_heads=4, max_position_embeddings=131072, rope_scaling=LinearRopeScaling(8.0),
    sliding_windows=gemma_windows("gemma3", 34, 1024), **_GEMMA3, **_TRAIN_DTYPES,
)

KNOWN = {
    "qwen2.5-math-1.5b": QWEN25_MATH_1_5B,
    "qwen2.5-math-7b": QWEN25_MATH_7B,
    "llama-3.2-3b": LLAMA32_3B,
    "qwen3-4b": QWEN3_4B,
    "qwen3-4b-instruct-2507": QWEN3_4B_INSTRUCT_2507,
    "gemma-2-2b": GEMMA2_2B,
    "gemma-2-9b": GEMMA2_9B,
    "gemma-3-1b": GEMMA3_1B,
    "gemma-3-4b": GEMMA3_4B,
}


def known(name: str) -> ModelConfig:
    key = name.lower()
    if key not in KNOWN:
        raise ValueError(f"unknown model {name!r}; known full-size models: {sorted(KNOWN)}")
    return KNOWN[key]
