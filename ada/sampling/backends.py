"""The one sampler factory, and its table of KV-cache backends: one row per
`sampling.kv_cache` value, so a backend is decided here and nowhere else.

A row says which engine class the Driver runs (both keep the contract of
`sampling/contract.py`), what the checks are that need the sampler's devices and the model
(the knobs alone are checked by `paged_config.kv_cache_problems`, which `ada.config.validate`
calls), the engine's own knobs, and the planner's hooks: the knobs `ada.plan` sets when it
plans the backend beside the run's (`plan_variant`), and whether the cache's bytes follow the
slots. Adding a backend is one row here, its name in `paged_config.KV_CACHES`
(tests/test_backends.py holds the two together) and its engine class.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import jax

from ada.errors import ConfigError
from ada.meshes import sampling_mesh
from ada.sampling.engine import Engine
from ada.sampling.paged import PagedEngine
from ada.sampling.paged_config import auto_attention, kernel_problem
from ada.sampling.samplers import SamplingConfig


@dataclasses.dataclass(frozen=True)
class Backend:
    engine: type  # the engine class the Driver runs
    knobs: Callable  # (sampling section, platform, model) -> the engine's own keyword arguments
    check: Callable = lambda s, platform, model_cfg: None  # -> one line, or None: fits
    error: str = ""  # the user's line for a ValueError of the engine ({e}: its text); "": raise
    plan_knobs: Callable = lambda s: {}  # the sampling knobs ada.plan plans this backend at
    # The cache's bytes follow the slots, so cohorts in flight, which keep it through the
    # update, cap the slots (memory.update_slots); False: a pool's bytes are its pages'.
    slot_bound: bool = True


BACKENDS: dict[str, Backend] = {
    "dense": Backend(Engine, lambda s, platform, model_cfg: {"slot_bucketing": s.slot_bucketing}),
    "paged": Backend(PagedEngine,
                     lambda s, platform, model_cfg: {
                         "page_size": s.page_size, "num_pages": s.num_pages,
                         "attention": (auto_attention(platform, model_cfg)
                                       if s.paged_attention == "auto" else s.paged_attention)},
                     lambda s, platform, model_cfg: kernel_problem(s.paged_attention, platform,
                                                                   model_cfg),
                     # the pool's size (eval.max_new_tokens may exceed sampling's)
                     "sampling.num_pages: {e}; raise --config.sampling.num_pages (0 = every "
                     "slot's worst case)",
                     plan_knobs=lambda s: {"num_pages": 0},  # every slot's worst case
                     slot_bound=False),
}


def plan_variant(config, kv_cache: str):
    """A copy of `config` sampling with `kv_cache` at the knobs its row plans it at: the
    planner compiles the dense programs and plans the paged pool beside them."""
    config = copy.deepcopy(config)
    config.sampling.kv_cache = kv_cache
    config.sampling.update(BACKENDS[kv_cache].plan_knobs(config.sampling))
    return config


def eval_sampling(config) -> dict | None:
    """The temperature and length of the eval engine, or None where eval samples through the
    training engine (same temperature and length): eval builds its own engine only then
    (ada.run.build, and the memory ledger that counts what it builds)."""
    s, e = config.sampling, config.eval
    new = e.max_new_tokens or s.max_new_tokens
    if e.temperature == s.temperature and new == s.max_new_tokens:
        return None
    return dict(temperature=e.temperature, max_new_tokens=new)


def make_engine(config, model_cfg, tokenizer, mesh=None, *, temperature: float | None = None,
                max_new_tokens: int | None = None, num_slots: int | None = None,
                turn_end_ids: tuple[int, ...] = ()):
    """The one sampler factory (training, evaluation, pass rates, serving, the planner): the
    engine `config.sampling` describes, for prompts of data.max_prompt_len tokens. `mesh`:
    default this process's `sampling_mesh`; the planner passes abstract TPU chips. Without a
    tokenizer it stops at no EOS id (the planner: no compiled shape depends on them).
    temperature, max_new_tokens and num_slots default to the sampling section's.
    turn_end_ids: the ids that end a multi-turn request's turn (ada/sampling/turns.py).
    sampling.kv_cache=paged gives a paged.PagedEngine, which the Driver runs with the same
    contract (docs/paged.md); its decode attention at sampling.paged_attention=auto is
    `paged_config.auto_attention`'s for the devices' platform."""
    s = config.sampling
    backend = BACKENDS[s.kv_cache]
    mesh = sampling_mesh(config) if mesh is None else mesh
    num_slots = s.num_slots if num_slots is None else num_slots
    data = 1 if mesh is None else mesh.shape["data"]
    if num_slots < 1 or num_slots % data:
        raise ConfigError(f"sampling.num_slots={num_slots} does not split over sampling.mesh "
                          f"data={data}; use a positive multiple of {data}")
    platform = (jax.local_devices()[0] if mesh is None else mesh.devices.flat[0]).platform
    if why := backend.check(s, platform, model_cfg):
        raise ConfigError(why)
    prompt_len = 1 << max(0, (config.data.max_prompt_len - 1).bit_length())
    temperature = s.temperature if temperature is None else temperature
    try:
        return backend.engine(
            model_cfg, num_slots=num_slots, max_prompt_len=prompt_len,
            max_new_tokens=s.max_new_tokens if max_new_tokens is None else max_new_tokens,
            sampling=SamplingConfig(temperature=temperature, top_k=s.top_k, top_p=s.top_p),
            eos_ids=tuple(tokenizer.eos_ids) if tokenizer is not None else (),
            turn_end_ids=tuple(turn_end_ids),
            chunk_size=s.chunk_size, mesh=mesh, max_prefill_rows=s.max_prefill_rows,
            num_windows=s.num_windows, min_prompt_bucket=min(16, prompt_len),
            **backend.knobs(s, platform, model_cfg))
    except ValueError as e:
        if not backend.error:
            raise
        raise ConfigError(backend.error.format(e=e)) from None
