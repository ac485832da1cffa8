"""Tokenizers: SentencePiece training and round trips, HF tokenizer.json loading with special
tokens from the config files, parity of ids with transformers, and the errors at the boundary."""

import json
import random

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTok
from tokenizers import decoders, models, pre_tokenizers, trainers

from ada.tokenizer import (
    ARITHMETIC_SYMBOLS,
    HFTokenizer,
    SentencePieceTokenizer,
    load_tokenizer,
    train_sentencepiece,
)


def arithmetic_texts(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 99999), rng.randint(-999, 999)
        op = rng.choice("+-*/")
        out.append(f"Question: What is ({a} {op} {b})^2 % 7?\nAnswer: {rng.randint(-9999, 9999)}.5")
    return out


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("sp") / "arith.model"
    return train_sentencepiece(arithmetic_texts(400, seed=0), 96, path), path


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_hf_json(path, specials=SPECIALS, truncate=None):
    """A byte-level BPE tokenizer.json, as Qwen/Llama ship, trained on a few strings."""
    tok = HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(arithmetic_texts(200, seed=1) + ["hello world, ünïcode ✓"], trainer)
    if truncate:
        tok.enable_truncation(truncate)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return tok


def write_json(path, obj):
    path.write_text(json.dumps(obj), encoding="utf-8")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    build_hf_json(d)
    write_json(
        d / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": "<|im_end|>",
            "pad_token": {"__type": "AddedToken", "content": "<|endoftext|>", "special": True},
            "bos_token": None,
            "chat_template": "{{ messages[0]['content'] }}",
        },
    )
    write_json(d / "generation_config.json", {"eos_token_id": [2, 0]})
    return d


# -- SentencePiece -------------------------------------------------------------------------


def test_sp_round_trip_and_single_digit_pieces(sp_model):
    tok, _ = sp_model
    assert tok.vocab_size <= 96
    held_out = arithmetic_texts(50, seed=123) + ["-42 + (17 * 3) = 9", "  0.25 ,  1/4\n\n"]
    for s in held_out:
        ids = tok.encode(s)
        assert tok.decode(ids) == s
        for i in ids:
            piece = tok.id_to_piece(i)
            if any(c.isdigit() for c in piece):
                assert piece in tuple("0123456789"), piece  # digits are never merged
    # Every digit-bearing piece in the whole vocabulary is one digit.
    pieces = [tok.id_to_piece(i) for i in range(tok.vocab_size)]
    assert sorted(p for p in pieces if any(c.isdigit() for c in p)) == list("0123456789")
    # "123" is exactly three tokens, one per digit.
    assert [tok.id_to_piece(i) for i in tok.encode("123")[-3:]] == ["1", "2", "3"]
    for sym in ARITHMETIC_SYMBOLS:
        assert tok.encode(sym)[-1:] == [tok.token_to_id(sym)]


def test_sp_special_ids_and_decode(sp_model):
    tok, _ = sp_model
    assert (tok.pad_id, tok.bos_id, tok.eos_ids, tok.eos_id) == (0, 1, (2,), 2)
    assert tok.special_ids == {0, 1, 2}
    ids = tok.encode("1+2", add_special=True)
    assert ids[0] == 1 and tok.encode("1+2") == ids[1:]
    full = ids + [tok.eos_id, tok.pad_id]
    assert tok.decode(full) == "1+2"
    assert tok.decode(full, skip_special=False) == "<s>1+2</s><pad>"
    assert tok.decode(np.array(full, dtype=np.int32)) == "1+2"  # arrays from the sampler
    assert tok.decode_batch([ids, ids[1:]]) == ["1+2", "1+2"]
    assert tok.decode([]) == "" and tok.decode(iter(ids)) == "1+2"
    assert tok.encode_batch(["1", "2"]) == [tok.encode("1"), tok.encode("2")]
    assert tok.token_to_id("no-such-piece") is None
    assert tok.token_to_id("<unk>") == 3


def test_sp_training_is_deterministic(sp_model, tmp_path):
    _, path = sp_model
    again = tmp_path / "again.model"
    train_sentencepiece(arithmetic_texts(400, seed=0), 96, again)
    assert again.read_bytes() == path.read_bytes()


def test_sp_errors(sp_model, tmp_path):
    tok, _ = sp_model
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="flat sequence of int ids"):
        tok.decode([[1, 2]])
    with pytest.raises(TypeError, match="flat sequence of int ids"):
        tok.decode([1.5])
    with pytest.raises(TypeError, match="expects a str"):
        tok.encode(b"1+2")
    with pytest.raises(ValueError, match="smaller than required_chars"):
        train_sentencepiece(["abcdefghij 123"], 8, tmp_path / "small.model")
    with pytest.raises(ValueError, match="no non-empty training text"):
        train_sentencepiece(["", ""], 64, tmp_path / "empty.model")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        train_sentencepiece(["1+1", 2], 64, tmp_path / "bad.model")
    with pytest.raises(ValueError, match="must end in .model"):
        train_sentencepiece(["1+1"], 64, tmp_path / "x.spm")
    corrupt = tmp_path / "corrupt.model"
    corrupt.write_bytes(b"\x00not a model")
    with pytest.raises(ValueError, match="not a readable SentencePiece model"):
        load_tokenizer(corrupt)


def test_load_sp_by_file_and_directory(sp_model, tmp_path):
    tok, path = sp_model
    by_file = load_tokenizer(path)
    assert isinstance(by_file, SentencePieceTokenizer)
    (tmp_path / "tokenizer.model").write_bytes(path.read_bytes())
    by_dir = load_tokenizer(tmp_path)
    s = "Question: What is (1 + 2)^2 % 7?\nAnswer: 2.5"
    assert by_dir.encode(s) == by_file.encode(s) == tok.encode(s)
    # A Llama-2 style directory: tokenizer_config.json overrides the model's own ids.
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": "=", "pad_token": None})
    cfg = load_tokenizer(tmp_path)
    assert cfg.eos_ids == (tok.token_to_id("="),) and cfg.pad_id == cfg.eos_ids[0]


# -- Hugging Face tokenizer.json ------------------------------------------------------------


def test_hf_specials_from_config_files(hf_dir):
    tok = load_tokenizer(hf_dir)
    assert isinstance(tok, HFTokenizer)
    assert tok.eos_ids == (2, 0)  # tokenizer_config eos first, then generation_config extras
    assert tok.pad_id == 0 and tok.bos_id is None
    assert tok.special_ids == {0, 1, 2}
    assert tok.chat_template == "{{ messages[0]['content'] }}"
    # The json file itself also works (config read from its directory).
    assert load_tokenizer(hf_dir / "tokenizer.json").eos_ids == (2, 0)
    # Explicit overrides win; None means "no such token".
    over = load_tokenizer(hf_dir, eos_token="<|endoftext|>", pad_token=None)
    assert over.eos_ids == (0, 2) and over.pad_id == 0


def test_hf_matches_transformers(hf_dir):
    from transformers import AutoTokenizer

    ours = load_tokenizer(hf_dir)
    ref = AutoTokenizer.from_pretrained(str(hf_dir))
    assert (ref.eos_token_id, ref.pad_token_id, ref.bos_token_id) == (2, 0, None)
    assert ours.vocab_size == len(ref)
    texts = arithmetic_texts(20, seed=7) + [
        "<|im_start|>user\nhello world, ünïcode ✓<|im_end|>\n",
        "  leading and trailing spaces  ",
        "",
    ]
    ids = ours.encode_batch(texts)
    for t, i in zip(texts, ids, strict=True):
        assert i == ours.encode(t) == ref.encode(t, add_special_tokens=False)
        assert ours.decode(i, skip_special=False) == ref.decode(i, skip_special_tokens=False) == t
        assert ours.decode(i) == ref.decode(i, skip_special_tokens=True)
    assert ours.decode_batch(ids) == [ours.decode(i) for i in ids]
    assert ours.token_to_id("<|im_end|>") == 2 and ours.id_to_piece(1) == "<|im_start|>"


def test_hf_saved_truncation_is_ignored(tmp_path):
    build_hf_json(tmp_path, truncate=4)
    tok = load_tokenizer(tmp_path, eos_token="<|im_end|>")
    text = "Question: What is (123 + 456)^2 % 7?"
    assert len(tok.encode(text)) > 4
    assert tok.decode(tok.encode(text)) == text


def test_hf_chat_template_file_and_list_form(tmp_path):
    build_hf_json(tmp_path)
    write_json(
        tmp_path / "tokenizer_config.json",
        {"eos_token": "<|im_end|>", "chat_template": [{"name": "default", "template": "A"}]},
    )
    assert load_tokenizer(tmp_path).chat_template == "A"
    (tmp_path / "chat_template.jinja").write_text("B", encoding="utf-8")
    assert load_tokenizer(tmp_path).chat_template == "B"


def test_hf_errors(tmp_path):
    build_hf_json(tmp_path)
    with pytest.raises(ValueError, match="no end-of-sequence token.*eos_token="):
        load_tokenizer(tmp_path)  # no tokenizer_config.json
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": "</s>"})
    with pytest.raises(ValueError, match=r"eos_token '</s>' .*tokenizer_config.json.* not in"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{broken", encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer_config.json is not valid JSON"):
        load_tokenizer(tmp_path)
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": 7})
    with pytest.raises(ValueError, match="`eos_token` must be a string"):
        load_tokenizer(tmp_path)
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": "<|im_end|>"})
    write_json(tmp_path / "generation_config.json", {"eos_token_id": [2, 99999]})
    with pytest.raises(ValueError, match="eos_token_id 99999"):
        load_tokenizer(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    with pytest.raises(TypeError, match="unknown overrides"):
        load_tokenizer(tmp_path, eos="x")
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": ', encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer.json is not a readable tokenizer.json"):
        load_tokenizer(tmp_path)


def test_missing_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="tokenizer.json .*tokenizer.model"):
        load_tokenizer(tmp_path)
    (tmp_path / "vocab.txt").write_text("a\n")
    with pytest.raises(
        ValueError, match="neither a SentencePiece .model file nor a tokenizer.json"
    ):
        load_tokenizer(tmp_path / "vocab.txt")
