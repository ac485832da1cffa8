"""The policy update: old- and reference-logp pass, PPO epochs over mini-batches, gradient
accumulation.

Batch format (a dict of arrays; one row per selected response, B = P prompts x n):

  tokens         [B, T] int32   prompt left-padded, then the response right-padded
  positions      [B, T] int32   RoPE positions (`positions_from_mask(mask)`)
  mask           [B, T] bool    real (non-padding) tokens, prompt and response
  response_mask  [B, T] float   1 where tokens[b, t] is a response token: the loss positions
  advantages     [B]    float   one per response, broadcast over its tokens
  old_logp       [B, T] float   filled by `TrainFns.add_logps` right after collection;
                                may be absent when on-policy (1 epoch, 1 mini-batch)
  ref_logp       [B, T] float   log-probs under frozen reference params, filled by the same
                                `add_logps` call; needed when loss.kl_coef > 0
  behav_logp     [B, T] float   the loop's at every rl.max_staleness (ada/stream.py): the
  lag            [B, T] int     sampler's log-prob of each response token, and how many
                                policy versions before this update's it was sampled; with
                                them the loss is loss.stale_objective's (losses.is_weights)

Alignment convention: every [B, T] array is indexed by the position of the token it is
about. logp[b, t] = log pi(tokens[b, t] | tokens[b, :t]), computed from the hidden state at
t - 1; logp[:, 0] = 0 (nothing predicts the first token), so response_mask[:, 0] must be 0
— it always is, since a response follows a non-empty prompt. All log-probs and entropies are
of softmax(logits / config.temperature), the distribution the sampler draws from.

Mini- and micro-batches are strided, not contiguous: with K mini-batches and M micro-batches,
row i belongs to mini-batch i % K and micro-batch (i // K) % M. Under a batch sharded in
contiguous blocks over data x fsdp every device then holds an equal share of every micro-
batch, so no rows move between devices. B must be a multiple of K * M * (data * fsdp).

On-policy (epochs == 1 and mini_batches == 1) the ratio is exp(logp - stop_grad(logp))
= 1 exactly, as in verl: the loss is then the plain policy gradient and old_logp is unused.
Otherwise the ratio is against the batch's old_logp, which must come from this same forward
pass (`add_logps`), never from the sampler.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ada import sharding as shd
from ada.models import lora
from ada.models.lora import LoraConfig
from ada.models.transformer import ModelConfig, forward, param_shapes, project_logits
from ada.rl.losses import LossConfig, denominators, logp_and_entropy, policy_loss, stale_terms
from ada.rl.optimizer import OptimConfig, all_finite, guarded_update, lr_schedule, make_optimizer

REQUIRED_KEYS = ("tokens", "positions", "mask", "response_mask", "advantages")
OPTIONAL_KEYS = ("old_logp", "ref_logp", "behav_logp", "lag")
BATCH_DTYPES = dict(tokens=jnp.int32, positions=jnp.int32, mask=jnp.bool_,
                    response_mask=jnp.float32, advantages=jnp.float32, old_logp=jnp.float32,
                    ref_logp=jnp.float32, behav_logp=jnp.float32, lag=jnp.int32)


def split_problem(prompts: int, n: int, mini_batches: int, micro_batches: int) -> str | None:
    """Why a batch of `prompts` x `n` responses does not split into `mini_batches` PPO
    mini-batches of whole prompts, each cut into `micro_batches` equal micro-batches; None
    when it does. The one divisibility check behind the run config (ada/config.py) and the
    row order (ada/rl/batch.py)."""
    K, M = mini_batches, micro_batches
    if K < 1 or M < 1:
        return f"mini_batches={K} and micro_batches={M} must be >= 1"
    if prompts % K:
        return f"mini_batches={K} does not divide the {prompts} prompts (whole prompts per mini-batch)"
    if prompts * n % (K * M):
        return (f"mini_batches x micro_batches = {K} x {M} does not divide the {prompts} x {n} "
                f"= {prompts * n} responses")
    return None


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The policy update. `epochs`, `mini_batches` and `micro_batches` are the run
    config's `train` section's fields of those names; `loss` and `optim` its `loss` and
    `optim` sections."""

    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    epochs: int = 1  # PPO epochs over each collected batch
    mini_batches: int = 1  # optimizer updates per epoch
    micro_batches: int = 1  # gradient-accumulation splits of each mini-batch
    remat: bool = False  # rematerialise each transformer block in the backward pass
    logit_chunk: int = 512  # tokens per chunk of the [B, chunk, V] logits
    # Models of at most this many layers run their blocks unrolled, not under lax.scan: the
    # backward pass then skips filling and slicing stacked per-layer residuals (~10% of a
    # small model's update on CPU, docs/results.md); deeper ones scan, so compile time stays
    # flat in depth.
    unroll_layers: int = 8
    # The sampler's temperature: log-probs and entropy are of softmax(logits / T), the
    # distribution sampled from. Greedy sampling (T = 0) trains on the raw distribution: pass 1.
    temperature: float = 1.0
    # Low-rank adapters (model.lora): only they are trained; the base is frozen.
    lora: LoraConfig = LoraConfig()

    @property
    def reference_copy(self) -> bool:
        """Whether the KL term needs its own frozen copy of the initial params: kl_coef > 0
        without LoRA (LoRA's reference is the frozen base the train params hold)."""
        return self.loss.kl_coef > 0 and not self.lora.rank

    def __post_init__(self):
        problems = [f"{name}={getattr(self, name)} must be >= 1"
                    for name in ("epochs", "mini_batches", "micro_batches", "logit_chunk")
                    if getattr(self, name) < 1]
        if not self.temperature > 0:
            problems.append(f"temperature={self.temperature} must be > 0 (for greedy "
                            "sampling, temperature 0, train at 1.0)")
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))

    def unroll(self, model_cfg: ModelConfig) -> bool:
        return model_cfg.num_layers <= self.unroll_layers

    @property
    def on_policy(self) -> bool:
        return self.epochs == 1 and self.mini_batches == 1


@struct.dataclass
class TrainState:
    params: Any
    opt_state: Any
    step: jax.Array  # train_step calls
    updates: jax.Array  # optimizer updates applied
    skipped: jax.Array  # optimizer updates skipped because the loss or a gradient was not finite


def init_state(params, config: TrainConfig) -> TrainState:
    """The state of `params` (with their adapters, under LoRA: `TrainFns.init_state` adds
    them): Adam's moments for the trained leaves only."""
    zero = jnp.zeros((), jnp.int32)
    opt_state = make_optimizer(config.optim).init(lora.split(params)[0])
    return TrainState(params, opt_state, zero, zero, zero)


# ----------------------------------------------------------------------------- log-probs


def token_logp(params, model_cfg: ModelConfig, batch, *, chunk: int, remat: bool = False,
               mesh=None, temperature: float = 1.0,
               unroll: bool = False) -> tuple[jax.Array, jax.Array]:
    """Per-token log-probs and entropies [B, T] of softmax(logits / temperature), the
    sampler's distribution (see the alignment convention above).

    The vocabulary projection runs over chunks of `chunk` positions under `jax.checkpoint`,
    so neither the forward nor the backward pass holds more than [B, chunk, V] logits. When
    the whole sequence fits one chunk there is nothing to save: no checkpoint, no loop.
    `unroll`: the blocks in a Python loop (`forward`).
    """
    tokens = batch["tokens"]
    hidden_BxTxD, _ = forward(params, model_cfg, tokens, batch["positions"], batch["mask"],
                              remat=remat, return_hidden=True, unroll=unroll)
    hidden_BxTxD = shd.constrain_batch(hidden_BxTxD, mesh)
    B, T, D = hidden_BxTxD.shape
    if T < 2:
        raise ValueError(f"sequences of length T={T} have no token to predict; need T >= 2")
    n = T - 1
    C = min(chunk, n)
    chunks = -(-n // C)
    if chunks == 1:
        logp, ent = logp_and_entropy(project_logits(params, model_cfg, hidden_BxTxD[:, :-1]),
                                     tokens[:, 1:], temperature)
        return jnp.pad(logp, ((0, 0), (1, 0))), jnp.pad(ent, ((0, 0), (1, 0)))
    pad = chunks * C - n
    h = jnp.pad(hidden_BxTxD[:, :-1], ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, pad)))
    h_NxBxCxD = h.reshape(B, chunks, C, D).swapaxes(0, 1)
    t_NxBxC = targets.reshape(B, chunks, C).swapaxes(0, 1)

    @jax.checkpoint
    def one(p, h_BxCxD, t_BxC):
        return logp_and_entropy(project_logits(p, model_cfg, h_BxCxD), t_BxC, temperature)

    logp, ent = jax.lax.map(lambda xs: one(params, *xs), (h_NxBxCxD, t_NxBxC))

    def unchunk(x_NxBxC):
        x = x_NxBxC.swapaxes(0, 1).reshape(B, chunks * C)[:, :n]
        return jnp.pad(x, ((0, 0), (1, 0)))

    return unchunk(logp), unchunk(ent)


# ----------------------------------------------------------------------------- splitting


def _split(x, K: int, M: int, mesh=None):
    """[B, ...] -> [K, M, B / (K M), ...], row i in mini i % K, micro (i // K) % M."""
    B = x.shape[0]
    y = x.reshape(B // (K * M), M, K, *x.shape[1:])
    y = jnp.moveaxis(y, (0, 1, 2), (2, 1, 0))
    if mesh is not None:
        y = jax.lax.with_sharding_constraint(
            y, NamedSharding(mesh, P(None, None, shd.BATCH_AXES)))
    return y


def _merge(y):
    """Inverse of `_split`."""
    K, M, b = y.shape[:3]
    return jnp.moveaxis(y, (0, 1, 2), (2, 1, 0)).reshape(K * M * b, *y.shape[3:])


def check_batch(batch, config: TrainConfig, mesh=None, required=REQUIRED_KEYS) -> int:
    """Validate keys, shapes and divisibility (runs at trace time); returns B."""
    missing = [k for k in required if k not in batch]
    unknown = [k for k in batch if k not in REQUIRED_KEYS + OPTIONAL_KEYS]
    if missing or unknown:
        raise ValueError(f"train batch: missing keys {missing}, unknown keys {unknown}; "
                         f"expected {REQUIRED_KEYS} + optional {OPTIONAL_KEYS}")
    B, T = batch["tokens"].shape
    for k, x in batch.items():
        want = (B,) if k == "advantages" else (B, T)
        if tuple(x.shape) != want:
            raise ValueError(f"train batch: {k} has shape {tuple(x.shape)}, expected {want} "
                             f"(tokens is {(B, T)})")
    groups = config.mini_batches * config.micro_batches
    if B % groups:
        raise ValueError(
            f"train batch size {B} is not a multiple of mini_batches x micro_batches = "
            f"{config.mini_batches} x {config.micro_batches}; change the batch or the split")
    if mesh is not None:
        shd.check_batch_size(B, mesh, groups, what="train batch")
    return B


# ----------------------------------------------------------------------------- the step


def loss_fn(params, micro, denoms, model_cfg: ModelConfig, config: TrainConfig, mesh=None):
    logp, entropy = token_logp(params, model_cfg, micro, chunk=config.logit_chunk,
                               remat=config.remat, mesh=mesh, temperature=config.temperature,
                               unroll=config.unroll(model_cfg))
    # the proximal policy's log-probs: the weights this update starts from
    old = jax.lax.stop_gradient(logp) if config.on_policy else micro["old_logp"]
    weight = None
    if "lag" in micro:  # tokens of older policies (a stream)
        old, weight = stale_terms(old, micro["behav_logp"], micro["lag"], config.loss)
    return policy_loss(logp, old, micro["advantages"], micro["response_mask"], config.loss,
                       entropy_BxT=entropy, ref_logp_BxT=micro.get("ref_logp"), denoms=denoms,
                       is_weight=weight)


def minibatch_grads(params, mini, model_cfg: ModelConfig, config: TrainConfig, mesh=None,
                    grad_shardings=None):
    """Gradient (float32) and metrics of one mini-batch [M, b, ...], accumulated over its M
    micro-batches. Each micro-batch divides by the whole mini-batch's denominators, so the
    sum equals the unsplit mini-batch's loss and gradient. The gradient is of the trained
    leaves only (`lora.split`: the adapters under LoRA, else every parameter)."""
    denoms = denominators(mini["response_mask"], config.loss.loss_agg)
    params, frozen = lora.split(params)
    if frozen is not None:
        grad_shardings = None if grad_shardings is None else lora.split(grad_shardings)[0]
    vg = jax.value_and_grad(lambda p, *args: loss_fn(lora.join(p, frozen), *args), has_aux=True)
    if mini["tokens"].shape[0] == 1:  # no accumulation: saves a float32 copy of the grads
        (_, metrics), grads = vg(params, jax.tree.map(lambda x: x[0], mini), denoms,
                                 model_cfg, config, mesh)
        return jax.tree.map(lambda g: g.astype(jnp.float32), grads), metrics
    micro0 = jax.tree.map(lambda x: x[0], mini)
    metric_shapes = jax.eval_shape(
        lambda: loss_fn(lora.join(params, frozen), micro0, denoms, model_cfg, config, mesh)[1])

    def constrain(g):
        if grad_shardings is None:
            return g
        return jax.lax.with_sharding_constraint(g, grad_shardings)

    def micro_step(acc, micro):
        (_, metrics), grads = vg(params, micro, denoms, model_cfg, config, mesh)
        acc_g, acc_m = acc
        acc_g = constrain(jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc_g, grads))
        return (acc_g, jax.tree.map(jnp.add, acc_m, metrics)), None

    zeros_g = constrain(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))
    zeros_m = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
    (grads, metrics), _ = jax.lax.scan(micro_step, (zeros_g, zeros_m), mini)
    return grads, metrics


def train_step(state: TrainState, batch, model_cfg: ModelConfig, config: TrainConfig,
               mesh=None, grad_shardings=None):
    """epochs x mini_batches guarded AdamW updates on one collected batch.

    Returns (state, metrics): loss metrics averaged over the updates, `skipped` (updates
    skipped in this call), `skipped_total`, `grad_norm` (before clipping), `lr` (of this RL
    step: the schedule counts train_step calls, see ada/rl/optimizer.py).
    """
    if not config.on_policy and "old_logp" not in batch:
        raise ValueError("train batch has no old_logp but the update is off-policy "
                         f"(epochs={config.epochs}, mini_batches={config.mini_batches});"
                         " call add_logps first")
    check_batch(batch, config, mesh)
    K, M = config.mini_batches, config.micro_batches
    optimizer = make_optimizer(config.optim)
    lr = lr_schedule(config.optim)(state.step)  # one lr for all updates of this RL step
    minis = jax.tree.map(lambda x: _split(x, K, M, mesh), batch)  # [K, M, b, ...]

    def update(state: TrainState, mini):
        grads, metrics = minibatch_grads(state.params, mini, model_cfg, config, mesh,
                                         grad_shardings)
        ok = jnp.isfinite(metrics["loss"]) & all_finite(grads)
        trained, frozen = lora.split(state.params)
        trained, opt_state = guarded_update(optimizer, grads, state.opt_state, trained, ok, lr)
        params = lora.join(trained, frozen)
        metrics = dict(metrics, grad_norm=optax.tree.norm(grads),
                       skipped=(~ok).astype(jnp.float32))
        okint = ok.astype(jnp.int32)
        state = state.replace(params=params, opt_state=opt_state,
                              updates=state.updates + okint, skipped=state.skipped + 1 - okint)
        return state, metrics

    def epoch(state, _):
        return jax.lax.scan(update, state, minis)

    state, metrics = jax.lax.scan(epoch, state, None, length=config.epochs)  # [E, K]
    out = {k: jnp.mean(v) for k, v in metrics.items()}
    out["skipped"] = jnp.sum(metrics["skipped"])
    out["skipped_total"] = state.skipped.astype(jnp.float32)
    out["lr"] = lr
    return state.replace(step=state.step + 1), out


def compute_logp(params, batch, model_cfg: ModelConfig, config: TrainConfig, mesh=None):
    """Per-token log-probs [B, T] by the training forward pass, in K x M sequential groups
    (the training micro-batch size, so whatever trains also fits here)."""
    G = config.mini_batches * config.micro_batches
    keys = ("tokens", "positions", "mask")
    inputs = {k: batch[k] for k in keys}
    check_batch(inputs, config, mesh, required=keys)
    groups = jax.tree.map(lambda x: _split(x, 1, G, mesh)[0], inputs)  # [G, b, ...]

    def one(micro):
        return token_logp(params, model_cfg, micro, chunk=config.logit_chunk, mesh=mesh,
                          temperature=config.temperature,
                          unroll=config.unroll(model_cfg))[0]

    return _merge(jax.lax.map(one, groups)[None])


def compute_logps(params, ref_params, batch, model_cfg: ModelConfig, config: TrainConfig,
                  mesh=None) -> dict[str, jax.Array]:
    """The log-probs the update needs besides its own: old_logp from `params` when off-policy,
    ref_logp when loss.kl_coef > 0 from the frozen `ref_params`, or under LoRA from the base
    inside `params`, adapters off (empty dict when neither)."""
    needed = {}
    if not config.on_policy:
        needed["old_logp"] = params
    if config.loss.kl_coef > 0:
        needed["ref_logp"] = lora.base(params) if config.lora.rank else ref_params
    return {k: compute_logp(p, batch, model_cfg, config, mesh) for k, p in needed.items()}


def response_logp(params, batch, model_cfg: ModelConfig, config: TrainConfig, mesh=None):
    """[B] log-probability of each row's response, summed over its tokens (what the update
    diagnostics compare before and after an update)."""
    logp = compute_logp(params, batch, model_cfg, config, mesh)
    return jnp.sum(logp * batch["response_mask"], axis=-1)


# ----------------------------------------------------------------------------- jit + shardings


@dataclasses.dataclass(frozen=True)
class TrainFns:
    """The jitted update and log-prob functions for one (model, train config, mesh).

    Without a mesh everything lives on the default device. With one, parameters and Adam
    moments follow ada/sharding.py, the batch is split over data x fsdp, metrics are
    replicated, and the state passed to `train_step` is donated (do not reuse it).
    """

    model: ModelConfig
    config: TrainConfig
    mesh: Any
    state_sharding: Any
    train_step: Any  # (state, batch) -> (state, metrics)
    logps: Any  # (params, ref_params, batch) -> {old_logp, ref_logp} as needed (compute_logps)
    response_logp: Any  # (params, batch) -> [B] each response's log-prob (response_logp)
    _init: Any

    def init_state(self, params) -> TrainState:
        """The state of the base `params`, with adapters added under LoRA (the base cast to
        the compute dtype where it lies: on the host for a host copy)."""
        params = lora.attach(params, self.config.lora, self.model.compute_dtype)
        if self.mesh is not None:
            params = jax.device_put(params, self.state_sharding.params)
        return self._init(params)

    def shard_batch(self, batch):
        """Canonical dtypes (so a float64 or weakly typed input never recompiles), placed
        on the mesh."""
        batch = {k: jnp.asarray(v, BATCH_DTYPES.get(k)) for k, v in batch.items()}
        return batch if self.mesh is None else shd.shard_batch(batch, self.mesh)

    def add_logps(self, state: TrainState, batch, ref_params=None):
        """The batch with old_logp (off-policy) and ref_logp (kl_coef > 0, from the frozen
        `ref_params`, placed like the policy params; under LoRA from the base in the state,
        and `ref_params` is not needed) in one call; call right after collection, before the
        parameters move."""
        kl_coef = self.config.loss.kl_coef
        if not self.config.reference_copy:
            ref_params = None  # unused (none, or LoRA's: the base in state.params)
        elif ref_params is None:
            raise ValueError(f"loss.kl_coef={kl_coef} needs reference params for ref_logp: "
                             "pass ref_params (e.g. the initial policy), or set kl_coef=0")
        return dict(batch, **self.logps(state.params, ref_params, batch))


def abstract_state(model_cfg: ModelConfig, config: TrainConfig) -> TrainState:
    """ShapeDtypeStructs of the train state (no memory is allocated)."""
    dtype = jnp.dtype(model_cfg.param_dtype)
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, dtype), param_shapes(model_cfg),
                          is_leaf=lambda x: isinstance(x, tuple))
    return jax.eval_shape(lambda p: init_state(
        lora.attach(p, config.lora, model_cfg.compute_dtype), config), params)


def make_train_fns(model_cfg: ModelConfig, config: TrainConfig, mesh=None) -> TrainFns:
    """Build (once per model, config and mesh) the jitted train step and log-prob pass."""
    return _make_train_fns(model_cfg, config, mesh)


@functools.lru_cache(maxsize=32)
def _make_train_fns(model_cfg: ModelConfig, config: TrainConfig, mesh) -> TrainFns:
    step = functools.partial(train_step, model_cfg=model_cfg, config=config, mesh=mesh)
    logps = functools.partial(compute_logps, model_cfg=model_cfg, config=config, mesh=mesh)
    resp = functools.partial(response_logp, model_cfg=model_cfg, config=config, mesh=mesh)
    init = functools.partial(init_state, config=config)
    if mesh is None:
        return TrainFns(model_cfg, config, None, None, jax.jit(step, donate_argnums=0),
                        jax.jit(logps), jax.jit(resp), jax.jit(init))

    abstract = abstract_state(model_cfg, config)
    p_sh = shd.param_shardings(abstract.params, mesh)
    replicated = NamedSharding(mesh, P())
    state_sh = TrainState(
        params=p_sh,
        opt_state=shd.state_shardings(abstract.opt_state, p_sh, abstract.params, mesh),
        step=replicated, updates=replicated, skipped=replicated,
    )
    batch_sh = NamedSharding(mesh, P(shd.BATCH_AXES))
    step = functools.partial(step, grad_shardings=p_sh)
    return TrainFns(
        model_cfg, config, mesh, state_sh,
        jax.jit(step, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, replicated),
                donate_argnums=0),
        jax.jit(logps, in_shardings=(p_sh, p_sh if config.reference_copy else None, batch_sh),
                out_shardings=batch_sh),
        jax.jit(resp, in_shardings=(p_sh, batch_sh), out_shardings=batch_sh),
        jax.jit(init, in_shardings=(p_sh,), out_shardings=state_sh),
    )


def train_flops_per_token(model_cfg: ModelConfig, seq_len: int) -> float:
    """Model FLOPs of one training token (forward + backward = 3x forward), excluding remat
    recomputation: 6 per weight used in a matmul, plus attention scores and mixing (full
    T x T, as the model computes it)."""
    c = model_cfg
    qd, kvd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = c.hidden_size * (2 * qd + 2 * kvd) + 3 * c.hidden_size * c.intermediate_size
    matmul_weights = c.num_layers * per_layer + c.hidden_size * c.vocab_size
    attention = c.num_layers * 2 * 2 * seq_len * qd  # QK^T and PV, forward
    return 6.0 * matmul_weights + 3.0 * attention
