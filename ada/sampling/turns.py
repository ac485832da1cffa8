"""Multi-turn requests in the Driver (driver.py): a tool-using policy's episode as one
request that decodes turn by turn, its KV cache kept between turns.

A request's turn ends on the device at an EOS id, its max new tokens, or a turn-end id (the
engine's `turn_end_ids`: a tool call's end marker, e.g. Qwen's `</tool_call>`). At a turn-end
id the Driver returns the turn's Completion (finish_reason "turn", the id its last token)
and parks the request: it keeps its slot and what its backend holds for it (dense cache
rows, pages), is not decoded and is `busy()`, while every other slot keeps decoding.

  extend(seq, token_ids, max_new_tokens=None)
            appends the observation (the tool's output as token ids) to the parked request
            and resumes it. At the next step() its backend appends them to its cache after
            the turn-end id (`SlotBackend.extend`: one prefill of those tokens only; paged:
            pages added to its own, the prompt's shared pages untouched) and the next token
            is drawn from the logits after the last of them. Its next Completion (same seq,
            prompt_id and sample_idx, `turn` + 1) holds that turn's tokens, log-probs and
            versions. max_new_tokens: the turn's; None: the request's own, cut to the room
            left in its slot's cache (engine.cache_len positions hold the prompt, every turn
            and every observation). A bad extend raises ValueError and changes nothing (the
            request stays parked: extend it again, e.g. with a truncated observation, or end
            it): a seq that is not parked (unknown, queued, running, finished, or extended /
            ended already), an observation that leaves no room for one new token, a
            max_new_tokens past the room, token ids outside the vocabulary, or none.
  end(seq)  the caller ends a parked episode (e.g. at its last turn): its slot and cache are
            freed; no Completion follows.

Randomness and positions. Token i of a request (i counting every token it drew, over all
its turns) is drawn with fold_in(request_key, i), the device's `generated` counting on over
turns; observations take cache and RoPE positions after the turn-end id, as if the whole
sequence had been one prompt. So a token depends on the request's key, its index and the
sequence before it, not on its slot, its neighbours, when it was extended or a restart.

Restarts (paged preemption). A preempted multi-turn request is queued again with its
episode so far: once admitted, its prompt is prefilled (or its cached pages shared) and
everything after it (earlier turns' tokens, observations) appended by one `extend`, and the
current turn is drawn again (the same tokens: same keys, same sequence). A parked request
may be preempted too (first, before any running one: its pages are idle): it then waits
off its slot, and its `extend` queues it to restart with the observation; `end` drops it.

Stats (Driver.stats): turns (turns parked), extend_calls and appended_tokens (the callers'
observations: environment tokens), append_prefills and append_prefilled_tokens (the
backends' appends, restarted contexts included).
"""

from __future__ import annotations

import numpy as np


class Turns:
    """The Driver's multi-turn half (module docstring); a mixin over the Driver's queue,
    slots and counters."""

    def extend(self, seq: int, token_ids, max_new_tokens: int | None = None) -> None:
        """Append `token_ids` (the observation) to parked request `seq` and resume it."""
        slot, s = self._parked_at(seq)
        tokens = np.asarray(list(token_ids))
        room = self.engine.cache_len - s.prompt_bucket - len(s.context) - len(tokens)
        budget = (min(self.max_new(s.request), room) if max_new_tokens is None
                  else max_new_tokens)
        why = None
        if tokens.size == 0:
            why = "no tokens to append"
        elif tokens.dtype.kind not in "iu":
            why = f"token ids must be integers, got dtype {tokens.dtype}"
        elif ((tokens < 0) | (tokens >= self.engine.config.vocab_size)).any():
            why = f"token ids outside the vocabulary [0, {self.engine.config.vocab_size})"
        elif not isinstance(budget, int | np.integer) or not 0 < budget <= room:
            why = (f"{len(tokens)} tokens after {s.prompt_bucket + len(s.context)} cache "
                   f"positions leave room for {max(room, 0)} new tokens of the slot's "
                   f"{self.engine.cache_len} (engine.cache_len); max_new_tokens="
                   f"{max_new_tokens!r} must be in [1, {max(room, 0)}]")
        if why is not None:
            raise ValueError(f"cannot extend request {seq}: {why}")
        s.context.extend(tokens.tolist())
        s.budget, s.parked = int(budget), False
        self.extend_calls += 1
        self.appended_tokens += len(tokens)
        if slot is None:  # preempted while parked: restarts with its context
            del self._parked_off[seq]
            self._restart(s)

    def end(self, seq: int) -> None:
        """End parked request `seq` (its episode is over): its slot and cache are freed."""
        self._end(*self._parked_at(seq))

    def context_of(self, seq: int, request) -> tuple[int, int]:
        """(tokens a queued request appends after its prompt once started: a restarted
        multi-turn request's turns and observations so far, its turn's max new tokens):
        what a backend admits it for."""
        s = self._carry.get(seq)
        return (0, self.max_new(request)) if s is None else (len(s.context), s.budget)

    def turn_stats(self) -> dict:
        return {"turns": self.turns, "extend_calls": self.extend_calls,
                "appended_tokens": self.appended_tokens,
                "append_prefills": self.counts.appends,
                "append_prefilled_tokens": self.counts.appended_tokens}

    def decoding(self) -> bool:
        """A request in a slot that is not parked (a chunk has work)."""
        return any(not s.parked for s in self._slots.values())

    # -- internals ---------------------------------------------------------------

    def _parked_at(self, seq: int):
        """(its slot, or None off-slot, and its _Slot) of parked request `seq`."""
        for slot, s in self._slots.items():
            if s.seq == seq and s.parked:
                return slot, s
        if seq in self._parked_off:
            return None, self._parked_off[seq]
        raise ValueError(f"request {seq} is not parked: extend / end take a request whose last "
                         "Completion had finish_reason 'turn', once")

    def _end(self, slot: int | None, s) -> None:
        if slot is None:
            del self._parked_off[s.seq]
        else:
            self._vacate(slot)

    def _park(self, slot: int):
        """`slot`'s turn ended at a turn-end id: its Completion; the request stays parked."""
        s = self._slots[slot]
        done = self._completion(s, "turn")
        s.context.extend(s.tokens)
        s.cached += len(s.tokens)
        s.before += len(s.tokens)
        s.tokens, s.logprobs, s.versions = [], [], []
        s.turn, s.parked = s.turn + 1, True
        self.turns += 1
        return done

    def _restart(self, s) -> None:
        """A request that lost its slot: back at the queue's front (its episode so far
        carried to its next start), or off-slot while parked."""
        s.tokens, s.logprobs, s.versions, s.cached = [], [], [], 0
        if s.parked:
            self._parked_off[s.seq] = s
            return
        if s.context:
            self._carry[s.seq] = s
        self._queue.appendleft((s.seq, s.request))

    def _append(self) -> None:
        """The pending appends (callers' observations, restarted contexts) onto the device,
        before the chunk."""
        appends = {slot: s.context[s.cached:] for slot, s in self._slots.items()
                   if not s.parked and s.cached < len(s.context)}
        if not appends:
            return
        self.counts += self.backend.extend(appends)
        for slot in appends:
            if slot in self._slots:  # else requeued by the backend (no room for it)
                s = self._slots[slot]
                s.cached, s.logits_version = len(s.context), self.version
