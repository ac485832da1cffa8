"""The full config schema with neutral defaults; every knob is named once, here.

Config files start from `base()` and change what their setup needs. `set_method` picks
one of the methods of `ada.methods` (the only thing that differs between GRPO, Ada-pos and
Ada-balance runs of the same setup). Configs import no part of ada (as big_vision's import
only ml_collections): they are leaves, and `ada.config.validate` checks the method name.
"""

from __future__ import annotations

import ml_collections


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0  # RL seed: prompt order, sampling and selection keys, random init
    # grpo: one round of n per prompt; ada_pos / ada_balance: rounds of M until the exit
    # rule holds (at most N rounds), then down-sample to n; dapo: drop uniform groups;
    # exhaustive: the whole M x N budget. The table is ada/methods.py.
    c.method = "ada_balance"  # grpo | dapo | ada_pos | ada_balance | exhaustive

    c.model = ml_collections.ConfigDict()
    c.model.path = ""  # a Hugging Face model directory; '' -> random init from the preset
    c.model.preset = "tiny"  # ada.models.presets name, used when path is ''
    c.model.family = "qwen2"  # qwen2 | qwen3 | llama | gemma2 | gemma3 (ada/models/families.py)
    c.model.hidden_size = 0  # > 0 overrides the preset's size (tiny embedded model)
    c.model.num_layers = 0  # > 0 overrides the preset's depth
    c.model.dtype = "float32"  # compute dtype (and the sampler's weights)
    c.model.param_dtype = "float32"  # dtype of the trained params and Adam state
    c.model.remat = False  # rematerialise each block in the backward pass (less memory)
    c.model.lora = ml_collections.ConfigDict()
    # low-rank adapters on the targets, only they trained (base frozen in model.dtype); 0 = off
    c.model.lora.rank = 0
    c.model.lora.alpha = 32.0  # adapters scaled by alpha / rank (fixed alpha: lr ~ rank-free)
    c.model.lora.targets = ("q", "k", "v", "o", "gate", "up", "down")  # linear layers adapted

    c.tokenizer = ml_collections.ConfigDict()
    c.tokenizer.path = ""  # '' -> the model dir's tokenizer, or the task's char tokenizer
    c.tokenizer.template = "plain"  # ada.templates: plain | qwen25_math | qwen3 | llama32 | gemma ...
    c.tokenizer.vocab_size = 96  # synthetic tasks: size of the SentencePiece trained on them

    c.data = ml_collections.ConfigDict()
    c.data.source = "arithmetic"  # arithmetic | countdown | jsonl | parquet | tfds
    c.data.train_path = ""  # for jsonl / parquet
    c.data.eval_path = ""  # held-out prompts (jsonl / parquet); '' -> none
    # tfds: a prepared dataset's name (looked up in tfds_data_dir) or its version folder;
    # nothing is downloaded. Needs the extra: pip install 'ada[tfds]'.
    c.data.tfds_name = ""  # tfds: a prepared dataset's name or version folder
    c.data.tfds_data_dir = ""  # '' -> TFDS's default (~/tensorflow_datasets)
    c.data.tfds_split = "train"  # a split name, optionally sliced: train[:90%]
    c.data.tfds_eval_split = ""  # '' -> no held-out prompts
    c.data.problem_key = "problem"  # the column (TFDS: feature) holding the problem
    c.data.answer_key = "answer"  # the column (TFDS: feature) holding the reference answer
    c.data.reward = ""  # 'package.module:function' to replace the task's reward
    c.data.num_train = 4096  # synthetic tasks: size of the generated splits
    c.data.num_eval = 64  # held-out prompts evaluated at most (all sources)
    c.data.level_mix = "1:1,2:1,3:1"  # synthetic: level:weight (ada.data.synthetic levels)
    c.data.task_seed = 0  # synthetic: seed of the generated train/test splits
    c.data.prompts_per_step = 8  # prompts per RL step (all processes together)
    c.data.max_prompt_len = 32  # tokens; longer prompts are dropped (and counted)
    c.data.shuffle = True  # shuffle the training prompts each pass
    c.data.on_bad_row = "raise"  # jsonl / parquet / tfds: raise | skip (count, log) a bad row
    # Train only on prompts whose pass rate under the initial policy (pass_rate_samples draws
    # at sampling.temperature, cached) lies in [lo, hi]: the paper's easy / hard prompt sets.
    # (0.0, 1.0) keeps every prompt without sampling.
    c.data.pass_rate_range = (0.0, 1.0)  # (lo, hi): keep prompts with pass rate in [lo, hi]
    c.data.pass_rate_samples = 16  # draws per prompt to estimate its pass rate

    c.adaptive = ml_collections.ConfigDict()
    c.adaptive.n = 4  # responses kept per prompt
    c.adaptive.samples_per_round = 8  # M
    c.adaptive.max_rounds = 4  # N
    c.adaptive.scheduler = "rounds"  # rounds | continuous
    # rounds over the engine: score each finished response on a thread while the engine
    # decodes on (the round's exit decisions still wait for all of it: same batch either way)
    c.adaptive.overlap_scoring = True  # score responses on a thread while the engine decodes
    c.adaptive.positive_threshold = 0.5  # a response is positive iff its reward > this
    c.adaptive.reward_range = (0.0, 1.0)  # (low, high) of the rewards
    # Divide the advantage by the std: None = the method's own (grpo, dapo: yes; ada: no).
    c.adaptive.normalize_std = None
    c.adaptive.dapo_max_batches = 4  # dapo: how many extra prompt batches it may draw
    # A step's samples split across its prompts (ada/adaptive/allocation.py, ada/run/allocator.py):
    # none = every prompt may draw M x N (today's collection, bit for bit). The budget is in
    # samples, not tokens: the exit rules and the kept group are counted in samples, a
    # response's length is unknown before it is drawn, and GRPO's n x prompts_per_step is then
    # "equal samples" by default. Method rows *_knapsack set knapsack themselves.
    c.adaptive.allocation = "none"  # none | knapsack | variance
    c.adaptive.budget = 0  # samples per step over all prompts; 0 = n x data.prompts_per_step
    c.adaptive.half_life = 40.0  # steps until a success record counts half (40: the simulator's plateau)
    c.adaptive.floor = 2  # fewest samples a kept prompt may draw under an allocation
    c.adaptive.explore = 0.1  # share of the budget above the floors spread evenly
    c.adaptive.skip_above = 0.5  # skip a prompt whose own P(no signal at M x N) exceeds it; 1 never

    c.sampling = ml_collections.ConfigDict()
    c.sampling.temperature = 1.0  # 0 = greedy; training log-probs use the same temperature
    c.sampling.top_p = 1.0  # nucleus sampling; 1.0 = off
    c.sampling.top_k = 0  # 0 = off
    c.sampling.max_new_tokens = 16  # response length cap, in tokens
    c.sampling.num_slots = 64  # decode slots of the engine
    c.sampling.chunk_size = 8  # decode steps per jitted chunk
    # Attention-window buckets: a chunk reads only the cache front its slots have filled.
    c.sampling.num_windows = 4  # attention-window buckets of decode; 1 = the whole cache
    # Bit-reproducible across process counts: no slot buckets, one prompt per prefill and
    # one attention window (different shapes may round logits differently and flip a
    # sample).
    c.sampling.slot_bucketing = True  # also compile power-of-two slot counts (a round's tail)
    c.sampling.max_prefill_rows = 8  # prompts prefilled per jitted call at most
    # The sampler's (data, tensor) mesh over this process's devices: slots split over data,
    # heads / MLP / vocabulary over tensor. data=-1: local device count // tensor.
    c.sampling.mesh = (-1, 1)  # the sampler's (data, tensor) mesh; data=-1: all local devices
    # The decode KV cache (docs/paged.md): dense reserves prompt + max_new_tokens positions
    # per slot; paged holds pages as responses grow, shares a prompt's pages among its
    # samples, defers and preempts when a bounded pool runs out (same tokens either way).
    c.sampling.kv_cache = "dense"  # dense | paged (both for every family: qwen2, qwen3, llama, gemma2, gemma3)
    c.sampling.page_size = 16  # paged: tokens per page
    c.sampling.num_pages = 0  # paged: pages in the pool; 0 = every slot's worst case (never preempts)
    c.sampling.paged_attention = "auto"  # paged: auto (TPU: kernel, else gather) | kernel | gather
    c.sampling.mean_response_len = 0  # ada.plan: mean response tokens slots are planned at with pages; 0 = half of max_new_tokens

    # The policy loss: ada.rl.losses.LossConfig, field for field.
    c.loss = ml_collections.ConfigDict()
    c.loss.clip_low = 0.2  # PPO clip: the ratio is clipped below at 1 - clip_low
    c.loss.clip_high = 0.28  # ... and above at 1 + clip_high (DAPO's clip-higher)
    c.loss.dual_clip = 10.0  # A < 0: the token loss is at most -A * dual_clip (> 1); 0 = off
    c.loss.loss_agg = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean
    c.loss.entropy_coef = 1e-4  # weight of the entropy bonus
    c.loss.kl_coef = 0.0  # > 0: KL to the initial policy (a frozen copy) in the loss
    c.loss.kl_estimator = "k3"  # k1 | k2 | k3 (Schulman's estimators; k3 = verl's low_var_kl)
    c.loss.stale_objective = "decoupled"  # stale tokens (rl.max_staleness > 0): decoupled (PPO vs the proximal policy x capped IS weight) | naive (behaviour log-probs as PPO's old)
    c.loss.is_weight_cap = 2.0  # decoupled: the proximal / behaviour weight of a stale token is capped here
    c.loss.is_weight_rule = "truncate"  # a weight above the cap: truncate (to the cap) | filter (to 0: the token does not train, as the AReaL paper)

    # The stream (ada/stream.py): the next steps' prompts sample while a step's last rounds
    # drain; a trained token lags the policy by at most max_staleness versions. 0 = the
    # synchronous loop (each step samples, then trains), bit for bit.
    c.rl = ml_collections.ConfigDict()
    c.rl.max_staleness = 0  # k: a trained token lags the policy by at most k versions
    c.rl.sampler_devices = 0  # 0 = colocated (turns on every device); N = this process's last N devices sample on their own thread, the others train (sampling.mesh must span the N: data x tensor = N, or data=-1)

    # Tools in an episode (ada/envs: ada.envs.EnvConfig, field for field): the policy's turn
    # ends at a tool call, the tool's output is appended, the policy goes on until it answers.
    c.env = ml_collections.ConfigDict()
    c.env.tools = ""  # comma-separated tools: calculator, python; '' = no tools (one turn per response, as before)
    c.env.tool_format = "qwen"  # qwen (<tool_call> JSON, Qwen2.5/Qwen3 chat) | tags (<calc>12*34</calc>, the tiny model)
    c.env.max_turns = 4  # policy turns per episode at most (a call in the last one is not run)
    c.env.max_tool_output_tokens = 256  # a tool's output is cut to this many tokens
    c.env.max_total_tokens = 0  # prompt + policy + tool tokens of an episode at most; 0 = no cap of the env's own
    c.env.tool_timeout_s = 10.0  # wall-clock seconds a tool call may run (the python tool's CPU limit too)
    c.env.sandbox_url = ""  # python tool: '' = a local sandboxed subprocess; a SandboxFusion URL = run there

    # The optimizer (AdamW): ada.rl.optimizer.OptimConfig, field for field.
    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-6  # learning rate (constant after warm-up)
    c.optim.warmup_steps = 10  # RL steps of linear warm-up
    c.optim.weight_decay = 0.0  # AdamW's decoupled weight decay
    c.optim.grad_clip = 1.0  # global gradient-norm clip; 0 = off
    c.optim.max_skipped_in_row = 10  # stop after this many RL steps in a row with a non-finite update

    # The update (ada.rl.train.TrainConfig's epochs, mini_batches, micro_batches) and the loop.
    c.train = ml_collections.ConfigDict()
    c.train.steps = 600  # RL steps
    c.train.epochs = 1  # PPO epochs over each collected batch
    c.train.mini_batches = 1  # PPO mini-batches per epoch (optimizer updates per epoch)
    c.train.micro_batches = 1  # gradient-accumulation splits of each mini-batch
    # Cut each train batch to its longest prompt and response (rounded up to a power of two,
    # so a run compiles a few shapes); False: always max_prompt_len + max_new_tokens.
    c.train.trim_padding = True  # cut each batch to its longest prompt and response

    c.eval = ml_collections.ConfigDict()
    c.eval.every = 50  # steps; 0 disables
    c.eval.samples = 32  # avg@k at temperature eval.temperature
    c.eval.temperature = 1.0  # sampling temperature of the held-out evaluation
    c.eval.pass_k = (1, 8, 32)  # pass@k reported for each k (each <= eval.samples)
    c.eval.max_new_tokens = 0  # 0 -> sampling.max_new_tokens

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 50  # steps between checkpoints (and one at the end)
    c.checkpoint.keep = 3  # newest checkpoints kept
    c.checkpoint.export_hf = False  # also write a Hugging Face directory at the end
    # what export_hf writes: merged (a plain model; LoRA folded in) | peft (a LoRA run's
    # adapters as a PEFT adapter on its base)
    c.checkpoint.export_format = "merged"
    # After SIGTERM (a spot VM's ~30 s notice) the rest of the step and the final checkpoint
    # get this long; past it they are abandoned with one line, and the last complete
    # checkpoint stays the one to resume from (exit 143 either way; ada/preemption.py).
    c.checkpoint.preemption_budget_s = 25.0  # seconds from SIGTERM to the end of the final save

    c.warmstart = ml_collections.ConfigDict()
    # Synthetic tasks: a supervised warm start (cached) before RL plays the pretrained model.
    c.warmstart.enabled = False
    c.warmstart.steps = 0  # supervised steps on the exact answers
    c.warmstart.batch_size = 64  # examples per warm-start step
    c.warmstart.lr = 3e-3  # warm-start learning rate
    c.warmstart.seed = 0  # warm-start init and data order (the RL seed is separate)
    # The noisy teacher (arithmetic only): after `steps` on the exact answers, `noise_steps`
    # more at `noise_lr` on targets of which a share `teacher_noise` are near misses. The
    # policy keeps the answers it learnt as its likeliest replies but samples their
    # neighbours too (ada/warmstart.py: examples). 0 and 0: exact answers only.
    c.warmstart.teacher_noise = 0.0  # share of near misses among the noisy teacher's targets
    c.warmstart.noise_steps = 0  # steps on the noisy teacher after the exact ones
    c.warmstart.noise_lr = 1e-3  # learning rate of the noisy phase
    # A run with tools (env.tools, configs/tools.py): the warm start teaches only the call
    # format, one trace for each of the first `tool_traces` training records (ada/warmstart.py:
    # ToolTraces): a share answered by a call, the tool's output (masked out of the loss: the
    # env writes it) and its copy; a share the same but with a digit of the copy wrong; the
    # rest by a guess without a call. RL learns when to call and to copy exactly.
    c.warmstart.tool_traces = 256  # tool runs: training records answered by a warm-start trace
    c.warmstart.tool_call_share = 0.4  # share of the traces that call and copy the output
    c.warmstart.tool_wrong_copy_share = 0.2  # share that call, then copy a digit wrong
    c.warmstart.cache_dir = ""  # '' -> ~/.cache/ada/warmstart

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1  # the train mesh's data-parallel size; -1: all remaining devices
    c.mesh.fsdp = 1  # params and Adam state sharded this many ways
    c.mesh.tensor = 1  # tensor-parallel size (heads / MLP / vocabulary)

    c.distributed = ml_collections.ConfigDict()
    # A process that sends no heartbeat for this long is lost: the others stop within about
    # this time with one line naming it (ada/distributed.py); multi-process runs only.
    c.distributed.timeout_s = 300.0  # seconds without a heartbeat before a process counts as lost

    c.log = ml_collections.ConfigDict()
    c.log.tensorboard = True  # also write TensorBoard event files
    c.log.progress = True  # a progress bar on stderr
    c.log.every = 10  # with log.progress=false: a text line on stderr every this many steps (0: none)
    c.log.plots = True  # write PNG plots of metrics.jsonl at the end
    c.log.wandb = False  # also log to Weights & Biases (pip install -e '.[wandb]'; process 0)
    c.log.wandb_project = "ada"  # the W&B project
    c.log.wandb_entity = ""  # the W&B entity (team or user); '' -> your default
    c.log.wandb_mode = ""  # '' -> W&B's own (WANDB_MODE) | online | offline | disabled
    # Log how each update moved its own responses (advantage and log-prob change of the
    # positive- and negative-advantage ones): two more forward passes per step.
    c.log.update_diagnostics = False  # log the log-prob change of +/- advantage responses
    return c


def set_method(c: ml_collections.ConfigDict, method: str | None) -> ml_collections.ConfigDict:
    if method is not None:
        c.method = method  # checked by ada.config.validate, with the methods to choose from
    return c


def paper(model_path: str, family: str, template: str, method: str | None) -> ml_collections.ConfigDict:
    """The paper's training setup (Reinforce-Ada, section 4), shared by all four models; each
    preset adds the layout planned for its TPU slice (mesh, micro-batches, sampler).

    Only what differs from `base()` is set here: base's defaults are the paper's (n=4, M=8,
    N=4, lr 1e-6 with 10 warm-up steps, clip 0.2 / 0.28, entropy 1e-4, token-mean loss, no
    KL, 600 steps, avg@32 and pass@1/8/32 at temperature 1.0 every 50 steps);
    tests/test_config.py checks the values."""
    c = base()
    c.model.path = model_path
    c.model.family = family
    c.model.dtype = "bfloat16"
    c.model.remat = True
    c.tokenizer.template = template
    c.data.source = "jsonl"
    c.data.train_path = "data/train.jsonl"  # OpenR1-Math style rows (problem, answer)
    c.data.eval_path = "data/math500.jsonl"
    c.data.prompts_per_step = 512
    c.data.max_prompt_len = 1024
    c.adaptive.positive_threshold = 0.7  # the official implementation's default
    # The official setup: 1024 prompt + 2048 response tokens (Qwen2.5-Math's context is 4096).
    c.sampling.max_new_tokens = 2048
    c.train.mini_batches = 4  # 512 prompts x 4 = 2048 responses, mini-batches of 512
    c.checkpoint.export_hf = True
    return set_method(c, method)
