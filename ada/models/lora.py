"""Low-rank adapters (LoRA) on the transformer's linear layers, as extra leaves of the params.

A target weight `layers/q` [L, I, O] gets `layers/q_lora_a` [L, I, r] and `layers/q_lora_b`
[L, r, O]; `layers/lora_scale` [L] holds alpha / r (float32 at rest; the forward casts every
layer leaf to the compute dtype, the scale too: 32/3 is 10.625 in bfloat16, and the sampler's
merge of the cast params uses the same value). The block computes
x @ W + ((x @ A) * scale) @ B (ada.models.layers.linear) wherever the adapter leaves are
present, so every forward (training, log-probs, the reference) reads one self-describing
pytree and needs no flag. B starts at zero: the adapted model is the base exactly until the
first update. The base is stored in the compute dtype (the forward casts it there anyway, so
its numbers do not change) and is frozen: `split` / `join` separate the adapters, the only
leaves that get gradients and Adam state (ada.rl.train). The reference policy of the KL term
is `base(params)`, the same arrays without the adapters: no second copy.

The sampler reads `merge(params)`: W + scale * A @ B, one jitted pass on device inside the
engine's hand-off (ada.sampling.engine_base.sampling_params), so the dense and paged decode
kernels never see an adapter; an export merges the gathered host tree on the host.

Why not qwix (tunix's LoRA): qwix adds adapters by intercepting the dot_generals of flax
linen / nnx modules and creates the adapter weights as module variables; ada's model is pure
functions over a param pytree with no module to intercept (docs/design.md).
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

# Every linear layer of a block; embeddings and the head stay frozen.
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
SUFFIXES = ("_lora_a", "_lora_b")
SCALE = "lora_scale"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """The run config's `model.lora` section field for field, plus the run's seed (A's
    init). rank 0: no adapters, every weight trained (the default)."""

    rank: int = 0
    alpha: float = 32.0  # the update is scaled by alpha / rank ("LoRA Without Regret": 32)
    targets: tuple[str, ...] = TARGETS
    seed: int = 0

    def __post_init__(self):
        problems = []
        if not (isinstance(self.rank, int) and self.rank >= 0):
            problems.append(f"rank={self.rank!r} must be an integer >= 0 (0 = no adapters)")
        if not self.alpha > 0:
            problems.append(f"alpha={self.alpha} must be > 0")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            problems.append(f"targets={tuple(self.targets)} must be a non-empty subset of "
                            f"{TARGETS}")
        if problems:
            raise ValueError("invalid LoraConfig: " + "; ".join(problems))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def is_adapter(name: str) -> bool:
    return name.endswith(SUFFIXES)


def has_adapters(params) -> bool:
    layers = params.get("layers")
    return isinstance(layers, dict) and SCALE in layers


def attach(params, config: LoraConfig, dtype):
    """The base `params` (stacked) with the base cast to `dtype` (the compute dtype) and
    adapters added: A ~ U(-1/sqrt(I), 1/sqrt(I)) (PEFT's kaiming-uniform), B = 0, in the
    params' own dtype. Works on arrays and under eval_shape."""
    if not config.rank:
        return params
    base = jax.tree.map(lambda x: x.astype(dtype), params)
    layers = dict(base["layers"])
    keys = jax.random.split(jax.random.key(config.seed), len(config.targets))
    for name, key in zip(config.targets, keys, strict=True):
        w = params["layers"][name]
        L, fan_in, fan_out = w.shape
        bound = fan_in ** -0.5
        a = jax.random.uniform(key, (L, fan_in, config.rank), jnp.float32, -bound, bound)
        layers[name + "_lora_a"] = a.astype(w.dtype)
        layers[name + "_lora_b"] = jnp.zeros((L, config.rank, fan_out), w.dtype)
    layers[SCALE] = jnp.full((params["layers"]["q"].shape[0],), config.scale, jnp.float32)
    return dict(base, layers=layers)


def split(params):
    """(adapters, the rest): the adapter leaves as a params-shaped subtree, and every other
    leaf; (params, None) without adapters, so a full fine-tune traces as before."""
    if not has_adapters(params):
        return params, None
    layers = params["layers"]
    adapters = {"layers": {k: v for k, v in layers.items() if is_adapter(k)}}
    rest = dict(params, layers={k: v for k, v in layers.items() if not is_adapter(k)})
    return adapters, rest


def join(adapters, rest):
    """Inverse of `split`."""
    if rest is None:
        return adapters
    return dict(rest, layers={**rest["layers"], **adapters["layers"]})


def base(params):
    """The params without adapters (the same arrays): the reference policy."""
    if not has_adapters(params):
        return params
    layers = {k: v for k, v in params["layers"].items() if not is_adapter(k) and k != SCALE}
    return dict(params, layers=layers)


def merge(params):
    """The base with each adapter folded in, W + scale * A @ B (float32 products, in W's
    dtype): what the sampler decodes with. The params unchanged without adapters."""
    if not has_adapters(params):
        return params
    layers = params["layers"]
    merged = base(params)
    out = dict(merged["layers"])
    # host leaves (an export's gathered tree) merge on the host, one tensor at a time
    xp = jnp if isinstance(layers[SCALE], jax.Array) else np
    scale = layers[SCALE].astype(np.float32)[:, None, None]
    for name in [k[:-len("_lora_a")] for k in layers if k.endswith("_lora_a")]:
        w = layers[name]
        delta = xp.einsum("lir,lro->lio", layers[name + "_lora_a"].astype(np.float32),
                          layers[name + "_lora_b"].astype(np.float32))
        out[name] = (w.astype(np.float32) + scale * delta).astype(w.dtype)
    return dict(merged, layers=out)


def _checksums(x):
    """Two uint32 sums of a leaf's bit patterns, plain and position-weighted: integer sums
    wrap exactly, so they are the same in any order, on any device or mesh."""
    bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))
    bits = bits.reshape(-1).astype(jnp.uint32)
    weight = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2654435761) + 1
    return jnp.stack([bits.sum(dtype=jnp.uint32), (bits * weight).sum(dtype=jnp.uint32)])


def fingerprint(params) -> str:
    """A content hash of a params tree (a LoRA checkpoint's reference to its base): every
    leaf's name, shape, dtype and bit checksums, computed on device in one pass over the
    weights where they already are (sharded or not, no gather)."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    sums = jax.device_get(jax.jit(lambda xs: [_checksums(x) for x in xs])(
        [x for _, x in leaves]))
    h = hashlib.sha256()
    for (path, x), s in zip(leaves, sums, strict=True):
        h.update(f"{jax.tree_util.keystr(path)}:{x.shape}:{x.dtype}:{s[0]}:{s[1]};".encode())
    return h.hexdigest()[:16]
