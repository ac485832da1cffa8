"""A LoRA run's PEFT export (ada.export.export_peft): the adapter loads with `peft` on the
base Hugging Face model in transformers and gives ada's logits."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
import torch
import transformers
from test_hf_interop import _batch, ada_logits, hf_logits, real_max_diff
from test_tokenizer import arithmetic_texts
from tiny_hf import make_tiny_hf
from tolerances import model_tol

from ada import config as C
from ada.export import export_peft
from ada.models import init_params, lora, preset
from ada.models.hf import load_hf
from ada.models.hf_lora import save_peft
from ada.models.lora import LoraConfig
from ada.tokenizer import load_tokenizer, train_sentencepiece

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.numerics  # CI runs it again under another CPU's kernels


def adapted(base, targets):
    """`base` with rank-4, alpha-12 (scale 3) adapters whose B is random, not zero."""
    params = lora.attach(base, LoraConfig(rank=4, alpha=12.0, targets=targets, seed=1),
                         jnp.float32)
    layers = dict(params["layers"])
    for i, name in enumerate(targets):
        b = layers[name + "_lora_b"]
        layers[name + "_lora_b"] = 0.05 * jax.random.normal(jax.random.key(i), b.shape)
    return dict(params, layers=layers)


def check_peft_logits(base_model, adapter_dir, params, config):
    """PeftModel (base + the adapter) gives ada's adapted logits within the float32 model
    tolerance, and the base's differ by far more."""
    tokens, mask, positions = _batch(config.vocab_size)
    plain = hf_logits(base_model, tokens, mask, positions)  # before peft wraps it in place
    model = peft.PeftModel.from_pretrained(base_model, adapter_dir).eval()
    targets = [k[:-len("_lora_a")] for k in params["layers"] if k.endswith("_lora_a")]
    modules = {n.rsplit(".", 1)[0] for n, _ in model.named_modules() if n.endswith("lora_A")}
    assert len(modules) == len(targets) * config.num_layers, sorted(modules)
    ref = hf_logits(model, tokens, mask, positions)
    tol = model_tol(ref, config)
    assert real_max_diff(ada_logits(params, config, tokens, mask, positions), ref, mask) <= tol
    assert real_max_diff(plain, ref, mask) > 100 * tol


def test_peft_adapter_loads_on_the_base_in_transformers(tmp_path):
    """Every target on a transformers-made qwen2, exported as PEFT and loaded with PeftModel
    on the base: ada's logits. Breaks if A or B were not transposed to torch's [out, in],
    lora_alpha were written as ada's scale (PEFT scales by lora_alpha / r), a module were
    misnamed (PEFT would skip it) or a target dropped."""
    base_model, config = make_tiny_hf("qwen2", tmp_path / "base", seed=5)
    params = adapted(load_hf(tmp_path / "base")[0], lora.TARGETS)
    written = save_peft(params, config, tmp_path / "adapter", str(tmp_path / "base"))
    assert written == ["adapter_model.safetensors", "adapter_config.json"]
    adapter_config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (4, 12.0)
    assert adapter_config["base_model_name_or_path"] == str(tmp_path / "base")
    check_peft_logits(base_model, tmp_path / "adapter", params, config)


def test_export_peft_of_a_run_without_an_hf_base(tmp_path):
    """A seeded llama base (no model.path) with three targets: export_peft writes the base
    to base/, the adapter and the tokenizer beside it; the adapter_config names base/, and
    base + adapter load in transformers to ada's logits."""
    tok = train_sentencepiece(arithmetic_texts(400, seed=0), 96, tmp_path / "arith.model")
    config = preset("tiny", family="llama", vocab_size=128)
    params = adapted(init_params(config, jax.random.key(3)), ("q", "v", "down"))
    out = tmp_path / "hf"
    written = export_peft(params, config, tok, out, None, "plain")
    assert {"base/model.safetensors", "base/config.json", "adapter_model.safetensors",
            "adapter_config.json", "tokenizer.model"} <= set(written)
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(out / "base")
    assert adapter_config["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    base_model = transformers.AutoModelForCausalLM.from_pretrained(out / "base",
                                                                   dtype=torch.float32).eval()
    check_peft_logits(base_model, out, params, config)
    assert load_tokenizer(out).encode("12+345=357") == tok.encode("12+345=357")


def test_export_format_is_checked():
    cfg = C.load_config(C.DEFAULT_CONFIG)
    cfg.checkpoint.export_format = "peft"
    with pytest.raises(C.ConfigError, match="checkpoint.export_format=peft writes a LoRA run's "
                                            "adapters; set model.lora.rank > 0"):
        C.validate(cfg)
    cfg.model.lora.rank = 8
    C.validate(cfg)
    cfg.checkpoint.export_format = "gguf"
    with pytest.raises(C.ConfigError, match="checkpoint.export_format='gguf' must be merged"):
        C.validate(cfg)
