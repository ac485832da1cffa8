"""Prompt templates: byte-identical to transformers' apply_chat_template on the families'
official Jinja templates, the registry's errors, and length filtering counts."""

import json
import random
import re

import pytest
from chat_templates import QWEN3_JINJA, QWEN25_INSTRUCT_JINJA, QWEN25_MATH_JINJA
from tokenizers import Tokenizer as HFTok
from tokenizers import decoders, models, pre_tokenizers, trainers

from ada.templates import (
    QWEN25_MATH_INSTRUCTION,
    TEMPLATES,
    check_template_tokens,
    encode_prompt,
    filter_by_length,
    get_template,
    prompt_messages,
    render_messages,
    render_prompt,
)
from ada.tokenizer import load_tokenizer, train_sentencepiece

# The official chat templates of Meta-Llama-3-Instruct and Llama-3.2-Instruct
# (tokenizer_config.json), with the tool-calling branches cut: they do not fire without tools.
# The Qwen ones, tool branches included: tests/chat_templates.py.
LLAMA3_JINJA = r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"""

LLAMA32_JINJA = r"""{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# google/gemma-2-2b-it and google/gemma-3-1b-it tokenizer_config.json (Gemma 3's branches for
# list contents and images cut: ada renders string contents only).
GEMMA2_JINJA = r"""{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"""

GEMMA3_JINJA = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

PROBLEMS = [
    "What is $\\frac{1}{2} + \\frac{1}{3}$?",
    "  Find $x$ if $2x + 3 = 11$.\n\nGive $x$ as an integer.  ",
    "Évaluez $\\sum_{k=1}^{10} k^2$ — ünïcode ✓ {braces} {{double}}",
]
CONVERSATION = [
    {"role": "system", "content": " Be brief. "},
    {"role": "user", "content": "1+1?"},
    {"role": "assistant", "content": "2\n"},
    {"role": "user", "content": "\nAnd 2+2?"},
]


def corpus():
    rng = random.Random(0)
    return [f"What is {rng.randint(0, 999)} + {rng.randint(0, 999)}?" for _ in range(50)] + PROBLEMS


def make_hf_dir(path, specials, config):
    tok = HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("templates")
    qwen = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}
    llama = {"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"}
    gemma = {"eos_token": "<eos>", "bos_token": "<bos>", "pad_token": "<pad>"}
    return {
        "gemma2": make_hf_dir(
            root / "gemma2", GEMMA_SPECIALS, {**gemma, "chat_template": GEMMA2_JINJA}
        ),
        "gemma3": make_hf_dir(
            root / "gemma3", GEMMA_SPECIALS, {**gemma, "chat_template": GEMMA3_JINJA}
        ),
        "qwen25": make_hf_dir(
            root / "qwen25", QWEN_SPECIALS, {**qwen, "chat_template": QWEN25_INSTRUCT_JINJA}
        ),
        "qwen25_math": make_hf_dir(
            root / "qm", QWEN_SPECIALS, {**qwen, "chat_template": QWEN25_MATH_JINJA}
        ),
        "qwen3": make_hf_dir(root / "qwen3", QWEN_SPECIALS, {**qwen, "chat_template": QWEN3_JINJA}),
        "llama3": make_hf_dir(
            root / "llama3", LLAMA_SPECIALS, {**llama, "chat_template": LLAMA3_JINJA}
        ),
        "llama32": make_hf_dir(
            root / "llama32", LLAMA_SPECIALS, {**llama, "chat_template": LLAMA32_JINJA}
        ),
    }


@pytest.fixture(scope="module")
def hf_ref(hf_dirs):
    from transformers import AutoTokenizer

    return {k: AutoTokenizer.from_pretrained(str(d)) for k, d in hf_dirs.items()}


def ref_render(ref, messages, add_generation_prompt=True, **kw):
    return ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kw
    )


# (our template, reference tokenizer, template options, reference kwargs)
CASES = [
    ("qwen_chat", "qwen25", {}, {}),
    ("qwen25_math", "qwen25_math", {}, {}),  # conversations too: its default system turn
    ("qwen3", "qwen3", {}, {}),
    ("qwen3", "qwen3", {"enable_thinking": False}, {"enable_thinking": False}),
    ("qwen3", "qwen3", {"enable_thinking": True}, {"enable_thinking": True}),
    ("llama3", "llama3", {}, {}),
    ("llama32", "llama32", {}, {"date_string": "26 Jul 2024"}),
    ("llama32", "llama32", {"date_string": "01 Jan 2025"}, {"date_string": "01 Jan 2025"}),
    ("gemma", "gemma3", {}, {}),
]


@pytest.mark.parametrize("name,ref_key,opts,ref_kw", CASES)
def test_prompts_match_transformers(hf_dirs, hf_ref, name, ref_key, opts, ref_kw):
    ref = hf_ref[ref_key]
    ours_tok = load_tokenizer(hf_dirs[ref_key])
    for problem in PROBLEMS:
        for instruction in (None, "Answer with a number."):
            messages = prompt_messages(name, problem, instruction)
            text = render_prompt(name, problem, instruction, **opts)
            assert text == ref_render(ref, messages, **ref_kw)
            ids = encode_prompt(ours_tok, name, problem, instruction, **opts)
            assert ids == ref.encode(text, add_special_tokens=False)
    for gen in (True, False):
        assert render_messages(name, CONVERSATION, gen, **opts) == ref_render(
            ref, CONVERSATION, gen, **ref_kw
        )
        no_system = CONVERSATION[1:]
        assert render_messages(name, no_system, gen, **opts) == ref_render(
            ref, no_system, gen, **ref_kw
        )


def test_gemma_matches_both_official_templates(hf_dirs, hf_ref):
    """One renderer for Gemma 2 and 3: Gemma 2's template renders the same text wherever it
    renders at all (it has no system role and raises on one; Gemma 3's folds it into the
    first user turn, and so does ada: test_prompts_match_transformers)."""
    ref = hf_ref["gemma2"]
    tok = load_tokenizer(hf_dirs["gemma2"])
    for problem in PROBLEMS:
        text = render_prompt("gemma", problem, "Answer with a number.")
        assert text == ref_render(ref, prompt_messages("gemma", problem, "Answer with a number."))
        assert encode_prompt(tok, "gemma", problem) == ref.encode(
            render_prompt("gemma", problem), add_special_tokens=False)
    for gen in (True, False):
        assert render_messages("gemma", CONVERSATION[1:], gen) == ref_render(
            ref, CONVERSATION[1:], gen)
    with pytest.raises(Exception, match="System role not supported"):
        ref_render(ref, CONVERSATION)
    assert render_messages("gemma", CONVERSATION[:2]) == (
        "<bos><start_of_turn>user\n Be brief. \n\n1+1?<end_of_turn>\n<start_of_turn>model\n")
    for bad in ([CONVERSATION[2]], [CONVERSATION[1], CONVERSATION[1]]):
        with pytest.raises(ValueError, match="alternate"):
            render_messages("gemma", bad)
        with pytest.raises(Exception, match="alternate"):
            ref_render(hf_ref["gemma3"], bad)


def test_qwen25_math_is_the_math_models_default(hf_ref):
    """Qwen2.5-Math's own template puts the CoT instruction in its default system turn."""
    text = render_prompt("qwen25_math", PROBLEMS[0])
    assert text == ref_render(hf_ref["qwen25_math"], [{"role": "user", "content": PROBLEMS[0]}])
    assert text == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within "
        "\\boxed{}.<|im_end|>\n<|im_start|>user\nWhat is $\\frac{1}{2} + \\frac{1}{3}$?"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert get_template("qwen25_math").default_instruction == QWEN25_MATH_INSTRUCTION


def test_exact_strings_of_other_templates():
    assert render_prompt("plain", "1+2?") == "Question: 1+2?\nAnswer:"
    assert render_prompt("plain", "1+2?", "Be exact.") == "Question: 1+2? Be exact.\nAnswer:"
    assert render_prompt("qwen3", "1+2?", enable_thinking=False) == (
        "<|im_start|>user\n1+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert render_prompt("llama3", " 1+2? ") == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n1+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_registry_and_input_errors():
    assert set(TEMPLATES) == {"qwen25_math", "qwen_chat", "qwen3", "llama3", "llama32", "gemma",
                              "plain"}
    with pytest.raises(ValueError, match=r"unknown prompt template 'chatml'; known templates: \["):
        render_prompt("chatml", "1+1")
    with pytest.raises(TypeError, match=r"unknown options \['enable_thinking'\]; it accepts none"):
        render_prompt("llama3", "1+1", enable_thinking=False)
    with pytest.raises(TypeError, match="problem must be a str"):
        render_prompt("plain", 3)
    with pytest.raises(ValueError, match="messages is empty"):
        render_messages("qwen_chat", [])
    with pytest.raises(ValueError, match=r"messages\[0\] has role 'tool'"):
        render_messages("qwen_chat", [{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages\[1\]: a system message may only come first"):
        render_messages("qwen_chat", [CONVERSATION[1], CONVERSATION[0]])
    with pytest.raises(ValueError, match="exactly one user message"):
        render_messages("plain", CONVERSATION)
    with pytest.raises(ValueError, match="<think>"):
        render_messages(
            "qwen3",
            [
                CONVERSATION[1],
                {"role": "assistant", "content": "<think>a</think>2"},
                CONVERSATION[3],
            ],
        )


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
    rng = random.Random(0)
    texts = [
        f"Question: {rng.randint(0, 99999)} + {rng.randint(0, 999)} = ?\nAnswer:"
        for _ in range(300)
    ]
    return train_sentencepiece(texts, 64, tmp_path_factory.mktemp("sp") / "t.model")


def test_template_tokens_must_exist(sp_tok, hf_dirs):
    check_template_tokens(sp_tok, "plain")
    with pytest.raises(
        ValueError, match=re.escape("needs '<|im_start|>' as a single token") + ".*'plain'"
    ):
        check_template_tokens(sp_tok, "qwen_chat")
    with pytest.raises(ValueError, match=re.escape("needs '<|begin_of_text|>'")):
        filter_by_length([{"problem": "1+1"}], load_tokenizer(hf_dirs["qwen3"]), "llama3", 100)


def test_filter_by_length_counts(sp_tok, hf_dirs):
    # Digits are single tokens, so each extra digit is exactly one more prompt token.
    base = len(encode_prompt(sp_tok, "plain", "1 + 1 = ?"))
    assert encode_prompt(sp_tok, "plain", "1 + 1 = ?")[0] == sp_tok.bos_id  # plain adds BOS
    records = [{"problem": "1" * k + " + 1 = ?", "id": k} for k in range(1, 11)]
    for limit in (base - 1, base, base + 4, base + 9, base + 100):
        kept, dropped = filter_by_length(records, sp_tok, "plain", limit)
        expect = [r for r in records if base + r["id"] - 1 <= limit]
        assert kept == expect and dropped == len(records) - len(expect)
    # Chat template on a HF tokenizer: the count agrees with a per-record reference.
    hf = load_tokenizer(hf_dirs["qwen25"])
    problems = [{"problem": p} for p in PROBLEMS * 3]
    lengths = [len(hf.encode(render_prompt("qwen25_math", r["problem"]))) for r in problems]
    limit = sorted(lengths)[len(lengths) // 2]
    kept, dropped = filter_by_length(problems, hf, "qwen25_math", limit)
    assert dropped == sum(n > limit for n in lengths) > 0
    assert kept == [r for r, n in zip(problems, lengths, strict=True) if n <= limit]


def test_filter_by_length_errors(sp_tok):
    with pytest.raises(ValueError, match="record 1 needs a str 'problem'"):
        filter_by_length([{"problem": "1"}, {"question": "2"}], sp_tok, "plain", 10)
    with pytest.raises(ValueError, match="max_prompt_tokens must be a positive int"):
        filter_by_length([{"problem": "1"}], sp_tok, "plain", 0)
    assert filter_by_length([], sp_tok, "plain", 5) == ([], 0)
