"""ModelConfig: the frozen (hashable) description of one decoder, a static argument of `jax.jit`.

The families differ only in switches (the rows of ada/models/families.py; what each switch
does to the block is the table in ada/models/transformer.py). Per-layer
attention (a Gemma local layer's sliding window) lives here, in `sliding_windows`, so the
training forward, the cached forward and the HF mapping read one source of truth.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ada.models.families import FAMILIES, Family, LinearRopeScaling, Llama3RopeScaling


def gemma_windows(family: str, num_layers: int, window: int, pattern: int | None = None):
    """Per-layer windows of HF's default `layer_types`: local unless (i + 1) % pattern == 0
    (the family row's `layer_pattern` unless given)."""
    pattern = pattern or FAMILIES[family].layer_pattern
    return tuple(None if (i + 1) % pattern == 0 else window for i in range(num_layers))


_LATER_FIELDS = ("sliding_windows", "rope_local_theta", "query_pre_attn_scalar",
                 "attn_logit_softcap", "final_logit_softcap")


@dataclasses.dataclass(frozen=True, repr=False)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    # On the global layers only (every layer of a model without sliding windows).
    rope_scaling: Llama3RopeScaling | LinearRopeScaling | None = None
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    max_position_embeddings: int = 32768
    dtype: str = "float32"  # compute dtype: "float32" or "bfloat16"
    param_dtype: str = "float32"
    # Per layer: a local layer's window (a query at position p sees keys at positions
    # > p - window), None for a global layer; () when every layer is global.
    sliding_windows: tuple[int | None, ...] = ()
    rope_local_theta: float | None = None  # RoPE base of the local layers (None: rope_theta)
    query_pre_attn_scalar: float | None = None  # scores * scalar**-0.5 (None: / sqrt(head_dim))
    attn_logit_softcap: float | None = None  # cap * tanh(scores / cap) (Gemma 2)
    final_logit_softcap: float | None = None  # cap * tanh(logits / cap) (Gemma 2)

    def __post_init__(self):
        problems = []
        if self.family not in FAMILIES:
            problems.append(f"family={self.family!r} is not one of {tuple(FAMILIES)}")
        if self.num_heads % max(self.num_kv_heads, 1):
            problems.append(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} must be even for RoPE")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16"):
                problems.append(f"{name}={getattr(self, name)!r} must be 'float32' or 'bfloat16'")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be positive")
        w = self.sliding_windows
        if not isinstance(w, tuple):
            problems.append(f"sliding_windows must be a tuple, got {type(w).__name__}")
        elif w and len(w) != self.num_layers:
            problems.append(f"sliding_windows has {len(w)} entries for {self.num_layers} layers")
        elif any(x is not None and (isinstance(x, bool) or not isinstance(x, int) or x < 1)
                 for x in w):
            problems.append(f"sliding_windows={w} must hold positive ints or None")
        for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                problems.append(f"{name}={value} must be positive or None")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    def __repr__(self):
        """The fields of the families before Gemma, then only the Gemma fields that are set:
        the warm-start cache keys on this repr (ada.warmstart.cache_key) stay valid."""
        shown = [f for f in dataclasses.fields(self)
                 if f.name not in _LATER_FIELDS or getattr(self, f.name) != f.default]
        return "ModelConfig(" + ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in shown) + ")"

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def row(self) -> Family:
        """This family's row of ada.models.families.FAMILIES."""
        return FAMILIES[self.family]

    @property
    def gemma(self) -> bool:
        """Gemma's block: (1 + w) norms, sandwich norms, GeGLU, scaled embeddings."""
        return self.row.gemma

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        return self.sliding_windows or (None,) * self.num_layers

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)
