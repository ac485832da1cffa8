"""What the dense Engine (engine.py) and the PagedEngine (paged.py) share, written once as
their base class: the argument checks of the contract (contract.DecodeEngine), the weight
hand-off from wherever the weights lie to the engine's mesh, and the decode state born
sharded (one jitted init laid out by the state's shardings, `abstract_state` its bytes per
chip for ada/memory.py). A subclass sets `config`, `mesh`, `choices`, `max_prompt_len` and
`max_new_tokens`, defines `state_shardings` and `_empty_state`, and calls `_jit_shared`."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from ada import sharding as shd
from ada.models.transformer import ModelConfig, decode_params, in_decode_form


def sampling_params(params, *, config: ModelConfig, unembed_copy: bool = True):
    """The weights as sampling reads them: in decode form and the compute dtype (the forward
    casts to it anyway: the same numbers, and half a float32 master's bytes in bfloat16)."""
    return decode_params(jax.tree.map(lambda x: x.astype(config.compute_dtype), params),
                         config, unembed_copy=unembed_copy)


class EngineBase:
    """The members both decode engines have alike (module docstring)."""

    def _jit_shared(self) -> None:
        """The weight hand-off's jitted cast and the jitted init (after the state's shapes
        and `choices` are set)."""
        self._sampling_fn = functools.partial(sampling_params, config=self.config,
                                              unembed_copy=self.choices.unembed_copy)
        self._sampling_params = jax.jit(self._sampling_fn)
        self._handoffs: dict[Mesh, Any] = {}  # replica mesh -> jitted sampling_params
        self._init = jax.jit(self._empty_state, out_shardings=self.state_placement())

    # -- the weight hand-off -------------------------------------------------------

    def param_shardings(self, params, mesh: Mesh | None = None) -> Any:
        """NamedShardings of `params` in sampling form on `mesh` (default: the engine's),
        from ada.sharding's tables: heads, MLP width and vocabulary over tensor."""
        return shd.param_shardings(jax.eval_shape(self._sampling_fn, params), mesh or self.mesh)

    def prepare_params(self, params):
        """`sampling_params` on the engine's mesh by one jitted cast + reshard + split: each
        process takes its own from copies of this mesh (the train mesh, `shd.replica_mesh`);
        host or one-chip params go onto their shards first (never cast whole on a chip)."""
        if in_decode_form(params, self.config, self.choices.unembed_copy):
            return params
        if self.mesh is None:
            return self._sampling_params(params)
        leaf = jax.tree.leaves(params)[0]
        source = False if isinstance(leaf, jax.core.Tracer) else getattr(leaf, "sharding", None)
        if source is None or (source and len(source.device_set) == 1 < self.mesh.devices.size):
            params = jax.device_put(jax.device_get(params), shd.param_shardings(params, self.mesh))
            source = jax.tree.leaves(params)[0].sharding
        view = (shd.replica_mesh(self.mesh, source.mesh.devices.flat)
                if isinstance(source, NamedSharding) else None)
        if view is None:
            return jax.device_put(self._sampling_params(params), self.param_shardings(params))
        cast = self._handoffs.setdefault(view, jax.jit(  # one jit per view: compiled once
            self._sampling_fn, out_shardings=self.param_shardings(params, view)))
        return shd.take_replica(cast(params), self.param_shardings(params))

    # -- the decode state, born sharded ----------------------------------------------

    def _constrain(self, state):
        return jax.lax.with_sharding_constraint(state, self.state_shardings())

    def state_placement(self):
        """Where the decode state lives (its shardings on the mesh, else the first local
        device): committed like generate's outputs, so insert compiles once per bucket."""
        return (self.state_shardings() if self.mesh is not None
                else jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))

    def init_decode_state(self):
        """The empty decode state, born sharded: one jitted init (compiled once per engine)
        whose outputs are laid out by `state_placement`, so each chip allocates its own
        shard. Zeros made eagerly and then placed would first hold the whole cache on one
        chip (tests/test_born_sharded.py)."""
        return self._init()

    def abstract_state(self):
        """The state as ShapeDtypeStructs with its shardings: for lowering, and (through
        roofline.device_bytes) its bytes per chip."""
        return jax.eval_shape(self._init)

    def lower_init(self):
        """The init lowered for the engine's devices (abstract TPU chips too): its
        `compile().memory_analysis()` is the decode state's bytes per chip."""
        return self._init.lower()

    # -- the contract's argument checks ------------------------------------------------

    def check_prompt(self, tokens) -> str | None:
        """Why a prompt cannot be served (None when it can)."""
        n = len(tokens)
        if n == 0:
            return "empty prompt: give at least one token"
        if n > self.max_prompt_len:
            return (f"prompt has {n} tokens, more than the largest prompt bucket "
                    f"{self.max_prompt_len}; truncate it or raise max_prompt_len")
        arr = np.asarray(tokens)
        if arr.dtype.kind not in "iu":
            return f"prompt token ids must be integers, got dtype {arr.dtype}"
        bad = arr[(arr < 0) | (arr >= self.config.vocab_size)]
        if bad.size:
            return (f"prompt token ids {bad[:5].tolist()} are outside the vocabulary "
                    f"[0, {self.config.vocab_size}); check the tokenizer matches the model")
        return None

    def check_max_new(self, max_new_tokens) -> str | None:
        """Why a request's max new tokens cannot be served (None when they can)."""
        if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens <= 0:
            return f"max_new_tokens={max_new_tokens!r} must be a positive integer"
        if max_new_tokens > self.max_new_tokens:
            return (f"max_new_tokens={max_new_tokens} exceeds the engine's cap "
                    f"{self.max_new_tokens}; raise Engine(max_new_tokens=...)")
        return None
