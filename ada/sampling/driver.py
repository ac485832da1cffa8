"""Host-side continuous-batching scheduler over the decode engine.

The driver owns the decode state and a FIFO request queue. `step()` does one round of:

  1. refill free slots from the queue (lowest slot first). Requests of the same prompt
     share one prefill: the prefix is looked up in a small LRU keyed by (prompt_id,
     tokens), otherwise the new prompts are prefilled together, one call per
     prompt-length bucket (at most max_prefill_rows each), and inserted into their slots;
  2. one jitted chunk of K decode steps over the first b slots (b = the smallest slot
     bucket holding every busy slot), attending to the smallest window bucket that holds
     every busy slot's filled cache positions plus K;
  3. on the host: append each slot's valid tokens, finish the slots that hit EOS or their
     max new tokens (both decided on the device), and free them;
  4. when the queue is empty, compact the busy slots downwards so the next chunk runs on a
     smaller slot bucket (the tail of a round does not pay for empty slots).

Bad requests (empty prompt, too long, ids outside the vocabulary, max_new_tokens <= 0 or
above the engine's cap) do not raise: they come back from the next `step()` as a
Completion with finish_reason "error" and a message; everything else keeps running.

finish_reason: "eos" (an EOS id was sampled; it is the last of token_ids, not in text),
"length" (max_new_tokens reached), "turn" (a turn-end id was sampled, the engine's
`turn_end_ids`: it is the last of token_ids and in text; the request is parked), "error".

Multi-turn requests (ada/sampling/turns.py): a request whose turn ends at a turn-end id (a
tool call's end marker) leaves the decode loop parked: it keeps its slot and cache, is not
decoded, and is `busy()`, while every other slot keeps decoding. `extend(seq, token_ids)`
appends the tool's observation to its cache at the next step (no re-prefill of what is
cached) and resumes it; its next Completion (same seq) holds that turn's tokens. `end(seq)`
frees a parked request.

Steps 1, 2 and 4 touch the device state, which belongs to the driver's backend, the
engine's `driver_backend` (the contract: ada/sampling/contract.py): `dense_host.DenseSlots` (the
steps as written) for the dense Engine.
A paged.PagedEngine (sampling.kv_cache=paged) gives paged_host.PagedSlots: admission by free
pages (a request that does not fit waits at the head of the queue), prompts' pages shared
by their samples, pages grown before each chunk, the youngest requests preempted and
requeued when they cannot grow (docs/paged.md). Either way a request's tokens depend only
on the request and the step key, not on its slot, its neighbours or a restart. A backend
sees the Driver through a few calls only (`head`, `admit`, `start`, `requeue`, `move`, and
the read-only `running`, `queued`, `idle_slots` and `lowest_free_slot`), never its
attributes.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import types
from collections.abc import Iterator
from typing import Any, Protocol

import jax
import numpy as np

from ada.sampling.contract import ChunkStats, DecodeEngine, SlotBackend
from ada.sampling.turns import Turns


class Detokenizer(Protocol):
    def decode(self, ids: list[int]) -> str: ...


@dataclasses.dataclass(frozen=True)
class Request:
    prompt_tokens: list[int]
    prompt_id: int
    sample_idx: int = 0
    max_new_tokens: int | None = None  # None: the engine's cap
    # the key it draws with, request_key(step_key, prompt_id, sample_idx); None: the
    # driver's. A stream's driver runs several steps' prompts at once, each with its own.
    step_key: Any = None


@dataclasses.dataclass
class Completion:
    prompt_id: int
    sample_idx: int
    token_ids: list[int]
    text: str
    logprobs: list[float]  # the policy's, untruncated by top-k / top-p (samplers.py)
    finish_reason: str  # "eos" | "length" | "turn" | "error"
    prompt_tokens: list[int]
    error: str | None = None
    seq: int = -1  # submission number, from Driver.submit
    # the policy version (Driver.version: updates applied) of the logits each token was
    # drawn from; a response that spans a weight update (ada/stream.py) has two, the first
    # token after the update still of the old ones (drawn from the chunk before's logits)
    versions: list[int] = dataclasses.field(default_factory=list)
    turn: int = 0  # the turn of its request these tokens are (multi-turn: Driver.extend)
    # a whole trajectory (ada/trajectory.py): 1 on the policy's tokens, 0 on the
    # environment's (tool output, not trained); None: every token is the policy's
    policy_mask: list[int] | None = None
    episode: Any = None  # its env's counters (ada/envs/base.py EpisodeStats)

    @property
    def length(self) -> int:
        return len(self.token_ids)


@dataclasses.dataclass
class _Slot:
    request: Request
    seq: int
    prompt_bucket: int  # cache positions its prompt fills; generated tokens follow
    budget: int  # this turn's max new tokens
    tokens: list[int] = dataclasses.field(default_factory=list)  # this turn's
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    # the version of the logits its next token is drawn from: the prefill's, then each
    # chunk's last forward pass (a chunk's first token comes from the chunk before)
    logits_version: int = 0
    # multi-turn: after the prompt its cache holds `context` (earlier turns' tokens and the
    # observations after them), the first `cached` of it on the device already
    context: list[int] = dataclasses.field(default_factory=list)
    cached: int = 0
    before: int = 0  # tokens it drew in earlier turns: this turn's keys count on from here
    turn: int = 0
    parked: bool = False

    @property
    def filled(self) -> int:
        """Cache positions written: the prompt's, the cached context, this turn's tokens."""
        return self.prompt_bucket + self.cached + len(self.tokens)

    @property
    def end(self) -> int:
        """Cache positions this turn may reach."""
        return self.prompt_bucket + len(self.context) + self.budget

    @property
    def stop_counts(self) -> tuple[int, int]:
        """The device's (generated, max_new) for it on resuming after an append."""
        return self.before, self.before + self.budget


class Driver(Turns):
    """Continuous batching over `engine` with `params`.

    Args:
      engine: the Engine (sets slots, buckets, sampling, EOS ids), or a paged.PagedEngine.
      params: model params, from wherever they lie; the driver keeps them as
        `engine.prepare_params` gives them (on the engine's mesh, in the compute dtype, one
        buffer per layer). Params already in that form are kept as they are, so one
        prepared copy can serve several drivers.
      tokenizer: anything with `decode(ids) -> str`; None gives empty texts.
      step_key: the PRNG key of this sampling step (or an int seed).
      prefix_cache_size: prompts whose prefill is kept for reuse (dense: prefill rows held,
        a prefill call's rows dropped together; ada/memory.py counts the bound).
      version: the policy version of `params` (updates applied), recorded with each token.

    The queue, the slots' requests and tokens, completions and counters are the driver's;
    the device state and how requests enter and leave it are its backend's
    (`engine.driver_backend`, contract.SlotBackend): `dense_host.DenseSlots` for the Engine,
    paged_host.PagedSlots for the PagedEngine (page admission, shared prompt pages, growth
    and preemption).
    """

    def __init__(self, engine: DecodeEngine, params, *, tokenizer: Detokenizer | None = None,
                 step_key: Any = 0, prefix_cache_size: int = 64, version: int = 0):
        self.engine = engine
        self.params = engine.prepare_params(params)
        self.version = int(version)
        self.tokenizer = tokenizer
        self.prefix_cache_size = int(prefix_cache_size)
        self.set_step_key(step_key)
        self._queue: collections.deque[tuple[int, Request]] = collections.deque()
        self._errors: list[Completion] = []
        self._slots: dict[int, _Slot] = {}  # running and parked requests
        self._carry: dict[int, _Slot] = {}  # seq -> a queued restart's turns so far
        self._parked_off: dict[int, _Slot] = {}  # seq -> parked, its slot preempted
        self.extend_calls = self.appended_tokens = self.turns = 0
        self._free = list(range(engine.num_slots))
        heapq.heapify(self._free)
        self._seq = itertools.count()
        self.useful_token_steps = 0
        self.counts = ChunkStats()  # the sum of what the backend's fills and chunks did
        self.carried_tokens = 0  # tokens of running requests at a weight change (set_params)
        self.kept_prompts: frozenset[int] = frozenset()
        self.backend: SlotBackend = engine.driver_backend(self)

    @property
    def state(self):
        return self.backend.state

    # -- configuration between RL steps ------------------------------------------

    def set_step_key(self, step_key) -> None:
        if isinstance(step_key, int | np.integer):
            step_key = jax.random.PRNGKey(int(step_key))
        self.step_key = step_key

    def set_params(self, params, version: int) -> None:
        """New weights, between two chunks (ada/stream.py). Running requests continue under
        them with the cache their earlier tokens wrote (PipelineRL's choice: nothing is
        recomputed or redrawn; each token records its version). Cached prompt prefills
        were computed by the old weights and are dropped, so no new request starts from
        them."""
        self.params = self.engine.prepare_params(params)
        self.version = int(version)
        self.backend.forget_prefixes()
        # what aborting the running requests would discard (redrawing them), and what
        # recomputing their caches would prefill again: their tokens so far
        self.carried_tokens += sum(len(s.tokens) for s in self._slots.values())

    def release(self, weights: bool = True) -> None:
        """Free what this driver holds on the chips while nothing runs: its decode state
        (made again at the next fill), its cached prefills and, with `weights`, its copy of
        the weights (`set_params` brings new ones). The memory policy of ada/stream.py: an
        update or an eval then does not sit beside an idle sampler."""
        if self.busy():
            raise RuntimeError("Driver.release with requests queued or running")
        self.backend.forget_prefixes()
        self.backend.drop_state()
        if weights:
            self.params = None

    def close(self) -> None:
        """Abandon every queued and running request and free the chips (`release`): a run
        that ends leaves no decode state or weights behind it."""
        for held in (self._queue, self._slots, self._carry, self._parked_off):
            held.clear()
        self.release()

    def key_of(self, request: Request):
        """The step key `request` draws with."""
        return self.step_key if request.step_key is None else request.step_key

    # -- the API the adaptive scheduler calls -------------------------------------

    def submit(self, request: Request) -> int:
        """Queue a request; a bad one comes back from the next step() as an error.
        Returns the submission number (Completion.seq)."""
        seq = next(self._seq)
        why = self.engine.check_prompt(request.prompt_tokens)
        if why is None:
            why = self.engine.check_max_new(self.max_new(request))
        if why is None:
            for name in ("prompt_id", "sample_idx"):
                value = getattr(request, name)
                if not isinstance(value, int | np.integer) or not 0 <= value < 2**32:
                    why = f"{name}={value!r} must be an integer in [0, 2**32)"
        if why is not None:
            self._errors.append(Completion(
                prompt_id=request.prompt_id, sample_idx=request.sample_idx, token_ids=[],
                text="", logprobs=[], finish_reason="error",
                prompt_tokens=list(request.prompt_tokens), error=f"bad request: {why}",
                seq=seq))
            return seq
        self._queue.append((seq, request))
        return seq

    def keep_prompts(self, prompt_ids) -> None:
        """The prompts still active in an adaptive collection: the paged backend keeps their
        prefilled pages past the prefix LRU (`prefix_cache_size`) until they leave this set,
        so a later round neither prefills them again nor copies their full pages; under page
        pressure they are released after the prompts nobody keeps. The dense backend keeps
        to its LRU: its prefixes are device memory outside any budget (the paper's 1.5B
        holds ~29 MB per 1,024-token prompt)."""
        self.kept_prompts = frozenset(int(p) for p in prompt_ids)

    def max_new(self, request: Request) -> int:
        return (self.engine.max_new_tokens if request.max_new_tokens is None
                else request.max_new_tokens)

    def free_slots(self) -> int:
        """Slots that queued requests will not already take at the next step()."""
        return max(0, len(self._free) - len(self._queue))

    def step(self) -> list[Completion]:
        """Refill, run one jitted chunk, return the responses that finished."""
        done, self._errors = self._errors, []
        self.counts += self.backend.fill()
        self._append()
        if self.decoding():
            done.extend(self._run_chunk())
        if not self._queue:
            self.backend.compact()
        return done

    def generate_all(self, requests: list[Request]) -> list[Completion]:
        """Run requests to completion; completions come back in the requests' order."""
        seqs = [self.submit(r) for r in requests]
        where = {seq: i for i, seq in enumerate(seqs)}
        results: list[Completion | None] = [None] * len(requests)
        while self._queue or self.decoding() or self._errors:
            for c in self.step():
                if c.seq in where:
                    results[where[c.seq]] = c
        return results  # type: ignore[return-value]

    def stats(self) -> dict:
        n = self.counts
        return {
            "slot_occupancy": self.useful_token_steps / max(n.computed_token_steps, 1),
            "useful_token_steps": self.useful_token_steps,
            "computed_token_steps": n.computed_token_steps,
            "chunks": n.chunks,
            # the mean share of the cache a chunk attended to (window buckets, engine.py)
            "attention_window": n.attended_positions / max(n.chunks, 1) / self.engine.cache_len,
            "prefill_calls": n.prefills,
            "prefilled_prompts": n.prefilled_prompts,
            "prefilled_tokens": n.prefilled_tokens,
            "carried_tokens": self.carried_tokens,
            **self.turn_stats(),
            "compiles": self.engine.compiles(),
            **self.backend.stats(),
        }

    def busy(self) -> bool:
        """Requests queued, running or parked."""
        return bool(self._queue or self._slots or self._parked_off)

    # -- what a backend reads and changes (DenseSlots, paged_host.PagedSlots) ------
    # A backend reads the queue and the running requests; these calls are the only ways
    # it changes them (it never touches the Driver's attributes).

    @property
    def running(self) -> types.MappingProxyType:
        """slot -> its request, tokens and log-probs so far (read-only)."""
        return types.MappingProxyType(self._slots)

    def queued(self) -> Iterator[Request]:
        """The queued requests, head first."""
        return (r for _, r in self._queue)

    def head(self) -> tuple[int, Request] | None:
        """(seq, request) at the queue's head when a slot is free for it, else None."""
        return self._queue[0] if self._queue and self._free else None

    def admit(self, slot: int | None = None) -> tuple[int, int, Request]:
        """Take the queue's head into free `slot` (default the lowest): (slot, seq,
        request). The backend then puts it on the device and calls `start`."""
        seq, request = self._queue.popleft()
        if slot is None:
            return heapq.heappop(self._free), seq, request
        self._free.remove(slot)
        heapq.heapify(self._free)
        return slot, seq, request

    def start(self, slot: int, seq: int, request: Request, filled: int) -> None:
        """Record an admitted request running in `slot` (its cache holds `filled`
        positions)."""
        s = self._carry.pop(seq, None)  # a restarted multi-turn request: its context follows
        if s is None:
            s = _Slot(request=request, seq=seq, prompt_bucket=filled,
                      budget=self.max_new(request))
        s.prompt_bucket, s.logits_version = filled, self.version
        self._slots[slot] = s

    def requeue(self, slot: int) -> None:
        """A preempted request: its slot is free, the request back at the queue's front
        (restarted from scratch: its tokens depend only on the request and their index). A
        multi-turn one keeps its earlier turns (appended again after its prompt, `extend`)
        and draws this turn again; a parked one waits off-slot for its `extend`."""
        s = self._slots.pop(slot)
        heapq.heappush(self._free, slot)
        self._restart(s)

    def lowest_free_slot(self) -> int | None:
        return self._free[0] if self._free else None

    def idle_slots(self) -> list[int]:
        """The free slots, lowest first."""
        return sorted(self._free)

    def move(self, src: int, dst: int) -> None:
        """The request running in `src` now runs in the free slot `dst` (compaction)."""
        self._free.remove(dst)
        heapq.heapify(self._free)
        self._slots[dst] = self._slots.pop(src)
        heapq.heappush(self._free, src)

    # -- internals ---------------------------------------------------------------

    def _run_chunk(self) -> list[Completion]:
        out, counts = self.backend.run_chunk()
        self.counts += counts
        if out is None:  # every running request was preempted (requeued)
            return []
        tokens, logprobs, valid, active = out
        done = []
        for slot in sorted(self._slots):
            s = self._slots[slot]
            if s.parked:
                continue
            keep = valid[slot]
            s.tokens.extend(tokens[slot][keep].tolist())
            s.logprobs.extend(logprobs[slot][keep].tolist())
            # a token's version is that of the logits it was drawn from: the first of the
            # chunk from the last chunk's (the old weights after set_params), the rest ours
            n = int(np.sum(keep))
            s.versions.extend([s.logits_version] * min(n, 1) + [self.version] * (n - 1))
            s.logits_version = self.version
            if not active[slot] and not s.parked:
                last = s.tokens[-1] if s.tokens else None
                if last in self.engine.turn_end_ids and last not in self.engine.eos_ids:
                    done.append(self._park(slot))
                else:
                    done.append(self._finish(slot, "eos" if last in self.engine.eos_ids
                                             else "length"))
        return done

    def _decode(self, ids: list[int]) -> str:
        """Text of the ids the tokenizer knows. A model whose embedding is padded past the
        tokenizer (Qwen: to a multiple of 128) can sample the padding ids; they are no text,
        and must not crash a collection."""
        if self.tokenizer is None:
            return ""
        n = getattr(self.tokenizer, "vocab_size", None)
        return self.tokenizer.decode([i for i in ids if n is None or 0 <= i < n])

    def _finish(self, slot: int, reason: str) -> Completion:
        return self._completion(self._vacate(slot), reason)

    def _vacate(self, slot: int) -> _Slot:
        """Free `slot` (its request done or ended) and what the backend held for it."""
        s = self._slots.pop(slot)
        heapq.heappush(self._free, slot)
        self.backend.release(slot)
        return s


    def _completion(self, s: _Slot, reason: str) -> Completion:
        """The Completion of `s`'s turn so far (its tokens counted as useful steps)."""
        ids = s.tokens
        text = self._decode(ids[:-1] if reason == "eos" else ids)
        self.useful_token_steps += len(ids)
        return Completion(prompt_id=s.request.prompt_id, sample_idx=s.request.sample_idx,
                          token_ids=ids, text=text, logprobs=s.logprobs,
                          finish_reason=reason, prompt_tokens=list(s.request.prompt_tokens),
                          seq=s.seq, versions=s.versions, turn=s.turn)
