"""The one place that decides how arrays are laid out on a device mesh.

Two tables, read together:

  PARAM_RULES   parameter path  -> logical axes (one name per array dimension)
  LOGICAL_RULES logical axis    -> mesh axis (or axes, or None = replicated)

The mesh has three named axes:

  data    pure data parallelism: parameters replicated, batch split
  fsdp    batch split *and* parameters split on their hidden ("embed") dimension, so each
          device holds 1/fsdp of the weights and optimizer state (ZeRO-3 style); XLA's SPMD
          partitioner inserts the all-gathers / reduce-scatters
  tensor  Megatron-style: heads, MLP width and vocabulary split

The batch's leading axis is split over data x fsdp. A dimension whose size does not divide
its mesh axes is replicated on that dimension (e.g. 2 KV heads on tensor=4 would not split
evenly) rather than padded.

The sampling engine reads the same tables on its own mesh (`local_mesh`: this process's
devices, fsdp 1, so weights split only over tensor), in decode form (a list of layers: a
rule's "layers" axis is indexed away). The trained params reach it through `replica_mesh`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical axes of every parameter of ada/models/transformer.py (see its layout docstring).
# Keys are "/"-joined pytree paths.
PARAM_RULES: dict[str, tuple[str | None, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "final_norm": ("norm",),
    "layers/attn_norm": ("layers", "norm"),
    "layers/mlp_norm": ("layers", "norm"),
    "layers/post_attn_norm": ("layers", "norm"),  # Gemma
    "layers/post_mlp_norm": ("layers", "norm"),  # Gemma
    "layers/q": ("layers", "embed", "q_heads"),
    "layers/k": ("layers", "embed", "kv_heads"),
    "layers/v": ("layers", "embed", "kv_heads"),
    "layers/o": ("layers", "q_heads", "embed"),
    "layers/q_bias": ("layers", "q_heads"),
    "layers/k_bias": ("layers", "kv_heads"),
    "layers/v_bias": ("layers", "kv_heads"),
    "layers/q_norm": ("layers", "head_dim"),
    "layers/k_norm": ("layers", "head_dim"),
    "layers/gate": ("layers", "embed", "mlp"),
    "layers/up": ("layers", "embed", "mlp"),
    "layers/down": ("layers", "mlp", "embed"),
}
# LoRA (ada/models/lora.py): A [L, I, r] splits as its weight's input, B [L, r, O] as its
# output; the rank is never split.
_WEIGHTS = {n: a for n, a in PARAM_RULES.items() if n.startswith("layers/") and len(a) == 3}
PARAM_RULES.update({"layers/lora_scale": ("layers",),
                    **{f"{n}_lora_a": ("layers", a[1], "lora_rank") for n, a in _WEIGHTS.items()},
                    **{f"{n}_lora_b": ("layers", "lora_rank", a[2]) for n, a in _WEIGHTS.items()}})

LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": BATCH_AXES,
    "seq": None,
    "embed": "fsdp",
    "vocab": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "layers": None,
    "norm": None,
    "head_dim": None,
    "lora_rank": None,
}


# ----------------------------------------------------------------------------- mesh


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all). Auto axes: GSPMD decides
    the layout of intermediates from the input/output shardings."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(MESH_AXES) or any(s < 1 for s in shape):
        raise ValueError(
            f"mesh shape {shape} must be three positive sizes for axes {MESH_AXES}, "
            "e.g. (1, 4, 2)"
        )
    devices = list(jax.devices() if devices is None else devices)
    if math.prod(shape) != len(devices):
        raise ValueError(
            f"mesh shape {dict(zip(MESH_AXES, shape, strict=True))} needs "
            f"{math.prod(shape)} devices but {len(devices)} are available; choose sizes "
            f"whose product is {len(devices)}"
        )
    grid = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def local_mesh(data: int, tensor: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The sampler's (data, 1, tensor) mesh over the first data*tensor of `devices` (default
    this process's) in id order, the order `replica_mesh` groups every process's devices
    in."""
    devices = jax.local_devices() if devices is None else devices
    return make_mesh((data, 1, tensor), _by_id(devices)[:data * tensor])


def replica_mesh(mesh: Mesh, devices: Sequence[jax.Device]) -> Mesh | None:
    """`devices` (a train mesh's, over every process) as disjoint copies of `mesh`'s grid on
    a leading "replica" axis, each process's devices grouped in id order so that `mesh` (a
    `local_mesh`) is one of the copies; None when they do not split so.

    The rules give the same specs on both meshes and never name "replica", so an array laid
    out on this one holds a full copy on every replica, arranged like on `mesh`: a process
    takes its copy from its own shards, with no host round trip.
    """
    size, devices = mesh.devices.size, list(devices)
    groups = []
    for p in sorted({d.process_index for d in devices}):
        own = _by_id(d for d in devices if d.process_index == p)
        groups += [own[i:i + size] for i in range(0, len(own), size)]
    if any(len(g) != size for g in groups) or list(mesh.devices.flat) not in groups:
        return None
    grid = np.asarray(groups, dtype=object).reshape((len(groups),) + mesh.devices.shape)
    return Mesh(grid, ("replica",) + tuple(mesh.axis_names),
                axis_types=(AxisType.Auto,) * (1 + len(mesh.axis_names)))


def take_replica(tree: Any, shardings: Any) -> Any:
    """This process's copy, laid out by `shardings` (on one replica's mesh), of arrays laid
    out on a `replica_mesh`: that replica's shards, assembled without a copy."""

    def one(x, sh):
        return jax.make_array_from_single_device_arrays(
            x.shape, sh, [s.data for s in x.addressable_shards if s.device in sh.device_set])

    return jax.tree.map(one, tree, shardings)


def _by_id(devices) -> list[jax.Device]:
    return sorted(devices, key=lambda d: d.id)


def batch_shards(mesh: Mesh) -> int:
    """How many ways the batch's leading axis is split."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def check_batch_size(batch_size: int, mesh: Mesh, multiple: int = 1, what: str = "batch") -> None:
    """The batch must split evenly over data x fsdp (times `multiple` sub-batches per shard)."""
    need = batch_shards(mesh) * multiple
    if batch_size % need:
        detail = f" x {multiple} mini/micro-batches" if multiple > 1 else ""
        raise ValueError(
            f"{what} size {batch_size} does not divide over the mesh: data*fsdp = "
            f"{batch_shards(mesh)}{detail} = {need}; use a {what} size that is a multiple "
            f"of {need} or a smaller data/fsdp mesh"
        )


# ----------------------------------------------------------------------------- parameters


def path_name(path) -> str:
    """'layers/q' for a pytree path of dict keys (other key kinds are skipped)."""
    return "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def logical_axes(params_or_shapes: Any) -> Any:
    """The logical-axes tuple of every parameter (same tree structure as the input)."""

    def one(path, leaf):
        name = path_name(path)
        if name not in PARAM_RULES:
            raise ValueError(
                f"parameter {name!r} has no sharding rule; add its logical axes to "
                "PARAM_RULES in ada/sharding.py"
            )
        axes = PARAM_RULES[name]
        if axes[0] == "layers" and any(isinstance(k, jax.tree_util.SequenceKey) for k in path):
            axes = axes[1:]  # one layer of the decode form (ada.models.decode_params)
        ndim = len(_shape(leaf))
        if len(axes) != ndim:
            raise ValueError(
                f"parameter {name!r} has {ndim} dims but its rule {axes} names {len(axes)}; "
                "fix PARAM_RULES in ada/sharding.py"
            )
        return axes

    return jax.tree_util.tree_map_with_path(one, params_or_shapes, is_leaf=_is_shape)


def spec_for(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh) -> P:
    """PartitionSpec for one array; a dimension that does not divide its mesh axes, or whose
    mesh axes are already used by an earlier dimension, is replicated."""
    used: set[str] = set()
    out = []
    for name, size in zip(logical, shape, strict=True):
        mesh_axes = LOGICAL_RULES.get(name) if name is not None else None
        if name is not None and name not in LOGICAL_RULES:
            raise ValueError(
                f"logical axis {name!r} has no mesh rule; add it to LOGICAL_RULES in "
                "ada/sharding.py"
            )
        if mesh_axes is None:
            out.append(None)
            continue
        axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
        axes = tuple(a for a in axes if mesh.shape[a] > 1 and a not in used)
        ways = math.prod(mesh.shape[a] for a in axes)
        if not axes or size % ways:
            out.append(None)
            continue
        used.update(axes)
        out.append(axes[0] if len(axes) == 1 else axes)
    return P(*out)


def param_shardings(params_or_shapes: Any, mesh: Mesh) -> Any:
    """NamedSharding of every parameter (input: arrays, ShapeDtypeStructs or shape tuples)."""
    axes = logical_axes(params_or_shapes)
    return jax.tree_util.tree_map(
        lambda leaf, ax: NamedSharding(mesh, spec_for(ax, _shape(leaf), mesh)),
        params_or_shapes, axes, is_leaf=_is_shape,
    )


def state_shardings(tree: Any, params_shardings: Any, params: Any, mesh: Mesh) -> Any:
    """Shardings for a tree that mirrors the parameters somewhere inside (optimizer state).

    A leaf whose dict-key path ends like a parameter path and has that parameter's shape
    takes the parameter's sharding (Adam's mu and nu); everything else (step counts,
    schedules' state) is replicated.
    """
    by_name = {}
    for (path, leaf), sh in zip(
        jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_shape)[0],
        jax.tree_util.tree_leaves(params_shardings),
        strict=True,
    ):
        by_name[path_name(path)] = (tuple(_shape(leaf)), sh)
    replicated = NamedSharding(mesh, P())

    def one(path, leaf):
        name = path_name(path)
        hit = by_name.get(name)
        if hit is not None and hit[0] == tuple(_shape(leaf)):
            return hit[1]
        return replicated

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=_is_shape)


def gather_to_host(tree: Any) -> Any:
    """A full numpy copy of every array on every process (the HF export's float32 params).
    Arrays sharded across processes are all-gathered: every process must call it."""
    return jax.tree.map(lambda x: np.asarray(
        x if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)), tree)


# ----------------------------------------------------------------------------- batch


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Leading (batch) axis over data x fsdp, the rest replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def batch_shardings(batch: Any, mesh: Mesh) -> Any:
    return jax.tree_util.tree_map(lambda x: batch_sharding(mesh, len(_shape(x))), batch)


def shard_batch(batch: Any, mesh: Mesh) -> Any:
    """Place a host batch on the mesh (checks that it splits evenly first)."""
    for x in jax.tree_util.tree_leaves(batch):
        check_batch_size(_shape(x)[0], mesh)
    return jax.device_put(batch, batch_shardings(batch, mesh))


def constrain_batch(x: jax.Array, mesh: Mesh | None) -> jax.Array:
    """Inside jit: keep an activation's leading axis split like the batch."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.ndim))


def _is_shape(x) -> bool:
    """A plain shape tuple (not a NamedTuple such as optax's EmptyState)."""
    return type(x) is tuple and all(isinstance(d, int) for d in x)


def _shape(x) -> tuple[int, ...]:
    return tuple(x) if _is_shape(x) else tuple(x.shape)
