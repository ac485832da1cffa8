"""HF export of a run's policy (ada.export.export_hf: save_hf, then export_tokenizer): the directory
must load with transformers' AutoTokenizer and AutoModelForCausalLM, keep the chat template and
special tokens, and encode every text to the ids ada's tokenizer gives."""

import json
import random

import jax
import numpy as np
import optax
import pytest
import torch
import transformers
from test_templates import CONVERSATION, GEMMA_SPECIALS, LLAMA_SPECIALS, PROBLEMS, QWEN_SPECIALS, make_hf_dir
from test_tokenizer import arithmetic_texts, write_json
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTok

from ada.checkpoint import Checkpointer
from ada.export import export_hf, export_tokenizer
from ada.models import init_params, preset
from ada.models.hf import load_hf
from ada.models.hf_config import CheckpointError
from ada.templates import TEMPLATES, encode_prompt, prompt_messages, render_messages, render_prompt
from ada.tokenizer import load_tokenizer, train_sentencepiece

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
MODEL_FILES = ["config.json", "model.safetensors"]  # what save_hf writes for a tiny model
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_tokenizer_json(path, style):
    """A byte-level BPE tokenizer.json as shipped by Qwen2.5 ("qwen": NFC, Qwen's split regex),
    Llama 3 ("llama": the post-processor adds <|begin_of_text|>) or neither ("plain")."""
    tok = HFTok(models.BPE())
    if style == "qwen":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(arithmetic_texts(200, seed=1) + ["hello world, ünïcode ✓"], trainer)
    if style == "llama":
        bos = ("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos[0]} $A", pair=f"{bos[0]} $A $B", special_tokens=[bos])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))


def probe_texts():
    """Task-like texts plus the awkward ones: leading/repeated/trailing whitespace, characters
    outside the vocabulary, and special-token strings typed as plain text."""
    rng = random.Random(0)
    alphabet = "abcXYZ 0123456789+-*/=()^%.,<>\n\t ü✓"
    noise = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(200)]
    return arithmetic_texts(20, seed=5) + noise + [
        "", " ", "  leading", "trailing  ", "a\n\nb", "ünïcode ✓", "<s>1+2</s>", "<pad><unk>",
        "<|im_start|>user\nhi<|im_end|>",
    ]


def export(tok, out, family):
    """What the loop does with checkpoint.export_hf=true; returns the tokenizer's files."""
    config = preset("tiny", family=family, vocab_size=tok.vocab_size)
    written = export_hf(init_params(config, jax.random.key(0)), config, tok, out)
    assert sorted(written[:2]) == MODEL_FILES
    return written[2:]


def check_loads_and_encodes(tok, out):
    """Both Auto classes load `out`; ids match ada's with and without special tokens; the model
    runs on them; bos/eos/pad agree; ada reads its own export back to the same ids."""
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    texts = probe_texts()
    for text in texts:
        assert hf_tok(text)["input_ids"] == tok.encode(text, add_special=True), text
        assert hf_tok.encode(text, add_special_tokens=False) == tok.encode(text), text
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id) == (
        tok.bos_id, tok.eos_id, tok.pad_id)
    gen_eos = model.generation_config.eos_token_id
    assert set(gen_eos if isinstance(gen_eos, list) else [gen_eos]) == set(tok.eos_ids)
    ids = tok.encode("What is 12 + 30?", add_special=True)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), tok.vocab_size)
    back = load_tokenizer(out)
    assert back.encode_batch(texts, add_special=True) == tok.encode_batch(texts, add_special=True)
    assert back.eos_ids == tok.eos_ids and back.chat_template == tok.chat_template
    return hf_tok


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_export_hf_model_directory(tmp_path, family):
    """Case (a): the tokenizer.json of an HF model directory (Qwen2.5-like with the chat template
    in tokenizer_config.json, Llama-3-like with chat_template.jinja). Its tokenizer files are
    copied as they are; its weights and config.json are not (save_hf wrote those). The old export,
    tokenizer.json copied as tokenizer.model, fails here: no tokenizer loads from that."""
    src = tmp_path / "src"
    build_tokenizer_json(src, "qwen" if family == "qwen2" else "llama")
    if family == "qwen2":
        config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "unk_token": None,
                  "chat_template": CHATML}
        copied = ["special_tokens_map.json"]
        write_json(src / "special_tokens_map.json", {"eos_token": "<|im_end|>"})
    else:
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>"}
        copied = ["chat_template.jinja"]
        (src / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    config.update(eos_token="<|im_end|>", pad_token="<|endoftext|>")
    write_json(src / "tokenizer_config.json", config)
    write_json(src / "generation_config.json", {"eos_token_id": [2, 0]})
    write_json(src / "config.json", {"model_type": "not-this-one"})
    (src / "model.safetensors").write_bytes(b"not these weights")
    tok = load_tokenizer(src)
    assert tok.chat_template == CHATML and tok.eos_ids == (2, 0)

    out = tmp_path / "hf"
    written = export(tok, out, family)
    assert sorted(written) == sorted(
        ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] + copied)
    for name in written:
        assert (out / name).read_bytes() == (src / name).read_bytes(), name
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    assert not (out / "tokenizer.model").exists()

    hf_tok = check_loads_and_encodes(tok, out)
    assert hf_tok.chat_template == CHATML
    rendered = hf_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert hf_tok.encode(rendered, add_special_tokens=False) == tok.encode(rendered)


def test_export_bare_tokenizer_json_writes_config(tmp_path):
    """A tokenizer.json with no tokenizer_config.json beside it gets one from ada's tokens. With a
    qwen2 config.json transformers would otherwise load Qwen2Tokenizer, whose Qwen split rules
    encode this (non-Qwen) tokenizer differently."""
    src = tmp_path / "src"
    build_tokenizer_json(src, "plain")
    tok = load_tokenizer(src / "tokenizer.json", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    out = tmp_path / "hf"
    assert sorted(export(tok, out, "qwen2")) == [
        "generation_config.json", "tokenization_ada.py", "tokenizer.json", "tokenizer_config.json"]
    check_loads_and_encodes(tok, out)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_export_sentencepiece(tmp_path, family):
    """Case (b): a SentencePiece .model as the embedded default run (qwen2) trains one; for llama
    with a tokenizer_config.json naming LlamaTokenizer beside it, which converts the model and
    encodes differently (it drops <unk> and spaces), so only its chat template is kept."""
    src = tmp_path / "src"
    tok = train_sentencepiece(arithmetic_texts(400, seed=0), 96, src / "arith.model")
    if family == "llama":
        write_json(src / "tokenizer_config.json",
                   {"tokenizer_class": "LlamaTokenizer", "chat_template": CHATML})
        tok = load_tokenizer(src / "arith.model")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "tokenizer.json").write_text("{}")  # an earlier export's file must not shadow this one
    assert sorted(export(tok, out, family)) == [
        "generation_config.json", "tokenization_ada.py", "tokenizer.model", "tokenizer_config.json"]
    assert not (out / "tokenizer.json").exists()
    assert (out / "tokenizer.model").read_bytes() == (src / "arith.model").read_bytes()
    hf_tok = check_loads_and_encodes(tok, out)
    assert hf_tok.chat_template == (CHATML if family == "llama" else None)
    assert hf_tok.decode(tok.encode("12+345=357"), skip_special_tokens=True) == "12+345=357"


def test_export_hf_from_checkpoint(tmp_path):
    """A restored checkpoint exports through the same function; the weights come back unchanged
    whatever else the checkpoint held, and a tokenizer too large for the embedding writes nothing."""
    tok = train_sentencepiece(arithmetic_texts(400, seed=0), 96, tmp_path / "arith.model")
    config = preset("tiny", family="qwen2", vocab_size=128)
    params = init_params(config, jax.random.key(0))
    ckpt = Checkpointer(str(tmp_path / "ck"))
    ckpt.save(5, {"params": params, "opt_state": optax.sgd(0.1).init(params)}, {})
    state, _ = ckpt.restore_params()
    export_hf(state["params"], config, tok, tmp_path / "hf")
    loaded, config2 = load_hf(tmp_path / "hf")
    assert config2 == config.replace(dtype=config.param_dtype)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    assert load_tokenizer(tmp_path / "hf").encode("12+345=357") == tok.encode("12+345=357")

    with pytest.raises(CheckpointError, match="tokenizer has .* tokens but the model's embedding"):
        export_hf(params, config.replace(vocab_size=tok.vocab_size - 1), tok, tmp_path / "small")
    assert not (tmp_path / "small").exists()


# (template, tokenizer): every template ada trains with, on a tokenizer it runs on; plain
# twice: on a tokenizer.json without a BOS and on a SentencePiece model that adds one
TEMPLATE_CASES = [(t, "sentencepiece" if t == "plain" else "hf") for t in sorted(TEMPLATES)]
TEMPLATE_CASES.append(("plain", "hf"))


@pytest.mark.parametrize("template,kind", TEMPLATE_CASES)
def test_export_carries_the_run_template(tmp_path, template, kind):
    """The exported chat template is the run's prompt format: transformers'
    apply_chat_template on a problem's messages gives ada's prompt text and encode_prompt's ids
    (the BOS a plain prompt is encoded with written as text), and renders any conversation
    as render_messages does. Before, a plain run's export had no chat_template (transformers
    raised) and a chat run kept the model's own (Llama 3.2's stamps today's date)."""
    if kind == "sentencepiece":
        tok = train_sentencepiece(arithmetic_texts(400, seed=0), 96, tmp_path / "src" / "a.model")
    else:
        specials = {"gemma": GEMMA_SPECIALS, "llama3": LLAMA_SPECIALS,
                    "llama32": LLAMA_SPECIALS}.get(template, QWEN_SPECIALS)
        src = make_hf_dir(tmp_path / "src", specials, {"chat_template": CHATML, "bos_token": None,
                                                       "eos_token": specials[-1]})
        tok = load_tokenizer(src)
    out = tmp_path / "hf"
    written = export_tokenizer(tok, out, template)
    assert "chat_template.jinja" in written and "tokenizer_config.json" in written
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    bos = "<s>" if kind == "sentencepiece" else ""
    for problem in [*PROBLEMS, "12 + 34 = ?"]:
        for instruction in (None, "Answer with a number."):
            messages = prompt_messages(template, problem, instruction)
            text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert text == bos + render_prompt(template, problem, instruction)
            ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
            assert ids == encode_prompt(tok, template, problem, instruction)
    if template != "plain":
        for messages in (CONVERSATION, CONVERSATION[1:]):
            for gen in (True, False):
                assert hf_tok.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=gen) == render_messages(
                    template, messages, gen)
    assert load_tokenizer(out).chat_template == (out / "chat_template.jinja").read_text()
