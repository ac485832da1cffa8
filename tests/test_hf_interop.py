"""Hugging Face interop: load/save parity with transformers, sharding, inspect CLI, bad input.

Every model here is a tiny random transformers model written to a temporary directory
(tests/tiny_hf.py); nothing is downloaded. Parity is measured over real (non-padding)
tokens of a left-padded batch.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from helpers import jit_forward, left_padded
from safetensors.numpy import load_file, save_file
from tiny_hf import make_tiny_hf
from tolerances import model_tol

from ada.cli.inspect_model import main as inspect_main
from ada.models.hf import load_hf, read_safetensors_header, save_hf
from ada.models.hf_config import CheckpointError, check_vocab, config_from_hf, config_to_hf
from ada.models.known import KNOWN
from ada.models.presets import preset
from ada.models.summary import inspect_checkpoint

pytestmark = pytest.mark.numerics  # CI runs it again under another CPU's kernels

# bfloat16 compute vs float32 transformers on the same (bf16-rounded) weights: bf16 keeps 8
# mantissa bits (relative step 2**-8 = 0.4%), and the error of two tiny layers stays within a
# few percent of the largest logit; measured ~1.5% here, asserted at 5%.
BF16_REL_TOL = 0.05

_batch = functools.partial(left_padded, T=16, pads=(0, 3, 9))


def hf_logits(model, tokens, mask, positions):
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=torch.tensor(positions),
        )
    return out.logits.float().numpy()


def ada_logits(params, config, tokens, mask, positions):
    out, _ = jit_forward(params, config, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
    return np.asarray(out)


def real_max_diff(a, b, mask):
    return float(np.abs(a - b)[mask].max())


# (family, tie override): every family with its preset tying, plus the other tying choice
# for qwen2 (Qwen2.5-Math-7B is untied) and llama (Llama-3.2-3B is tied).
CASES = [("qwen2", None), ("qwen3", None), ("llama", None), ("qwen2", False), ("llama", True)]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-tie{c[1]}")
def tiny(request, tmp_path_factory):
    family, tie = request.param
    path = tmp_path_factory.mktemp(f"{family}_tie{tie}")
    model, config = make_tiny_hf(family, path, tie=tie, seed=len(family) + 7 * bool(tie))
    return model, config, path


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_base")
    model, config = make_tiny_hf("qwen2", path)
    return model, config, path


# ----------------------------------------------------------------------------- parity


def test_load_matches_transformers(tiny):
    model, config, path = tiny
    params, loaded = load_hf(path)
    assert loaded == config  # config.json written by transformers maps back to the preset
    assert ("lm_head" in params) == (not config.tie_embeddings)
    tokens, mask, positions = _batch(config.vocab_size)
    ref = hf_logits(model, tokens, mask, positions)
    diff = real_max_diff(ada_logits(params, loaded, tokens, mask, positions), ref, mask)
    assert diff <= model_tol(ref, config), diff


def test_export_loads_in_transformers(tiny, tmp_path):
    _, config, path = tiny
    params, config = load_hf(path)
    written = save_hf(params, config, tmp_path)
    assert sorted(written) == ["config.json", "model.safetensors"]
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert type(exported).__name__ == json.load(open(tmp_path / "config.json"))["architectures"][0]
    tokens, mask, positions = _batch(config.vocab_size, seed=1)
    ref = hf_logits(exported.eval(), tokens, mask, positions)
    diff = real_max_diff(ada_logits(params, config, tokens, mask, positions), ref, mask)
    assert diff <= model_tol(ref, config), diff
    # and back into ada bit for bit
    again, config_again = load_hf(tmp_path)
    assert config_again == config
    jax.tree.map(np.testing.assert_array_equal, again, params)


def test_bf16_checkpoint_loads_exactly_and_computes_close(tmp_path):
    model, config = make_tiny_hf("qwen3", tmp_path, dtype=torch.bfloat16, seed=3)
    assert read_safetensors_header(str(tmp_path / "model.safetensors"))["model.norm.weight"][0] == "BF16"
    params, loaded = load_hf(tmp_path)
    assert (loaded.dtype, loaded.param_dtype) == ("bfloat16", "bfloat16")
    q_hf = model.model.layers[1].self_attn.q_proj.weight.detach().float().numpy()
    assert params["layers"]["q"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(params["layers"]["q"][1], np.float32), q_hf.T)

    # reference: the same bf16 weights in float32 (from_pretrained, not model.float(): casting
    # the module to bf16 also rounded its RoPE inv_freq buffer)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    tokens, mask, positions = _batch(config.vocab_size)
    ref = hf_logits(reference.eval(), tokens, mask, positions)
    out = ada_logits(params, loaded, tokens, mask, positions)
    assert np.isfinite(out).all()
    rel = real_max_diff(out, ref, mask) / np.abs(ref[mask]).max()
    assert rel <= BF16_REL_TOL, rel
    # float32 master weights of the same checkpoint: exact upcast, so float32 compute is tight
    params32, config32 = load_hf(tmp_path, dtype="float32")
    assert params32["embed"].dtype == jnp.float32
    diff = real_max_diff(ada_logits(params32, config32, tokens, mask, positions), ref, mask)
    assert diff <= model_tol(ref, config32), diff


def test_training_layout_and_bf16_export(qwen2_dir, tmp_path):
    model, config, path = qwen2_dir
    params, loaded = load_hf(path, dtype="bfloat16", param_dtype="float32")
    assert (loaded.dtype, loaded.param_dtype) == ("bfloat16", "float32")
    assert params["embed"].dtype == jnp.float32
    save_hf(params, loaded, tmp_path, dtype="bfloat16")
    header = read_safetensors_header(str(tmp_path / "model.safetensors"))
    assert {dt for dt, _ in header.values()} == {"BF16"}
    assert json.load(open(tmp_path / "config.json"))["dtype"] == "bfloat16"
    # transformers on the exported bf16 weights (upcast) == ada float32 on bf16-rounded weights
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)
    f32 = loaded.replace(dtype="float32", param_dtype="float32")
    tokens, mask, positions = _batch(config.vocab_size)
    ref = hf_logits(exported, tokens, mask, positions)
    diff = real_max_diff(ada_logits(rounded, f32, tokens, mask, positions), ref, mask)
    assert diff <= model_tol(ref, config), diff


# ----------------------------------------------------------------------------- sharding


def test_sharded_export_and_load(qwen2_dir, tmp_path):
    model, _, path = qwen2_dir
    params, config = load_hf(path)
    written = save_hf(params, config, tmp_path, max_shard_size="100KB")
    shards = [f for f in written if f.endswith(".safetensors")]
    assert len(shards) > 2 and "model.safetensors.index.json" in written
    assert not (tmp_path / "model.safetensors").exists()
    for shard in shards:  # no shard over the limit unless it holds a single larger tensor
        header = read_safetensors_header(str(tmp_path / shard))
        assert os.path.getsize(tmp_path / shard) <= 100_000 + 2_000 or len(header) == 1
    again, config_again = load_hf(tmp_path)
    assert config_again == config
    jax.tree.map(np.testing.assert_array_equal, again, params)
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    tokens, mask, positions = _batch(config.vocab_size)
    ref = hf_logits(exported.eval(), tokens, mask, positions)
    diff = real_max_diff(ada_logits(params, config, tokens, mask, positions), ref, mask)
    assert diff <= model_tol(ref, config), diff
    assert inspect_checkpoint(tmp_path)["num_shards"] == len(shards)
    # re-saving unsharded into the same directory removes the stale index
    save_hf(params, config, tmp_path)
    assert not (tmp_path / "model.safetensors.index.json").exists()
    jax.tree.map(np.testing.assert_array_equal, load_hf(tmp_path)[0], params)


def test_transformers_sharded_checkpoint_loads(qwen2_dir, tmp_path):
    model, config, path = qwen2_dir
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    params, loaded = load_hf(tmp_path)
    reference, _ = load_hf(path)
    jax.tree.map(np.testing.assert_array_equal, params, reference)


# ----------------------------------------------------------------------------- inspect CLI


def test_inspect_cli(tiny, capsys):
    model, config, path = tiny
    assert inspect_main([str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_parameters"] == sum(p.numel() for p in model.parameters())
    assert info["family"] == config.family
    assert info["architecture"] == type(model).__name__
    assert info["dtype"] == "float32" and info["num_shards"] == 1 and info["loadable"]
    assert (info["num_layers"], info["num_heads"], info["num_kv_heads"], info["head_dim"],
            info["vocab_size"], info["tied_embeddings"]) == (
        config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim,
        config.vocab_size, config.tie_embeddings)
    assert inspect_main([str(path)]) == 0
    text = capsys.readouterr().out
    assert f"family             {config.family}" in text
    assert f"num_parameters     {info['num_parameters']:,}" in text


def test_inspect_reads_headers_only(qwen2_dir, monkeypatch):
    import safetensors

    def forbidden(*a, **k):
        raise AssertionError("inspect must not open tensors")

    monkeypatch.setattr(safetensors, "safe_open", forbidden)
    assert inspect_checkpoint(qwen2_dir[2])["loadable"]


def test_inspect_module_entry_point_and_errors(qwen2_dir, tmp_path, capsys):
    out = subprocess.run([sys.executable, "-m", "ada.cli.inspect_model", str(qwen2_dir[2])],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Qwen2ForCausalLM" in out.stdout
    assert inspect_main([str(tmp_path)]) == 2
    assert "config.json: missing" in capsys.readouterr().err
    bad = _copy(qwen2_dir[2], tmp_path / "swa", config=dict(use_sliding_window=True))
    assert inspect_main([str(bad), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert not info["loadable"] and "use_sliding_window" in info["problem"]


# ----------------------------------------------------------------------------- config mapping


# Published config.json files (transcribed; transformers-4 spelling) of the models the paper
# trains, against the planning configs in ada/models/known.py.
PUBLISHED = {
    "qwen2.5-math-1.5b": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
        "hidden_size": 1536, "initializer_range": 0.02, "intermediate_size": 8960,
        "max_position_embeddings": 4096, "max_window_layers": 21, "model_type": "qwen2",
        "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
        "use_mrope": False, "use_sliding_window": False, "vocab_size": 151936,
    },
    "qwen2.5-math-7b": {
        "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 3584,
        "intermediate_size": 18944, "max_position_embeddings": 4096, "max_window_layers": 28,
        "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 10000,
        "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_sliding_window": False, "vocab_size": 152064,
    },
    "llama-3.2-3b": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 24, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "vocab_size": 128256,
    },
    "qwen3-4b": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 9728,
        "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_sliding_window": False, "vocab_size": 151936,
    },
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_config_from_published_configs(name):
    config = config_from_hf(PUBLISHED[name])
    assert config == KNOWN[name].replace(dtype="bfloat16", param_dtype="bfloat16")


@pytest.mark.parametrize("config", [preset("tiny", family=f) for f in ("qwen2", "qwen3", "llama")]
                         + list(KNOWN.values()), ids=lambda c: f"{c.family}-{c.hidden_size}")
def test_config_round_trip(config):
    assert config_from_hf(config_to_hf(config)) == config.replace(dtype=config.param_dtype)
    # transformers reads the same numbers back from what ada writes
    hf = transformers.AutoConfig.for_model(**config_to_hf(config))
    rope = hf.rope_parameters.get("full_attention", hf.rope_parameters)  # Gemma 3: per layer type
    assert (hf.hidden_size, hf.num_key_value_heads, rope["rope_theta"]) == (
        config.hidden_size, config.num_kv_heads, config.rope_theta)
    assert rope["rope_type"] == (config.rope_scaling.rope_type if config.rope_scaling else "default")


def test_config_rope_parameters_spelling_and_float16():
    base = {k: v for k, v in PUBLISHED["llama-3.2-3b"].items() if k not in ("rope_theta", "rope_scaling")}
    new = dict(base, rope_parameters={**PUBLISHED["llama-3.2-3b"]["rope_scaling"], "rope_theta": 500000.0},
               dtype="float16")
    del new["torch_dtype"]
    config = config_from_hf(new)
    assert config == KNOWN["llama-3.2-3b"].replace(dtype="float32", param_dtype="float32")
    assert config_from_hf(dict(base, rope_scaling={**PUBLISHED["llama-3.2-3b"]["rope_scaling"],
                                                   "type": "llama3"})).rope_theta == 10000.0


LLAMA = PUBLISHED["llama-3.2-3b"]
QWEN2 = PUBLISHED["qwen2.5-math-1.5b"]


@pytest.mark.parametrize("cfg, match", [
    (dict(QWEN2, architectures=["MistralForCausalLM"]),
     r"unsupported architecture \['MistralForCausalLM'\]; supported: Qwen2ForCausalLM, "
     r"Qwen3ForCausalLM, LlamaForCausalLM"),
    ({k: v for k, v in QWEN2.items() if k != "architectures"} | {"model_type": "gpt2"},
     "unknown model_type 'gpt2'"),
    (dict(QWEN2, model_type="llama"), "model_type 'llama' does not match architecture Qwen2ForCausalLM"),
    (dict(LLAMA, rope_scaling=dict(LLAMA["rope_scaling"], rope_type="yarn")),
     r"RoPE type 'yarn' is not supported; supported types: \('default', 'llama3'\)"),
    (dict(LLAMA, rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "RoPE type 'dynamic'"),
    (dict(LLAMA, rope_scaling={"rope_type": "llama3", "factor": 8.0}),
     "llama3 RoPE scaling is missing 'low_freq_factor'"),
    (dict(QWEN2, use_sliding_window=True), "use_sliding_window=true is not supported"),
    (dict(QWEN2, layer_types=["full_attention", "sliding_attention"]),
     r"layer_types \['sliding_attention'\] not supported"),
    (dict(LLAMA, attention_bias=True), "attention_bias=true is not supported for llama"),
    (dict(LLAMA, mlp_bias=True), "mlp_bias=true is not supported"),
    (dict(QWEN2, hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    ({k: v for k, v in QWEN2.items() if k != "hidden_size"}, r"missing required key\(s\) \['hidden_size'\]"),
    (dict(QWEN2, num_hidden_layers="28"), "'num_hidden_layers' must be an integer, got '28'"),
    (dict(QWEN2, num_key_value_heads=5), "num_heads=12 is not a multiple of num_kv_heads=5"),
    (dict(QWEN2, torch_dtype="int8"), "dtype 'int8' is not supported"),
    ([1, 2], "expected a JSON object, got list"),
])
def test_config_rejects(cfg, match):
    with pytest.raises(CheckpointError, match=match):
        config_from_hf(cfg)


def test_check_vocab():
    config = KNOWN["qwen2.5-math-7b"]
    check_vocab(config, 151665)  # Qwen's tokenizer is smaller than its padded embedding
    check_vocab(config, config.vocab_size)
    with pytest.raises(CheckpointError, match="tokenizer has 152065 tokens but the model's "
                       "embedding has 152064 rows"):
        check_vocab(config, config.vocab_size + 1)


# ----------------------------------------------------------------------------- bad checkpoints


def _copy(src, dst, config=None, drop_config=(), tensors=None):
    """Copy a checkpoint dir, editing config.json keys and/or rewriting its tensors."""
    shutil.copytree(src, dst)
    if config or drop_config:
        cfg = json.load(open(dst / "config.json"))
        cfg.update(config or {})
        for k in drop_config:
            del cfg[k]
        json.dump(cfg, open(dst / "config.json", "w"))
    if tensors is not None:
        file = str(dst / "model.safetensors")
        save_file(tensors(load_file(file)), file, metadata={"format": "pt"})
    return dst


def _edit(fn):
    def apply(t):
        fn(t)
        return t
    return apply


def _drop(name):
    return _edit(lambda t: t.pop(name))


def _put(name, value):
    return _edit(lambda t: t.__setitem__(name, value))


BAD_TENSORS = [
    ("missing", _drop("model.layers.1.self_attn.k_proj.weight"),
     "missing tensor 'model.layers.1.self_attn.k_proj.weight'"),
    ("wrong_shape", _put("model.layers.0.mlp.down_proj.weight", np.zeros((128, 64), np.float32)),
     r"tensor 'model.layers.0.mlp.down_proj.weight' has shape \[128, 64\], expected \[64, 128\]"),
    ("extra", _put("model.layers.0.self_attn.o_proj.bias", np.zeros(64, np.float32)),
     "unexpected tensor 'model.layers.0.self_attn.o_proj.bias'"),
    ("extra_layer", _put("model.layers.2.input_layernorm.weight", np.ones(64, np.float32)),
     "unexpected tensor 'model.layers.2.input_layernorm.weight'.*num_hidden_layers"),
    ("int_dtype", _put("model.norm.weight", np.ones(64, np.int32)),
     "tensor 'model.norm.weight' has dtype I32"),
    ("tied_lm_head_differs", _put("lm_head.weight", np.ones((512, 64), np.float32)),
     "tie_word_embeddings=true but 'lm_head.weight' differs"),
]


@pytest.mark.parametrize("edit, match", [c[1:] for c in BAD_TENSORS], ids=[c[0] for c in BAD_TENSORS])
def test_bad_tensors_rejected_before_reading(qwen2_dir, tmp_path, monkeypatch, edit, match):
    bad = _copy(qwen2_dir[2], tmp_path / "bad", tensors=edit)
    if "differs" not in match:  # header checks: no tensor may be read before they pass
        import safetensors

        monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: pytest.fail("read a tensor"))
    with pytest.raises(CheckpointError, match=match):
        load_hf(bad)


def test_tolerated_extras(qwen2_dir, tmp_path):
    """Tied checkpoints that also store an identical lm_head, and rotary inv_freq buffers."""
    def add(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"].copy()
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
        return t

    params, _ = load_hf(_copy(qwen2_dir[2], tmp_path / "ok", tensors=add))
    jax.tree.map(np.testing.assert_array_equal, params, load_hf(qwen2_dir[2])[0])


def test_bad_directories(qwen2_dir, tmp_path):
    src = qwen2_dir[2]
    with pytest.raises(CheckpointError, match="not a directory"):
        load_hf(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty/config.json: missing"):
        load_hf(tmp_path / "empty")
    broken = _copy(src, tmp_path / "broken")
    (broken / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"],')
    with pytest.raises(CheckpointError, match=r"config.json: malformed JSON .* line 1"):
        load_hf(broken)
    untied = _copy(src, tmp_path / "untied", config=dict(tie_word_embeddings=False))
    with pytest.raises(CheckpointError, match="missing tensor 'lm_head.weight'.*set it to true"):
        load_hf(untied)
    nohidden = _copy(src, tmp_path / "nohidden", drop_config=["hidden_size"])
    with pytest.raises(CheckpointError, match=r"missing required key\(s\) \['hidden_size'\]"):
        load_hf(nohidden)
    noweights = _copy(src, tmp_path / "noweights")
    os.rename(noweights / "model.safetensors", noweights / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"no model.safetensors .*found \['pytorch_model.bin'\]"):
        load_hf(noweights)
    corrupt = _copy(src, tmp_path / "corrupt")
    (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        load_hf(corrupt)
    with pytest.raises(CheckpointError, match="param_dtype='float16'"):
        load_hf(src, param_dtype="float16")


def test_bad_sharded_index(qwen2_dir, tmp_path):
    params, config = load_hf(qwen2_dir[2])
    save_hf(params, config, tmp_path, max_shard_size="100KB")
    index = json.load(open(tmp_path / "model.safetensors.index.json"))
    last = sorted(set(index["weight_map"].values()))[-1]
    os.remove(tmp_path / last)
    with pytest.raises(CheckpointError, match=f"shard '{last}' .* is missing"):
        load_hf(tmp_path)
    save_hf(params, config, tmp_path, max_shard_size="100KB")
    first = sorted(index["weight_map"])[0]
    index["weight_map"][first] = last if index["weight_map"][first] != last else sorted(
        set(index["weight_map"].values()))[0]
    json.dump(index, open(tmp_path / "model.safetensors.index.json", "w"))
    with pytest.raises(CheckpointError, match=f"tensor '{first}' is listed in the index but not"):
        load_hf(tmp_path)


def test_save_rejects_mismatched_params(qwen2_dir, tmp_path):
    params, config = load_hf(qwen2_dir[2])
    with pytest.raises(ValueError, match="params do not match the config's layout"):
        save_hf(params, config.replace(num_layers=3), tmp_path)
    with pytest.raises(ValueError, match="dtype='int8'"):
        save_hf(params, config, tmp_path, dtype="int8")


def test_save_merges_extra_config(qwen2_dir, tmp_path):
    params, config = load_hf(qwen2_dir[2])
    written = save_hf(params, config, tmp_path / "out", extra_config={"eos_token_id": 7})
    assert sorted(written) == ["config.json", "model.safetensors"]
    assert json.load(open(tmp_path / "out" / "config.json"))["eos_token_id"] == 7


def test_load_places_leaves_with_given_shardings(qwen2_dir):
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from ada.models import param_shapes

    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    _, config, path = qwen2_dir
    shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), param_shapes(config),
                             is_leaf=lambda x: isinstance(x, tuple))
    shardings["embed"] = NamedSharding(mesh, P("x", None))  # vocab rows split 4 ways
    params, _ = load_hf(path, shardings=shardings)
    assert params["embed"].sharding == shardings["embed"]
    assert params["embed"].addressable_shards[0].data.shape == (config.vocab_size // 4, config.hidden_size)
    jax.tree.map(np.testing.assert_array_equal, params, load_hf(path)[0])
