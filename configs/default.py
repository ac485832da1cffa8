"""The embedded default: a tiny model on synthetic arithmetic, CPU, a few minutes.

    python -m ada.runner --config configs/default.py --workdir runs/default
    python -m ada.runner --config configs/default.py:grpo --workdir runs/grpo

The task is two-digit addition / subtraction (arithmetic level 2, ~20k distinct problems,
so the held-out split tests the algorithm, not memorised facts). A supervised warm start
(cached, ~2 min once) imitates a noisy teacher: per training problem, 2 exact answers and 3
near misses (warmstart.teacher_noise=0.6). The policy then knows most answers but is unsure
of them (greedy ~0.39, temperature 1 ~0.20, pass@8 ~0.8), as a pretrained LLM whose pass@k
far exceeds its pass@1: the regime RL sharpens and adaptive sampling is for. From an exact
teacher the policy's mistakes are missing knowledge (the ones-digit table), which RL at
this budget barely teaches. Measured (docs/results.md): lr 3e-4 gains about twice as fast
as 1e-4 from this start; above ~5e-4 the negatives' log-probs fall much faster than the
positives' rise and accuracy drops. The update diagnostics (log-prob change of positive
and negative responses per update) are on: two more forward passes per step.
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
