"""The environment contract: an episode of turns between the policy and an environment.

A trajectory flows like this (the sampler drives it; the env only reads and writes text):

    prompt (from the task record) -> policy turn 1 -> env.step(text) -> observation
    -> policy turn 2 (its context: prompt + turn 1 + observation) -> env.step(text) -> ...

A policy turn ends where the sampler stops it: at the format's call end marker (the
parser's `stops`, e.g. `</tool_call>`) or at EOS. `env.step(turn_text)` answers with a
`Turn`: the observation's text, which the sampler encodes and appends to the context
(prompt, policy and observation tokens are one sequence; only the policy's are trained),
and whether the episode is over. The episode ends, and `Turn.reward` is set, when

  - the policy's turn holds no tool call (it answered: EOS without a call),
  - the policy has had `max_turns` turns (a call in the last one is not run), or
  - appending the observation would take the episode past `max_total_tokens`.

Whatever the policy writes, `step` never raises: a bad call becomes an observation the
policy reads (an error message), counted by kind (ERROR_KINDS) in `Env.stats`.
"""

from __future__ import annotations

import abc
import collections
import dataclasses

# Every kind of failed tool call, in one place: what the policy did wrong (or what failed
# under it), as counted in EpisodeStats.errors and reported in Turn.error.
ERROR_KINDS = {
    "bad_call": "the turn holds a call that cannot be read (malformed JSON, missing or "
                "mistyped arguments, an empty tag)",
    "unknown_tool": "the call names a tool that is not in env.tools",
    "timeout": "the tool ran past env.tool_timeout_s (or the code past its CPU limit)",
    "error": "the tool or the code failed: an exception, a non-zero exit, the memory limit",
    "forbidden": "the code tried what the sandbox refuses: an import off the allow-list, "
                 "a fork or a command, a write outside its folder",
    "unavailable": "the remote sandbox did not answer properly (HTTP error, no reply in "
                   "time, an unreadable reply): not the policy's doing",
}
# Why an episode ended (EpisodeStats.end, Turn.end).
END_REASONS = ("answer", "max_turns", "max_total_tokens")


@dataclasses.dataclass(frozen=True)
class Turn:
    """The env's answer to one policy turn."""

    observation: str  # text to append to the context ('' when done)
    done: bool
    reward: float | None = None  # set when done (None if the env defers scoring)
    tool: str | None = None  # the tool the turn called, if any
    error: str | None = None  # an ERROR_KINDS key, or None
    tool_seconds: float = 0.0  # wall-clock time of the tool call
    truncated: bool = False  # the tool's output was cut (not an error)
    end: str | None = None  # an END_REASONS entry when done


@dataclasses.dataclass
class EpisodeStats:
    """Per-episode counters: what the episode cost and what went wrong, by kind."""

    turns: int = 0  # policy turns
    tool_calls: int = 0  # turns that held a call (readable or not)
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    truncated: int = 0  # tool outputs cut to the limits
    tool_seconds: float = 0.0
    total_tokens: int = 0  # prompt + policy + observation tokens so far
    end: str | None = None  # an END_REASONS entry once done

    def record(self, turn: Turn) -> None:
        """Count a turn's tool call (the policy turn itself is counted by the env)."""
        if turn.tool is not None or turn.error is not None:
            self.tool_calls += 1
        if turn.error is not None:
            self.errors[turn.error] += 1
        self.truncated += int(turn.truncated)
        self.tool_seconds += turn.tool_seconds
        self.end = turn.end


class Env(abc.ABC):
    """One episode, started from a task record (a dict, as ada.data produces)."""

    stats: EpisodeStats
    done: bool

    @abc.abstractmethod
    def step(self, policy_text: str, policy_tokens: int | None = None) -> Turn:
        """The policy's turn (its text up to and including the call end marker, or up to
        EOS) -> the env's answer. `policy_tokens`: the turn's token count, when the sampler
        knows it (else the env counts). Never raises on what the policy wrote; calling it
        after the episode is done is a programming error (RuntimeError)."""
