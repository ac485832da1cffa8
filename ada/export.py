"""Write a run's policy as a Hugging Face directory: weights, config.json and tokenizer; or
a LoRA run's as a PEFT adapter on its base (`export_peft`).

`export_hf` is the one export path (the training loop calls it; a restored checkpoint goes
through it too, via `Checkpointer.restore_params`). The directory loads with transformers'
AutoModelForCausalLM and AutoTokenizer, and that tokenizer encodes every text to ada's ids.
Given the run's prompt template, it carries that template as its chat template, so that
`apply_chat_template` on a problem gives the ids the run trained and ada-serve answers on.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ada import paths
from ada.models import lora
from ada.models.hf import save_hf
from ada.models.hf_lora import save_peft
from ada.models.hf_config import check_vocab
from ada.models.transformer import ModelConfig, Params
from ada.templates import chat_template, get_template
from ada.tokenizer import HFTokenizer, SentencePieceTokenizer, Tokenizer

# The files of a Hugging Face directory that describe its tokenizer (never weights or config.json).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
    "generation_config.json", "tokenization_ada.py",
)
# Written beside a tokenizer_config.json that ada writes itself; see export_tokenizer.
_TOKENIZER_MODULE = '''"""Written by ada: {base} under a name auto_map can point to."""
from transformers import {base}


class AdaTokenizer({base}):
    pass
'''


def export_tokenizer(tokenizer: Tokenizer, out_dir: str | os.PathLike,
                     template: str | None = None) -> list[str]:
    """Write `tokenizer` into the HF model directory `out_dir` (beside save_hf's weights) so
    that `transformers.AutoTokenizer.from_pretrained(out_dir)` loads it and encodes every text to
    ada's ids (add_special_tokens=True matching add_special=True).

    tokenizer.json: copied with the tokenizer files beside it (TOKENIZER_FILES: tokenizer_config.json
    and its chat template, special_tokens_map.json, chat_template.jinja, generation_config.json...).
    SentencePiece: tokenizer.model with a tokenizer_config.json naming transformers'
    SentencePieceBackend, which encodes with the same sentencepiece call as ada (a converted
    tokenizer.json re-implements SentencePiece's BPE, with no guarantee of equal ids);
    split_special_tokens keeps a "<s>" typed in the text as text, as ada does.
    A missing tokenizer_config.json / generation_config.json is written from ada's bos/eos/pad
    ids and chat template. Such a config also carries an auto_map to tokenization_ada.py: without
    one, transformers 5 swaps tokenizer_class for the model type's own class on some types (a
    qwen2 config.json gets Qwen2Tokenizer, which re-tokenizes with Qwen's byte-level rules).
    `template` (an ada.templates name: the run's tokenizer.template) replaces the chat template
    with ada's rendering of it (`templates.chat_template`), in tokenizer_config.json and in
    chat_template.jinja (transformers 5 reads the latter first), whatever the model shipped:
    `apply_chat_template(messages, add_generation_prompt=True)` then gives encode_prompt's ids.
    A template encoded with the tokenizer's special tokens (plain) writes its BOS as text, so
    a SentencePiece export then parses special tokens in text (split_special_tokens off: pass
    sanitize_control_tokens=True to apply_chat_template to keep a typed "<s>" as text, as ada
    does). Without `template` the tokenizer's own chat template is kept.
    Tokenizer files of an earlier export that this one does not write are removed (they could
    shadow it). Returns the written file names.
    """
    bos_text = ""
    if template is not None and get_template(template).add_special:
        bos_text = "".join(tokenizer.id_to_piece(i) for i in tokenizer.encode("", add_special=True))
    chat = tokenizer.chat_template if template is None else chat_template(template, bos_text)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    beside = lambda names: {n: tokenizer.config_dir / n for n in names
                            if tokenizer.config_dir and (tokenizer.config_dir / n).is_file()}
    if isinstance(tokenizer, HFTokenizer):
        sources = beside(TOKENIZER_FILES) | {"tokenizer.json": Path(tokenizer.path)}
        config: dict[str, Any] = {"tokenizer_class": "TokenizersBackend"}
    elif isinstance(tokenizer, SentencePieceTokenizer):
        # A tokenizer_config.json beside the model names a class that converts the model (e.g.
        # LlamaTokenizer) and encodes differently, so only generation_config.json is taken.
        sources = beside(["generation_config.json"]) | {"tokenizer.model": Path(tokenizer.path)}
        config = {
            "tokenizer_class": "SentencePieceBackend", "legacy": True,
            "split_special_tokens": not bos_text, "unk_token": tokenizer.id_to_piece(tokenizer.unk_id),
            "special_tokens_pattern": "none" if tokenizer.bos_id is None else "bos",
        }
    else:
        raise TypeError(f"cannot export a {type(tokenizer).__name__}; expected an ada tokenizer")

    if template is not None:  # the run's template replaces any the model shipped
        sources.pop("chat_template.json", None)
    for name, src in sources.items():
        dst = out / name
        if not (dst.exists() and os.path.samefile(src, dst)):
            shutil.copyfile(src, dst)
    written = list(sources)
    piece = lambda i: None if i is None else tokenizer.id_to_piece(i)
    if "tokenizer_config.json" not in sources:
        config.update(bos_token=piece(tokenizer.bos_id), eos_token=piece(tokenizer.eos_id),
                      pad_token=piece(tokenizer.pad_id))
        if chat is not None:
            config["chat_template"] = chat
        # With auto_map set AutoTokenizer loads tokenizer_class as named, or under
        # trust_remote_code=True its subclass in tokenization_ada.py.
        ref = "tokenization_ada.AdaTokenizer"
        fast = isinstance(tokenizer, HFTokenizer)
        config["auto_map"] = {"AutoTokenizer": [None, ref] if fast else [ref, None]}
        module = _TOKENIZER_MODULE.format(base=config["tokenizer_class"])
        (out / "tokenization_ada.py").write_text(module)
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        written += ["tokenization_ada.py", "tokenizer_config.json"]
    elif template is not None:  # the model's own config, with the run's template
        config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["chat_template"] = chat
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False),
                                                   encoding="utf-8")
    if template is not None:
        (out / "chat_template.jinja").write_text(chat, encoding="utf-8")
        written += [] if "chat_template.jinja" in written else ["chat_template.jinja"]
    if "generation_config.json" not in sources:
        eos = list(tokenizer.eos_ids)
        gen_config = {"bos_token_id": tokenizer.bos_id, "pad_token_id": tokenizer.pad_id,
                      "eos_token_id": eos[0] if len(eos) == 1 else eos}
        (out / "generation_config.json").write_text(json.dumps(gen_config, indent=2))
        written.append("generation_config.json")
    for name in set(TOKENIZER_FILES) - set(written):
        (out / name).unlink(missing_ok=True)
    return written


def export_hf(params: Params, model_cfg: ModelConfig, tokenizer: Tokenizer,
              out_dir: str | os.PathLike, template: str | None = None) -> list[str]:
    """Write `params` (save_hf; LoRA adapters merged in) and `tokenizer` (export_tokenizer,
    with the run's prompt `template` as its chat template) into `out_dir`; checks first
    that the tokenizer's ids fit the embedding, so no half-usable directory is written. A gs://
    `out_dir` is written locally first, then copied up file by file. Returns the written
    file names."""
    check_vocab(model_cfg, tokenizer.vocab_size)
    return _written(out_dir, lambda d: save_hf(params, model_cfg, d)
                    + export_tokenizer(tokenizer, d, template))


def export_peft(params: Params, model_cfg: ModelConfig, tokenizer: Tokenizer,
                out_dir: str | os.PathLike, base_model: str | None = None,
                template: str | None = None) -> list[str]:
    """Write a LoRA run's adapters as a PEFT adapter (save_peft) with the tokenizer files
    into `out_dir`. `base_model`: the base's Hugging Face directory (the run's model.path);
    None (a seeded or warm-started base, which has none) writes the base itself, unmerged,
    to `out_dir`/base with export_hf and names that. Returns the written file names."""
    check_vocab(model_cfg, tokenizer.vocab_size)

    def write(d):
        names = []
        if base_model is None:
            names = [f"base/{n}" for n in export_hf(lora.base(params), model_cfg, tokenizer,
                                                    os.path.join(d, "base"), template)]
        base = base_model or paths.join(str(out_dir), "base")
        return names + save_peft(params, model_cfg, d, base) + export_tokenizer(tokenizer, d,
                                                                                 template)

    return _written(out_dir, write)


def _written(out_dir, write) -> list[str]:
    """`write(directory)`'s files in `out_dir`: a gs:// one written locally first, then
    copied up file by file."""
    if not paths.is_remote(out_dir):
        return write(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        names = write(tmp)
        for name in names:
            with open(os.path.join(tmp, name), "rb") as src, \
                    paths.path(out_dir).joinpath(name).open("wb") as dst:
                shutil.copyfileobj(src, dst, 64 << 20)
    return names
