"""The tools a policy may call: one registry, `TOOLS` (a new tool is one entry there).

A Tool has a name (what env.tools and a Qwen call name), a description and JSON-schema
parameters (what a Qwen `tools=` system prompt renders: `Tool.schema()`), the tag the tag
format writes it with, and `run(arguments, timeout_s) -> ToolOutput`. `Tool.call` checks the
arguments against the schema first and turns anything the tool raises into an `error`
output, so a call never raises.

  calculator  {"expression": "12*34"}: + - * / ( ) over decimal numbers, exact
              (ada.rewards.tasks.parse_expression, no eval). The result is an integer when
              integral ("408", "-3"), else a finite decimal when it has one of at most 20
              places ("3.5", "0.125"), else a fraction ("1/3"); always exact.
  python      {"code": "print(2**10)"}: the code's stdout and stderr (print what you want
              to see), run in the local sandbox (ada/envs/sandbox.py) or, with env.sandbox_url,
              on a SandboxFusion service (ada/envs/remote.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from fractions import Fraction

from ada.envs.remote import run_remote
from ada.envs.sandbox import SandboxResult, run_python
from ada.rewards.tasks import ExpressionError, parse_expression

MAX_DECIMAL_PLACES = 20


@dataclasses.dataclass(frozen=True)
class ToolOutput:
    text: str  # what the policy reads (before the env's token limit)
    error: str | None = None  # an ada.envs.base.ERROR_KINDS key, or None
    truncated: bool = False


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments: an object of string properties
    tag: str  # the tag format's marker: <tag>argument</tag>
    run: Callable[[dict, float], ToolOutput]  # (arguments, timeout_s) -> output

    @property
    def main_arg(self) -> str:
        """The argument the tag format's body fills (the first required one)."""
        return self.parameters["required"][0]

    def schema(self) -> dict:
        """The function entry of a Qwen / OpenAI `tools=` list."""
        return {"type": "function", "function": {"name": self.name, "description":
                                                 self.description, "parameters": self.parameters}}

    def call(self, arguments: dict, timeout_s: float) -> ToolOutput:
        props = self.parameters["properties"]
        extra = sorted(set(arguments) - set(props))
        missing = [k for k in self.parameters["required"] if k not in arguments]
        mistyped = [k for k, v in arguments.items() if k in props and not isinstance(v, str)]
        if extra or missing or mistyped:
            return ToolOutput(f"error: {self.name} takes {{{', '.join(map(repr, props))}}} as "
                              f"strings (unknown: {extra}, missing: {missing}, not a string: "
                              f"{mistyped})", "bad_call")
        try:
            return self.run(arguments, timeout_s)
        except Exception as e:  # noqa: BLE001 - a tool's failure is an observation, not a crash
            return ToolOutput(f"error: {type(e).__name__}: {e}", "error")


def format_number(value: Fraction) -> str:
    """An exact value as text: an integer, a finite decimal (at most MAX_DECIMAL_PLACES), or p/q."""
    if value.denominator == 1:
        return str(value.numerator)
    d, places = value.denominator, 0
    for p in (2, 5):
        k = 0
        while d % p == 0:
            d, k = d // p, k + 1
        places = max(places, k)
    if d != 1 or places > MAX_DECIMAL_PLACES:
        return f"{value.numerator}/{value.denominator}"
    digits = str(abs(value.numerator) * 10**places // value.denominator).rjust(places + 1, "0")
    return ("-" if value < 0 else "") + digits[:-places] + "." + digits[-places:]


def _calculate(arguments: dict, timeout_s: float) -> ToolOutput:
    try:
        return ToolOutput(format_number(parse_expression(arguments["expression"]).value))
    except ExpressionError as e:
        return ToolOutput(f"error: {e}", "error")


def sandbox_output(result: SandboxResult, timeout_s: float) -> ToolOutput:
    """A sandbox run (local or remote) as the policy reads it."""
    text = result.output
    if result.error == "timeout":
        text += f"\nTimeoutError: the code ran past {timeout_s:g} s and was stopped"
    elif result.truncated:
        text += "\n[output cut: the code printed too much]"
    elif not text.strip() and result.error is None:
        text = "(no output; print what you want to see)"
    return ToolOutput(text, result.error, result.truncated)


def _run_local(arguments: dict, timeout_s: float) -> ToolOutput:
    return sandbox_output(run_python(arguments["code"], timeout_s=timeout_s), timeout_s)


def _run_remote(arguments: dict, timeout_s: float, *, url: str) -> ToolOutput:
    return sandbox_output(run_remote(arguments["code"], url, timeout_s=timeout_s), timeout_s)


def _string_params(name: str, what: str) -> dict:
    return {"type": "object", "properties": {name: {"type": "string", "description": what}},
            "required": [name]}


TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("calculator", "Evaluate an arithmetic expression exactly (+ - * / and parentheses).",
         _string_params("expression", "the expression, e.g. (12+3)*4/5"), "calc", _calculate),
    Tool("python", "Run Python code and return what it prints. Only math, fractions, "
                   "itertools, collections, sympy and similar modules can be imported.",
         _string_params("code", "a Python program; print the values you need"), "python",
         _run_local),
)}


def get_tools(names, sandbox_url: str = "") -> dict[str, Tool]:
    """The registry's tools called `names`; `python` runs on the SandboxFusion service at
    `sandbox_url` when one is given. KeyError names an unknown tool."""
    tools = {n: TOOLS[n] for n in names}
    if sandbox_url and "python" in tools:
        tools["python"] = dataclasses.replace(
            tools["python"], run=functools.partial(_run_remote, url=sandbox_url))
    return tools
