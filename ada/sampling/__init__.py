"""Sampling engine: jitted prefill / insert / generate over decode slots, samplers, and a
host-side continuous-batching driver. contract.py says what a KV cache implements for the
driver; engine.py (dense) and paged.py (paged) are the two. The JetStream adapter (optional
extra) lives in ada.sampling.jetstream_adapter and is imported only on demand."""

from ada.sampling.driver import Completion, Driver, Request
from ada.sampling.engine import Chunk, Engine
from ada.sampling.samplers import SamplingConfig, sample, sampling_logprobs
from ada.sampling.slots import DecodeState, Prefix, request_key

__all__ = [
    "Chunk", "Completion", "DecodeState", "Driver", "Engine", "Prefix", "Request",
    "SamplingConfig", "request_key", "sample", "sampling_logprobs",
]
