"""Reinforce-Ada paper setup for Qwen3-4B-Instruct-2507 (512 prompts/step, n=4, M=8, N=4, lr 1e-6).

Select the method with the arg: configs/qwen3_4b.py:grpo | :ada_pos | :ada_balance
(default ada_balance). Put the Hugging Face checkpoint at models/Qwen3-4B-Instruct-2507 or pass
--config.model.path=DIR.
"""

from configs import common


def get_config(arg=None):
    c = common.paper("models/Qwen3-4B-Instruct-2507", family="qwen3", template="qwen3",
                     method=arg or "ada_balance")
    return c
