"""What a method is, in one table: every other place (config, collection, the step) reads it.

  method         collection                                   baseline from  / std  more prompts
  grpo           one round of n per prompt                    the n kept     yes    no
  dapo           grpo; drop uniform groups, draw new prompts  the n kept     yes    yes
  ada_pos        rounds of M until one correct (at most N)    every draw     no     no
  ada_balance    rounds of M until n/2 correct + n/2 wrong    every draw     no     no
  exhaustive     the whole M x N budget, no early exit        every draw     no     no
  ada_knapsack   ada_balance inside knapsack caps             every draw     no     no
  grpo_knapsack  one draw of each prompt's knapsack cap       the n kept     yes    no

As the official scripts: GRPO and DAPO divide the advantage by the group's std;
Reinforce-Ada takes mean and std from the whole pool and does not divide
(norm_adv_by_std_in_grpo=False). `adaptive.normalize_std` overrides the division when set.
`exhaustive` is the upper bound on sampling cost the adaptive rules are measured against.
The `*_knapsack` rows split a step's `adaptive.budget` across its prompts by Knapsack RL's
value (`ada.adaptive.allocation`; the run's side: ada/run/allocator.py); any other method
takes the split by `adaptive.allocation`. grpo_knapsack's one round may draw up to M x N
for a prompt (the cap decides), as the simulator's arm does (docs/allocation/).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ada.adaptive import success
from ada.adaptive.allocation import AllocConfig
from ada.adaptive.collect import CollectConfig, Collected
from ada.rl.advantages import advantages as _advantages


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    rule: str  # exit rule (ada.adaptive.rules)
    adaptive_rounds: bool  # rounds of M up to N; False: one round of n
    stats_from: str  # advantage baseline: "group" (the n kept) or "pool" (every draw)
    normalize_std: bool  # divide the advantage by the std
    draws_more_prompts: bool = False  # DAPO's dynamic sampling
    allocation: str | None = None  # the budget split it implies (None: adaptive.allocation)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("grpo", rule="none", adaptive_rounds=False, stats_from="group", normalize_std=True),
    Method("dapo", rule="none", adaptive_rounds=False, stats_from="group", normalize_std=True,
           draws_more_prompts=True),
    Method("ada_pos", rule="pos", adaptive_rounds=True, stats_from="pool", normalize_std=False),
    Method("ada_balance", rule="balance", adaptive_rounds=True, stats_from="pool",
           normalize_std=False),
    Method("exhaustive", rule="none", adaptive_rounds=True, stats_from="pool",
           normalize_std=False),
    Method("ada_knapsack", rule="balance", adaptive_rounds=True, stats_from="pool",
           normalize_std=False, allocation="knapsack"),
    Method("grpo_knapsack", rule="none", adaptive_rounds=False, stats_from="group",
           normalize_std=True, allocation="knapsack"),
)}


def get(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[name]


def collect_config(name: str, n: int = 4, samples_per_round: int = 8, max_rounds: int = 4,
                   **overrides) -> CollectConfig:
    """The CollectConfig of a method: grpo/dapo draw one round of n, the others rounds of
    `samples_per_round` (M) up to `max_rounds` (N). `overrides` set any other field
    (positive_threshold, reward_range, scheduler, dapo_max_batches, overlap_scoring: the
    `adaptive.*` config knobs of the same names and defaults)."""
    m = get(name)
    one = samples_per_round * max_rounds if m.allocation else n  # the cap decides (doc)
    rounds = (dict(samples_per_round=samples_per_round, max_rounds=max_rounds)
              if m.adaptive_rounds else dict(samples_per_round=one, max_rounds=1))
    return CollectConfig(rule=m.rule, n=n, dynamic_sampling=m.draws_more_prompts,
                         **{**rounds, **overrides})


def allocation_of(name: str, knob: str | None = "none") -> str:
    """The budget split of a run: the method's own, else `adaptive.allocation`'s (None, as
    `--config.adaptive.allocation=none` parses: none)."""
    return get(name).allocation or knob or "none"


def alloc_config(name: str, prompts: int, collect: CollectConfig, allocation: str | None = "none",
                 budget: int = 0, **knobs) -> AllocConfig:
    """The AllocConfig of a run of `prompts` per step: `budget` 0 is GRPO's n x prompts
    (equal samples built in); a prompt's cap is at most the collection's M x N. `knobs`:
    floor, explore, skip_above (the adaptive.* knobs of the same names)."""
    return AllocConfig(allocation=allocation_of(name, allocation),
                       budget=budget or collect.n * prompts, max_cap=collect.budget, **knobs)


def allocation_problems(name: str, knob: str, half_life: float, alloc: AllocConfig | None,
                        budget: int, prompts: int) -> list[str]:
    """Why a run's budget split (the adaptive.* knobs named) cannot run with method `name`."""
    row = get(name)
    out = [f"adaptive.{p}" for p in [success.check(half_life, success.PRIOR_STRENGTH)] if p]
    if row.allocation and knob not in (None, "none", row.allocation):
        out.append(f"adaptive.allocation={knob!r} with method={name}, which splits by "
                   f"{row.allocation}; drop the knob or pick another method")
    if alloc is None or alloc.allocation == "none":
        return out
    if row.draws_more_prompts:
        out.append(f"adaptive.allocation={alloc.allocation} with method={name}: DAPO's further "
                   "batches have no caps; use adaptive.allocation=none")
    if alloc.budget < alloc.floor * prompts:
        out.append(f"adaptive.budget={budget} is below adaptive.floor={alloc.floor} x "
                   f"data.prompts_per_step={prompts} = {alloc.floor * prompts} samples; raise "
                   "the budget (0: n x prompts_per_step) or lower the floor")
    return out


def advantages(name: str, collected: Collected, normalize_std: bool | None = None) -> np.ndarray:
    """Advantages [P, n] of a collected batch, as the method defines them (float32)."""
    m = get(name)
    norm = m.normalize_std if normalize_std is None else normalize_std
    return np.asarray(_advantages(collected.rewards, stats_from=m.stats_from, pool=collected.pool,
                                  group_valid_PxN=collected.group_valid, norm_by_std=norm))
