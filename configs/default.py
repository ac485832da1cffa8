"""The embedded default: a tiny model on synthetic arithmetic, CPU, a few minutes.

    python -m ada.runner --config configs/default.py --workdir runs/default
    python -m ada.runner --config configs/default.py:grpo --workdir runs/grpo

A short supervised warm start (cached) gives a policy that solves the easy level, half
solves the middle one and rarely solves the hard one, so at n=4 most groups start
all-correct or all-wrong: the regime adaptive sampling is for.
"""

from configs import common


def get_config(arg=None):
    c = common.base()
    c.seed = 0
    c.model.preset = "tiny"
    c.model.family = "qwen2"
    c.tokenizer.template = "plain"
    c.tokenizer.vocab_size = 96

    c.data.source = "arithmetic"
    c.data.difficulty = "1:2,2:1,3:1"
    c.data.num_train = 4000
    c.data.num_eval = 96
    c.data.prompts_per_step = 16
    c.data.max_prompt_len = 32

    c.adaptive.n = 4
    c.adaptive.samples_per_round = 8
    c.adaptive.max_rounds = 4
    c.adaptive.positive_threshold = 0.5

    c.sampling.temperature = 1.0
    c.sampling.max_new_tokens = 8
    c.sampling.num_slots = 128
    c.sampling.chunk_size = 8

    c.optim.lr = 2e-4
    c.optim.warmup_steps = 5
    c.optim.entropy_coef = 1e-4
    c.optim.mini_batches = 1

    c.train.steps = 60
    c.eval.every = 10
    c.eval.samples = 8
    c.eval.temperature = 1.0
    c.eval.pass_k = (1, 4, 8)
    c.checkpoint.every = 10
    c.checkpoint.keep = 2

    c.warmstart.enabled = True
    c.warmstart.steps = 1500
    c.warmstart.batch_size = 64
    c.warmstart.lr = 3e-3

    c.mesh.data = 1  # the tiny model runs on one device
    return common.set_method(c, arg or "ada_balance")
