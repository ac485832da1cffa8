"""Reinforce-Ada paper setup for Qwen2.5-Math-7B (512 prompts/step, n=4, M=8, N=4, lr 1e-6).

Select the method with the arg: configs/qwen25_math_7b.py:grpo | :ada_pos | :ada_balance
(default ada_balance). Put the Hugging Face checkpoint at models/Qwen2.5-Math-7B or pass
--config.model.path=DIR.

Laid out for a v5e-16 slice (v5e:4x4: 4 hosts of 4 chips, 16 GiB HBM each) by the planner:
    python -m ada.plan --config configs/qwen25_math_7b.py --model qwen2.5-math-7b --topology v5e:4x4
Float32 weights and Adam state sharded 16 ways (fsdp), 16 micro-batches with remat; each
host's sampler splits heads over its 4 chips (bf16 weights, 80 slots). The README's "Will it
fit?" table has the planned figures.
"""

from configs import common


def get_config(arg=None):
    c = common.paper("models/Qwen2.5-Math-7B", family="qwen2", template="qwen25_math",
                     method=arg or "ada_balance")
    c.mesh.fsdp = 16
    c.train.micro_batches = 16
    c.sampling.mesh = (1, 4)
    c.sampling.num_slots = 80  # per host
    return c
