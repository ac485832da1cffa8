"""Write a LoRA run's adapters as a PEFT adapter directory (`save_peft`): what
`peft.PeftModel.from_pretrained(base, path)` loads on the base Hugging Face model.

PEFT's layout: `adapter_model.safetensors` holds, per adapted linear layer,
`base_model.model.<the base weight's name without .weight>.lora_A.weight` [r, in] and
`...lora_B.weight` [out, r] (torch Linear's [out, in] orientation: ada's A [I, r] and B [r, O]
transposed); `adapter_config.json` holds r, lora_alpha and target_modules. PEFT scales the
update by lora_alpha / r (use_rslora off), ada by the `lora_scale` leaf, alpha / rank: so
lora_alpha = scale * r, read from the tree, which describes itself.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from ada.models import lora
from ada.models.hf import _usual_mode, tensor_specs
from ada.models.transformer import ModelConfig

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PREFIX = "base_model.model."  # PeftModelForCausalLM's name for the wrapped model


def save_peft(params, config: ModelConfig, path: str | os.PathLike, base_model: str) -> list[str]:
    """Write `params`' adapters (float32) and adapter_config.json, naming `base_model` (the
    base's Hugging Face directory) as base_model_name_or_path. Returns the written names."""
    from safetensors.numpy import save_file

    if not lora.has_adapters(params):
        raise ValueError("save_peft needs a LoRA params tree (model.lora.rank > 0)")
    layers = jax.tree.map(np.asarray, params["layers"])
    scale = np.unique(np.asarray(layers[lora.SCALE], np.float32))
    if scale.size != 1:
        raise ValueError(f"lora_scale {scale} differs across layers; PEFT has one lora_alpha")
    tensors, modules, rank = {}, [], None
    for spec in tensor_specs(config).values():
        name = spec.leaf[-1]
        if spec.leaf[0] != "layers" or name + "_lora_a" not in layers:
            continue
        a = layers[name + "_lora_a"][spec.layer].astype(np.float32)  # [I, r]
        b = layers[name + "_lora_b"][spec.layer].astype(np.float32)  # [r, O]
        rank = a.shape[1]
        module = spec.hf_name.removesuffix(".weight")
        tensors[f"{PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"{PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(b.T)
        modules.append(module.rsplit(".", 1)[1])
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, ADAPTER_FILE), metadata={"format": "pt"})
    _usual_mode(os.path.join(path, ADAPTER_FILE))
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": rank, "lora_alpha": float(scale[0]) * rank, "lora_dropout": 0.0,
        "target_modules": sorted(set(modules)), "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "init_lora_weights": True,
        "inference_mode": True, "modules_to_save": None,
    }
    with open(os.path.join(path, ADAPTER_CONFIG), "w") as f:
        json.dump(adapter_config, f, indent=2)
    return [ADAPTER_FILE, ADAPTER_CONFIG]
