"""Reinforce-Ada paper setup for Llama-3.2-3B-Instruct (512 prompts/step, n=4, M=8, N=4, lr 1e-6).

Select the method with the arg: configs/llama32_3b.py:grpo | :ada_pos | :ada_balance
(default ada_balance). Put the Hugging Face checkpoint at models/Llama-3.2-3B-Instruct or pass
--config.model.path=DIR.
"""

from configs import common


def get_config(arg=None):
    c = common.paper("models/Llama-3.2-3B-Instruct", family="llama", template="llama32",
                     method=arg or "ada_balance")
    return c
