"""Environments (ada/envs): the call formats both ways, the Qwen observation against the
official chat template, the calculator's exact results, and ToolEnv's episodes: every bad
call an observation and a count (never an exception), output cut to the token limit, the
turn and token caps, the reward on the final turn; the env.* knobs' one-line errors."""

import dataclasses
import json

import jinja2.sandbox
import pytest
from chat_templates import QWEN25_INSTRUCT_JINJA

import ada.config as C
from ada.envs import ERROR_KINDS, TOOLS, BadCall, EnvConfig, QwenFormat, ToolCall, ToolEnv
from ada.envs.parsers import make_format
from ada.envs.tools import ToolOutput
from ada.knobs import base_config
from ada.rewards.tasks import arithmetic_reward
from ada.templates import render_messages

TAGS = {t.tag: (t.name, t.main_arg) for t in TOOLS.values()}
RECORD = {"problem": "What is 12*34?", "answer": "408"}


class CharTokenizer:
    """A token per character: what ToolEnv needs of a tokenizer (encode / decode)."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


def env(fmt="tags", tools="calculator,python", reward=arithmetic_reward, tokenizer=None,
        **knobs):
    return ToolEnv(RECORD, reward, EnvConfig(tools=tools, tool_format=fmt, **knobs),
                   tokenizer=tokenizer)


def call(e, name, arg):
    """The text a policy writes to call `name` with its main argument in e's format."""
    return e.format.render(ToolCall(name, {TOOLS[name].main_arg: arg}))


# ----------------------------------------------------------------------------- formats


@pytest.mark.parametrize("fmt", ["qwen", "tags"])
@pytest.mark.parametrize("name, arg", [("calculator", "12*34"),
                                       ("python", "s = 'é<tool_call>'\nprint(s[:1])")])
def test_a_rendered_call_is_found_again(fmt, name, arg):
    f = make_format(fmt, TAGS)
    text = "Let me compute.\n" + f.render(ToolCall(name, {TOOLS[name].main_arg: arg}))
    assert text.endswith(f.stops) and f.find(text) == ToolCall(name, {TOOLS[name].main_arg: arg})
    assert f.find("The answer is \\boxed{408}.") is None


def test_qwen_calls_read_loosely_and_fail_with_a_message():
    f = QwenFormat()
    assert f.find('<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"1\\"}"}'
                  "</tool_call>") == ToolCall("python", {"code": "1"})  # arguments as a string
    assert f.find('<tool_call>{"name": "x"}</tool_call>') == ToolCall("x", {})
    assert f.find('<tool_call>\n{"name": "x", "arguments": {"a": 1}\n') is None  # no end: EOS
    bad = f.find("<tool_call>\n{'name': 'calculator'}\n</tool_call>")
    assert isinstance(bad, BadCall) and "not valid JSON" in bad.message
    assert isinstance(f.find('<tool_call>["calculator"]</tool_call>'), BadCall)


def test_tags_are_short_and_the_first_call_counts():
    f = make_format("tags", TAGS)
    assert f.stops == ("</calc>", "</python>")
    assert f.find("<calc>1+1</calc> then <python>print(3)</python>") == ToolCall(
        "calculator", {"expression": "1+1"})
    assert isinstance(f.find("<calc>  </calc>"), BadCall) and f.find("<calc>1+1") is None
    assert f.wrap("2") == "<out>2</out>"


def test_the_qwen_observation_is_what_the_chat_template_renders():
    """prompt + policy turn + observation + final turn == the official template on the same
    conversation (as transformers compiles it: trim_blocks, lstrip_blocks, unsorted tojson)."""
    jinja = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    jinja.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    template = jinja.from_string(QWEN25_INSTRUCT_JINJA)
    args = {"expression": "12*34"}
    messages = [{"role": "user", "content": RECORD["problem"]},
                {"role": "assistant", "content": "Let me compute.",
                 "tool_calls": [{"type": "function",
                                 "function": {"name": "calculator", "arguments": args}}]},
                {"role": "tool", "content": "408"},
                {"role": "assistant", "content": "It is \\boxed{408}."}]
    e = env("qwen")
    prompt = render_messages("qwen_chat", messages[:1])
    assert template.render(messages=messages[:1], add_generation_prompt=True) == prompt
    first = "Let me compute.\n" + e.format.render(ToolCall("calculator", args))
    turn = e.step(first)
    assert turn.observation == e.format.wrap("408")
    final = e.step("It is \\boxed{408}.")
    assert final.done and final.reward == 1.0
    assert (prompt + first + turn.observation + "It is \\boxed{408}." + "<|im_end|>\n"
            == template.render(messages=messages, add_generation_prompt=False))


# ----------------------------------------------------------------------------- tools


@pytest.mark.parametrize("expression, result", [
    ("12*34", "408"), ("7/2", "3.5"), ("-1/8", "-0.125"), ("1/3", "1/3"), ("(2+3)*4/5", "4"),
    ("0.1+0.2", "0.3"), ("10/4*2", "5"), ("1/1024", "0.0009765625"), ("2/3*3/7", "2/7"),
])
def test_the_calculator_is_exact(expression, result):
    assert TOOLS["calculator"].call({"expression": expression}, 1.0) == ToolOutput(result)


def test_tool_schemas_render_for_a_tools_prompt():
    schema = TOOLS["calculator"].schema()
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    json.dumps([t.schema() for t in TOOLS.values()])  # JSON all through


# ----------------------------------------------------------------------------- episodes


def test_an_episode_calls_a_tool_then_answers_and_is_scored():
    e = env()
    turn = e.step("12*34 is " + call(e, "calculator", "12*34"))
    assert turn == dataclasses.replace(turn, observation="<out>408</out>", done=False,
                                       reward=None, tool="calculator", error=None)
    assert turn.tool_seconds >= 0 and e.stops == ("</calc>", "</python>")
    last = e.step(" so \\boxed{408}")
    assert last.done and last.reward == 1.0 and last.end == "answer" and last.observation == ""
    assert (e.stats.turns, e.stats.tool_calls, e.stats.errors, e.stats.end) == (2, 1, {}, "answer")
    assert e.transcript == [e.policy_turns[0], "<out>408</out>", " so \\boxed{408}"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        e.step("more")


def test_the_reward_is_the_policys_text_only_and_never_raises():
    e = env()
    e.step(call(e, "calculator", "400+8"))  # 408 is in the observation, not in the answer
    assert e.step("I do not know.").reward == 0.0
    assert env(reward=None).step("\\boxed{408}").reward is None  # scored by the caller

    def broken(record, text):
        raise RuntimeError("a user reward")
    assert env(reward=broken).step("\\boxed{408}").reward == 0.0


BAD_CALLS = [  # (format, the policy's turn, kind, what the observation says)
    ("qwen", '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+"\n</tool_call>',
     "bad_call", "not valid JSON"),
    ("qwen", '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>',
     "unknown_tool", "no tool 'search'; the tools are calculator, python"),
    ("qwen", '<tool_call>\n{"name": "calculator", "arguments": {"expr": "1"}}\n</tool_call>',
     "bad_call", "missing: ['expression']"),
    ("tags", "<calc></calc>", "bad_call", "is empty"),
    ("tags", "<calc>2**3</calc>", "error", "unexpected"),
    ("tags", "<python>1/0</python>", "error", "ZeroDivisionError"),
    ("tags", "<python>while True:\n    pass</python>", "timeout", "ran past 0.3 s"),
    ("tags", "<python>import os\nos.fork()</python>", "forbidden", "import os"),
    ("tags", "<python>import collections\ncollections._sys.modules['os'].fork()</python>",
     "forbidden", "os.fork is not allowed"),
    ("tags", "<python>open('/tmp/ada_env_escape.txt', 'w')</python>", "forbidden",
     "outside the working folder"),
]


@pytest.mark.parametrize("fmt, text, kind, needle", BAD_CALLS)
def test_a_bad_call_is_an_observation_and_a_count(fmt, text, kind, needle):
    e = env(fmt, tool_timeout_s=0.3)
    turn = e.step(text)
    assert not turn.done and turn.error == kind and kind in ERROR_KINDS
    assert needle in turn.observation, turn.observation
    assert e.stats.errors == {kind: 1} and e.stats.tool_calls == 1
    ok = e.step(call(e, "calculator", "12*34"))  # the episode goes on
    assert ok.error is None and "408" in ok.observation
    assert e.step("\\boxed{408}").reward == 1.0


@pytest.mark.parametrize("tokenizer", [None, CharTokenizer()])
def test_output_is_cut_to_max_tool_output_tokens(tokenizer):
    e = env(max_tool_output_tokens=10, tokenizer=tokenizer)
    turn = e.step("<python>print('x' * 10_000_000)</python>")  # also cut in the sandbox
    per = 1 if tokenizer else 4  # without a tokenizer a token is 4 characters
    inner = turn.observation[len("<out>"):-len("</out>")]
    assert inner == "x" * 10 * per + "\n[output cut to the first 10 tokens]"
    assert turn.truncated and turn.error is None and e.stats.truncated == 1
    assert not e.step(call(e, "calculator", "1+1")).truncated and e.stats.truncated == 1


def test_max_turns_ends_the_episode_without_running_the_last_call():
    e = env(max_turns=2)
    assert not e.step(call(e, "calculator", "1+1")).done
    last = e.step(call(e, "calculator", "2+2"))
    assert last.done and last.end == "max_turns" and last.tool is None
    assert last.reward == 0.0 and e.stats.tool_calls == 1 and e.stats.turns == 2


def test_max_total_tokens_ends_the_episode_before_the_context_overflows():
    tok = CharTokenizer()
    e = ToolEnv(RECORD, arithmetic_reward, EnvConfig(tools="calculator", tool_format="tags",
                                                     max_total_tokens=30),
                tokenizer=tok, prompt_tokens=10)
    turn = e.step("<calc>1+1</calc>")  # 10 + 16 tokens, the observation's 12 would make 38
    assert turn.done and turn.end == "max_total_tokens" and turn.observation == ""
    assert turn.tool == "calculator" and e.stats.total_tokens == 26 and e.stats.tool_calls == 1
    e = ToolEnv(RECORD, None, EnvConfig(tools="calculator", tool_format="tags",
                                        max_total_tokens=40), tokenizer=tok, prompt_tokens=10)
    assert not e.step("<calc>1+1</calc>", policy_tokens=5).done  # the sampler's count
    assert e.stats.total_tokens == 10 + 5 + len("<out>2</out>")


# ----------------------------------------------------------------------------- the knobs


def test_the_env_section_is_envconfig_field_for_field():
    section = base_config().env
    assert dict(section) == dataclasses.asdict(EnvConfig())  # one default per knob
    C.validate(base_config())  # no tools: today's runs


@pytest.mark.parametrize("key, value, needle", [
    ("env.max_turns", "0", r"env.max_turns=0 must be an integer >= 1"),
    ("env.tools", "calculator,search", r"env.tools='calculator,search' names unknown tool "
                                       r"'search'; list some of calculator, python"),
    ("env.tool_format", "xml", r"env.tool_format='xml' is not one of \('qwen', 'tags'\)"),
    ("env.max_tool_output_tokens", "-1", "env.max_tool_output_tokens=-1 must be >= 1"),
    ("env.max_total_tokens", "-5", r"env.max_total_tokens=-5 must be >= 0 \(0 = no cap"),
    ("env.tool_timeout_s", "0", "env.tool_timeout_s=0.0 must be > 0 seconds"),
    ("env.sandbox_url", "localhost:8080", "env.sandbox_url='localhost:8080' must be an http"),
])
def test_a_bad_env_knob_is_one_line_naming_it(key, value, needle):
    cfg = C.build_config(C.DEFAULT_CONFIG, [(key, value)])
    with pytest.raises(C.ConfigError, match=needle) as e:
        C.validate(cfg)
    assert "\n" not in str(e.value) and "invalid" not in str(e.value)


def test_a_resume_may_move_the_sandbox_but_not_change_the_episode():
    from ada.knobs import resume_changes

    saved, new = base_config(), base_config()
    new.env.sandbox_url, new.env.max_turns = "http://sandbox:8080", 2
    refused, allowed = resume_changes(saved, new)
    assert [k for k, _, _ in allowed] == ["env.sandbox_url"]
    assert [k for k, _, _ in refused] == ["env.max_turns"]
