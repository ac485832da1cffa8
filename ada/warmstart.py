"""A short supervised warm start on the synthetic task, cached on disk by its config.

RL needs a policy that sometimes solves a prompt: a randomly initialised model never
does, so every group is all-wrong and there is no signal at all. The embedded default
therefore trains the tiny model for a few hundred steps of next-token cross-entropy on
`prompt + answer + EOS` for the training split, then RL takes over. The result depends
only on (model config, tokenizer, records, warm-start settings, seed), so it is cached
under a hash of those and computed once; every method compared in experiments/ starts
from the same bytes.

A run with tools (env.tools) warm-starts on a few traces that teach only the call format
(`ToolTraces`): the tool's output in them is masked out of the loss, so the policy is never
taught to write an observation (the env does), and when to call and what to copy is left
to RL.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from ada import paths
from ada.envs import EnvConfig, ToolCall, ToolEnv
from ada.models.transformer import ModelConfig, forward, init_params, positions_from_mask

log = logging.getLogger(__name__)


NEAR_MISSES = (-2, -1, 1, 2)  # what a noisy teacher answers instead of the true integer
TEACHER_COPIES = 5  # warm-start examples per record when the teacher is noisy


def examples(records, task, tokenizer, noise: float, seed: int):
    """(prompt tokens, target tokens) of the warm start. With teacher noise q > 0 each
    record with an integer answer appears TEACHER_COPIES times, round(q * copies) of them
    answered by a near miss (answer -2, -1, +1 or +2). Trained on after the exact answers
    (warmstart.noise_steps), it keeps the answer as the policy's most likely reply but
    spreads mass to its neighbours: a policy whose pass@k far exceeds its pass@1, as a
    pretrained LLM's (the regime RL sharpens; docs/results.md)."""
    eos = tokenizer.eos_id
    rng = np.random.default_rng(seed)
    wrong = round(noise * TEACHER_COPIES)
    out = []
    for r in records:
        target = tokenizer.encode(task.response(r)) + [eos]
        answer = r["answer"]
        if not wrong or not answer.lstrip("-").isdigit():
            out.append((r["prompt_tokens"], target))
            continue
        out += [(r["prompt_tokens"], target)] * (TEACHER_COPIES - wrong)
        for d in rng.choice(NEAR_MISSES, size=wrong, replace=False):
            miss = task.response(dict(r, answer=str(int(answer) + int(d))))
            out.append((r["prompt_tokens"], tokenizer.encode(miss) + [eos]))
    return out


@dataclasses.dataclass(frozen=True)
class ToolTraces:
    """A tool run's warm start (configs/tools.py): the first `records` training records, each
    answered one way (the policy's turns, the env's observation between them, masked):

      call        ` <calc>123 * 456</calc>` `<out>56088</out>` ` = 56088` EOS: a share `call`
      wrong copy  the same, then a copy with one digit wrong: a share `wrong_copy`
      no call     ` 51730` EOS, a guess with the answer's number of digits (rarely right)

    The answer after a call follows '=' (arithmetic_reward reads the number after the last
    '='). The observation is what a ToolEnv of `env` writes for the call, encoded on its own
    as the run's env driver appends it. Enough to teach the format, not when to call (the
    traces call `call + wrong_copy` of the time) or to copy exactly: RL's part."""

    env: EnvConfig
    records: int = 256
    call: float = 0.4
    wrong_copy: float = 0.2

    def settings(self) -> dict:
        """What the traces add to the warm start's cache key."""
        return {"tools": self.env.tools, "tool_format": self.env.tool_format,
                "tool_traces": self.records,
                "tool_call": self.call, "tool_wrong_copy": self.wrong_copy}

    def kinds(self, n: int, rng: np.random.Generator) -> list[str]:
        """Each of `n` records' trace kind: the shares' counts, shuffled."""
        calls, wrong = round(self.call * n), round(self.wrong_copy * n)
        kinds = ["call"] * calls + ["wrong_copy"] * wrong + ["no_call"] * (n - calls - wrong)
        return [kinds[i] for i in rng.permutation(n)]


def _guess(answer: str, rng: np.random.Generator) -> str:
    """A number with as many digits as `answer` (and its sign), drawn at random."""
    sign, n = ("-", len(answer) - 1) if answer.startswith("-") else ("", len(answer))
    digits = [int(rng.integers(1 if n > 1 else 0, 10))] + list(rng.integers(0, 10, n - 1))
    return sign + "".join(map(str, digits))


def _miscopy(answer: str, rng: np.random.Generator) -> str:
    """`answer` with one of its digits changed (never to a leading zero)."""
    i = int(rng.choice([k for k, c in enumerate(answer) if c.isdigit()]))
    lead = i == answer.startswith("-") and len(answer) > i + 1
    d = rng.choice([c for c in "0123456789" if c != answer[i] and not (lead and c == "0")])
    return answer[:i] + str(d) + answer[i + 1:]


def tool_examples(records, tokenizer, traces: ToolTraces, seed: int):
    """(prompt tokens, target tokens, target loss mask) of a tool run's warm start on the
    first `traces.records` of `records` (encoded, arithmetic): see ToolTraces. The mask is
    0 on the observation's tokens, 1 on the policy's."""
    if "calculator" not in traces.env.tool_names:
        raise ValueError(f"tool traces call the calculator; env.tools={traces.env.tools!r}")
    rng = np.random.default_rng(seed)
    chosen = records[: traces.records]
    eos = tokenizer.eos_id
    out = []
    for r, kind in zip(chosen, traces.kinds(len(chosen), rng), strict=True):
        if kind == "no_call":
            target = tokenizer.encode(" " + _guess(r["answer"], rng)) + [eos]
            out.append((r["prompt_tokens"], target, [1] * len(target)))
            continue
        env = ToolEnv(r, None, traces.env, tokenizer=tokenizer)
        call = " " + env.format.render(ToolCall("calculator", {"expression": r["expression"]}))
        observation = tokenizer.encode(env.step(call).observation)
        copy = r["answer"] if kind == "call" else _miscopy(r["answer"], rng)
        turn, answer = tokenizer.encode(call), tokenizer.encode(" = " + copy) + [eos]
        out.append((r["prompt_tokens"], turn + observation + answer,
                    [1] * len(turn) + [0] * len(observation) + [1] * len(answer)))
    return out


def cache_key(model_cfg: ModelConfig, vocab_fingerprint: str, records: Sequence[dict],
              response_fn_tag: str, settings: dict, seed: int) -> str:
    h = hashlib.sha256()
    h.update(repr(model_cfg).encode())
    h.update(vocab_fingerprint.encode())
    h.update(response_fn_tag.encode())
    h.update(json.dumps(settings, sort_keys=True).encode())
    h.update(str(seed).encode())
    for r in records:
        h.update(r["id"].encode() + b"\0" + r["problem"].encode() + b"\0" + r["answer"].encode())
    return h.hexdigest()[:16]


def _batch(examples: list[tuple], pad_id: int, T: int):
    """Left-pad prompts, right-pad targets into [B, T]; loss only on the target tokens (an
    example's third item, when it has one, masks some of them out: a tool's output)."""
    B = len(examples)
    tokens = np.full((B, T), pad_id, np.int32)
    mask = np.zeros((B, T), bool)
    loss_mask = np.zeros((B, T), np.float32)
    for i, (prompt, target, *weights) in enumerate(examples):
        seq = (prompt + target)[:T]
        tokens[i, : len(seq)] = seq
        mask[i, : len(seq)] = True
        loss_mask[i, len(prompt): len(seq)] = weights[0][: len(seq) - len(prompt)] if weights else 1
    return tokens, mask, loss_mask


def supervised_train(params, model_cfg: ModelConfig, examples: list[tuple],
                     *, steps: int, batch_size: int, lr: float, seed: int, pad_id: int,
                     log_every: int = 0):
    """AdamW (cosine decay) on token cross-entropy of the targets; deterministic. An example
    is (prompt, target) or (prompt, target, target loss mask)."""
    T = max(len(e[0]) + len(e[1]) for e in examples)
    tokens_all, mask_all, lmask_all = (jnp.asarray(x) for x in _batch(examples, pad_id, T))
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), max(steps, 2), lr * 0.1)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.0))
    opt_state = opt.init(params)

    def loss_fn(p, tokens, mask, lmask):
        logits, _ = forward(p, model_cfg, tokens, positions_from_mask(mask), mask)
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        ll = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        w = lmask[:, 1:]
        return -jnp.sum(ll * w) / jnp.maximum(jnp.sum(w), 1.0)

    @jax.jit
    def step(p, s, idx):
        loss, g = jax.value_and_grad(loss_fn)(p, tokens_all[idx], mask_all[idx], lmask_all[idx])
        upd, s = opt.update(g, s, p)
        return optax.apply_updates(p, upd), s, loss

    rng = np.random.Generator(np.random.PCG64(seed))
    n = len(examples)
    loss = float("nan")
    for k in range(steps):
        idx = rng.choice(n, size=min(batch_size, n), replace=False)
        params, opt_state, loss = step(params, opt_state, jnp.asarray(idx))
        if log_every and (k + 1) % log_every == 0:
            log.info("warm start step %d/%d loss %.4f", k + 1, steps, float(loss))
    return params, float(loss)


def warm_start(model_cfg: ModelConfig, examples: list[tuple], *,
               key_parts: str, steps: int, batch_size: int, lr: float, seed: int, pad_id: int,
               cache_dir: str, init=None) -> tuple[dict, dict]:
    """`init` (default: a random init from `seed`) + `steps` supervised steps, cached in
    `cache_dir/<key>.msgpack`, a local folder or gs:// (the key must name `init`'s own making).

    Returns (params, info) with info = {"cached": bool, "path": ..., "loss": ..., "sha256": ...}.
    `sha256` is the content hash of the saved bytes: the key names how a start was made, not
    what it came out as, and the same key trained on another CPU's kernels gives other
    params (docs/results.md, "The embedded default run on any CPU"); caches keyed on the start
    (the pass-rate filter) and comparisons of runs key on the hash.
    """
    paths.path(cache_dir).mkdir(parents=True, exist_ok=True)
    path = paths.join(cache_dir, f"warmstart-{key_parts}.msgpack")
    file, info = paths.path(path), paths.path(path + ".json")
    template = init_params(model_cfg, jax.random.key(seed))
    if file.exists():
        try:
            data = paths.read_bytes(file)
            params = serialization.from_bytes(template, data)
            meta = json.loads(paths.read_bytes(info)) if info.exists() else {}
            return params, {"cached": True, "path": path, "loss": meta.get("loss"),
                            "sha256": content_hash(data)}
        except Exception as e:  # a corrupt cache entry is recomputed, never trusted
            log.warning("warm-start cache %s unreadable (%s); recomputing", path, e)
    log.info("warm start: %d supervised steps on %d examples (runs once; cached in %s)",
             steps, len(examples), path)
    params, loss = supervised_train(template if init is None else init, model_cfg, examples,
                                    steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                                    pad_id=pad_id, log_every=max(steps // 5, 1))
    params = jax.device_get(params)
    data = serialization.to_bytes(params)
    if jax.process_index() == 0:  # a reader sees no file or the whole of it
        paths.write_atomic(info, json.dumps({"loss": loss, "steps": steps}))
        paths.write_atomic(file, data)
    return params, {"cached": False, "path": path, "loss": loss, "sha256": content_hash(data)}


def content_hash(data: bytes) -> str:
    """The first 16 hex digits of the saved warm start's sha256: the file's own, so
    `sha256sum` on a cache file checks it, and free since the bytes are in hand
    (`lora.fingerprint` hashes a params tree on device, for a base with no file of its own)."""
    return hashlib.sha256(data).hexdigest()[:16]
