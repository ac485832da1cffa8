"""The pass-rate filter of `data.pass_rate_range`: the paper's easy / hard prompt sets,
chosen by the policy that starts training, with the one cache key it shares with
`python -m ada.data.difficulty` (`pass_rate_settings`)."""

from __future__ import annotations

import hashlib
import logging
import os

from ada.data.preprocess import DifficultyFilter, difficulty_filter
from ada.data.task import reward_spec
from ada.errors import ConfigError
from ada.evaluation import pass_rates
from ada.rollout import Rollout
from ada.run.policy import cache_dir, initial_policy

log = logging.getLogger(__name__)


PASS_RATE_SEED = 0  # one key for every pass rate: the same easy / hard set for every RL seed


def pass_rate_settings(config, policy: str, k: int, instruction: str | None = None,
                       seed: int = PASS_RATE_SEED) -> dict:
    """Everything that changes a policy's pass rates, in one place: the cache key of the
    run's `data.pass_rate_range` and of `python -m ada.data.difficulty`."""
    s = config.sampling
    return {"policy": policy, "template": config.tokenizer.template, "instruction": instruction,
            "reward": reward_spec(config), "threshold": config.adaptive.positive_threshold,
            "k": k, "seed": seed, "temperature": s.temperature, "top_p": s.top_p,
            "top_k": s.top_k, "max_new_tokens": s.max_new_tokens,
            "max_prompt_len": config.data.max_prompt_len}

def filter_by_pass_rate(c, records: list[dict], params, model_cfg, rollout: Rollout,
                        warm_info: dict):
    """The training prompts whose pass rate under the initial policy lies in
    data.pass_rate_range: the paper's easy / hard prompt sets (section 4.1), chosen by the
    policy that starts training. Pass rates are data.pass_rate_samples draws
    (`ada.evaluation.pass_rates`), cached by `pass_rate_settings` and the records, so a
    second run with the same start does not sample."""
    lo, hi = c.data.pass_rate_range
    settings = pass_rate_settings(c, initial_policy(c, model_cfg, warm_info),
                                  c.data.pass_rate_samples)
    data_id = hashlib.sha256("\x00".join(f"{r['id']}\x01{r['problem']}\x01{r['answer']}"
                                         for r in records).encode()).hexdigest()
    tag = hashlib.sha256(repr((sorted(settings.items()), data_id)).encode()).hexdigest()[:16]
    rates, _ = pass_rates(records, rollout, params, k=c.data.pass_rate_samples,
                          seed=PASS_RATE_SEED, threshold=c.adaptive.positive_threshold,
                          cache_path=os.path.join(cache_dir(c), "passrates", f"{tag}.jsonl"),
                          settings=settings)
    kept, _ = difficulty_filter(records, rates, DifficultyFilter(
        k=c.data.pass_rate_samples, min_pass_rate=lo, max_pass_rate=hi))
    if len(kept) < c.data.prompts_per_step:
        raise ConfigError(f"data.pass_rate_range={tuple(c.data.pass_rate_range)} keeps {len(kept)}"
                          f" of {len(records)} training prompts, fewer than data.prompts_per_step="
                          f"{c.data.prompts_per_step}; widen the range")
    log.info("pass-rate filter %s: kept %d of %d training prompts", (lo, hi), len(kept),
             len(records))
    return kept
