"""The model families as one table (ada/models/families.py): every place reads the row, so a
new family of a known block is one row (docs/design.md shows the diff)."""

import json

import numpy as np
import pytest
from helpers import random_params

from ada.models import families, forward, preset
from ada.models.families import FAMILIES, Family
from ada.models.hf_config import CheckpointError, config_from_hf, config_to_hf
from ada.models.summary import model_info
from ada.templates import TEMPLATES

# A Llama block under another name (Mistral 7B v0.3: no RoPE scaling, no sliding window),
# the row docs/design.md shows.
MISTRAL = Family("MistralForCausalLM", "mistral", qkv_bias=False, qk_norm=False,
                 off_keys=dict(sliding_window=None), chat_templates=("llama3",),
                 preset=dict(rope_theta=1_000_000.0, rms_norm_eps=1e-5), tie_embeddings=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_config_json_round_trips_through_the_row(family):
    """Breaks if the export writes another architecture or model_type than the load reads
    for a family, or a switch the row turns off is written on (or not rejected when on)."""
    c = preset("tiny", family=family)
    row = FAMILIES[family]
    hf = config_to_hf(c)
    assert (hf["architectures"], hf["model_type"]) == ([row.hf_architecture], row.model_type)
    assert config_from_hf(json.loads(json.dumps(hf))) == c
    for key, off in row.off_keys.items():
        assert hf[key] == off
        with pytest.raises(CheckpointError, match=f"{key}=true is not supported"):
            config_from_hf(dict(hf, **{key: True}))


def test_every_chat_template_belongs_to_a_family():
    """Breaks if a row names a template ada does not have, or a chat template is added that
    no family claims (ada-inspect would not suggest it)."""
    claimed = {t for row in FAMILIES.values() for t in row.chat_templates}
    assert claimed | {"plain"} == set(TEMPLATES)


def test_a_new_family_is_one_row(monkeypatch):
    """Breaks if a place other than the row lists the families: the preset, the forward,
    the config.json both ways and ada-inspect must take a family from its row alone."""
    monkeypatch.setitem(families.FAMILIES, "mistral", MISTRAL)
    c = preset("tiny", family="mistral")
    assert (c.qkv_bias, c.qk_norm, c.tie_embeddings, c.rope_theta) == (False, False, False, 1e6)
    logits, _ = forward(random_params(c), c, np.zeros((1, 4), np.int32), np.arange(4)[None])
    assert logits.shape == (1, 4, c.vocab_size)
    hf = config_to_hf(c)
    assert (hf["architectures"], hf["model_type"], hf["sliding_window"]) == (
        ["MistralForCausalLM"], "mistral", None)
    assert config_from_hf(hf) == c
    assert config_from_hf({k: v for k, v in hf.items() if k != "architectures"}) == c
    with pytest.raises(CheckpointError, match="sliding_window=4096 is not supported for mistral"):
        config_from_hf(dict(hf, sliding_window=4096))
    assert model_info(c)["chat_templates"] == "llama3"
