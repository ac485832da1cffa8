"""What many tests build the same way: a tiny model's random params, a left-padded batch,
the jitted forward. One copy here, so a test that needs them imports this module and never
another test module."""

from __future__ import annotations

import socket

import jax
import jax.numpy as jnp
import numpy as np

from ada.models import ModelConfig, forward, param_shapes, positions_from_mask

# The families whose block has no sliding windows (Gemma's are tested on their own).
DENSE_FAMILIES = ("qwen2", "qwen3", "llama")

jit_forward = jax.jit(forward, static_argnums=1)


def random_params(config: ModelConfig, seed: int = 0):
    """normal(0, 0.1) weights, norms 1 + normal(0, 0.1), biases normal(0, 0.1): every tensor
    matters to the output. Drawn with NumPy (eager jax.random would compile per shape)."""
    rng = np.random.default_rng(seed)

    def draw(path, shape):
        x = 0.1 * rng.standard_normal(shape)
        return jnp.asarray(x + 1.0 if path[-1].key.endswith("norm") else x, jnp.float32)

    return jax.tree_util.tree_map_with_path(draw, param_shapes(config),
                                            is_leaf=lambda x: isinstance(x, tuple))


def left_padded(vocab_size, B=3, T=20, pads=(0, 4, 11), seed=0, low=0):
    """tokens [B, T] drawn from [low, vocab_size), row b left-padded by pads[b], with its
    mask and RoPE positions (numpy)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(low, vocab_size, (B, T))
    mask = np.ones((B, T), bool)
    for b, p in enumerate(pads):
        mask[b, :p] = False
    return tokens, mask, np.asarray(positions_from_mask(jnp.asarray(mask)))


def free_port() -> int:
    """A TCP port free on localhost now (for a coordinator, a server or an emulator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
