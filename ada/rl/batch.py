"""A collected [P, n] batch -> the train step's [P*n, T] arrays (see ada/rl/train.py for
the format), with rows ordered so every PPO mini-batch holds whole prompts, and cut to the
lengths the batch needs."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ada import sharding as shd
from ada.adaptive.collect import Collected
from ada.models.transformer import positions_from_mask
from ada.rl.train import split_problem

MIN_BUCKET = 8  # shortest prompt or response part of a trimmed batch


def length_bucket(n: int, full: int) -> int:
    """The smallest power of two >= n (at least MIN_BUCKET), capped at `full`: a run's train
    step then compiles for a handful of lengths, not one per batch."""
    return min(full, max(MIN_BUCKET, 1 << max(int(n) - 1, 0).bit_length()))


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    prompt_len: int  # prompts left-padded to this many tokens
    response_len: int  # responses right-padded (and cut) to this many
    pad_id: int
    mini_batches: int = 1
    # Cut each batch to its longest prompt and response, each rounded up by `length_bucket`:
    # the update's cost is linear (attention: quadratic) in T, and padding is pure waste
    # (the default run's prompts fill 16 of 32 columns). The real tokens' numbers do not
    # change, up to float summation order (tests/test_batch.py).
    trim_padding: bool = True  # the run config's train.trim_padding

    def fit(self, longest_prompt: int, longest_response: int) -> BatchLayout:
        """This layout cut to a batch whose longest prompt and response have these lengths
        (unchanged when `trim_padding` is off)."""
        if not self.trim_padding:
            return self
        return dataclasses.replace(self, prompt_len=length_bucket(longest_prompt, self.prompt_len),
                                   response_len=length_bucket(longest_response, self.response_len))


def longest(collected: Collected) -> np.ndarray:
    """[longest prompt, longest kept response] of a collected batch, in tokens."""
    prompt = max((len(p["prompt_tokens"]) for p in collected.prompts), default=0)
    response = max((len(c.token_ids) for p, row in enumerate(collected.completions)
                    for j, c in enumerate(row) if c is not None and collected.group_valid[p, j]),
                   default=0)
    return np.array([prompt, response], np.int64)


def minibatch_row_order(P: int, n: int, mini_batches: int) -> np.ndarray:
    """Row order under which the train step's strided split (row i -> mini-batch i % K) gives
    every mini-batch whole prompts: all n responses of a prompt update together, as in verl.

    Without it, prompt-major rows put member j of every prompt into mini-batch j when K = n,
    and selection lists positives first, so each optimizer update would see one sign only.
    """
    K = mini_batches
    if problem := split_problem(P, n, K, 1):
        raise ValueError(f"train.{problem}; make data.prompts_per_step / processes a multiple "
                         "of train.mini_batches")
    if K == 1:
        return np.arange(P * n)
    per_mini = [[p * n + j for p in range(k, P, K) for j in range(n)] for k in range(K)]
    return np.array([per_mini[i % K][i // K] for i in range(P * n)])


def build_train_batch(collected: Collected, advantages_PxN, layout: BatchLayout,
                      lengths=None, version: int | None = None) -> dict[str, np.ndarray]:
    """[P, n] selected responses -> a [P*n, T] batch (prompt left-padded, response right),
    rows in `minibatch_row_order`, cut to `layout.fit(*lengths)` (default: the batch's own
    `longest`). Invalid group slots keep the prompt, no response tokens and advantage 0.
    With `version` (the policy version that trains on it) the batch also holds behav_logp
    (the sampler's log-prob of each response token) and lag (version minus the version
    that sampled it)."""
    layout = layout.fit(*(longest(collected) if lengths is None else lengths))
    P, n = collected.group_valid.shape
    Tp, Tr = layout.prompt_len, layout.response_len
    B = P * n
    tokens = np.full((B, Tp + Tr), layout.pad_id, np.int32)
    mask = np.zeros((B, Tp + Tr), bool)
    rmask = np.zeros((B, Tp + Tr), np.float32)
    adv = np.zeros((B,), np.float32)
    behav = np.zeros((B, Tp + Tr), np.float32)
    lag = np.zeros((B, Tp + Tr), np.int32)
    for p in range(P):
        prompt = collected.prompts[p]["prompt_tokens"]
        if len(prompt) > Tp:
            raise ValueError(f"prompt {p} has {len(prompt)} tokens, more than the train "
                             f"batch's prompt_len={Tp}; pass lengths of at least the batch's "
                             "`longest` and a layout.prompt_len of at least the engine's")
        rows = slice(p * n, (p + 1) * n)
        tokens[rows, Tp - len(prompt): Tp] = prompt
        mask[rows, Tp - len(prompt): Tp] = True
        for j in range(n):
            c = collected.completions[p][j]
            if not collected.group_valid[p, j] or c is None:
                continue
            b = p * n + j
            resp = list(c.token_ids)[:Tr]
            tokens[b, Tp: Tp + len(resp)] = resp
            mask[b, Tp: Tp + len(resp)] = True
            # a trajectory's environment tokens (tool output: ada/trajectory.py) are context,
            # never trained: 0 in the loss mask, so no loss term, ratio or count covers them
            mask_of = getattr(c, "policy_mask", None)
            rmask[b, Tp: Tp + len(resp)] = 1.0 if mask_of is None else mask_of[:Tr]
            adv[b] = advantages_PxN[p, j]
            if version is not None:
                behav[b, Tp: Tp + len(resp)] = c.logprobs[:Tr]
                lag[b, Tp: Tp + len(resp)] = version - np.asarray(c.versions[:Tr])
    positions = np.asarray(positions_from_mask(mask)).astype(np.int32)
    order = minibatch_row_order(P, n, layout.mini_batches)
    batch = {"tokens": tokens, "positions": positions, "mask": mask, "response_mask": rmask,
             "advantages": adv}
    if version is not None:
        batch.update(behav_logp=behav, lag=lag)
    return {k: v[order] for k, v in batch.items()}


def to_global(batch: dict[str, np.ndarray], mesh) -> dict:
    """Every process's rows stacked into one global batch sharded over data x fsdp."""
    return {k: jax.make_array_from_process_local_data(shd.batch_sharding(mesh, np.ndim(v)),
                                                      np.asarray(v))
            for k, v in batch.items()}
