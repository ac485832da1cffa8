"""Tool-call formats: where a policy's turn holds a call, and how the tool's answer is written
back into the context. Two formats behind one interface (`FORMATS`, env.tool_format):

  qwen  Qwen2.5 / Qwen3's own: the policy writes
            <tool_call>\\n{"name": "calculator", "arguments": {"expression": "12*34"}}\\n</tool_call>
        and the observation is exactly what the family's chat template renders after such an
        assistant turn for one `tool` message and the next assistant turn's start:
            <|im_end|>\\n<|im_start|>user\\n<tool_response>\\n{content}\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n
        (the template closes the assistant turn, opens a user turn holding the tool response,
        and opens the next assistant turn; tests/test_envs.py renders the official template's
        tool branches and compares). Qwen3 with enable_thinking=False adds its empty think
        block after that (`QwenFormat(assistant_prefix="<think>\\n\\n</think>\\n\\n")`).
  tags  short markers for the tiny embedded model: the tool's tag around its one argument,
        `<calc>12*34</calc>` or `<python>print(2**10)</python>`, answered by `<out>408</out>`
        (appended right after the policy's closing tag).

Each format has: `stops`, the strings that end a policy turn at a call (the sampler stops
there); `find(text)`, the turn's first complete call as a ToolCall, a BadCall (markers
around something unreadable) or None (no call: the policy answered); `wrap(content)`, the
observation text; `render(call)`, the text a policy writes for a call (the inverse of find).
One call per turn: the sampler stops at the first call's end marker.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclasses.dataclass(frozen=True)
class BadCall:
    """A call's markers around something that is not a call; `message` is what the policy
    reads back."""

    message: str


class QwenFormat:
    name = "qwen"
    open, close = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

    def __init__(self, assistant_prefix: str = ""):
        self.assistant_prefix = assistant_prefix  # after the next turn's <|im_start|>assistant\n
        self.stops = (self.close,)

    def find(self, text: str) -> ToolCall | BadCall | None:
        m = self._CALL.search(text)
        if m is None:
            return None
        try:
            call = json.loads(m.group(1))
        except json.JSONDecodeError as e:
            return BadCall(f"the tool call is not valid JSON ({e.msg} at character {e.pos}); "
                           'write {"name": ..., "arguments": {...}}')
        args = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not (isinstance(call, dict) and isinstance(call.get("name"), str)
                and isinstance(args, dict)):
            return BadCall('the tool call must be {"name": "<tool>", "arguments": {...}}')
        return ToolCall(call["name"], args)

    def render(self, call: ToolCall) -> str:
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{self.open}\n{body}\n{self.close}"

    def wrap(self, content: str) -> str:
        return ("<|im_end|>\n<|im_start|>user\n<tool_response>\n" + content
                + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n" + self.assistant_prefix)


class TagFormat:
    name = "tags"
    out = ("<out>", "</out>")

    def __init__(self, tags: Mapping[str, tuple[str, str]]):
        """tags: tag -> (tool name, the argument the tag's body fills), e.g.
        {"calc": ("calculator", "expression")}."""
        self.tags = dict(tags)
        self.stops = tuple(f"</{t}>" for t in self.tags)
        self._by_tool = {tool: (tag, arg) for tag, (tool, arg) in self.tags.items()}
        names = "|".join(re.escape(t) for t in self.tags) or r"(?!)"
        self._call = re.compile(rf"<({names})>(.*?)</\1>", re.S)

    def find(self, text: str) -> ToolCall | BadCall | None:
        m = self._call.search(text)
        if m is None:
            return None
        tag, body = m.groups()
        if not body.strip():
            return BadCall(f"<{tag}></{tag}> is empty; put the input between the tags")
        tool, arg = self.tags[tag]
        return ToolCall(tool, {arg: body})

    def render(self, call: ToolCall) -> str:
        tag, arg = self._by_tool[call.name]
        return f"<{tag}>{call.arguments[arg]}</{tag}>"

    def wrap(self, content: str) -> str:
        return f"{self.out[0]}{content}{self.out[1]}"


FORMATS = ("qwen", "tags")


def make_format(name: str, tags: Mapping[str, tuple[str, str]]) -> QwenFormat | TagFormat:
    """The format called `name` (one of FORMATS); `tags` for the tag format (TagFormat)."""
    if name == "qwen":
        return QwenFormat()
    if name == "tags":
        return TagFormat(tags)
    raise ValueError(f"unknown tool format {name!r}; choose one of {FORMATS}")
