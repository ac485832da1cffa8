"""Reinforce-Ada paper setup for Qwen2.5-Math-1.5B (512 prompts/step, n=4, M=8, N=4, lr 1e-6).

Select the method with the arg: configs/qwen25_math_1p5b.py:grpo | :ada_pos | :ada_balance
(default ada_balance). Put the Hugging Face checkpoint at models/Qwen2.5-Math-1.5B or pass
--config.model.path=DIR.

Laid out for a v5e-4 slice (v5e:2x2: one host of 4 chips, 16 GiB HBM each) by the planner:
    python -m ada.plan --config configs/qwen25_math_1p5b.py --model qwen2.5-math-1.5b --topology v5e:2x2
Float32 weights and Adam state sharded 4 ways (fsdp), 32 micro-batches with remat; the
sampler splits slots over 2 and heads over 2 chips (bf16 weights, 160 slots). The README's
"Will it fit?" table has the planned figures.
"""

from configs import common


def get_config(arg=None):
    c = common.paper("models/Qwen2.5-Math-1.5B", family="qwen2", template="qwen25_math",
                     method=arg or "ada_balance")
    c.mesh.fsdp = 4
    c.train.micro_batches = 32
    c.sampling.mesh = (2, 2)
    c.sampling.num_slots = 160  # per host
    return c
