"""ToolEnv: the policy calls tools until it answers (the Env contract: ada/envs/base.py).

Each turn: the format (ada/envs/parsers.py) finds the turn's call; a call to a tool of
env.tools runs (ada/envs/tools.py), its output is cut to `max_tool_output_tokens` and
wrapped as the observation; a turn without a call ends the episode, scored by the task's
reward on the policy's text (all its turns joined, observations left out) through
ada.rewards.score, which never raises. Counting tokens needs the tokenizer the sampler
encodes with (anything with `encode(text)` and `decode(ids)`); without one a token is
counted as CHARS_PER_TOKEN characters, the usual English average, so the limits are rough.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from ada.envs.base import Env, EpisodeStats, Turn
from ada.envs.parsers import FORMATS, BadCall
from ada.envs.tokens import run_format
from ada.envs.tools import TOOLS, ToolOutput, get_tools
from ada.rewards.score import score

CHARS_PER_TOKEN = 4  # without a tokenizer: a token is counted as 4 characters
TRUNCATION_NOTE = "\n[output cut to the first {n} tokens]"


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """The env section of a run config, field for field (configs/common.py: base())."""

    tools: str = ""  # comma-separated names of TOOLS; '' = no tools (single-turn runs)
    tool_format: str = "qwen"  # one of parsers.FORMATS
    max_turns: int = 4
    max_tool_output_tokens: int = 256
    max_total_tokens: int = 0  # 0 = no cap of the env's own
    tool_timeout_s: float = 10.0
    sandbox_url: str = ""  # the python tool on a SandboxFusion service; '' = local sandbox

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(n.strip() for n in self.tools.split(",") if n.strip())

    def __post_init__(self):
        problems = []
        unknown = [n for n in self.tool_names if n not in TOOLS]
        if unknown:
            problems.append(f"tools={self.tools!r} names unknown tool {unknown[0]!r}; list "
                            f"some of {', '.join(TOOLS)} (comma-separated), or '' for no tools")
        if self.tool_format not in FORMATS:
            problems.append(f"tool_format={self.tool_format!r} is not one of {FORMATS}")
        if not (isinstance(self.max_turns, int) and self.max_turns >= 1):
            problems.append(f"max_turns={self.max_turns!r} must be an integer >= 1 (1: the "
                            "policy answers once and a call in it is not run)")
        if not self.max_tool_output_tokens >= 1:
            problems.append(f"max_tool_output_tokens={self.max_tool_output_tokens} must be >= 1")
        if not self.max_total_tokens >= 0:
            problems.append(f"max_total_tokens={self.max_total_tokens} must be >= 0 "
                            "(0 = no cap of the env's own)")
        if not self.tool_timeout_s > 0:
            problems.append(f"tool_timeout_s={self.tool_timeout_s} must be > 0 seconds")
        if self.sandbox_url and not self.sandbox_url.startswith(("http://", "https://")):
            problems.append(f"sandbox_url={self.sandbox_url!r} must be an http(s) URL such "
                            "as http://localhost:8080, or '' for the local sandbox")
        if problems:
            raise ValueError("invalid EnvConfig: " + "; ".join(problems))


class ToolEnv(Env):
    """One episode of a task record with tools. `reward_fn(record, text) -> float`, or None
    to leave scoring to the caller (Turn.reward stays None); `prompt_tokens`: the prompt's
    length, which counts toward max_total_tokens."""

    def __init__(self, record: dict, reward_fn: Callable | None, config: EnvConfig, *,
                 tokenizer=None, prompt_tokens: int = 0):
        self.record, self.reward_fn, self.config = record, reward_fn, config
        self.tokenizer = tokenizer
        self.tools = get_tools(config.tool_names, config.sandbox_url)
        self.format = run_format(config.tool_format)
        self.stats = EpisodeStats(total_tokens=prompt_tokens)
        self.policy_turns: list[str] = []
        self.transcript: list[str] = []  # policy turns and observations, in order
        self.done = False

    @property
    def stops(self) -> tuple[str, ...]:
        """The strings that end a policy turn at a call (besides EOS)."""
        return self.format.stops

    def count_tokens(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text))
        return -(-len(text) // CHARS_PER_TOKEN)

    def step(self, policy_text: str, policy_tokens: int | None = None) -> Turn:
        if self.done:
            raise RuntimeError("ToolEnv.step after the episode ended; start a new ToolEnv")
        self.stats.turns += 1
        self.stats.total_tokens += (policy_tokens if policy_tokens is not None
                                    else self.count_tokens(policy_text))
        self.policy_turns.append(policy_text)
        self.transcript.append(policy_text)
        call = self.format.find(policy_text)
        cap = self.config.max_total_tokens
        if call is None:
            return self._finish("answer")
        if self.stats.turns >= self.config.max_turns:
            return self._finish("max_turns")
        if cap and self.stats.total_tokens >= cap:
            return self._finish("max_total_tokens")
        name = None if isinstance(call, BadCall) else call.name
        start = time.monotonic()
        if isinstance(call, BadCall):
            out = ToolOutput(f"error: {call.message}", "bad_call")
        elif call.name not in self.tools:
            out = ToolOutput(f"error: there is no tool {call.name!r}; the tools are "
                             f"{', '.join(self.tools) or 'none'}", "unknown_tool")
        else:
            out = self.tools[call.name].call(call.arguments, self.config.tool_timeout_s)
        seconds = time.monotonic() - start
        text, cut = self._cut(out.text)
        observation = self.format.wrap(text)
        n = self.count_tokens(observation)
        info = dict(tool=name, error=out.error, tool_seconds=seconds,
                    truncated=out.truncated or cut)
        if cap and self.stats.total_tokens + n > cap:
            return self._finish("max_total_tokens", **info)
        self.stats.total_tokens += n
        self.transcript.append(observation)
        turn = Turn(observation, False, **info)
        self.stats.record(turn)
        return turn

    def _cut(self, text: str) -> tuple[str, bool]:
        """The tool's output cut to max_tool_output_tokens (plus a note saying so)."""
        n = self.config.max_tool_output_tokens
        if self.tokenizer is not None:
            ids = self.tokenizer.encode(text)
            if len(ids) <= n:
                return text, False
            return self.tokenizer.decode(ids[:n]) + TRUNCATION_NOTE.format(n=n), True
        if len(text) <= n * CHARS_PER_TOKEN:
            return text, False
        return text[: n * CHARS_PER_TOKEN] + TRUNCATION_NOTE.format(n=n), True

    def _finish(self, end: str, **info) -> Turn:
        self.done = True
        reward = None
        if self.reward_fn is not None:
            scores, _ = score(self.reward_fn, [self.record], ["".join(self.policy_turns)])
            reward = float(scores[0])
        turn = Turn("", True, reward, end=end, **info)
        self.stats.record(turn)
        return turn

