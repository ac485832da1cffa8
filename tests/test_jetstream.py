"""A real JetStream orchestrator serving a tiny ada model end to end (no gRPC server: the
orchestrator's Decode is called directly, as JetStream's own tests do)."""

import asyncio
import threading
import traceback

import jax
import numpy as np
import pytest

pytest.importorskip("jetstream.core.orchestrator", reason="google-jetstream (ada[jetstream]) is not installed")

from jetstream.core import orchestrator  # noqa: E402
from jetstream.core.proto import jetstream_pb2  # noqa: E402

from ada.models import init_params, preset  # noqa: E402
from ada.sampling.driver import Driver, Request  # noqa: E402
from ada.sampling.engine import Engine  # noqa: E402
from ada.sampling.jetstream_adapter import PagedJetStreamEngine, jetstream_engine  # noqa: E402
from ada.sampling.paged import PagedEngine  # noqa: E402
from ada.sampling.samplers import SamplingConfig  # noqa: E402

ALPHABET = "abcdefghijklmnopqrstuvwxyz"


class CharTokenizer:
    eos_ids = (511,)
    pad_id = 0
    bos_id = None  # Qwen style: no BOS, JetStream's prepended one is masked out

    def encode(self, text):
        return [1 + ALPHABET.index(ch) for ch in text]

    def decode(self, ids):
        return "".join(ALPHABET[(i - 1) % 26] for i in ids)


async def _decode(client, request):
    ids, text = [], []
    async for response in client.Decode(request):
        for sample in response.stream_content.samples:
            ids.extend(sample.token_ids)
            text.append(sample.text)
    return ids, "".join(text)


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache", ["dense", "paged"])
def test_orchestrator_serves_ada_engine(monkeypatch, kv_cache):
    """Either cache: the paged one through PagedJetStreamEngine (pages of 4 tokens, every
    slot's worst case reserved), each request's answer the Driver's over the same engine."""
    # JetStream SIGKILLs its own process when a driver thread raises; under pytest-xdist
    # that takes the worker down unnamed and can hang the run. Record the error instead
    # and fail this test with it.
    thread_errors = []

    def run_recording(thread):
        try:
            threading.Thread.run(thread)
        except Exception as e:  # noqa: BLE001 - reported below
            thread_errors.append(f"{thread.name}: {e!r}\n{traceback.format_exc()}")

    monkeypatch.setattr(orchestrator.JetThread, "run", run_recording)
    config = preset("tiny")
    params = init_params(config, jax.random.PRNGKey(0), std=0.3)
    tok = CharTokenizer()
    common = dict(num_slots=4, max_prompt_len=16, max_new_tokens=16,
                  sampling=SamplingConfig(temperature=0.0), eos_ids=tok.eos_ids,
                  max_prefill_rows=1)
    engine = (Engine(config, slot_bucketing=False, **common) if kv_cache == "dense" else
              PagedEngine(config, page_size=4, **common))
    jet = jetstream_engine(engine, params, tok)
    assert isinstance(jet, PagedJetStreamEngine) == (kv_cache == "paged")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 500, n).tolist() for n in (5, 11, 3)]
    max_tokens = [6, 9, 12]
    expected = Driver(engine, params, tokenizer=tok).generate_all(
        [Request(p, i, 0, m) for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))])

    driver = orchestrator.Driver(
        prefill_engines=[jet], generate_engines=[jet],
        prefill_params=[jet.load_params()], generate_params=[jet.load_params()],
        interleaved_mode=True)
    client = orchestrator.LLMOrchestrator(driver=driver)
    token_requests = [
        jetstream_pb2.DecodeRequest(
            token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=p), max_tokens=m)
        for p, m in zip(prompts, max_tokens, strict=True)]
    text_request = jetstream_pb2.DecodeRequest(
        text_content=jetstream_pb2.DecodeRequest.TextContent(text="hello"), max_tokens=5)

    async def run_all():
        try:
            return await asyncio.wait_for(asyncio.gather(
                *[_decode(client, r) for r in token_requests + [text_request]]), timeout=120)
        finally:
            # Stop the driver while the event loop is still open: a request's return
            # channel hands its last callback to the loop after the client has seen the
            # end of the stream, and on a closed loop that raises in JetStream's
            # detokenize thread ("Event loop is closed"; seen once in a CI run).
            await asyncio.to_thread(driver.stop)

    results = asyncio.run(run_all())
    assert not thread_errors, "a JetStream driver thread raised:\n" + "\n".join(thread_errors)
    for (ids, _), exp in zip(results[:-1], expected, strict=True):
        want = exp.token_ids[:-1] if exp.finish_reason == "eos" else exp.token_ids
        assert ids == want
    # Text in, text out: the same greedy continuation as the driver's on the encoded prompt.
    (hello,) = Driver(engine, params, tokenizer=tok).generate_all(
        [Request(tok.encode("hello"), 9, 0, 5)])
    ids, text = results[-1]
    assert text == hello.text and len(text) == len(hello.text) > 0
