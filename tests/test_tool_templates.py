"""Tool conversations: ada's rendering (render_tool_prompt, render_tool_messages) equals
transformers' apply_chat_template(messages, tools=...) on the official Qwen2.5-Instruct and
Qwen3 chat templates, byte for byte; and a tool run's text (the prompt, the policy's turn up to
</tool_call>, QwenFormat.wrap(result), the final answer, <|im_end|>) is the template's
rendering of the whole conversation, up to the differences stated in
test_a_tool_run_is_the_template_rendering."""

import json
import random

import pytest
from chat_templates import QWEN3_JINJA, QWEN25_INSTRUCT_JINJA, QWEN25_MATH_JINJA
from tokenizers import Tokenizer as HFTok
from tokenizers import decoders, models, pre_tokenizers

from ada.envs import TOOLS, QwenFormat, ToolCall
from ada.templates import render_messages, render_tool_messages, render_tool_prompt

# the official templates, tool branches included (tests/chat_templates.py)
OFFICIAL = {"qwen_chat": QWEN25_INSTRUCT_JINJA, "qwen25_math": QWEN25_MATH_JINJA,
            "qwen3": QWEN3_JINJA}
# (ada template, its options = the reference's kwargs)
CASES = [("qwen_chat", {}), ("qwen25_math", {}), ("qwen3", {}),
         ("qwen3", {"enable_thinking": False})]

TOOL_SCHEMAS = [TOOLS["calculator"].schema(), TOOLS["python"].schema()]
SYSTEM = {"role": "system", "content": "Use the tools when they help."}
USER = {"role": "user", "content": "What is 12*34? Answer in \\boxed{}."}
ARGS = {"expression": "12*34"}
RESULT = TOOLS["calculator"].call(ARGS, 1.0).text  # "408"
CALL = {"role": "assistant", "content": "Let me compute.",
        "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": ARGS}}]}
ANSWER = {"role": "assistant", "content": "It is \\boxed{408}."}
CONVERSATION = [SYSTEM, USER, CALL, {"role": "tool", "content": RESULT}, ANSWER]


def tiny_qwen_tokenizer(path, chat_template):
    """A byte-level tokenizer with Qwen's special tokens and `chat_template`, saved and loaded
    as transformers loads a model's (offline: conftest sets HF_HUB_OFFLINE)."""
    from transformers import AutoTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = HFTok(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                    "<think>", "</think>"])
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "bos_token": None, "chat_template": chat_template}
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    root = tmp_path_factory.mktemp("tool_templates")
    return {name: tiny_qwen_tokenizer(root / name, t) for name, t in OFFICIAL.items()}


def reference(tokenizer, messages, add_generation_prompt, tools=TOOL_SCHEMAS, **kw):
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kw)


@pytest.mark.parametrize("name,opts", CASES)
def test_the_tool_prompt_is_the_templates(official, name, opts):
    ref = official[name]
    for messages in ([SYSTEM, USER], [USER]):
        assert (render_tool_messages(name, messages, TOOL_SCHEMAS, **opts)
                == reference(ref, messages, True, **opts))
    prompt = render_tool_prompt(name, USER["content"], TOOL_SCHEMAS, **opts)
    assert prompt == reference(ref, [USER], True, **opts)
    assert "<tools>\n" + json.dumps(TOOL_SCHEMAS[0]) + "\n" + json.dumps(TOOL_SCHEMAS[1]) in prompt
    # no tools: the template's plain rendering, which is ada's render_messages
    assert (render_tool_messages(name, [SYSTEM, USER], [], **opts)
            == reference(ref, [SYSTEM, USER], True, tools=None, **opts)
            == render_messages(name, [SYSTEM, USER], **opts))


@pytest.mark.parametrize("name,opts", CASES)
def test_a_tool_conversation_is_the_templates(official, name, opts):
    """The whole conversation (with and without the system turn, closed or with a generation
    prompt), and harder ones: two calls in one turn answered by two tool turns (one user turn
    of two <tool_response> blocks), a call with no text before it, arguments as a JSON string
    (Qwen3 writes it verbatim, Qwen2.5 JSON-quotes it), a second question after a finished
    tool exchange."""
    ref = official[name]
    two_calls = {"role": "assistant", "content": "", "tool_calls": [
        {"name": "calculator", "arguments": ARGS},
        {"type": "function", "function": {"name": "python", "arguments": '{"code": "print(1)"}'}}]}
    conversations = [
        CONVERSATION, CONVERSATION[1:],
        [USER, two_calls, {"role": "tool", "content": RESULT}, {"role": "tool", "content": "1"},
         ANSWER],
        CONVERSATION + [{"role": "user", "content": "And 2+2?"}, CALL,
                        {"role": "tool", "content": "4"}],
    ]
    for messages in conversations:
        for gen in (False, True):
            assert (render_tool_messages(name, messages, TOOL_SCHEMAS, gen, **opts)
                    == reference(ref, messages, gen, **opts))


def test_qwen3_think_blocks_in_earlier_turns_are_the_templates(official):
    """Qwen3's template splits an assistant turn's reasoning off at </think>. Before the last
    user query it drops the think block; after it (the turns of the current tool exchange) it
    keeps a non-empty one, writes an empty one only on the last turn, and drops an empty one
    elsewhere. ada renders the same."""
    think = {"role": "assistant", "content": "<think>\nI need 12*34.\n</think>\n\n2"}
    empty = dict(CALL, content="<think>\n\n</think>\n\nLet me compute.")
    reasoned = dict(CALL, content="<think>\nUse the calculator.\n</think>\n\nLet me compute.")
    for messages in (
        [USER, think, USER, empty, {"role": "tool", "content": RESULT}, ANSWER],
        [USER, reasoned, {"role": "tool", "content": RESULT}, think],
        [USER, think],
    ):
        for opts in ({}, {"enable_thinking": False}):
            assert (render_tool_messages("qwen3", messages, TOOL_SCHEMAS, False, **opts)
                    == reference(official["qwen3"], messages, False, **opts))
    text = render_tool_messages("qwen3", [USER, think, USER, reasoned], TOOL_SCHEMAS, False)
    assert "I need" not in text and "<think>\nUse the calculator.\n</think>\n\n" in text


def test_random_conversations_are_the_templates(official):
    """Seeded random conversations: contents with stray newlines, think blocks and text that
    looks like a tool response, zero to two calls a turn (arguments as dicts or JSON strings),
    runs of tool turns, with and without a system turn, the tools or none."""
    rng = random.Random(0)
    texts = ["", "a", "\nb\n", "<think>\nr\n</think>\n\nc", "<think></think>d", "x</think>\n\ny",
             "<tool_response>\n1\n</tool_response>", "<think>\n\n</think>\n\n", "é {json}"]
    calls = [{"name": "calculator", "arguments": ARGS},
             {"type": "function", "function": {"name": "python", "arguments": '{"code": "x"}'}}]

    def message():
        m = {"role": rng.choice(["user", "assistant", "assistant", "tool"]),
             "content": rng.choice(texts)}
        if m["role"] == "assistant" and rng.random() < 0.5:
            m["tool_calls"] = rng.choices(calls, k=rng.randint(1, 2))
        return m

    for _ in range(60):
        system = [{"role": "system", "content": rng.choice(texts)}] if rng.random() < 0.5 else []
        messages = system + [message() for _ in range(rng.randint(1, 6))]
        tools, gen = rng.choice([[], TOOL_SCHEMAS, TOOL_SCHEMAS[:1]]), rng.random() < 0.5
        for name, opts in CASES:
            assert (render_tool_messages(name, messages, tools, gen, **opts)
                    == reference(official[name], messages, gen, tools=tools or None, **opts))


@pytest.mark.parametrize("name,opts", CASES)
def test_a_tool_run_is_the_template_rendering(official, name, opts):
    """What the sampler builds: the prompt, the policy's turn (decoded up to </tool_call>), the
    observation QwenFormat writes, the final answer and the <|im_end|> that ends it (EOS).

    It is the template's rendering of the whole conversation (each assistant message's content
    = what the policy wrote in that turn, the call aside) but for the "\\n" the template writes
    after the last <|im_end|> (the run stops at EOS), and, for Qwen3 with enable_thinking=False,
    one block: the prompt opens the first assistant turn with an empty think block (and
    QwenFormat's assistant_prefix the final one with another); the template writes the final
    turn's (loop.last) but drops the empty block of the tool-calling turn (not the last, no
    reasoning), so the run's text is the template's with "<think>\\n\\n</think>\\n\\n" after the
    first "<|im_start|>assistant\\n". (Qwen3 with thinking on: the policy writes its own think
    blocks; the template keeps both, as they follow the last user query and are not empty.)"""
    empty_think = "<think>\n\n</think>\n\n"
    no_thinking = opts.get("enable_thinking") is False
    fmt = QwenFormat(assistant_prefix=empty_think if no_thinking else "")
    thinks = name == "qwen3" and not no_thinking
    first = ("<think>\nI need 12*34.\n</think>\n\n" if thinks else "") + "Let me compute."
    final = ("<think>\nIt is 408.\n</think>\n\n" if thinks else "") + ANSWER["content"]
    for system in ([SYSTEM], []):
        messages = system + [USER, dict(CALL, content=first), CONVERSATION[3],
                             dict(ANSWER, content=final)]
        prompt = render_tool_messages(name, system + [USER], TOOL_SCHEMAS, **opts)
        assert prompt == reference(official[name], system + [USER], True, **opts)
        turn = first + "\n" + fmt.render(ToolCall("calculator", ARGS))
        assert turn.endswith(fmt.stops[0]) and fmt.find(turn) == ToolCall("calculator", ARGS)
        run = prompt + turn + fmt.wrap(RESULT) + final + "<|im_end|>"
        expected = reference(official[name], messages, False)
        assert expected == render_tool_messages(name, messages, TOOL_SCHEMAS, False)
        if no_thinking:
            opened = "<|im_start|>assistant\n"
            expected = expected.replace(opened, opened + empty_think, 1)
        assert run + "\n" == expected


def test_tool_rendering_errors():
    for name in ("llama3", "llama32", "gemma", "plain"):
        with pytest.raises(ValueError, match="tools are rendered for the Qwen templates only"):
            render_tool_prompt(name, "1+1?", TOOL_SCHEMAS)
    with pytest.raises(ValueError, match="unknown prompt template 'chatml'"):
        render_tool_prompt("chatml", "1+1?", TOOL_SCHEMAS)
    with pytest.raises(TypeError, match=r"unknown options \['enable_thinking'\]"):
        render_tool_prompt("qwen_chat", "1+1?", TOOL_SCHEMAS, enable_thinking=False)
    with pytest.raises(ValueError, match="tools must be a list of function schemas"):
        render_tool_prompt("qwen3", "1+1?", TOOL_SCHEMAS[0])
    with pytest.raises(ValueError, match=r"messages\[0\]: tool_calls belong to assistant turns"):
        render_tool_messages("qwen3", [dict(USER, tool_calls=CALL["tool_calls"])], TOOL_SCHEMAS)
    with pytest.raises(ValueError, match=r"messages\[1\]: tool_calls belong .* \"arguments\""):
        render_tool_messages("qwen3", [USER, dict(CALL, tool_calls=[{"name": "calculator"}])],
                             TOOL_SCHEMAS)
    with pytest.raises(ValueError, match=r"messages\[1\] has role 'tool'; .*render_tool_messages"):
        render_messages("qwen3", [USER, {"role": "tool", "content": "408"}])


def test_a_tool_runs_prompts_list_its_tools(official, tmp_path):
    """encode_records with a tool run's schemas (build, ada.evaluate: trajectory.tool_schemas)
    encodes the template's prompt with the tools in its system turn, ada's tokenizer on the
    same files as transformers'; `plain` (the synthetic tasks) lists none; another family's
    template is refused."""
    from ada.data.encode import encode_records
    from ada.tokenizer import load_tokenizer

    official["qwen_chat"].save_pretrained(tmp_path / "qwen")
    tok = load_tokenizer(str(tmp_path / "qwen"))
    records = [{"problem": USER["content"], "answer": "408"}]
    (r,), _ = encode_records(records, tok, "qwen_chat", 4096, tools=TOOL_SCHEMAS)
    want = reference(official["qwen_chat"], [USER], True)
    assert r["prompt_tokens"] == official["qwen_chat"].encode(want, add_special_tokens=False)
    assert tok.decode(r["prompt_tokens"], skip_special=False) == want
    plain = encode_records(records, tok, "plain", 4096, tools=TOOL_SCHEMAS)[0][0]
    assert plain["prompt_tokens"] == encode_records(records, tok, "plain", 4096)[0][0]["prompt_tokens"]
    with pytest.raises(ValueError, match="Qwen templates only"):
        encode_records(records, tok, "llama3", 4096, tools=TOOL_SCHEMAS)
