"""The decode-backend contract (ada/sampling/contract.py) is binding: both engines (the dense
Engine, the PagedEngine) have every member `DecodeEngine` names and both host halves
(DenseSlots, PagedSlots) every member `SlotBackend` names, each method with the contract's
parameters; and a backend's counts come back from `fill` / `run_chunk` / `extend` (a
multi-turn request's appended observation) as `ChunkStats`, which the Driver adds up
(Driver.counts, Driver.stats).

What failing looks like: a member the contract gains and one backend lacks (or renames, or
takes other arguments for), or a backend that writes the Driver's counters instead of
returning them (the Driver's sum then differs from what the backend returned)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from helpers import random_params

from ada.models import preset
from ada.sampling.contract import ChunkStats, DecodeEngine, SlotBackend
from ada.sampling.driver import Driver, Request
from ada.sampling.engine import Engine
from ada.sampling.paged import PagedEngine

# small: a few compiles (one prompt bucket, one window)
ENGINE = dict(num_slots=2, max_prompt_len=16, max_new_tokens=4, chunk_size=4, num_windows=1,
              max_prefill_rows=1)


def members(protocol) -> tuple[set[str], dict]:
    """(the attributes, the methods by name) a contract Protocol names."""
    methods = {n: f for n, f in vars(protocol).items()
               if inspect.isfunction(f) and not n.startswith("_")}
    return set(protocol.__annotations__), methods


def parameters(fn) -> list[tuple[str, object]]:
    """A method's parameters after self: (name, kind), annotations aside."""
    return [(p.name, p.kind) for p in list(inspect.signature(fn).parameters.values())[1:]]


@pytest.fixture(scope="module")
def drivers():
    config = preset("tiny").replace(num_layers=1)
    params = random_params(config)
    return {cls.__name__: Driver(cls(config, **ENGINE), params, step_key=3)
            for cls in (Engine, PagedEngine)}


@pytest.mark.parametrize("name", ["Engine", "PagedEngine"])
def test_both_engines_and_host_halves_have_every_member_of_the_contract(drivers, name):
    driver = drivers[name]
    for protocol, impl in ((DecodeEngine, driver.engine), (SlotBackend, driver.backend)):
        attributes, methods = members(protocol)
        assert attributes and methods, protocol  # the Protocol was read
        missing = sorted(n for n in attributes | set(methods) if not hasattr(impl, n))
        assert not missing, (type(impl).__name__, missing)
        for n, fn in methods.items():
            assert callable(getattr(impl, n)), (type(impl).__name__, n)
            assert parameters(getattr(type(impl), n)) == parameters(fn), (type(impl).__name__, n)


def counted(backend) -> list:
    """The ChunkStats `backend`'s fill, run_chunk and extend return from now on."""
    returned = []
    fill, run_chunk, extend = backend.fill, backend.run_chunk, backend.extend

    def counted_fill():
        returned.append(fill())
        return returned[-1]

    def counted_chunk():
        out, stats = run_chunk()
        returned.append(stats)
        return out, stats

    def counted_extend(appends):
        returned.append(extend(appends))
        return returned[-1]

    backend.fill, backend.run_chunk, backend.extend = counted_fill, counted_chunk, counted_extend
    return returned


@pytest.mark.parametrize("name", ["Engine", "PagedEngine"])
def test_the_driver_adds_up_the_counts_its_backend_returns(drivers, name):
    driver = drivers[name]
    returned = counted(driver.backend)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 60, n).tolist() for n in (5, 9)]
    done = driver.generate_all([Request(p, prompt_id=i % 2, sample_idx=i // 2)
                                for i, p in enumerate(prompts * 2)])  # 4 requests, 2 slots
    assert all(c.finish_reason != "error" for c in done)
    assert all(isinstance(s, ChunkStats) for s in returned)
    total = sum(returned, ChunkStats())
    assert driver.counts == total
    assert total.prefills == total.prefilled_prompts == 2  # each prompt once, one a call
    assert total.prefilled_tokens == 5 + 9 and total.chunks >= 2
    stats = driver.stats()
    assert (stats["prefill_calls"], stats["chunks"], stats["computed_token_steps"]) == (
        total.prefills, total.chunks, total.computed_token_steps)


@pytest.mark.parametrize("cls", [Engine, PagedEngine])
def test_the_driver_adds_up_the_appends_its_backend_returns(cls):
    """Multi-turn requests (half the ids end a turn): each observation appended once, by the
    backend's `extend`, counted in what it returns and in Driver.stats."""
    config = preset("tiny").replace(num_layers=1)
    engine = cls(config, **dict(ENGINE, max_new_tokens=16), turn_end_ids=tuple(range(256, 512)))
    driver = Driver(engine, random_params(config), step_key=3)
    returned = counted(driver.backend)
    for i in range(2):
        driver.submit(Request([5 + i] * 7, prompt_id=i, max_new_tokens=4))
    extends = 0
    while driver.busy():
        for c in driver.step():
            assert c.finish_reason != "error", c.error
            if c.finish_reason == "turn" and c.turn == 0:
                driver.extend(c.seq, [9, 10])
                extends += 1
            elif c.finish_reason == "turn":
                driver.end(c.seq)
    total = sum(returned, ChunkStats())
    assert extends and driver.counts == total
    assert 1 <= total.appends <= extends and total.appended_tokens == 2 * extends
    stats = driver.stats()
    assert (stats["append_prefills"], stats["appended_tokens"], stats["extend_calls"]) == (
        total.appends, 2 * extends, extends)
