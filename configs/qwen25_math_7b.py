"""Reinforce-Ada paper setup for Qwen2.5-Math-7B (512 prompts/step, n=4, M=8, N=4, lr 1e-6).

Select the method with the arg: configs/qwen25_math_7b.py:grpo | :ada_pos | :ada_balance
(default ada_balance). Put the Hugging Face checkpoint at models/Qwen2.5-Math-7B or pass
--config.model.path=DIR.
"""

from configs import common


def get_config(arg=None):
    c = common.paper("models/Qwen2.5-Math-7B", family="qwen2", template="qwen25_math",
                     method=arg or "ada_balance")
    return c
