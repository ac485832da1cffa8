"""`ada-inspect PATH [--json]`: describe a model without loading its weights.

PATH is a local Hugging Face checkpoint (its config.json and safetensors headers, instant
on a 7B checkpoint: family, size, dtype, whether ada loads it; ada/models/summary.py), or a
run: its directory, its checkpoints/ or one checkpoint in it (the run's saved config and the
checkpoint's stored array shapes: the same numbers, the method and step, and how to export
it as a Hugging Face folder).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from ada.models.hf_config import CheckpointError
from ada.models.summary import format_info, inspect_checkpoint, model_info


def run_of(path: str) -> tuple[str, int | None] | None:
    """(workdir, step) when `path` is a run directory, its checkpoints/ or one checkpoint
    in it (step None: the latest complete); None for anything else."""
    p, step = os.path.abspath(path), None
    if os.path.basename(os.path.dirname(p)) == "checkpoints" and os.path.basename(p).isdigit():
        p, step = os.path.dirname(p), int(os.path.basename(p))
    if os.path.basename(p) == "checkpoints":
        p = os.path.dirname(p)
    try:
        with open(os.path.join(p, "config.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return (p, step) if os.path.isdir(os.path.join(p, "checkpoints")) else None
    return (p, step) if isinstance(raw, dict) and "method" in raw and "model" in raw else None


def inspect_run(workdir: str, step: int | None = None) -> dict:
    """A run's model from its saved config and checkpoint `step` (default the latest
    complete): no weight is read. CheckpointError (one line) when there is none."""
    import types

    import jax

    from ada.checkpoint import complete_steps, stored_tree
    from ada.config import load_run_config
    from ada.run.policy import model_config_for

    try:
        config = load_run_config(workdir)
    except FileNotFoundError as e:
        raise CheckpointError(str(e)) from None
    directory = os.path.join(workdir, "checkpoints")
    steps = complete_steps(directory)
    if step is None and not steps:
        raise CheckpointError(f"{directory}: no complete checkpoint yet; inspect the run once it "
                              f"has saved one (checkpoint.every={config.checkpoint.every} steps)")
    if step is not None and step not in steps:
        raise CheckpointError(f"{directory}/{step}: not a complete checkpoint (complete steps: "
                              f"{steps})")
    step = steps[-1] if step is None else step
    params = stored_tree(os.path.join(directory, str(step)))["params"]
    arrays = jax.tree.leaves(params)
    dtypes = sorted({str(a.dtype) for a in arrays})
    hf = os.path.join(workdir, "hf")
    info = {
        "path": workdir, "method": config.method, "step": step,
        "checkpoint": os.path.join(directory, str(step)),
        "num_parameters": sum(math.prod(a.shape) for a in arrays), "num_tensors": len(arrays),
        "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
        "hf": hf if os.path.isfile(os.path.join(hf, "config.json")) else
        ("none: rerun the run's command with --config.checkpoint.export_hf=true "
         f"(it writes {hf} once train.steps={config.train.steps} is reached)"),
    }
    if "embed" not in params:  # LoRA: the adapters alone; the base is the run's model.path
        info["lora_rank"] = config.model.lora.rank
        if not config.model.path:  # a seeded / warm-started base: its vocabulary is not here
            return info
    vocab = params["embed"].shape[0] if "embed" in params else 0
    try:  # the vocabulary is the stored embedding's rows: no tokenizer is built
        model = model_config_for(config, types.SimpleNamespace(vocab_size=vocab))
    except CheckpointError as e:  # model.path moved since the run: the shapes still count
        info["problem"] = str(e)
    else:
        info.update(model_info(model))
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ada-inspect", description="Describe a Hugging Face checkpoint or a run's model "
                                        "(config and headers only; no weight is read).")
    parser.add_argument("path", help="a Hugging Face checkpoint directory (config.json + "
                                     "*.safetensors), or a run: its --workdir, its checkpoints/ "
                                     "or checkpoints/STEP")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    from ada import quiet

    quiet.quiet_start()
    run = run_of(args.path)
    try:
        info = inspect_run(*run) if run else inspect_checkpoint(args.path)
    except CheckpointError as e:
        also = "" if run else "; ada-inspect also reads a run (its --workdir or checkpoints/STEP)"
        print(f"ada-inspect: error: {e}{also}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
