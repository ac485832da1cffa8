"""Reinforce-Ada paper setup for Qwen3-4B-Instruct-2507 (512 prompts/step, n=4, M=8, N=4, lr 1e-6).

Select the method with the arg: configs/qwen3_4b.py:grpo | :ada_pos | :ada_balance
(default ada_balance). Put the Hugging Face checkpoint at models/Qwen3-4B-Instruct-2507 or pass
--config.model.path=DIR.

Laid out for a v5e-8 slice (v5e:2x4: one host of 8 chips, 16 GiB HBM each) by the planner:
    python -m ada.plan --config configs/qwen3_4b.py --model qwen3-4b-instruct-2507 --topology v5e:2x4
Float32 weights and Adam state sharded 8 ways (fsdp), 64 micro-batches with remat; the
sampler splits slots over 2 and heads over 4 chips (bf16 weights, 48 slots). The README's
"Will it fit?" table has the planned figures.
"""

from configs import common


def get_config(arg=None):
    c = common.paper("models/Qwen3-4B-Instruct-2507", family="qwen3", template="qwen3",
                     method=arg or "ada_balance")
    c.mesh.fsdp = 8
    c.train.micro_batches = 64
    c.sampling.mesh = (2, 4)
    c.sampling.num_slots = 48  # per host
    return c
