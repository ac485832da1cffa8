"""The embedded tool run: the tiny model learns to call a calculator, CPU, a few minutes.

    python -m ada.runner --config configs/tools.py --workdir runs/tools
    python -m ada.runner --config configs/tools.py:notools --workdir runs/notools

The task is arithmetic past what the tiny model computes in its head (ada/data/synthetic.py,
levels 6-8, a third each): products of two 3-digit or two 4-digit numbers and sums of four
3-digit numbers, answers of 4 to 8 digits. With env.tools=calculator and the tag format the
policy may write `<calc>640 * 806</calc>`; its turn ends at `</calc>` (one token: the task's
tokenizer holds the markers as pieces in a run with tools), the env appends `<out>515840</out>`
and the policy goes on (` = 515840`); its text (observations left out) is scored by the
exact `arithmetic_reward` on the number after its last '=', so a copied `<out>` is right.
A supervised warm start (cached; 2.6 min on a busy 2-core CPU) teaches only the format,
one trace a record (warmstart.tool_*: 40% call and copy, 20% call and copy a digit wrong,
40% a guess without a call); the tool's output is masked out of its loss (the env writes
it, never the policy). Greedy, it then calls on every held-out problem and is right on
~1/8 (copies of the expression or the output go wrong). RL learns to copy exactly.

`:notools` is the same model, task and warm-start budget without tools: the warm start is
then the exact answers themselves, and its end is the no-tool ceiling the tool run should
pass. A method name (`configs/tools.py:grpo`) picks the method of the tool run.
"""
from configs import common, default


def get_config(arg=None):
    c = default.get_config()  # the default run's tiny model, optimizer, eval and logging

    c.data.level_mix = "6:1,7:1,8:1"  # 3-digit and 4-digit products, sums of four 3-digit numbers
    c.data.num_eval = 96
    c.data.prompts_per_step = 32
    c.data.max_prompt_len = 40  # the longest prompt (a long sum) is 30 tokens

    c.env.tools = "calculator"
    c.env.tool_format = "tags"  # <calc>expr</calc> answered by <out>value</out>
    c.env.max_turns = 2  # a call, then the answer (a call in the second turn is not run)
    # a long sum's call, its <out> and ' = ' with the copied answer: the warm start's longest
    # trace is 41 tokens after the prompt
    c.sampling.max_new_tokens = 44

    c.train.steps = 100
    c.eval.samples = 4
    c.eval.pass_k = (1, 4)

    # on the traces only: the format, and copying from the context. 800 steps (or 2,000 on
    # 1,024 traces, memorised: train CE 0.18) copied nothing on held-out prompts; 2,000 on
    # all 4,000 copy most expressions and some answers (greedy held-out 6/48 right, all by a call)
    c.warmstart.steps = 2000
    c.warmstart.batch_size = 32
    c.warmstart.teacher_noise = 0.0  # the traces' wrong copies play the noisy teacher
    c.warmstart.noise_steps = 0
    c.warmstart.tool_traces = 4000  # one trace per training record
    c.warmstart.tool_call_share = 0.4
    c.warmstart.tool_wrong_copy_share = 0.2
    if arg == "notools":
        c.env.tools = ""
        c.sampling.max_new_tokens = 10  # an answer of at most 8 digits, its space and EOS
        return c
    return common.set_method(c, arg or "ada_balance")
