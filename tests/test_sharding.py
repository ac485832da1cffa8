"""Sharding rules: every parameter of every family has one, the specs are the intended ones,
bad meshes and unknown parameters are stopped with a message that names them."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from ada import sharding as shd
from ada.models import init_params, param_shapes, preset
from ada.models.known import KNOWN


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_every_parameter_has_a_rule(family):
    shapes = param_shapes(preset("tiny", family=family))
    axes = shd.logical_axes(shapes)
    flat = jax.tree_util.tree_leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
    assert len(flat) == len(jax.tree_util.tree_leaves(
        shapes, is_leaf=lambda x: isinstance(x, tuple)))


def test_specs_on_a_3d_mesh():
    mesh = shd.make_mesh((2, 2, 2))
    sh = shd.param_shardings(param_shapes(preset("tiny", family="qwen2")), mesh)
    assert sh["embed"].spec == P("tensor", "fsdp")
    assert sh["layers"]["q"].spec == P(None, "fsdp", "tensor")
    assert sh["layers"]["down"].spec == P(None, "tensor", "fsdp")
    assert sh["layers"]["q_bias"].spec == P(None, "tensor")
    assert sh["layers"]["attn_norm"].spec == P(None, None)
    # size-1 mesh axes are dropped: pure FSDP shards only the hidden dimension
    sh = shd.param_shardings(param_shapes(preset("tiny", family="llama")), shd.make_mesh((1, 8, 1)))
    assert sh["lm_head"].spec == P("fsdp", None)
    assert sh["layers"]["gate"].spec == P(None, "fsdp", None)


def test_indivisible_dimension_is_replicated():
    mesh = shd.make_mesh((1, 2, 4))
    assert shd.spec_for(("layers", "embed", "kv_heads"), (2, 64, 6), mesh) == P(None, "fsdp", None)
    assert shd.spec_for(("batch", "seq"), (8, 5), mesh) == P("fsdp", None)


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_full_size_models_shard_evenly_over_a_pod_slice(name):
    """Every big matrix of the full-size models splits 32 ways (fsdp=8 x tensor=4)."""
    shapes = param_shapes(KNOWN[name])
    mesh = jax.sharding.AbstractMesh((1, 8, 4), shd.MESH_AXES)
    for (path, shape), ax in zip(
        jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))[0],
        jax.tree_util.tree_leaves(shd.logical_axes(shapes),
                                  is_leaf=lambda x: isinstance(x, tuple)), strict=True):
        spec = shd.spec_for(ax, shape, mesh)
        if len(shape) == 3 and shd.path_name(path).split("/")[-1] in ("q", "o", "gate", "up", "down"):
            assert "fsdp" in spec and "tensor" in spec, (path, spec)


def test_unknown_parameter_is_named():
    shapes = dict(param_shapes(preset("tiny")))
    shapes["layers"] = dict(shapes["layers"], router=(2, 64, 8))
    with pytest.raises(ValueError, match="'layers/router' has no sharding rule.*PARAM_RULES"):
        shd.param_shardings(shapes, shd.make_mesh((2, 2, 2)))
    with pytest.raises(ValueError, match="'final_norm' has 2 dims"):
        shd.logical_axes({"final_norm": (4, 4)})


def test_bad_mesh_is_named():
    with pytest.raises(ValueError, match="needs 12 devices but 8 are available"):
        shd.make_mesh((2, 2, 3))
    with pytest.raises(ValueError, match="three positive sizes"):
        shd.make_mesh((4, 2))
    mesh = shd.make_mesh((2, 2, 2))
    with pytest.raises(ValueError, match="batch size 6 does not divide.*data\\*fsdp = 4"):
        shd.check_batch_size(6, mesh)
    with pytest.raises(ValueError, match="x 2 mini/micro-batches = 8"):
        shd.check_batch_size(12, mesh, multiple=2)
    shd.check_batch_size(16, mesh, multiple=2)


def test_optimizer_state_follows_parameters_and_batch_is_split():
    mesh = shd.make_mesh((2, 2, 2))
    params = init_params(preset("tiny"), jax.random.key(0))
    p_sh = shd.param_shardings(params, mesh)
    opt = jax.eval_shape(optax.adamw(1e-3).init, params)
    o_sh = shd.state_shardings(opt, p_sh, params, mesh)
    assert o_sh[0].mu["layers"]["q"] == p_sh["layers"]["q"]
    assert o_sh[0].nu["embed"] == p_sh["embed"]
    assert o_sh[0].count.spec == P()
    x = shd.shard_batch({"t": np.arange(16 * 3).reshape(16, 3)}, mesh)["t"]
    # rows split in contiguous blocks of 4 over data x fsdp, replicated over tensor
    for s in x.addressable_shards:
        assert s.data.shape == (4, 3)
        np.testing.assert_array_equal(np.asarray(s.data), np.asarray(x)[s.index])
    y = jax.jit(lambda a: shd.constrain_batch(a * 2, mesh))(jnp.ones((8, 2)))
    assert y.sharding.is_equivalent_to(shd.batch_sharding(mesh, 2), 2)


def test_sampler_mesh_and_its_replicas():
    """The sampler's mesh is this process's first devices in id order; the train mesh's
    devices split into copies of it (one of them the sampler's), so the same specs hold a
    full, identically arranged copy on each."""
    devices = jax.devices()
    mesh = shd.local_mesh(2, 2)
    assert mesh.devices.shape == (2, 1, 2) and list(mesh.devices.flat) == devices[:4]
    view = shd.replica_mesh(mesh, reversed(devices))  # any order: grouped by id
    assert dict(view.shape) == {"replica": 2, "data": 2, "fsdp": 1, "tensor": 2}
    assert list(view.devices[0].flat) == devices[:4]
    assert shd.replica_mesh(mesh, devices[:6]) is None  # not whole copies
    assert shd.replica_mesh(shd.make_mesh((2, 1, 2), devices[4:]), devices) is not None
    assert shd.replica_mesh(shd.make_mesh((2, 1, 2), devices[1:5]), devices) is None
    # decode form: a list of layers, each without the "layers" axis
    shapes = param_shapes(preset("tiny", family="qwen2"))
    layer = {k: v[1:] for k, v in shapes["layers"].items()}
    decode = dict(shapes, layers=[layer, layer], lm_head=shapes["embed"][::-1])
    for m in (mesh, view):
        sh = shd.param_shardings(decode, m)
        assert sh["layers"][1]["q"].spec == P(None, "tensor")
        assert sh["layers"][0]["attn_norm"].spec == P(None)
        assert sh["lm_head"].spec == P(None, "tensor")


def test_gather_to_host():
    mesh = shd.make_mesh((2, 2, 2))
    params = init_params(preset("tiny"), jax.random.key(0))
    host = shd.gather_to_host(jax.device_put(params, shd.param_shardings(params, mesh)))
    for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(params), strict=True):
        assert isinstance(a, np.ndarray)
        np.testing.assert_array_equal(a, np.asarray(b))
