"""Environments: multi-turn episodes in which the policy calls tools before it answers.

  base.py      the contract: Env.step(policy_text) -> Turn, EpisodeStats, ERROR_KINDS
  tool_env.py  ToolEnv (tools until the policy answers) and EnvConfig (the env.* knobs)
  parsers.py   the call formats: Qwen's <tool_call> JSON, and short tags for the tiny model
  tools.py     the tool registry (TOOLS): calculator, python
  sandbox.py   the python tool's local sandbox (a limited subprocess)
  remote.py    the python tool on a SandboxFusion service
  tokens.py    a format's markers as tokens: markers(tool_format), turn_end_ids(tokenizer, stops)

A foundation package: it imports only errors-, rewards- and tokenizer-level modules, never
the sampler or the training loop (which will drive an Env). With env.tools = '' (the
default) nothing here runs: a response is one turn, as before.
"""

from ada.envs.base import END_REASONS, ERROR_KINDS, Env, EpisodeStats, Turn
from ada.envs.parsers import FORMATS, BadCall, QwenFormat, TagFormat, ToolCall, make_format
from ada.envs.tool_env import EnvConfig, ToolEnv
from ada.envs.tools import TOOLS, Tool, ToolOutput, get_tools

__all__ = ["END_REASONS", "ERROR_KINDS", "FORMATS", "TOOLS", "BadCall", "Env", "EnvConfig",
           "EpisodeStats", "QwenFormat", "TagFormat", "Tool", "ToolCall", "ToolEnv",
           "ToolOutput", "Turn", "get_tools", "make_format"]
