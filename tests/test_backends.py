"""The table of KV-cache backends (ada/sampling/backends.py): one row per sampling.kv_cache
value, and make_engine builds the row's engine with the row's own knobs."""

import pytest

from ada import config as C
from ada.models import preset
from ada.sampling.backends import BACKENDS, eval_sampling, make_engine, plan_variant
from ada.sampling.paged_config import KV_CACHES


def test_every_kv_cache_value_has_one_row():
    """Breaks if a value the config accepts has no engine (a KeyError at the first sample),
    or a row is unreachable from the config."""
    assert set(BACKENDS) == set(KV_CACHES)


@pytest.mark.parametrize("kv_cache", KV_CACHES)
def test_make_engine_builds_the_rows_engine(kv_cache):
    """Breaks if a row's knobs miss a keyword its engine needs, or the factory builds
    another row's engine."""
    cfg = C.build_config(C.DEFAULT_CONFIG, [("sampling.kv_cache", kv_cache),
                                            ("sampling.num_slots", "4"),
                                            ("sampling.mesh", "(1,1)")])
    engine = make_engine(cfg, preset("tiny", vocab_size=64), None, max_new_tokens=4)
    assert type(engine) is BACKENDS[kv_cache].engine


@pytest.mark.parametrize("kv_cache", KV_CACHES)
def test_plan_variant_sets_the_rows_plan_knobs(kv_cache):
    """Breaks if the planner's variant of a backend is another row's, keeps the run's knobs
    where its row plans others (the paged pool at the run's num_pages rather than every
    slot's worst case), or changes the run's own config."""
    cfg = C.build_config(C.DEFAULT_CONFIG, [("sampling.num_pages", "64")])
    variant = plan_variant(cfg, kv_cache)
    knobs = BACKENDS[kv_cache].plan_knobs(cfg.sampling)
    assert variant.sampling.kv_cache == kv_cache
    assert all(variant.sampling[k] == v for k, v in knobs.items())
    assert (cfg.sampling.kv_cache, cfg.sampling.num_pages) == ("dense", 64)
    assert BACKENDS[kv_cache].slot_bound == (kv_cache == "dense")


@pytest.mark.parametrize("overrides, own", [
    ([], None),
    ([("eval.max_new_tokens", "16")], None),  # the sampling length spelled out
    ([("eval.temperature", "0.6")], dict(temperature=0.6, max_new_tokens=16)),
    ([("eval.max_new_tokens", "32")], dict(temperature=1.0, max_new_tokens=32)),
])
def test_eval_gets_its_own_engine_only_for_another_temperature_or_length(overrides, own):
    """Breaks if eval builds a second engine (a second decode state the ledger would not
    count, or miss) at the training engine's own temperature and length, or shares it at
    another."""
    cfg = C.build_config(C.DEFAULT_CONFIG, [("sampling.max_new_tokens", "16")] + overrides)
    assert eval_sampling(cfg) == own


@pytest.mark.parametrize("platform, fits, want", [
    ("tpu", True, "kernel"), ("tpu", False, "gather"),  # head_dim 128 or 16
    ("gpu", True, "gather"), ("cuda", True, "gather"), ("cpu", True, "gather"),
])
def test_auto_paged_attention_is_the_kernel_on_tpu_only(platform, fits, want):
    """Breaks if sampling.paged_attention=auto picks a path that cannot run on the platform:
    the Pallas TPU kernel off TPU or for a head_dim it does not serve (a GPU takes gather,
    not JAX's Pallas GPU paged kernel), make_engine builds what the choice names, and a
    PagedEngine built directly with attention="auto" (engine.backend_choices) agrees."""
    from ada.sampling.engine import backend_choices
    from ada.sampling.paged_config import auto_attention

    model = preset("tiny", vocab_size=64, head_dim=128 if fits else 16)
    assert auto_attention(platform, model) == want
    knobs = BACKENDS["paged"].knobs(C.build_config(C.DEFAULT_CONFIG, []).sampling, platform,
                                    model)
    assert knobs["attention"] == want
    assert (backend_choices(platform).paged_attention if fits else "gather") == want
