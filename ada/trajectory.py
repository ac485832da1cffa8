"""Multi-turn sampling with tools: a Driver whose responses are whole trajectories.

`EnvDriver` wraps a sampling Driver (ada/sampling/driver.py) and keeps its calls (`submit`,
`free_slots`, `step`, `keep_prompts`, `busy`, `stats`, `release`, ...), so the adaptive
collection, the stream and evaluation run over it unchanged: a completion is a trajectory,
scored on its final text as a one-turn response is. Per request:

    prompt -> policy turn (decoded until EOS or the format's end marker, one token id: the
    engine's `turn_end_ids`; the request is then parked, keeping its KV cache)
    -> env.step(turn text), on a worker thread (a tool may take seconds; every other slot
    keeps decoding meanwhile) -> the observation's tokens appended to the parked request's
    cache (`Driver.extend`: no re-prefill) -> the next policy turn -> ... -> the episode
    ends (an answer without a call, env.max_turns, or the sampler's token cap).

The trajectory's Completion holds every token after the prompt, policy and observation
interleaved, with `policy_mask` 1 on the policy's and 0 on the environment's (its log-probs
there are 0 and never trained: ada/rl/batch.py), its text is the policy's turns joined (the
reward reads what the policy wrote, not the tools' output), and `episode` is the env's
counters (ada/envs/base.py EpisodeStats). `sampling.max_new_tokens` caps a trajectory's
tokens after the prompt, policy and observation together, so a train row always holds it.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import time
from collections.abc import Callable

import numpy as np

from ada import distributed
from ada.envs import ERROR_KINDS, TOOLS, Env, EnvConfig, Turn
from ada.envs.tokens import run_format, turn_end_ids
from ada.sampling.driver import Completion, Driver, Request

# What an EnvDriver counts over the trajectories it finished (its `stats()`, beside the
# Driver's own, whose `turns` are its parked turns; a step's share: `env_metrics`): summed
# over processes, so fixed names in a fixed order.
COUNTERS = ("trajectories", "with_tool_call", "policy_turns", "tool_calls", "tool_truncated",
            "policy_tokens", "env_tokens", "tool_seconds", "sampler_idle_s",
            *(f"tool_error_{k}" for k in ERROR_KINDS))


def turn_ends(env: EnvConfig | None, tokenizer) -> tuple[int, ...]:
    """The engine's turn_end_ids for the run's tools: the token of each end marker of its
    call format (ConfigError naming env.tool_format if one is not one token); () without."""
    if env is None:
        return ()
    return turn_end_ids(tokenizer, run_format(env.tool_format).stops, env.tool_format)


def tool_schemas(env: EnvConfig | None) -> list[dict]:
    """The run's tools as a chat template lists them (templates.render_tool_prompt)."""
    return [] if env is None else [TOOLS[name].schema() for name in env.tool_names]


def env_metrics(counts: dict) -> dict:
    """A step's tool-use metrics (docs/metrics.md) from its EnvDriver counts, summed over
    processes: per trajectory, its turns and calls; the errors by kind; the seconds tools
    ran and the sampler sat idle waiting on them; the tokens drawn (methods compare at
    equal tokens) and the environment's share of a trajectory's."""
    c = dict(zip(COUNTERS, distributed.global_sum(
        np.array([counts.get(k, 0) for k in COUNTERS], np.float64))))
    n, tokens = max(c["trajectories"], 1), c["policy_tokens"] + c["env_tokens"]
    return {"turns_per_trajectory": c["policy_turns"] / n,
            "tool_calls_per_trajectory": c["tool_calls"] / n,
            "tool_call_rate": c["with_tool_call"] / n,  # trajectories with at least one call
            **{f"tool_errors_{k}": c[f"tool_error_{k}"] for k in ERROR_KINDS},
            "tool_outputs_truncated": c["tool_truncated"],
            "tool_seconds": c["tool_seconds"], "sampler_idle_tools_s": c["sampler_idle_s"],
            "policy_tokens": c["policy_tokens"], "env_tokens": c["env_tokens"],
            "env_token_share": c["env_tokens"] / max(tokens, 1)}


@dataclasses.dataclass
class _Episode:
    request: Request
    env: Env
    tokens: list[int] = dataclasses.field(default_factory=list)  # after the prompt
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)  # 1: the policy's token
    texts: list[str] = dataclasses.field(default_factory=list)  # the policy's turns


class EnvDriver:
    """`driver` with an environment per request: `make_env(request) -> Env`. `encode(text)`
    gives an observation's token ids; `workers` tool calls run at once."""

    def __init__(self, driver: Driver, make_env: Callable[[Request], Env],
                 encode: Callable[[str], list[int]], workers: int = 8):
        self.driver, self.make_env, self.encode = driver, make_env, encode
        self._episodes: dict[int, _Episode] = {}
        self._tools: dict[cf.Future, int] = {}  # a running env.step -> its request's seq
        self._pool = cf.ThreadPoolExecutor(workers, thread_name_prefix="ada-tool")
        self._counts = dict.fromkeys(COUNTERS, 0)

    def __getattr__(self, name):  # everything else is the driver's (engine, params, ...)
        return getattr(self.driver, name)

    def submit(self, request: Request) -> int:
        seq = self.driver.submit(request)
        self._episodes[seq] = _Episode(request, self.make_env(request))
        return seq

    def busy(self) -> bool:
        return bool(self._tools) or self.driver.busy()

    def step(self) -> list[Completion]:
        """One driver step; the tools that have finished append their observations first.
        When every live request waits on a tool, waits for the first (sampler idle)."""
        done = self._observe(wait=self._all_waiting())
        for c in self.driver.step():
            ep = self._episodes.get(c.seq)
            if ep is None:  # not ours (an error for an unknown seq): pass it on
                done.append(c)
                continue
            ep.tokens += c.token_ids
            ep.logprobs += c.logprobs
            ep.versions += c.versions
            ep.mask += [1] * len(c.token_ids)
            ep.texts.append(c.text)
            if c.finish_reason == "turn":
                self._tools[self._pool.submit(ep.env.step, c.text, len(c.token_ids))] = c.seq
            else:  # answered (eos), out of tokens (length) or an error: the episode ends
                ep.env.stats.turns += 1
                ep.env.stats.end = ep.env.stats.end or c.finish_reason
                done.append(self._trajectory(c.seq, c))
        return done

    def generate_all(self, requests: list[Request]) -> list[Completion]:
        """Run requests to completion; trajectories come back in the requests' order."""
        where = {self.submit(r): i for i, r in enumerate(requests)}
        out: list[Completion | None] = [None] * len(requests)
        while self.busy() or self._episodes:
            for c in self.step():
                out[where[c.seq]] = c
        return out  # type: ignore[return-value]

    def stats(self) -> dict:
        return {**self.driver.stats(), **self._counts}

    def close(self) -> None:
        for f in self._tools:
            f.cancel()
        self._tools.clear()
        self._episodes.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.driver.close()

    # -- internals ------------------------------------------------------------------

    def _all_waiting(self) -> bool:
        """Tools run and the driver has nothing to do: no request decodes, none can start."""
        return bool(self._tools) and not self.driver.decoding() and self.driver.head() is None

    def _observe(self, wait: bool) -> list[Completion]:
        """Append the observations of the finished tool calls (all of them, or with `wait`
        at least one); an episode the env ends is finished here."""
        if not self._tools:
            return []
        start = time.monotonic()
        ready, _ = cf.wait(self._tools, timeout=None if wait else 0,
                           return_when=cf.FIRST_COMPLETED)
        if wait:
            self._counts["sampler_idle_s"] += time.monotonic() - start
        done = []
        for f in ready:
            seq = self._tools.pop(f)
            ep = self._episodes[seq]
            turn: Turn = f.result()  # Env.step never raises (ada/envs/base.py)
            self._counts["tool_seconds"] += turn.tool_seconds
            obs = self.encode(turn.observation) if not turn.done else []
            room = self.driver.max_new(ep.request) - len(ep.tokens) - len(obs)
            if turn.done or room < 1:
                if not turn.done:
                    ep.env.stats.end = "length"
                self.driver.end(seq)
                done.append(self._trajectory(seq, None))
                continue
            ep.tokens += obs
            ep.logprobs += [0.0] * len(obs)
            ep.versions += [ep.versions[-1]] * len(obs)
            ep.mask += [0] * len(obs)
            self.driver.extend(seq, obs, max_new_tokens=room)
        return done

    def _trajectory(self, seq: int, last: Completion | None) -> Completion:
        """The episode of `seq` as one Completion (its last turn's, or a parked one's)."""
        ep = self._episodes.pop(seq)
        r, st, n = ep.request, ep.env.stats, self._counts
        policy = sum(ep.mask)
        for k, v in (("trajectories", 1), ("with_tool_call", st.tool_calls > 0),
                     ("policy_turns", st.turns), ("tool_calls", st.tool_calls),
                     ("tool_truncated", st.truncated), ("policy_tokens", policy),
                     ("env_tokens", len(ep.mask) - policy),
                     *((f"tool_error_{k}", st.errors[k]) for k in ERROR_KINDS)):
            n[k] += int(v)
        return Completion(
            prompt_id=r.prompt_id, sample_idx=r.sample_idx, token_ids=ep.tokens,
            text="".join(ep.texts), logprobs=ep.logprobs,
            # ended by the env or the token cap with a call unanswered: cut, as at "length"
            finish_reason="length" if last is None else last.finish_reason,
            prompt_tokens=list(r.prompt_tokens), error=None if last is None else last.error,
            seq=seq, versions=ep.versions, policy_mask=ep.mask, episode=ep.env.stats)
