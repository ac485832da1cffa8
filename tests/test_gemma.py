"""Gemma 2 and Gemma 3 (text) against transformers: logits, the cached forward, export, greedy
decoding through the engine, Gemma 3's multimodal checkpoints, the published configs, and a
short RL run.

The models are tiny random transformers models (float32, eager attention) with a sliding
window of 4 and sequences several windows long, Gemma 2's soft-caps small enough that the
logits saturate them (final cap 3: the largest logit is within 1e-3 of it), and a Gemma 3
with its own local RoPE base and linear RoPE scaling on the global layers. Nothing is
downloaded.
"""

from __future__ import annotations

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from helpers import left_padded
from safetensors.numpy import load_file, save_file
from tolerances import model_tol

from ada.models import forward, init_cache
from ada.models.hf import load_hf, save_hf
from ada.models.hf_config import CheckpointError, config_from_hf, config_to_hf
from ada.models.known import KNOWN
from ada.models.transformer import decode_params
from ada.sampling.driver import Driver, Request
from ada.sampling.engine import Engine
from ada.sampling.samplers import SamplingConfig

pytestmark = pytest.mark.numerics  # CI runs it again under another CPU's kernels

WINDOW = 4
_forward = jax.jit(forward, static_argnums=1,
                   static_argnames=("attend_len", "read_then_write", "return_hidden"))

TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
            max_position_embeddings=256, pad_token_id=0, bos_token_id=2, eos_token_id=1)
HF_CONFIGS = {
    "gemma2": lambda: transformers.Gemma2Config(
        num_hidden_layers=4, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, **TEXT),
    "gemma3": lambda: transformers.Gemma3TextConfig(
        num_hidden_layers=6, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}, **TEXT),
}
HF_MODELS = {"gemma2": transformers.Gemma2ForCausalLM, "gemma3": transformers.Gemma3ForCausalLM}


def randomize(model, seed=0):
    """Norm weights normal(0, 0.1) (Gemma scales by 1 + w), the rest normal(0, 0.3): large
    enough that the soft-caps bite, every tensor matters."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((0.1 if "norm" in name else 0.3) * torch.randn_like(p))
    return model.eval()


def make_gemma(family, path, seed=0):
    config = HF_CONFIGS[family]()
    config._attn_implementation = "eager"
    model = randomize(HF_MODELS[family](config), seed)
    model.save_pretrained(os.fspath(path))
    return model


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def gemma(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = make_gemma(request.param, path)
    params, config = load_hf(path)
    return model, params, config, path


# left-padded rows that run several windows past WINDOW
batch = functools.partial(left_padded, T=24, pads=(0, 3, 9), low=3)


def hf_logits(model, tokens, mask, positions):
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                     position_ids=torch.tensor(positions)).logits.float().numpy()


def ada_logits(params, config, tokens, mask, positions):
    out, _ = _forward(params, config, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
    return np.asarray(out)


def max_diff(a, b, mask):
    return float(np.abs(a - b)[mask].max())


# ----------------------------------------------------------------------------- parity


def test_config_maps_every_switch(gemma):
    _, _, config, _ = gemma
    if config.family == "gemma2":
        assert config.sliding_windows == (WINDOW, None, WINDOW, None)
        assert (config.attn_logit_softcap, config.final_logit_softcap) == (2.0, 3.0)
        assert not config.qk_norm and config.rope_local_theta is None
    else:  # 5 local : 1 global
        assert config.sliding_windows == (WINDOW,) * 5 + (None,)
        assert config.qk_norm and config.rope_local_theta == 100.0
        assert config.rope_scaling.rope_type == "linear" and config.rope_scaling.factor == 8.0
    assert config.query_pre_attn_scalar == 24.0 and config.tie_embeddings


def test_logits_match_transformers(gemma):
    model, params, config, _ = gemma
    tokens, mask, positions = batch(config.vocab_size)
    ref = hf_logits(model, tokens, mask, positions)
    diff = max_diff(ada_logits(params, config, tokens, mask, positions), ref, mask)
    assert diff <= model_tol(ref, config), diff
    # the window, the caps and the local RoPE are exercised: without them the logits move
    plain = config.replace(sliding_windows=(), attn_logit_softcap=None, final_logit_softcap=None)
    assert max_diff(ada_logits(params, plain, tokens, mask, positions), ref, mask) > 0.1
    if config.family == "gemma2":
        assert np.abs(ref[mask]).max() > 0.999 * config.final_logit_softcap
    else:
        shared = config.replace(rope_local_theta=None)
        assert max_diff(ada_logits(params, shared, tokens, mask, positions), ref, mask) > 0.01


@pytest.mark.slow
def test_cached_forward_honours_the_window(gemma):
    """Prefill then one token at a time, under left padding and an attention window
    (attend_len), reading the cache before the step's write (the TPU's decode; the CPU's,
    write then read, is the engine test's): the full forward's logits."""
    _, params, config, _ = gemma
    tokens, mask, positions = batch(config.vocab_size, T=20, pads=(0, 5, 11), seed=1)
    ref = ada_logits(params, config, tokens, mask, positions)
    dparams = decode_params(params, config)
    for read_then_write in (False, True):
        cache = init_cache(config, 3, 32)
        out, cache = _forward(dparams, config, jnp.asarray(tokens[:, :8]), jnp.asarray(positions[:, :8]),
                              jnp.asarray(mask[:, :8]), cache)
        outs = [np.asarray(out)]
        for t in range(8, 20):
            step = slice(t, t + 1)
            out, cache = _forward(dparams, config, jnp.asarray(tokens[:, step]),
                                  jnp.asarray(positions[:, step]), jnp.asarray(mask[:, step]), cache,
                                  attend_len=24, read_then_write=read_then_write)
            outs.append(np.asarray(out))
        diff = max_diff(np.concatenate(outs, 1), ref, mask)
        assert diff <= model_tol(ref, config), (read_then_write, diff)


def _attention_dots(jaxpr, config):
    """The cache lengths read by the jaxpr's q.k and p.v dots: S' of every dot operand shaped
    [B, K, S', Hd] (keys or values), through nested jaxprs."""
    lengths = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            lengths += [v.aval.shape[2] for v in eqn.invars if v.aval.ndim == 4
                        and v.aval.shape[1::2] == (config.num_kv_heads, config.head_dim)]
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    lengths += _attention_dots(inner, config)
    return lengths


@pytest.mark.parametrize("read_then_write", [False, True])
def test_local_layers_decode_reading_only_their_window(gemma, read_then_write):
    """A decode step's local layers attend over WINDOW cache entries, the global ones over
    the whole attended length (the logits are the cached-forward test's)."""
    _, params, config, _ = gemma
    S = 32
    cache = init_cache(config, 3, S)
    one = jnp.ones((3, 1), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda p, c: forward(p, config, one, one, None, c, attend_len=S,
                                                read_then_write=read_then_write))(
        decode_params(params, config), cache)
    lengths = sorted(_attention_dots(jaxpr.jaxpr, config))
    local = sum(w is not None for w in config.layer_windows)
    glob = config.num_layers - local
    assert lengths == [WINDOW] * 2 * local + [S] * 2 * glob, lengths


def test_export_round_trip(gemma, tmp_path):
    """ada params -> HF checkpoint (transformers loads it, same logits) -> ada, bit for bit."""
    _, params, config, _ = gemma
    save_hf(params, config, tmp_path)
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                                 attn_implementation="eager")
    assert type(exported).__name__ == config_to_hf(config)["architectures"][0]
    tokens, mask, positions = batch(config.vocab_size, seed=2)
    ours = ada_logits(params, config, tokens, mask, positions)
    ref = hf_logits(exported.eval(), tokens, mask, positions)
    assert max_diff(ours, ref, mask) <= model_tol(ref, config)
    again, config_again = load_hf(tmp_path)
    assert config_again == config
    jax.tree.map(np.testing.assert_array_equal, again, params)
    diff = max_diff(ada_logits(again, config_again, tokens, mask, positions), ours, mask)
    assert diff <= model_tol(ours, config)


@pytest.mark.slow
def test_greedy_decode_equals_transformers_generate(gemma):
    """40 greedy tokens per prompt through the decode engine (prefill buckets, slots, chunks,
    attention windows), each prompt beside others of other lengths: transformers' generate."""
    model, params, config, _ = gemma
    engine = Engine(config, num_slots=4, max_prompt_len=16, max_new_tokens=40, chunk_size=8,
                    sampling=SamplingConfig(temperature=0.0), max_prefill_rows=4,
                    slot_bucketing=False, num_windows=2)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, config.vocab_size, n).tolist() for n in (3, 16, 9, 6)]
    out = Driver(engine, params).generate_all([Request(p, i, 0, 40) for i, p in enumerate(prompts)])
    # transformers on the same prompts as one left-padded batch (positions from the mask)
    T = max(map(len, prompts))
    ids = torch.tensor([[0] * (T - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40,
                             min_new_tokens=40, eos_token_id=None, pad_token_id=0)
    assert [c.token_ids for c in out] == ref[:, T:].tolist()


# ----------------------------------------------------------------------------- Gemma 3 multimodal


def _rename(src, dst, rename, config):
    os.makedirs(dst)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    save_file({rename(k): v for k, v in tensors.items()}, os.path.join(dst, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)


def test_multimodal_checkpoint_loads_its_text_model(tmp_path):
    """A tiny Gemma3ForConditionalGeneration: its text model loads (vision tensors skipped)
    with the logits of transformers' text-only forward, from the checkpoint transformers
    writes (`language_model.model.`, as published) and from the `model.language_model.`
    spelling, under a published-style config.json (no layer_types: sliding_window_pattern;
    transformers-4 RoPE keys; sizes left to Gemma3TextConfig's defaults where omitted)."""
    text = {k: v for k, v in TEXT.items() if not k.endswith("token_id")}
    text.update(num_hidden_layers=4, sliding_window_pattern=3, rope_theta=10000.0,
                rope_local_base_freq=100.0, rope_scaling={"rope_type": "linear", "factor": 4.0})
    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32,
                  num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14)
    hf_config = transformers.Gemma3Config(text_config=text, vision_config=vision,
                                          mm_tokens_per_image=4, boi_token_index=253,
                                          eoi_token_index=254, image_token_index=255)
    hf_config._attn_implementation = hf_config.text_config._attn_implementation = "eager"
    model = randomize(transformers.Gemma3ForConditionalGeneration(hf_config))
    model.save_pretrained(tmp_path / "saved")
    names = list(load_file(tmp_path / "saved" / "model.safetensors"))
    assert any(n.startswith("vision_tower.") for n in names)
    params, config = load_hf(tmp_path / "saved")
    assert config.family == "gemma3" and config.sliding_windows == (WINDOW, WINDOW, None, WINDOW)
    tokens, mask, positions = batch(250, T=16)
    ref = hf_logits(model, tokens, mask, positions)
    assert max_diff(ada_logits(params, config, tokens, mask, positions), ref, mask) <= model_tol(ref, config)

    published = {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "boi_token_index": 253, "eoi_token_index": 254, "image_token_index": 255,
        "mm_tokens_per_image": 4, "torch_dtype": "float32", "vision_config": vision,
        "text_config": {**{k: v for k, v in text.items() if k != "max_position_embeddings"},
                        "model_type": "gemma3_text"},
    }
    _rename(tmp_path / "saved", tmp_path / "new", lambda k: "model." + k.replace(
        "language_model.model.", "language_model.") if not k.startswith("lm_head") else k, published)
    params2, config2 = load_hf(tmp_path / "new")
    assert config2 == config.replace(max_position_embeddings=131072)
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    # a text-only export of it is a Gemma3ForCausalLM
    save_hf(params2, config2, tmp_path / "text")
    assert json.load(open(tmp_path / "text" / "config.json"))["architectures"] == ["Gemma3ForCausalLM"]


# ----------------------------------------------------------------------------- configs


# Published config.json files as remembered (transformers-4 spelling; no download here).
PUBLISHED = {
    "gemma-2-2b": {
        "architectures": ["Gemma2ForCausalLM"], "attention_bias": False,
        "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
        "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
        "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 2304, "intermediate_size": 9216, "max_position_embeddings": 8192,
        "model_type": "gemma2", "num_attention_heads": 8, "num_hidden_layers": 26,
        "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
        "torch_dtype": "bfloat16", "vocab_size": 256000,
    },
    "gemma-3-1b": {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
        "attn_logit_softcapping": None, "final_logit_softcapping": None, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
        "intermediate_size": 6912, "max_position_embeddings": 32768,
        "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
        "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
        "vocab_size": 262144,
    },
    "gemma-3-4b": {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
        "mm_tokens_per_image": 256, "torch_dtype": "bfloat16",
        "text_config": {
            "head_dim": 256, "hidden_size": 2560, "intermediate_size": 10240,
            "model_type": "gemma3_text", "num_attention_heads": 8, "num_hidden_layers": 34,
            "num_key_value_heads": 4, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
    },
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_give_the_known_shapes(name):
    config = config_from_hf(PUBLISHED[name])
    assert config == KNOWN[name].replace(dtype="bfloat16", param_dtype="bfloat16")


@pytest.mark.parametrize("name", ["gemma-2-2b", "gemma-2-9b", "gemma-3-1b", "gemma-3-4b"])
def test_known_config_round_trips_through_transformers(name):
    config = KNOWN[name].replace(dtype="float32", param_dtype="float32")
    assert config_from_hf(config_to_hf(config)) == config
    hf = transformers.AutoConfig.for_model(**config_to_hf(config))
    assert config_from_hf({**hf.to_dict(), "architectures": config_to_hf(config)["architectures"]}) == config
    assert hf.layer_types == ["full_attention" if w is None else "sliding_attention"
                              for w in config.layer_windows]


@pytest.mark.parametrize("changes, match", [
    (dict(hidden_activation="silu"), "hidden_activation 'silu' is not supported"),
    (dict(layer_types=["sliding_attention"] * 3), "layer_types has 3 entries"),
    (dict(layer_types=["chunked_attention"] * 26), r"layer_types \['chunked_attention'\]"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "RoPE type 'yarn' is not supported"),
    (dict(attention_bias=True), "attention_bias=true is not supported"),
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (dict(model_type="gemma2"), "expected model_type 'gemma3_text'"),
])
def test_bad_gemma_configs_are_refused(changes, match):
    with pytest.raises(CheckpointError, match=match):
        config_from_hf({**PUBLISHED["gemma-3-1b"], **changes})


# ----------------------------------------------------------------------------- the RL loop


@pytest.mark.slow
def test_rl_loop_runs_on_a_gemma_checkpoint(tmp_path):
    """Two RL steps of the default config on a tiny Gemma 2 checkpoint (its own tokenizer):
    sampling through the engine, the PPO update through the soft-capped logits, a checkpoint,
    and an HF export that transformers loads."""
    from ada import config as C
    from ada.loop import train
    from ada.metrics import read_jsonl
    from ada.templates import render_prompt
    from ada.tokenizer import train_sentencepiece

    d = tmp_path / "gemma"
    make_gemma("gemma2", d, seed=5)
    texts = [render_prompt("plain", f"What is {i} + {2 * i}?") + f" {3 * i}" for i in range(200)]
    train_sentencepiece(texts, 64, d / "tokenizer.model")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    overrides = [
        ("model.path", str(d)), ("tokenizer.template", "plain"), ("data.num_train", "64"),
        ("data.num_eval", "4"), ("data.prompts_per_step", "4"), ("adaptive.samples_per_round", "4"),
        ("adaptive.max_rounds", "2"), ("sampling.num_slots", "8"), ("sampling.num_windows", "1"), ("sampling.max_new_tokens", "6"),
        ("train.steps", "2"), ("eval.every", "0"), ("checkpoint.every", "1"),
        ("checkpoint.export_hf", "true"), ("log.progress", "false"), ("log.plots", "false"),
        ("log.update_diagnostics", "false"),
        ("warmstart.cache_dir", str(tmp_path / "cache")),
    ]
    cfg = C.build_config(os.path.join(root, "configs", "default.py"), overrides)
    C.validate(cfg, str(tmp_path / "run"))
    summary = train(cfg, str(tmp_path / "run"))
    rows = read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))[1:]
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows)
    exported = transformers.AutoModelForCausalLM.from_pretrained(summary["hf"])
    assert type(exported).__name__ == "Gemma2ForCausalLM"
    shutil.rmtree(tmp_path / "run" / "checkpoints")
