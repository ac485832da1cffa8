"""Sampling from the current policy: adaptive collection for training, plain k-per-prompt
draws (evaluation, pass rates), both through this process's engine.

Generation is process-local: each process samples its own prompts on its own devices (the
engine's mesh) with no collective inside the round loop, so one process whose prompts exit
in round 1 cannot hang another that needs four. The only cross-process step is bringing
the trained params to the engine, once per collection, when the Driver is made
(`Engine.prepare_params`: device to device, in the sampler's dtype): every process must
collect or sample, even with no prompts of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import jax

from ada.adaptive.collect import CollectConfig, Collected, Collector
from ada.envs import EnvConfig, ToolEnv
from ada.sampling.driver import Completion, Driver, Request
from ada.sampling.engine import Engine
from ada.trajectory import COUNTERS as ENV_COUNTERS
from ada.trajectory import EnvDriver


class Rollout:
    """One engine, the tokenizer that decodes it, the reward that scores its responses, and
    how a training batch is collected (`collect_cfg`; None for a sampler that only draws).
    With `env` (the run's tools, ada/envs) a response is a whole trajectory: every driver
    is wrapped in an EnvDriver (ada/trajectory.py), which keeps the Driver's calls."""

    def __init__(self, engine: Engine, tokenizer, collect_cfg: CollectConfig | None, reward,
                 env: EnvConfig | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.collect_cfg = collect_cfg
        self.reward = reward
        self.env = env
        self.process_index, self.process_count = jax.process_index(), jax.process_count()

    def driver(self, params, key) -> Driver:
        """A Driver over this process's copy of the trained params (the Driver hands them
        to the engine: `Engine.prepare_params`)."""
        # the engine folds raw uint32 keys
        return self.wrap(Driver(self.engine, params, tokenizer=self.tokenizer,
                                step_key=jax.random.key_data(key)))

    def wrap(self, driver: Driver) -> Driver | EnvDriver:
        """`driver` as this rollout samples: itself, or with the run's tools, an EnvDriver
        whose every request is an episode of a ToolEnv (scored by the Collector, as a
        one-turn response is: the env leaves the reward to it)."""
        if self.env is None:
            return driver
        encode = lambda text: self.tokenizer.encode(text, add_special=False)
        return EnvDriver(driver, lambda r: ToolEnv(
            {}, None, self.env, tokenizer=self.tokenizer, prompt_tokens=len(r.prompt_tokens)),
            encode)

    def collector(self, driver, step_key=None) -> Collector:
        """The adaptive collection of this process's prompt records over `driver`; its
        requests draw with `step_key` (None: the driver's; ada/stream.py gives each step's
        prompts their own)."""
        return Collector(
            self.collect_cfg, self.reward, driver=driver,
            make_request=lambda r: Request(prompt_tokens=r.prompt["prompt_tokens"],
                                           prompt_id=r.prompt_id, sample_idx=r.sample_idx,
                                           step_key=step_key),
            process_index=self.process_index, process_count=self.process_count)

    def collect(self, params, prompts: Sequence[dict], key,
                more_prompts: Iterable[Sequence[dict]] | None = None, caps=None) -> Collected:
        """One adaptive collection of this process's prompt records (with `prompt_tokens`);
        DAPO draws further prompts one by one from the batches of `more_prompts`. `caps`:
        per prompt, the samples it may draw (a budget split, `ada.adaptive.allocation`)."""
        with jax.default_device(jax.local_devices()[0]):
            driver = self.driver(params, jax.random.fold_in(key, 0))
            collector = self.collector(driver)
            more = None
            if self.collect_cfg.dynamic_sampling:
                more = itertools.chain.from_iterable(more_prompts or ())
            out = collector.collect(prompts, jax.random.fold_in(key, 1), more_prompts=more,
                                    caps=caps)
        stats = driver.stats()  # what the sampler prefilled and copied for it
        driver.release()  # its decode state and weights leave the chips now, not at a GC
        out.metrics.update(prefilled_prompts=stats["prefilled_prompts"],
                           prefilled_tokens=stats["prefilled_tokens"],
                           page_copies=stats.get("page_copies", 0))
        if self.env is not None:  # the trajectories' tool use (step.step_metrics)
            out.metrics["env"] = {k: stats[k] for k in ENV_COUNTERS}
        return out

    def sample(self, params, records: Sequence[dict], k: int, key,
               prompt_ids: Iterable[int]) -> list[list[Completion]]:
        """k responses for each record (with `prompt_tokens`); record i draws as prompt
        prompt_ids[i]: the only k-per-prompt sampler (evaluation, pass rates)."""
        with jax.default_device(jax.local_devices()[0]):
            driver = self.driver(params, key)
            reqs = [Request(prompt_tokens=r["prompt_tokens"], prompt_id=pid, sample_idx=j)
                    for r, pid in zip(records, prompt_ids, strict=True) for j in range(k)]
            outs = driver.generate_all(reqs)
            driver.release()
        return [outs[i * k:(i + 1) * k] for i in range(len(records))]

