"""RunState: everything a resume needs, in one value, saved and restored whole.

A run resumes exactly (the same parameters and metrics as an uninterrupted run) from the
train state (params, optimizer state, update counters), the base key every random draw of
step t derives from (`fold_in(key, t)`), the data position after the batches trained so far
(the stream's: batches in flight are drawn again), the run's counters and the non-finite
guard, and under a budget split (adaptive.allocation) the per-prompt success memory. A
checkpoint holds exactly this: its arrays as one orbax tree, the rest as its JSON meta, in
the format runs have always been saved in (`state_tree`), so older runs resume. The memory
rides in the meta (`memory_json`: the prompts it has seen, float64 exactly as JSON writes
a float), so a run without it saves what it always saved.

Under LoRA the frozen base is not saved: the params tree holds the adapters alone (a few MB,
not the model), and the meta names the base (`base`: its path and content hash,
`lora.fingerprint`). A resume rebuilds the base as the run did (model.path, the warm start
or the seeded init) and refuses, before restoring anything, one whose hash differs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from ada.adaptive import success
from ada.adaptive.success import SuccessMemory
from ada.checkpoint import Checkpointer
from ada.errors import ConfigError
from ada.models import lora
from ada.rl.train import TrainState

TRAIN_FIELDS = ("params", "opt_state", "step", "updates", "skipped")


def memory_json(mem: SuccessMemory | None) -> dict | None:
    """The memory as JSON: only the prompts with a record (every float round-trips exactly)."""
    if mem is None:
        return None
    seen = np.flatnonzero((mem.pos > 0) | (mem.neg > 0) | (mem.last > 0))
    return {"size": int(mem.pos.size), "ids": seen.tolist(), "pos": mem.pos[seen].tolist(),
            "neg": mem.neg[seen].tolist(), "last": mem.last[seen].tolist(),
            "pop": mem.pop.tolist(), "pop_last": int(mem.pop_last)}


def memory_from_json(saved: dict | None, template: SuccessMemory | None) -> SuccessMemory | None:
    """`memory_json`'s memory; the template when the checkpoint has none (or needs none)."""
    if saved is None or template is None:
        return template
    mem, ids = success.init(int(saved["size"])), np.asarray(saved["ids"], np.int64)
    mem.pos[ids], mem.neg[ids], mem.last[ids] = saved["pos"], saved["neg"], saved["last"]
    return mem.replace(pop=np.asarray(saved["pop"], np.float64),
                       pop_last=np.asarray(saved["pop_last"], np.int64))


def state_tree(state: TrainState, rng_data) -> dict:
    """A checkpoint's arrays: the train state's (under LoRA the adapters, not the frozen
    base) and the base key's data."""
    return {"params": lora.split(state.params)[0], "opt_state": state.opt_state, "step": state.step,
            "updates": state.updates, "skipped": state.skipped,
            "rng": np.asarray(jax.device_get(rng_data))}  # host value, same on every process


@dataclasses.dataclass(frozen=True)
class RunState:
    train: TrainState
    key: Any  # the base key (typed)
    step: int = 0  # the last trained RL step
    data: dict | None = None  # the data position after step `step`'s batch (None: the start)
    counters: dict = dataclasses.field(
        default_factory=lambda: {"samples_total": 0, "prompts_total": 0})
    guard: dict = dataclasses.field(  # non-finite updates skipped: in all, and in a row
        default_factory=lambda: {"skipped_steps": 0, "skipped_in_row": 0})
    seconds: float = 0.0  # training seconds of the run's earlier segments and this one
    base: dict | None = None  # LoRA: the frozen base's {"path", "hash"} (not checkpointed)
    memory: SuccessMemory | None = None  # per-prompt success (None: no budget split)

    def save(self, ckpt: Checkpointer, method: str) -> None:
        """Start writing this state as checkpoint `step` (Checkpointer.save: async)."""
        meta = {"data": self.data, "sampler": self.counters, "method": method,
                "guard": self.guard, "seconds": self.seconds}
        if self.memory is not None:
            meta["success_memory"] = memory_json(self.memory)
        if self.base is not None:
            meta["base"] = self.base
        ckpt.save(self.step, state_tree(self.train, jax.random.key_data(self.key)), meta)

    def restore(self, ckpt: Checkpointer) -> RunState:
        """The latest checkpoint's state, its arrays placed as this state's (the template;
        under LoRA its frozen base joins the saved adapters). ConfigError, before any array
        is read, when a LoRA checkpoint was trained on another base."""
        check_base(ckpt.read_meta(), self.base, ckpt.directory)
        tree, meta, step = ckpt.restore(state_tree(self.train, jax.random.key_data(self.key)))
        tree["params"] = lora.join(tree["params"], lora.split(self.train.params)[1])
        return RunState(self.train.replace(**{k: tree[k] for k in TRAIN_FIELDS}),
                        jax.random.wrap_key_data(np.asarray(tree["rng"])), step, meta["data"],
                        meta.get("sampler", self.counters), meta.get("guard", self.guard),
                        meta.get("seconds", self.seconds),  # 0: saved before it was kept
                        self.base, memory_from_json(meta.get("success_memory"), self.memory))


def check_base(meta: dict, base: dict | None, directory) -> None:
    """A LoRA checkpoint holds no base: refuse (one line) to join its adapters to a base
    whose content hash differs from the one it was trained on."""
    saved = meta.get("base")
    if saved is None or base is None or saved["hash"] == base["hash"]:
        return
    raise ConfigError(
        f"checkpoint {meta['step']} in {directory} holds LoRA adapters trained on the base "
        f"{saved['path']} (hash {saved['hash']}), but this command's base is {base['path']} "
        f"(hash {base['hash']}); resume with the run's own base (model.path, warm start and "
        "seed as saved), or start a new run with another --workdir")
