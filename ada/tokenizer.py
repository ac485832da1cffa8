"""Tokenizers behind one small interface: SentencePiece `.model` files and HF `tokenizer.json`.

Everything downstream (prompt encoding, the sampler's stop tokens, padding, response decoding)
talks to `Tokenizer`; nothing else imports `sentencepiece` or `tokenizers`. Chat formatting
lives in `ada.templates`, not here (one place for each idea); a tokenizer only exposes the raw
Jinja `chat_template` string it shipped with, for reference.

Special tokens are resolved once, at load time, into plain ints:
  eos_ids  every id that ends a response (tokenizer_config.json `eos_token` first, then the
           ids of generation_config.json `eos_token_id`, e.g. Llama 3 instruct's <|eot_id|>
           and <|end_of_text|>); the sampler stops on any of them.
  pad_id   tokenizer_config.json `pad_token`, else the model's pad piece, else eos_ids[0]
           (padding is always masked, so reusing eos is safe).
  bos_id   tokenizer_config.json `bos_token` (Qwen: none; Llama 3: <|begin_of_text|>).

`encode(text, add_special=True)` adds what the tokenizer adds by itself (SentencePiece: BOS;
tokenizer.json: its post-processor). Chat-template renderings already contain their special
tokens as text, so they are encoded with add_special=False (see `ada.templates`).
`vocab_size` is 1 + the largest id; check it against a model with `ada.models.hf_config.check_vocab`.

`train_sentencepiece` trains a tiny deterministic model for the synthetic tasks: digits are
single pieces and arithmetic symbols are always their own pieces, so a model sees "123" as
"1","2","3" and the checker's numbers map cleanly onto tokens. `synthetic_tokenizer` trains
(once, cached by its texts) a synthetic task's; in a run with tools it also holds the call
format's markers (`<calc>`, `</calc>`, `<out>`, `</out>`, ...) as single pieces.
"""

from __future__ import annotations

import abc
import hashlib
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Control ids of models made by `train_sentencepiece` (ids, not strings, are what the model sees).
SP_PAD_ID, SP_BOS_ID, SP_EOS_ID, SP_UNK_ID = 0, 1, 2, 3
# Always single pieces in trained models (arithmetic and countdown expressions, decimals).
ARITHMETIC_SYMBOLS = ("+", "-", "*", "/", "=", "(", ")", "^", "%", ".", ",", "<", ">")


class Tokenizer(abc.ABC):
    """The interface the whole project uses. Subclasses fill the attributes in __init__."""

    path: str  # where it was loaded from, for error messages
    config_dir: Path | None  # where tokenizer_config.json / generation_config.json were looked for
    vocab_size: int  # 1 + the largest token id (the model's embedding needs at least this)
    eos_ids: tuple[int, ...]
    pad_id: int
    bos_id: int | None
    special_ids: frozenset[int]  # ids that decode(skip_special=True) drops
    chat_template: str | None = None  # the Jinja template shipped with the tokenizer, if any

    @property
    def eos_id(self) -> int:
        """The primary end-of-sequence id (the one appended to training targets)."""
        return self.eos_ids[0]

    @abc.abstractmethod
    def encode(self, text: str, add_special: bool = False) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str], add_special: bool = False) -> list[list[int]]:
        return [self.encode(t, add_special) for t in texts]

    @abc.abstractmethod
    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str: ...

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special: bool = True) -> list[str]:
        return [self.decode(ids, skip_special) for ids in batch]

    @abc.abstractmethod
    def id_to_piece(self, token_id: int) -> str: ...

    @abc.abstractmethod
    def token_to_id(self, piece: str) -> int | None:
        """The id of a vocabulary piece, or None when the piece is not in the vocabulary."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.path!r}, vocab_size={self.vocab_size}, "
            f"eos_ids={self.eos_ids}, pad_id={self.pad_id}, bos_id={self.bos_id})"
        )

    # -- shared checks ---------------------------------------------------------------------

    def _check_text(self, text: Any) -> str:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}: {text!r:.80}")
        return text

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        """Plain ints in [0, vocab_size); numpy/jax arrays are accepted (1-D)."""
        arr = np.asarray(ids if hasattr(ids, "__len__") else list(ids))
        if arr.size == 0:
            return []
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(
                f"decode expects a flat sequence of int ids, got shape {arr.shape} of {arr.dtype}; "
                "use decode_batch for 2-D"
            )
        bad = arr[(arr < 0) | (arr >= self.vocab_size)]
        if bad.size:
            raise ValueError(
                f"token id {int(bad[0])} is outside the vocabulary of {self.path} "
                f"(size {self.vocab_size}); the ids come from a model whose vocabulary does not "
                "match this tokenizer"
            )
        return arr.tolist()


# -- special-token resolution (shared by both implementations) ---------------------------------


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-download or rewrite it") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def _token_string(value: Any, field: str, path: Path) -> str | None:
    """tokenizer_config.json stores special tokens as a string, an AddedToken dict, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"{path}: `{field}` must be a string or {{'content': ...}}, got {value!r}")


def _resolve_specials(
    tok: Tokenizer,
    config_dir: Path | None,
    defaults: dict[str, int | None],
    overrides: dict[str, str | None],
) -> None:
    """Set tok.eos_ids / pad_id / bos_id / chat_template from config files, defaults, overrides.

    Priority: explicit overrides (token strings) > tokenizer_config.json > the model's own ids.
    """
    config: dict = {}
    cfg_path = gen_path = None
    if config_dir is not None:
        cfg_path = config_dir / "tokenizer_config.json"
        gen_path = config_dir / "generation_config.json"
        if cfg_path.is_file():
            config = _read_json(cfg_path)

    def lookup(field: str) -> tuple[bool, int | None]:
        """(found, id) for a special-token field, from overrides then the config."""
        if field in overrides:
            text, where = overrides[field], f"the {field}= argument"
        elif field in config:
            text, where = _token_string(config[field], field, cfg_path), str(cfg_path)
        else:
            return False, None
        if text is None:
            return True, None
        token_id = tok.token_to_id(text)
        if token_id is None:
            raise ValueError(
                f"{field} {text!r} (from {where}) is not in the vocabulary of {tok.path}"
            )
        return True, token_id

    eos: list[int] = []
    found, eos_id = lookup("eos_token")
    eos_id = eos_id if found else defaults.get("eos")
    if eos_id is not None:
        eos.append(eos_id)
    if gen_path is not None and gen_path.is_file():
        extra = _read_json(gen_path).get("eos_token_id")
        extra = [] if extra is None else extra if isinstance(extra, list) else [extra]
        for i in extra:
            if not isinstance(i, int) or not 0 <= i < tok.vocab_size:
                raise ValueError(
                    f"{gen_path}: eos_token_id {i!r} is not an id of {tok.path} "
                    f"(vocabulary size {tok.vocab_size})"
                )
            if i not in eos:
                eos.append(i)
    if not eos:
        looked = [str(p) for p in (cfg_path,) if p is not None]
        raise ValueError(
            f"no end-of-sequence token for {tok.path}: looked for `eos_token` in "
            f"{looked or 'tokenizer_config.json (absent)'} and in the model itself; pass "
            "eos_token='...' to load_tokenizer or add tokenizer_config.json"
        )
    tok.eos_ids = tuple(eos)

    found, pad_id = lookup("pad_token")
    pad_id = pad_id if found else defaults.get("pad")
    tok.pad_id = eos[0] if pad_id is None else pad_id

    found, bos_id = lookup("bos_token")
    tok.bos_id = bos_id if found else defaults.get("bos")

    template = None
    if config_dir is not None and (config_dir / "chat_template.jinja").is_file():
        template = (config_dir / "chat_template.jinja").read_text(encoding="utf-8")
    elif isinstance(config.get("chat_template"), str):
        template = config["chat_template"]
    elif isinstance(config.get("chat_template"), list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in config["chat_template"]}
        template = named.get("default")
    tok.chat_template = template


# -- SentencePiece ----------------------------------------------------------------------------


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece `.model` file. Control pieces (pad/bos/eos) count as special."""

    unk_id: int  # the id of unknown text (ada.export names its piece in tokenizer_config.json)

    def __init__(self, model_file: str | Path, config_dir: Path | None = None, **overrides):
        import sentencepiece as spm

        self.path = str(model_file)
        self.config_dir = config_dir
        try:
            self._sp = spm.SentencePieceProcessor(model_file=self.path)
        except (RuntimeError, OSError) as e:
            raise ValueError(
                f"{self.path} is not a readable SentencePiece model ({e}); "
                "it may be truncated or a different file type"
            ) from e
        sp = self._sp
        self.vocab_size = sp.get_piece_size()
        self.unk_id = sp.unk_id()
        self.special_ids = frozenset(i for i in range(self.vocab_size) if sp.is_control(i))

        def opt(i: int) -> int | None:
            return None if i < 0 else i

        defaults = {"eos": opt(sp.eos_id()), "pad": opt(sp.pad_id()), "bos": opt(sp.bos_id())}
        _resolve_specials(self, config_dir, defaults, overrides)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        text = self._check_text(text)
        return self._sp.encode(text, add_bos=add_special and self.bos_id is not None)

    def encode_batch(self, texts: Sequence[str], add_special: bool = False) -> list[list[int]]:
        texts = [self._check_text(t) for t in texts]
        return self._sp.encode(texts, add_bos=add_special and self.bos_id is not None)

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        ids = self._check_ids(ids)
        if skip_special:
            return self._sp.decode([i for i in ids if i not in self.special_ids])
        # SentencePiece renders control pieces as ""; spell them out between decoded runs.
        parts, run = [], []
        for i in ids:
            if i in self.special_ids:
                parts += [self._sp.decode(run), self._sp.id_to_piece(i)]
                run = []
            else:
                run.append(i)
        parts.append(self._sp.decode(run))
        return "".join(parts)

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(self._check_ids([token_id])[0])

    def token_to_id(self, piece: str) -> int | None:
        i = self._sp.piece_to_id(piece)
        if i == self.unk_id and piece != self._sp.id_to_piece(self.unk_id):
            return None
        return i


# -- Hugging Face tokenizer.json --------------------------------------------------------------


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizer.json` (fast tokenizer), read with the `tokenizers` package.

    Special tokens come from the sibling tokenizer_config.json / generation_config.json; the
    saved truncation and padding settings are switched off so encode() never alters a text.
    """

    def __init__(self, tokenizer_json: str | Path, config_dir: Path | None = None, **overrides):
        from tokenizers import Tokenizer as _HFTok

        self.path = str(tokenizer_json)
        self.config_dir = config_dir
        try:
            self._tok = _HFTok.from_file(self.path)
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise ValueError(
                f"{self.path} is not a readable tokenizer.json ({e}); "
                "it may be truncated or written by an incompatible library version"
            ) from e
        self._tok.no_truncation()
        self._tok.no_padding()
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0
        if self.vocab_size == 0:
            raise ValueError(f"{self.path} has an empty vocabulary")
        added = self._tok.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        _resolve_specials(self, config_dir, {}, overrides)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        text = self._check_text(text)
        return self._tok.encode(text, add_special_tokens=add_special).ids

    def encode_batch(self, texts: Sequence[str], add_special: bool = False) -> list[list[int]]:
        texts = [self._check_text(t) for t in texts]
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=add_special)]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self._tok.decode(self._check_ids(ids), skip_special_tokens=skip_special)

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special: bool = True) -> list[str]:
        checked = [self._check_ids(ids) for ids in batch]
        return self._tok.decode_batch(checked, skip_special_tokens=skip_special)

    def id_to_piece(self, token_id: int) -> str:
        return self._tok.id_to_token(self._check_ids([token_id])[0])

    def token_to_id(self, piece: str) -> int | None:
        return self._tok.token_to_id(piece)


# -- loading ----------------------------------------------------------------------------------


def load_tokenizer(path: str | Path, **overrides: str | None) -> Tokenizer:
    """Load a tokenizer from a `.model` file, a `tokenizer.json` file, or a model directory.

    In a directory, `tokenizer.json` wins over `tokenizer.model` (HF ships both for some
    models and the fast one is the reference). `overrides` name special tokens by string
    (eos_token=, pad_token=, bos_token=; None means "none") and beat the config files.
    """
    unknown = set(overrides) - {"eos_token", "pad_token", "bos_token"}
    if unknown:
        raise TypeError(
            f"load_tokenizer got unknown overrides {sorted(unknown)}; "
            "use eos_token=, pad_token= or bos_token="
        )
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"tokenizer path {p} does not exist")
    if p.is_file():
        if p.suffix == ".model":
            return SentencePieceTokenizer(p, p.parent, **overrides)
        if p.suffix == ".json":
            return HFTokenizer(p, p.parent, **overrides)
        raise ValueError(
            f"{p} is neither a SentencePiece .model file nor a tokenizer.json; "
            "pass one of those or the model directory that holds them"
        )
    if (p / "tokenizer.json").is_file():
        return HFTokenizer(p / "tokenizer.json", p, **overrides)
    if (p / "tokenizer.model").is_file():
        return SentencePieceTokenizer(p / "tokenizer.model", p, **overrides)
    raise FileNotFoundError(
        f"no tokenizer in directory {p}: looked for tokenizer.json (Hugging Face) and "
        "tokenizer.model (SentencePiece); pass the path of a .model file directly if it has "
        "another name"
    )


# -- training a tiny SentencePiece model ------------------------------------------------------


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    out_path: str | Path,
    *,
    model_type: str = "bpe",
    user_defined_symbols: Sequence[str] = ARITHMETIC_SYMBOLS,
    split_digits: bool = True,
    pad_id: int = SP_PAD_ID,
    bos_id: int = SP_BOS_ID,
    eos_id: int = SP_EOS_ID,
    unk_id: int = SP_UNK_ID,
    hard_vocab_limit: bool = False,
) -> SentencePieceTokenizer:
    """Train a SentencePiece model offline and write it to `out_path` (a `.model` file).

    Deterministic (one thread, every sentence used, no sampling): the same texts give the same
    bytes. Text round-trips exactly: no normalisation, whitespace kept as is. With
    hard_vocab_limit=False the vocabulary is at most `vocab_size` (fewer when the texts do not
    support that many merges); the returned tokenizer's `vocab_size` is the real one.
    """
    import sentencepiece as spm

    out_path = Path(out_path)
    if out_path.suffix != ".model":
        raise ValueError(f"out_path {out_path} must end in .model")
    sentences = []
    for k, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{k}] is {type(t).__name__}, expected str")
        if t:
            sentences.append(t)
    if not sentences:
        raise ValueError("train_sentencepiece got no non-empty training text")
    max_len = max(len(s.encode("utf-8")) for s in sentences)
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=buf,
            vocab_size=vocab_size,
            model_type=model_type,
            user_defined_symbols=list(user_defined_symbols),
            split_digits=split_digits,
            pad_id=pad_id,
            bos_id=bos_id,
            eos_id=eos_id,
            unk_id=unk_id,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            character_coverage=1.0,
            hard_vocab_limit=hard_vocab_limit,
            max_sentence_length=max(max_len + 1, 4192),
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=1,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ValueError(f"SentencePiece training for {out_path} failed: {e}") from e
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(buf.getvalue())
    return SentencePieceTokenizer(out_path)


def synthetic_tokenizer(texts: Sequence[str], vocab_size: int, folder: str | Path,
                        markers: Sequence[str] = ()) -> SentencePieceTokenizer:
    """A synthetic task's tokenizer: `train_sentencepiece` on `texts`, cached in `folder` by
    the texts (and the markers), trained once.

    `markers` (a run with tools: ada.envs.tokens.markers(env.tool_format)) become
    user-defined symbols after ARITHMETIC_SYMBOLS, each one piece, so the sampler can end
    a turn on one token. Without markers the file and its name are today's:
    sp-{vocab_size}-{hash of texts}.model."""
    h = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]
    if markers:
        h += "-m" + hashlib.sha256("\0".join(markers).encode()).hexdigest()[:8]
    folder = Path(folder)
    path = folder / f"sp-{vocab_size}-{h}.model"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{path.stem}.tmp{os.getpid()}.model"
        train_sentencepiece(texts, vocab_size, tmp,
                            user_defined_symbols=ARITHMETIC_SYMBOLS + tuple(markers))
        os.replace(tmp, path)
    return SentencePieceTokenizer(path, path.parent)
