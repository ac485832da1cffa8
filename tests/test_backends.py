"""The table of KV-cache backends (ada/sampling/backends.py): one row per sampling.kv_cache
value, and make_engine builds the row's engine with the row's own knobs."""

import pytest

from ada import config as C
from ada.models import preset
from ada.sampling.backends import BACKENDS, make_engine
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
