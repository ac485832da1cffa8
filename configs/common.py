"""The full config schema with neutral defaults; every knob is named once, here.

Config files start from `base()` and change what their setup needs. `set_method` picks
one of the methods of `ada.methods` (the only thing that differs between GRPO, Ada-pos and
Ada-balance runs of the same setup).
"""

from __future__ import annotations

import ml_collections

from ada import methods


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # grpo: one round of n per prompt; ada_pos / ada_balance: rounds of M until the exit
    # rule holds (at most N rounds), then down-sample to n; dapo: drop uniform groups;
    # exhaustive: the whole M x N budget. The table is ada/methods.py.
    c.method = "ada_balance"

    c.model = ml_collections.ConfigDict()
    c.model.path = ""  # a Hugging Face model directory; '' -> random init from the preset
    c.model.preset = "tiny"  # ada.models.presets name, used when path is ''
    c.model.family = "qwen2"
    c.model.hidden_size = 0  # > 0 overrides the preset's size (tiny embedded model)
    c.model.num_layers = 0
    c.model.dtype = "float32"  # compute dtype
    c.model.param_dtype = "float32"
    c.model.remat = False

    c.tokenizer = ml_collections.ConfigDict()
    c.tokenizer.path = ""  # '' -> the model dir's tokenizer, or the task's char tokenizer
    c.tokenizer.template = "plain"  # ada.templates: plain | qwen25_math | qwen3 | llama32 ...
    c.tokenizer.vocab_size = 96  # synthetic tasks: size of the SentencePiece trained on them

    c.data = ml_collections.ConfigDict()
    c.data.source = "arithmetic"  # arithmetic | countdown | jsonl | parquet | tfds
    c.data.train_path = ""  # for jsonl / parquet
    c.data.eval_path = ""
    # tfds: a prepared dataset's name (looked up in tfds_data_dir) or its version folder;
    # nothing is downloaded. Needs the extra: pip install 'ada[tfds]'.
    c.data.tfds_name = ""
    c.data.tfds_data_dir = ""  # '' -> TFDS's default (~/tensorflow_datasets)
    c.data.tfds_split = "train"  # a split name, optionally sliced: train[:90%]
    c.data.tfds_eval_split = ""  # '' -> no held-out prompts
    c.data.problem_key = "problem"  # the column (TFDS: feature) holding the problem
    c.data.answer_key = "answer"
    c.data.reward = ""  # 'package.module:function' to replace the task's reward
    c.data.num_train = 4096  # synthetic tasks: size of the generated splits
    c.data.num_eval = 64
    c.data.difficulty = "1:1,2:1,3:1"  # synthetic: level:weight (ada.data.synthetic levels)
    c.data.task_seed = 0  # synthetic: seed of the generated train/test splits
    c.data.prompts_per_step = 8
    c.data.max_prompt_len = 32
    c.data.shuffle = True
    c.data.on_bad_row = "raise"  # jsonl / parquet / tfds: raise | skip (count, log) a bad row
    # Train only on prompts whose pass rate under the initial policy (pass_rate_samples draws
    # at sampling.temperature, cached) lies in [lo, hi]: the paper's easy / hard prompt sets.
    # (0.0, 1.0) keeps every prompt without sampling.
    c.data.pass_rate_range = (0.0, 1.0)
    c.data.pass_rate_samples = 16

    c.adaptive = ml_collections.ConfigDict()
    c.adaptive.n = 4  # responses kept per prompt
    c.adaptive.samples_per_round = 8  # M
    c.adaptive.max_rounds = 4  # N
    c.adaptive.scheduler = "rounds"  # rounds | continuous
    # rounds over the engine: score each finished response on a thread while the engine
    # decodes on (the round's exit decisions still wait for all of it: same batch either way)
    c.adaptive.overlap_scoring = True
    c.adaptive.positive_threshold = 0.5
    c.adaptive.reward_range = (0.0, 1.0)
    # Divide the advantage by the std: None = the method's own (grpo, dapo: yes; ada: no).
    c.adaptive.normalize_std = None
    c.adaptive.dapo_max_batches = 4  # dapo: how many extra prompt batches it may draw

    c.sampling = ml_collections.ConfigDict()
    c.sampling.temperature = 1.0
    c.sampling.top_p = 1.0
    c.sampling.top_k = 0
    c.sampling.max_new_tokens = 16
    c.sampling.num_slots = 64  # decode slots of the engine
    c.sampling.chunk_size = 8  # decode steps per jitted chunk
    # Attention-window buckets: a chunk reads only the cache front its slots have filled.
    c.sampling.num_windows = 4
    # Bit-reproducible across process counts: no slot buckets, one prompt per prefill and
    # one attention window (different shapes may round logits differently and flip a
    # sample).
    c.sampling.slot_bucketing = True
    c.sampling.max_prefill_rows = 8
    # The sampler's (data, tensor) mesh over this process's devices: slots split over data,
    # heads / MLP / vocabulary over tensor. data=-1: local device count // tensor.
    c.sampling.mesh = (-1, 1)

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-6
    c.optim.warmup_steps = 10
    c.optim.weight_decay = 0.0
    c.optim.grad_clip = 1.0
    c.optim.clip_low = 0.2
    c.optim.clip_high = 0.28
    c.optim.dual_clip = 10.0
    c.optim.loss_agg = "token-mean"
    c.optim.entropy_coef = 1e-4
    c.optim.kl_coef = 0.0  # > 0: KL to the initial policy (a frozen copy) in the loss
    c.optim.kl_estimator = "k3"  # k1 | k2 | k3 (Schulman's estimators; k3 = verl's low_var_kl)
    c.optim.mini_batches = 1  # PPO mini-batches per step (optimizer updates per step)
    c.optim.epochs = 1
    c.optim.micro_batches = 1  # gradient-accumulation splits of each mini-batch

    c.train = ml_collections.ConfigDict()
    c.train.steps = 600
    # Cut each train batch to its longest prompt and response (rounded up to a power of two,
    # so a run compiles a few shapes); False: always max_prompt_len + max_new_tokens.
    c.train.trim_padding = True

    c.eval = ml_collections.ConfigDict()
    c.eval.every = 50  # steps; 0 disables
    c.eval.samples = 32  # avg@k at temperature eval.temperature
    c.eval.temperature = 1.0
    c.eval.pass_k = (1, 8, 32)
    c.eval.max_new_tokens = 0  # 0 -> sampling.max_new_tokens

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 50
    c.checkpoint.keep = 3
    c.checkpoint.export_hf = False  # also write a Hugging Face directory at the end

    c.warmstart = ml_collections.ConfigDict()
    c.warmstart.enabled = False
    c.warmstart.steps = 0
    c.warmstart.batch_size = 64
    c.warmstart.lr = 3e-3
    c.warmstart.seed = 0
    # The noisy teacher (arithmetic only): after `steps` on the exact answers, `noise_steps`
    # more at `noise_lr` on targets of which a share `teacher_noise` are near misses. The
    # policy keeps the answers it learnt as its likeliest replies but samples their
    # neighbours too (ada/setup.py: warm_start_examples). 0 and 0: exact answers only.
    c.warmstart.teacher_noise = 0.0
    c.warmstart.noise_steps = 0
    c.warmstart.noise_lr = 1e-3
    c.warmstart.cache_dir = ""  # '' -> ~/.cache/ada/warmstart

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1  # -1: all remaining devices
    c.mesh.fsdp = 1
    c.mesh.tensor = 1

    c.log = ml_collections.ConfigDict()
    c.log.tensorboard = True
    c.log.progress = True
    c.log.plots = True  # write PNG plots of metrics.jsonl at the end
    # Log how each update moved its own responses (advantage and log-prob change of the
    # positive- and negative-advantage ones): two more forward passes per step.
    c.log.update_diagnostics = False
    return c


def set_method(c: ml_collections.ConfigDict, method: str | None) -> ml_collections.ConfigDict:
    if method is not None:
        c.method = methods.get(method).name
    return c


def paper(model_path: str, family: str, template: str, method: str | None) -> ml_collections.ConfigDict:
    """The paper's training setup (Reinforce-Ada, section 4), shared by all four models; each
    preset adds the layout planned for its TPU slice (mesh, micro-batches, sampler)."""
    c = base()
    c.model.path = model_path
    c.model.family = family
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat = True
    c.tokenizer.template = template
    c.data.source = "jsonl"
    c.data.train_path = "data/train.jsonl"  # OpenR1-Math style rows (problem, answer)
    c.data.eval_path = "data/math500.jsonl"
    c.data.prompts_per_step = 512
    c.data.max_prompt_len = 1024
    c.adaptive.n = 4
    c.adaptive.samples_per_round = 8
    c.adaptive.max_rounds = 4
    c.adaptive.positive_threshold = 0.7  # the official implementation's default
    c.sampling.temperature = 1.0
    c.sampling.top_p = 1.0
    # The official setup: 1024 prompt + 2048 response tokens (Qwen2.5-Math's context is 4096).
    c.sampling.max_new_tokens = 2048
    c.optim.lr = 1e-6
    c.optim.warmup_steps = 10
    c.optim.weight_decay = 0.0
    c.optim.grad_clip = 1.0
    c.optim.clip_low = 0.2
    c.optim.clip_high = 0.28
    c.optim.entropy_coef = 1e-4
    c.optim.kl_coef = 0.0  # > 0: KL to the initial policy (a frozen copy) in the loss
    c.optim.kl_estimator = "k3"  # k1 | k2 | k3 (Schulman's estimators; k3 = verl's low_var_kl)
    c.optim.loss_agg = "token-mean"
    c.optim.mini_batches = 4  # 512 prompts x 4 = 2048 responses, mini-batches of 512
    c.train.steps = 600
    c.eval.every = 50
    c.eval.samples = 32  # avg@32 at temperature 1.0
    c.eval.temperature = 1.0
    c.eval.pass_k = (1, 8, 32)
    c.checkpoint.every = 50
    c.checkpoint.keep = 3
    c.checkpoint.export_hf = True
    c.log.progress = True
    return set_method(c, method)
