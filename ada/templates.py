"""Prompt templates per model family, and prompt-length filtering.

The one place where a problem becomes prompt text. Each chat template is a plain-Python
re-implementation of the family's official Jinja chat template, restricted to the
system/user/assistant turns RL prompts use, and tested byte-for-byte against
`transformers.apply_chat_template` on those templates (tests/test_templates.py). Python instead
of Jinja keeps runtime free of transformers/jinja2 and makes prompts deterministic (Llama 3.2's
official template stamps today's date; ours takes `date_string`).

  name          format                                            instruction goes to
  qwen25_math   ChatML; system = the Qwen2.5-Math CoT instruction  system (default set)
  qwen_chat     ChatML as Qwen2/2.5-Instruct; default system is   system
                "You are Qwen, created by Alibaba Cloud. ..."
  qwen3         ChatML as Qwen3, no default system. Thinking:     user (suffix)
                enable_thinking=True (default) leaves the model
                free to open <think>; enable_thinking=False
                appends an empty "<think>\\n\\n</think>\\n\\n"
                block, as Qwen3's template does. (Qwen3-*-2507
                Instruct models never think and their template
                adds no block: use enable_thinking=True there.)
  llama3        Llama 3 instruct headers, BOS in the text         user (suffix)
  llama32       Llama 3.1/3.2 instruct: always a system block     system
                with "Cutting Knowledge Date"/"Today Date"
  gemma         Gemma 2/3 instruct turns (<start_of_turn>user /  user (suffix)
                model), BOS in the text. No system role: a
                system message is folded into the first user
                turn ("system\\n\\nuser"), as Gemma 3's template
                does (Gemma 2's raises on one)
  plain         "Question: ...\\nAnswer:" for base models and     user (suffix)
                the tiny synthetic models

A user-suffix instruction is joined as `problem + " " + instruction` (verl's data recipes).
`chat_template(name)` is the same rendering as a Jinja chat template, which an HF export
carries (ada/export.py) so that transformers' `apply_chat_template` gives ada's prompt text.
Chat renderings carry their special tokens as text (BOS included for Llama and Gemma), so they
are encoded with add_special=False; `plain` is encoded with add_special=True (the tokenizer's BOS,
if it has one). `encode_prompt` applies that rule; use it rather than calling encode directly.

Tools (Qwen templates only, for now): `render_tool_prompt` / `render_tool_messages` render as
apply_chat_template(..., tools=...) does. `chat_template` has no tool branches.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ada.tokenizer import Tokenizer

QWEN25_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
LLAMA32_DEFAULT_DATE = "26 Jul 2024"  # the fallback date in Meta's Llama 3.1/3.2 template

Message = dict[str, str]


@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    render: Callable[..., str]  # (messages, add_generation_prompt, **options) -> str
    instruction_role: str  # "system" or "user": where `instruction` goes
    default_instruction: str | None
    add_special: bool  # encode with the tokenizer's own special tokens (BOS)?
    special_tokens: tuple[str, ...]  # must each be one token of the tokenizer
    jinja: str  # the same rendering as a Jinja chat template (chat_template)

    @property
    def options(self) -> tuple[str, ...]:
        params = inspect.signature(self.render).parameters.values()
        return tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)


# -- renderers: one per official template --------------------------------------------------


def _chatml(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def _render_qwen25(messages, add_generation_prompt, *, default_system=QWEN_DEFAULT_SYSTEM):
    """Qwen2/2.5(-Math)-Instruct: a system turn always comes first (a default when absent)."""
    out = []
    if messages[0]["role"] == "system":
        out.append(_chatml("system", messages[0]["content"]))
        messages = messages[1:]
    else:
        out.append(_chatml("system", default_system))
    out += [_chatml(m["role"], m["content"]) for m in messages]
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def _render_qwen3(messages, add_generation_prompt, *, enable_thinking=True):
    """Qwen3: no default system; an empty think block when thinking is switched off."""
    last_user = max((k for k, m in enumerate(messages) if m["role"] == "user"), default=-1)
    for k, m in enumerate(messages):
        if m["role"] == "assistant" and ("<think>" in m["content"] or "</think>" in m["content"]):
            raise ValueError(
                "qwen3 template: assistant turns with <think> blocks are re-formatted by Qwen3's "
                "own template; ada renders RL prompts only (drop the reasoning from the history)"
            )
        if m["role"] == "assistant" and k > last_user:
            raise ValueError(
                "qwen3 template: an assistant turn after the last user turn (a continuation) "
                "gets a think block in Qwen3's template; ada does not render that case"
            )
    out = [_chatml(m["role"], m["content"]) for m in messages]
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if not enable_thinking:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


def _llama_turn(role: str, content: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}<|eot_id|>"


_LLAMA_GEN = "<|start_header_id|>assistant<|end_header_id|>\n\n"


def _render_llama3(messages, add_generation_prompt):
    """Llama 3 instruct: BOS, then header-wrapped turns with trimmed content."""
    out = ["<|begin_of_text|>"] + [_llama_turn(m["role"], m["content"]) for m in messages]
    if add_generation_prompt:
        out.append(_LLAMA_GEN)
    return "".join(out)


def _render_llama32(messages, add_generation_prompt, *, date_string=LLAMA32_DEFAULT_DATE):
    """Llama 3.1/3.2 instruct: the system block always exists and carries the dates."""
    system = ""
    if messages[0]["role"] == "system":
        system, messages = messages[0]["content"].strip(), messages[1:]
    out = [
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n",
        f"Cutting Knowledge Date: December 2023\nToday Date: {date_string}\n\n",
        system,
        "<|eot_id|>",
    ]
    out += [_llama_turn(m["role"], m["content"]) for m in messages]
    if add_generation_prompt:
        out.append(_LLAMA_GEN)
    return "".join(out)


def _render_gemma(messages, add_generation_prompt):
    """Gemma 2/3 instruct: BOS, then alternating user/model turns with trimmed content; a
    system message is prefixed to the first turn's text (Gemma 3's template)."""
    prefix = ""
    if messages[0]["role"] == "system":
        prefix, messages = messages[0]["content"] + "\n\n", messages[1:]
    out = ["<bos>"]
    for k, m in enumerate(messages):
        if (m["role"] == "user") != (k % 2 == 0):
            raise ValueError("gemma template: turns must alternate user/assistant/user/..., "
                             "starting with user (Gemma's template raises otherwise)")
        role = "model" if m["role"] == "assistant" else "user"
        text = (prefix if k == 0 else "") + m["content"].strip()
        out.append(f"<start_of_turn>{role}\n{text}<end_of_turn>\n")
    if add_generation_prompt:
        out.append("<start_of_turn>model\n")
    return "".join(out)


def _render_plain(messages, add_generation_prompt):
    """Base models: one question, the answer left open."""
    if len(messages) != 1 or messages[0]["role"] != "user":
        raise ValueError("plain template renders exactly one user message (no system, no history)")
    text = f"Question: {messages[0]['content']}\n"
    return text + "Answer:" if add_generation_prompt else text


# Qwen2.5-Math's own template opens with the CoT instruction when no system turn is given
_render_qwen25_math = functools.partial(_render_qwen25, default_system=QWEN25_MATH_INSTRUCTION)


# -- tool conversations: the tool branches of Qwen2.5(-Math)-Instruct's and Qwen3's templates --

_TOOLS_BLOCK = (  # closes the system turn; TOOLS: one JSON line per tool schema
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>TOOLS\n</tools>"
    "\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    '<args-json-object>}\n</tool_call>')


def _qwen_tool_call(call: dict, qwen3: bool) -> str:
    """One call as both templates write it (Qwen3 writes string arguments verbatim)."""
    args = call["arguments"]
    args = args if qwen3 and isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return '<tool_call>\n{"name": "' + call["name"] + '", "arguments": ' + args + "}\n</tool_call>"


def _qwen3_think(content: str, after_query: bool, last: bool) -> tuple[str, str]:
    """(text shown, answer) of a Qwen3 assistant turn: reasoning split off at </think> comes back
    as a think block only after the last user query, on the last turn or when not empty."""
    thought = ""
    if "</think>" in content:
        thought = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        content = content.split("</think>")[-1].lstrip("\n")
    if after_query and (last or thought):
        return "<think>\n" + thought.strip("\n") + "\n</think>\n\n" + content.lstrip("\n"), content
    return content, content


def _render_qwen_tools(messages, add_generation_prompt, tools, *, qwen3=False,
                       default_system=QWEN_DEFAULT_SYSTEM, enable_thinking=True):
    """Qwen2/2.5(-Math)-Instruct (a default system turn) or Qwen3 (qwen3=True) with tools: calls
    follow their turn's text a line each; consecutive `tool` turns share one user turn."""
    system = None if qwen3 else default_system
    if messages[0]["role"] == "system":
        system, messages = messages[0]["content"], messages[1:]
    if tools:
        listed = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        system = ("" if system is None else system + "\n\n") + _TOOLS_BLOCK.replace("TOOLS", listed)
    out = [] if system is None else [_chatml("system", system)]
    queries = [k for k, m in enumerate(messages) if m["role"] == "user" and not (
        m["content"].startswith("<tool_response>") and m["content"].endswith("</tool_response>"))]
    query = queries[-1] if queries else len(messages) - 1  # Qwen3's last_query_index
    for k, m in enumerate(messages):
        role, content, last = m["role"], m["content"], k + 1 == len(messages)
        if role == "tool":
            start = "" if k and messages[k - 1]["role"] == "tool" else "<|im_start|>user"
            end = "" if not last and messages[k + 1]["role"] == "tool" else "<|im_end|>\n"
            out.append(f"{start}\n<tool_response>\n{content}\n</tool_response>{end}")
        elif role == "assistant":
            shown, content = _qwen3_think(content, k > query, last) if qwen3 else (content,) * 2
            calls = [_qwen_tool_call(c, qwen3) for c in m.get("tool_calls", ())]
            out.append("<|im_start|>assistant\n" + shown + ("\n" if content and calls else "")
                       + "\n".join(calls) + "<|im_end|>\n")
        else:
            out.append(_chatml(role, content))
    gen = "<|im_start|>assistant\n" + ("" if enable_thinking else "<think>\n\n</think>\n\n")
    return "".join(out) + (gen if add_generation_prompt else "")


_TOOL_RENDERERS = {
    "qwen_chat": _render_qwen_tools,
    "qwen25_math": functools.partial(_render_qwen_tools, default_system=QWEN25_MATH_INSTRUCTION),
    "qwen3": functools.partial(_render_qwen_tools, qwen3=True),
}


# -- the same renderings as Jinja chat templates (tests/test_templates.py: equal text) ------


def _lit(text: str) -> str:
    """A Jinja string literal for `text` (Jinja unescapes literals like Python's)."""
    return json.dumps(text, ensure_ascii=False)


def _raise(message: str) -> str:
    return "{{- raise_exception(" + _lit(message) + ") }}"


# _check_messages: the roles ada renders, a system turn only first
_JINJA_CHECK = (
    "{%- for m in messages %}{%- if m['role'] not in ['system', 'user', 'assistant'] %}"
    + _raise("templates render system, user and assistant turns") + "{%- endif %}"
    "{%- if m['role'] == 'system' and not loop.first %}"
    + _raise("a system message may only come first") + "{%- endif %}{%- endfor %}"
)
_JINJA_CHATML_TURNS = ("{%- for m in loop_messages %}{{- '<|im_start|>' + m['role'] + '\\n' + "
                       "m['content'] + '<|im_end|>\\n' }}{%- endfor %}")


def _jinja_qwen25(default_system: str) -> str:
    return (
        _JINJA_CHECK + "{%- if default_system is not defined %}{%- set default_system = "
        + _lit(default_system) + " %}{%- endif %}"
        "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
        "{%- set loop_messages = messages[1:] %}{%- else %}{%- set system = default_system %}"
        "{%- set loop_messages = messages %}{%- endif %}"
        "{{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}" + _JINJA_CHATML_TURNS
        + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


_JINJA_QWEN3 = (
    _JINJA_CHECK + "{%- set ns = namespace(last_user=-1) %}{%- for m in messages %}"
    "{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}{%- for m in messages %}{%- if m['role'] == 'assistant' and ('<think>' in m['content'] or '</think>' in "
    "m['content']) %}" + _raise("qwen3 template: ada renders RL prompts only (drop the "
                                "reasoning from the history)") + "{%- endif %}"
    "{%- if m['role'] == 'assistant' and loop.index0 > ns.last_user %}"
    + _raise("qwen3 template: an assistant turn after the last user turn is not rendered")
    + "{%- endif %}{%- endfor %}{%- set loop_messages = messages %}" + _JINJA_CHATML_TURNS
    + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
_JINJA_LLAMA_TURNS = (
    "{%- for m in loop_messages %}{{- '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '" + _LLAMA_GEN.replace("\n", "\\n") + "' }}{%- endif %}"
)
_JINJA_LLAMA3 = (_JINJA_CHECK + "{{- '<|begin_of_text|>' }}{%- set loop_messages = messages %}"
                 + _JINJA_LLAMA_TURNS)
_JINJA_LLAMA32 = (
    _JINJA_CHECK + "{%- if date_string is not defined %}{%- set date_string = "
    + _lit(LLAMA32_DEFAULT_DATE) + " %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set system = '' %}"
    "{%- set loop_messages = messages %}{%- endif %}"
    "{{- '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}"
    "{{- system + '<|eot_id|>' }}" + _JINJA_LLAMA_TURNS
)
_JINJA_GEMMA = (
    _JINJA_CHECK + "{%- if messages[0]['role'] == 'system' %}"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set prefix = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- '<bos>' }}{%- for m in loop_messages %}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    + _raise("gemma template: turns must alternate user/assistant/user/..., starting with user")
    + "{%- endif %}{%- set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + m['content'] | trim"
    " + '<end_of_turn>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
# BOS_TEXT: what the tokenizer adds in front when encoding with add_special (chat_template)
_JINJA_PLAIN = (
    _JINJA_CHECK + "{%- if messages | length != 1 or messages[0]['role'] != 'user' %}"
    + _raise("plain template renders exactly one user message (no system, no history)")
    + "{%- endif %}{{- BOS_TEXT + 'Question: ' + messages[0]['content'] + '\\n' }}"
    "{%- if add_generation_prompt %}{{- 'Answer:' }}{%- endif %}"
)

_CHATML = ("<|im_start|>", "<|im_end|>")
_LLAMA = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
_GEMMA = ("<bos>", "<start_of_turn>", "<end_of_turn>")

TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template("qwen25_math", _render_qwen25_math, "system", QWEN25_MATH_INSTRUCTION, False,
                 _CHATML, _jinja_qwen25(QWEN25_MATH_INSTRUCTION)),
        Template("qwen_chat", _render_qwen25, "system", None, False, _CHATML,
                 _jinja_qwen25(QWEN_DEFAULT_SYSTEM)),
        Template("qwen3", _render_qwen3, "user", None, False, _CHATML, _JINJA_QWEN3),
        Template("llama3", _render_llama3, "user", None, False, _LLAMA, _JINJA_LLAMA3),
        Template("llama32", _render_llama32, "system", None, False, _LLAMA, _JINJA_LLAMA32),
        Template("gemma", _render_gemma, "user", None, False, _GEMMA, _JINJA_GEMMA),
        Template("plain", _render_plain, "user", None, True, (), _JINJA_PLAIN),
    )
}


def get_template(name: str) -> Template:
    if name not in TEMPLATES:
        raise ValueError(f"unknown prompt template {name!r}; known templates: {sorted(TEMPLATES)}")
    return TEMPLATES[name]


def chat_template(template: str, bos_text: str = "") -> str:
    """The Jinja chat template that renders as `render_messages(template, ...)` does, its
    options (enable_thinking, date_string, default_system) as template variables.
    `bos_text`: the special tokens the tokenizer puts in front under add_special (its BOS),
    which templates encoded with add_special (plain) then carry in the text, so that
    apply_chat_template's ids (encoded without special tokens) are encode_prompt's."""
    t = get_template(template)
    return t.jinja.replace("BOS_TEXT", _lit(bos_text if t.add_special else ""))


def _check_messages(messages: Sequence[Message], tool_turns: bool = False) -> list[Message]:
    if not messages:
        raise ValueError("messages is empty; a prompt needs at least one user message")
    roles = ("system", "user", "assistant", "tool")[: 4 if tool_turns else 3]
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{k}] must be a dict with a str 'content', got {m!r:.120}")
        if m.get("role") not in roles:
            raise ValueError(f"messages[{k}] has role {m.get('role')!r}; templates render "
                             f"{', '.join(roles)} turns"
                             + ("" if tool_turns else " (tool turns: render_tool_messages)"))
        if m["role"] == "system" and k > 0:
            raise ValueError(f"messages[{k}]: a system message may only come first")
        out.append({"role": m["role"], "content": m["content"]})
        if tool_turns and m.get("tool_calls"):
            calls = [c.get("function", c) if isinstance(c, dict) else c for c in m["tool_calls"]]
            if m["role"] != "assistant" or not all(isinstance(c, dict) and isinstance(c.get(
                    "name"), str) and isinstance(c.get("arguments"), dict | str) for c in calls):
                raise ValueError(f"messages[{k}]: tool_calls belong to assistant turns, each "
                                 '{"name": str, "arguments": dict} (or under "function")')
            out[-1]["tool_calls"] = calls
    return out


def _with_options(template: str, options: dict) -> Template:
    t = get_template(template)
    if unknown := set(options) - set(t.options):
        raise TypeError(f"template {template!r} got unknown options {sorted(unknown)}; "
                        f"it accepts {list(t.options) or 'none'}")
    return t


def render_messages(template: str, messages: Sequence[Message], add_generation_prompt: bool = True,
                    **options: Any) -> str:
    """Chat messages -> prompt text, as the family's official chat template would render it."""
    t = _with_options(template, options)
    return t.render(_check_messages(messages), add_generation_prompt, **options)


def prompt_messages(template: str, problem: str, instruction: str | None = None) -> list[Message]:
    """The messages of a one-question prompt: `instruction` (or the template's default) goes
    into the system turn or after the problem, as the template says."""
    t = get_template(template)
    if not isinstance(problem, str):
        raise TypeError(f"problem must be a str, got {type(problem).__name__}")
    instruction = t.default_instruction if instruction is None else instruction
    if t.instruction_role == "system":
        system = [] if instruction is None else [{"role": "system", "content": instruction}]
        return system + [{"role": "user", "content": problem}]
    content = problem if not instruction else f"{problem} {instruction}"
    return [{"role": "user", "content": content}]


def render_prompt(template: str, problem: str, instruction: str | None = None,
                  **options: Any) -> str:
    """One problem -> the prompt text the policy continues (generation prompt included)."""
    return render_messages(template, prompt_messages(template, problem, instruction), **options)


def render_tool_messages(template: str, messages: Sequence[dict], tools: Sequence[dict],
                         add_generation_prompt: bool = True, **options: Any) -> str:
    """A conversation with tools -> text, as the official chat template renders it with
    `tools=tools` (Qwen templates only, for now). messages: system (first only), user, assistant
    (`tool_calls`: [{"type": "function", "function": {"name": ..., "arguments": {...}}}] or the
    bare {"name", "arguments"}), tool (content: the result). tools: function schemas as plain
    dicts (ada.envs.tools' `Tool.schema()`), listed in order; none: no tool block. A tool run's
    whole text is this rendering (tests/test_tool_templates.py says where not)."""
    if template not in _TOOL_RENDERERS:
        raise ValueError(f"template {get_template(template).name!r}: tools are rendered for the "
                         f"Qwen templates only ({', '.join(_TOOL_RENDERERS)}), for now")
    _with_options(template, options)
    if not isinstance(tools, list | tuple) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("tools must be a list of function schemas (dicts, as Tool.schema() gives)")
    return _TOOL_RENDERERS[template](_check_messages(messages, tool_turns=True),
                                     add_generation_prompt, list(tools), **options)


def render_tool_prompt(template: str, problem: str, tools: Sequence[dict],
                       instruction: str | None = None, **options: Any) -> str:
    """One problem -> a tool run's prompt: `render_prompt`'s text with the tools in the system
    turn. A run passes `[TOOLS[name].schema() for name in env.tools]` (its env's tools, in
    order), encodes it with add_special=False and stops policy turns at </tool_call>."""
    return render_tool_messages(template, prompt_messages(template, problem, instruction), tools,
                                **options)


def check_template_tokens(tokenizer: Tokenizer, template: str) -> None:
    """A chat template's markers must each encode to one token, or the model sees garbage."""
    for s in get_template(template).special_tokens:
        ids = tokenizer.encode(s)
        if len(ids) != 1:
            raise ValueError(f"template {template!r} needs {s!r} as a single token, but tokenizer "
                             f"{tokenizer.path} splits it into {len(ids)} pieces; use the "
                             "template of the model's family (or 'plain' for base and "
                             "synthetic models)")


def encode_prompt(tokenizer: Tokenizer, template: str, problem: str, instruction: str | None = None,
                  tools: Sequence[dict] = (), **options: Any) -> list[int]:
    """Render and encode one prompt, adding BOS only where the rendering does not carry it.
    `tools` (a tool run's schemas) go in a chat template's system turn; `plain` renders none
    (the tiny synthetic models learn their call format from the warm start)."""
    text = (render_tool_prompt(template, problem, tools, instruction, **options)
            if tools and template != "plain" else
            render_prompt(template, problem, instruction, **options))
    return tokenizer.encode(text, add_special=get_template(template).add_special)


def filter_by_length(records: Iterable[dict], tokenizer: Tokenizer, template: str,
                     max_prompt_tokens: int, instruction: str | None = None,
                     **options: Any) -> tuple[list[dict], int]:
    """Keep the records whose rendered prompt has at most `max_prompt_tokens` tokens.

    Returns (kept records in their original order, number dropped). Prompts that do not fit
    would be truncated or crash the fixed-shape prefill, so they are dropped up front.
    """
    if not isinstance(max_prompt_tokens, int) or max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be a positive int, got {max_prompt_tokens!r}")
    records = list(records)
    check_template_tokens(tokenizer, template)
    texts = []
    for k, r in enumerate(records):
        if not isinstance(r, dict) or not isinstance(r.get("problem"), str):
            raise ValueError(f"record {k} needs a str 'problem' field, got {r!r:.120}")
        texts.append(render_prompt(template, r["problem"], instruction, **options))
    add_special = get_template(template).add_special
    lengths = [len(ids) for ids in tokenizer.encode_batch(texts, add_special=add_special)]
    kept = [r for r, n in zip(records, lengths, strict=True) if n <= max_prompt_tokens]
    return kept, len(records) - len(kept)
