"""The embedded default: a tiny model on synthetic arithmetic, CPU, a few minutes.

    python -m ada.runner --config configs/default.py --workdir runs/default
    python -m ada.runner --config configs/default.py:grpo --workdir runs/grpo

The task is two-digit addition / subtraction (arithmetic level 2, ~20k distinct problems,
so the held-out split tests the algorithm, not memorised facts). A short supervised warm
start (cached, ~1.5 min once) gives a policy that is right ~14% of the time at
temperature 1 but often has the answer within reach (pass@8 ~0.6): at n=4 most GRPO groups
start all-wrong, the regime adaptive sampling is for, and RL sharpening generalises to the
held-out split. Measured choices (docs/results.md): with 16 prompts per step or
lr >= 3e-4 the held-out accuracy stays flat or falls (Adam's sign-like first steps swamp
the signal); 64 prompts per step at lr 1e-4 rises steadily.
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
    c.data.difficulty = "2:1"
    c.data.num_train = 4000
    c.data.num_eval = 96
    c.data.prompts_per_step = 64
    c.data.max_prompt_len = 32

    c.adaptive.n = 4
    c.adaptive.samples_per_round = 8
    c.adaptive.max_rounds = 4
    c.adaptive.positive_threshold = 0.5

    c.sampling.temperature = 1.0
    c.sampling.max_new_tokens = 8
    c.sampling.num_slots = 128
    c.sampling.chunk_size = 8
    c.sampling.mesh = (1, 1)  # one device, as the train step (mesh.data below)

    c.optim.lr = 3e-4
    c.optim.warmup_steps = 5
    c.optim.entropy_coef = 1e-4
    c.optim.mini_batches = 1

    c.train.steps = 200
    c.eval.every = 25
    c.eval.samples = 8
    c.eval.temperature = 1.0
    c.eval.pass_k = (1, 4, 8)
    c.checkpoint.every = 50
    c.checkpoint.keep = 2

    c.warmstart.enabled = True
    c.warmstart.steps = 3000
    c.warmstart.teacher_noise = 0.6
    c.warmstart.batch_size = 64
    c.warmstart.lr = 3e-3

    c.mesh.data = 1  # the tiny model runs on one device
    c.log.update_diagnostics = True
    return common.set_method(c, arg or "ada_balance")
