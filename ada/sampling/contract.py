"""The decode-backend contract: what the Driver needs from a KV cache, in two parts, after
JetStream's `engine_api.Engine`. Read this first; then the two implementations:

  dense   engine.Engine (prefill into an [N, P] prefix, insert_many into slots, generate
          over slot and window buckets, move) with dense_host.DenseSlots on the host (a prefix
          LRU, refills, tail compaction).
  paged   paged.PagedEngine (prefill into pages, attach samples to a prompt's pages,
          generate over the page table, stop) with paged_host.PagedSlots on the host (the
          page allocator: admission by free pages, shared prompt pages, growth and
          preemption).

ada.sampling.backends.make_engine builds one from `sampling.kv_cache`. Shared by both, written once:
their base class (engine_base.EngineBase: the argument checks, the weight hand-off, the
decode state born sharded), the prompt and row buckets (slots.pow2_buckets, bucket_for),
the sampler layout and the per-backend choices (engine.sampler_layout, backend_choices),
and the decode step's sampling and stop rules (samplers.sample_and_stop). A backend's
counts come back to the Driver as `ChunkStats` from `fill`, `run_chunk` and `extend`; the
Driver adds them up.

Multi-turn requests (an engine's `turn_end_ids`): a slot that draws a turn-end id stops on
the device like one that draws an EOS, but the Driver parks it (Completion finish_reason
"turn"): the backend keeps what it holds (dense cache rows, pages) while other slots
decode. It stays in `running` with `parked` set: not decoded; the dense backend compacts it
as any other slot, the paged one preempts it first (it then waits off its slot for its
observation). `extend`
appends tokens to such slots (the caller's observation, `Driver.extend`, or a restarted
request's whole context after its prompt) without prefilling what is cached, and resumes
them: the next token is drawn from the logits after the last appended one, with the key of
its index among the request's tokens (`generated` counts on over turns).

tests/test_contract.py holds both pairs to every member named here, and to the signatures
of the methods.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax


class DecodeEngine(Protocol):
    """The device side: jitted programs over a decode state of `num_slots` slots."""

    num_slots: int
    max_new_tokens: int  # the cap on any request's new tokens
    cache_len: int  # positions a slot can hold (prompt bucket + max_new_tokens)
    chunk_size: int  # decode steps per generate call
    eos_ids: tuple[int, ...]
    turn_end_ids: tuple[int, ...]  # end a turn, the slot kept (module docstring); () none

    def prepare_params(self, params) -> Any:
        """The weights in sampling form on the engine's mesh (taken as they are if already)."""

    def check_prompt(self, tokens) -> str | None:
        """Why a prompt cannot be served (one line), or None."""

    def check_max_new(self, max_new_tokens: int) -> str | None:
        """Why a request's max new tokens cannot be served, or None."""

    def state_shardings(self) -> Any:
        """The decode state's NamedShardings on the engine's mesh."""

    def init_decode_state(self) -> Any:
        """The empty decode state, born sharded (`LazyState` makes it on first use)."""

    def abstract_state(self) -> Any:
        """The decode state as ShapeDtypeStructs with their shardings (ada/memory.py
        counts its bytes per chip from them)."""

    def compiles(self) -> dict[str, int]:
        """Compilations made so far, per jitted program."""

    def driver_backend(self, driver) -> SlotBackend:
        """The host side the Driver runs this engine through."""


class SlotBackend(Protocol):
    """The host side: admits the Driver's queued requests into slots and runs chunks. It
    sees the Driver only through `head`, `admit`, `start`, `requeue`, `move`,
    `lowest_free_slot`, `idle_slots`, `context_of` and the read-only `running` and
    `queued`."""

    state: Any  # the engine's decode state, made when first read (`LazyState`)

    def drop_state(self) -> None:
        """Nothing runs: free the decode state (Driver.release); it is made again when next
        read."""

    def fill(self) -> ChunkStats:
        """Admit queued requests into free slots (prefill what is not cached); returns the
        prefills it made."""

    def run_chunk(self) -> tuple[tuple | None, ChunkStats]:
        """One generate chunk: (host (tokens, logprobs, valid, active) [slots, K], its
        counts), or (None, no counts) when no request is left running (all preempted)."""

    def extend(self, appends: dict[int, list[int]]) -> ChunkStats:
        """Append appends[slot]'s token ids after what each slot's cache holds and resume it
        (a slot parked or just started; `running[slot].stop_counts` are its request's
        `generated` and `max_new` on resuming); returns the append prefills it made. A
        backend that cannot make room for one (paged) `requeue`s it instead."""

    def release(self, slot: int) -> None:
        """A request in `slot` finished (or was ended while parked): give back what it
        held."""

    def compact(self) -> None:
        """With the queue empty: move running requests so the next chunk is cheaper."""

    def forget_prefixes(self) -> None:
        """New weights: drop every cached prompt prefill (running requests keep theirs)."""

    def stats(self) -> dict:
        """The backend's own counters (merged into Driver.stats)."""


@dataclasses.dataclass(frozen=True)
class ChunkStats:
    """What a backend's `fill` or `run_chunk` did, for the Driver to add up (Driver.counts,
    Driver.stats): a backend returns its counts and never writes the Driver's."""

    prefills: int = 0  # prefill calls
    prefilled_prompts: int = 0
    prefilled_tokens: int = 0
    chunks: int = 0
    computed_token_steps: int = 0  # slots a chunk ran x its decode steps
    attended_positions: int = 0  # cache positions a chunk attended to (its window)
    appends: int = 0  # extend calls (multi-turn appends)
    appended_tokens: int = 0  # tokens they prefilled

    def __add__(self, other: ChunkStats) -> ChunkStats:
        return ChunkStats(*(a + b for a, b in zip(dataclasses.astuple(self),
                                                  dataclasses.astuple(other), strict=True)))

    @staticmethod
    def prefill(prompts: list) -> ChunkStats:
        """One prefill call of these prompts (token lists)."""
        return ChunkStats(prefills=1, prefilled_prompts=len(prompts),
                          prefilled_tokens=sum(map(len, prompts)))

    @staticmethod
    def append(appends) -> ChunkStats:
        """One extend call of these appends (token lists)."""
        return ChunkStats(appends=1, appended_tokens=sum(map(len, appends)))


def host_chunk(chunk, slots: int) -> tuple[tuple, ChunkStats]:
    """A generate chunk (engine.Chunk) run over `slots` slots: its host (tokens, logprobs,
    valid, active) and its counts."""
    out = jax.device_get((chunk.tokens, chunk.logprobs, chunk.valid, chunk.active))
    return out, ChunkStats(chunks=1, computed_token_steps=slots * out[0].shape[1],
                           attended_positions=chunk.window)


class LazyState:
    """A backend's decode state, made on first use (`engine.init_decode_state`, born sharded)
    and freed by `drop_state`: a driver with nothing to run need hold no decode state
    (Driver.release; the memory policy of ada/stream.py)."""

    engine: DecodeEngine
    _state: Any = None

    @property
    def state(self):
        if self._state is None:
            self._state = self.engine.init_decode_state()
        return self._state

    @state.setter
    def state(self, value) -> None:
        self._state = value

    def drop_state(self) -> None:
        self._state = None
