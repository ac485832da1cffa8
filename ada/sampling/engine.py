"""The decode engine: jitted prefill / insert / generate over a fixed pool of slots.

This is the JetStream contract (`prefill(params, prompt) -> prefix`,
`insert(prefix, state, slot) -> state`, `generate(params, state) -> (state, tokens)`) over
the model's KV cache:

  prefill   N prompts, left-padded to a power-of-two bucket P, run once into an
            [N, P] cache; the prefix keeps each row's next-token logits.
  insert    copies one prefix row (k/v/valid/end, logits) into one decode slot and sets that
            slot's request (key, max new tokens). A prompt sampled M times is prefilled once
            and inserted into M slots. The slot is a traced index: refilling a finished slot
            never recompiles (continuous batching). `insert_many` does a refill's requests
            in one call (the driver's path). The slot functions are in slots.py.
  generate  a chunk of K decode steps for the first `b` slots under `lax.scan` (sample from
            the slot's logits, then run the model on the sampled token). No host round trip
            inside the chunk; the host looks at the [b, K] tokens once per chunk.

Each slot stops on the device at an EOS id, a turn-end id or at its max new tokens (its later
tokens come back with valid=False); the driver (driver.py) only reads that off.

  extend    a multi-turn request (`turn_end_ids`): after its turn ended at a turn-end id its
            slot keeps its cache, inactive; `extend` appends the observation's tokens at
            the slot's write index and RoPE position (one prefill of those tokens only,
            slots.extend_fn) and resumes it from the logits after the last one.

Randomness: token i of request (prompt_id, sample_idx) is drawn with
fold_in(fold_in(fold_in(step_key, prompt_id), sample_idx), i), so a response does not
depend on its slot, its round, or its neighbours (up to float rounding across shapes).

Shapes are bucketed: prompt length (powers of two from `min_prompt_bucket` to
`max_prompt_len`), prefill rows (powers of two up to `num_slots`), active slot count
(powers of two up to `num_slots`) and, for `generate`, the attention window (`num_windows`
equal steps of the cache length: a chunk reads only the cache front its slots have filled).
`Engine.compiles()` reports the compilations made (from jit's own caches, not an
estimate). A shorter window sums attention in another order, so like a slot bucket it can
move logits in the last bits: equality is exact within one (slot, window) bucket.

Decode cache layout (ada.models.KVCache): per layer, keys and values alike [B, K, S, Hd]
(head dim minor: the TPU's dots and the in-place scatter read it where it lies, so a decode
step copies no cache-sized buffer; tests/test_decode_hlo.py), with S = largest prompt bucket
+ max_new_tokens; a prompt of bucket P occupies positions [0, P) (left padded), generated
tokens follow.

Params: `prepare_params` (engine_base.py, the paged engine's too) brings them once per
set of weights, in one jitted call,
from wherever they lie (the train mesh; the host or one device, put onto their shards
first) to the engine's mesh as `sampling_params`: the compute dtype, one buffer per layer,
and on CPU a [D, V] copy of a tied embedding for the unembedding (`backend_choices`,
ada.models.decode_params), read by each decode step where it lies. One more copy of the
weights (in bfloat16, half the master's bytes); the stacked form also works, slower on CPU.

Sampling over a vocabulary split across the tensor axis keeps its blocks inside each shard
(`vocab_shards`, samplers.inverse_cdf): the [slots, V] logits are never gathered.

`generate` compiles with XLA:CPU's default options. (With YNNPACK's fusions off, as an earlier
machine with a 32 MB L3 preferred, the step ran ~11% slower on the 2026-12-05 machine under
the current cache layout: docs/results.md, "Decode engine".)
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding

from ada import sharding as shd
from ada.models.transformer import (
    KVCache,
    ModelConfig,
    forward,
    init_cache,
    positions_from_mask,
    project_logits,
)
from ada.sampling.dense_host import DenseSlots
from ada.sampling.engine_base import EngineBase
from ada.sampling.samplers import SamplingConfig, sample_and_stop
from ada.sampling.slots import (
    DecodeState,
    Prefix,
    bucket_for,
    extend_fn,
    insert_fn,
    insert_many_fn,
    move_fn,
    pow2_buckets,
    put_rows,
    request_key,
    take_rows,
)


@struct.dataclass
class Chunk:
    """The result of K decode steps for b slots."""

    tokens: jax.Array  # [b, K] int32
    logprobs: jax.Array  # [b, K] float32: the policy's, untruncated by top-k / top-p (samplers)
    valid: jax.Array  # [b, K] bool: token belongs to the response
    active: jax.Array  # [b] bool: slot still generating after the chunk
    window: int = struct.field(pytree_node=False, default=0)  # cache positions attended


# ----------------------------------------------------------------------------- pure functions


@dataclasses.dataclass(frozen=True)
class BackendChoices:
    """How sampling lays out its weights and decode step on one backend: the one place
    these per-backend choices are made (`backend_choices`)."""

    # Hold a transposed [D, V] copy of a tied embedding for the unembedding. XLA:CPU's dot
    # reads [D, V] ~1.7x faster than it contracts against the [V, D] embedding; the TPU's
    # matmul reads [V, D] as it lies (no relayout, the same bytes per step), so there the
    # embedding is held once.
    unembed_copy: bool
    # Decode attends to the cache before the step's write (ada.models.forward's
    # read_then_write): on TPU the cache then streams from HBM with the write in place; on
    # XLA:CPU it would copy every layer's loop-carried cache per step.
    read_then_write: bool
    # The paged cache's decode attention: the Pallas ragged_paged_attention kernel on TPU (it
    # reads each slot's pages up to its length); the pure-JAX gather elsewhere.
    paged_attention: str


def backend_choices(platform: str) -> BackendChoices:
    """The choices for a backend ("cpu", "tpu", "gpu"...): docs/results.md, "Decode on TPU".
    Backends other than XLA:CPU take the TPU's (measured there, compiled ahead of time)."""
    cpu = platform == "cpu"
    return BackendChoices(unembed_copy=cpu, read_then_write=not cpu,
                          paged_attention="kernel" if platform == "tpu" else "gather")


def check_stop_ids(eos_ids, turn_end_ids, config: ModelConfig, problems: list) -> tuple:
    """The engines' EOS and turn-end ids as int tuples; ids outside the vocabulary go to
    `problems`."""
    out = []
    for name, ids in (("eos_ids", eos_ids), ("turn_end_ids", turn_end_ids)):
        ids = tuple(int(e) for e in ids)
        bad = [e for e in ids if not 0 <= e < config.vocab_size]
        if bad:
            problems.append(f"{name} {bad} are outside the vocabulary [0, {config.vocab_size})")
        out.append(ids)
    return tuple(out)


def sampler_layout(config: ModelConfig, num_slots: int, mesh) -> tuple[BackendChoices, int]:
    """A sampler's backend choices (from its devices' platform) and the number of shards its
    [slots, V] logits' vocabulary is split into on `mesh` (samplers.inverse_cdf)."""
    devices = list(mesh.devices.flat) if mesh is not None else jax.local_devices()[:1]
    on_cpu = all(d.platform == "cpu" for d in devices)
    choices = backend_choices("cpu" if on_cpu else next(iter(devices)).platform)
    if mesh is None:
        return choices, 1
    vocab = shd.spec_for(("batch", "vocab"), (num_slots, config.vocab_size), mesh)[1]
    return choices, math.prod(mesh.shape[a] for a in
                              ((vocab,) if isinstance(vocab, str) else vocab or ()))


def prefill_fn(params, tokens_NxP, mask_NxP, *, config: ModelConfig) -> Prefix:
    """Run N left-padded prompts into an [N, P] cache; keep the last position's logits."""
    N, Pl = tokens_NxP.shape
    positions = positions_from_mask(mask_NxP)
    cache = init_cache(config, N, Pl)
    hidden, cache = forward(
        params, config, tokens_NxP, positions, mask_NxP, cache, return_hidden=True
    )
    logits = project_logits(params, config, hidden[:, -1:])[:, 0]
    return Prefix(cache=cache, logits=logits, lengths=mask_NxP.sum(-1).astype(jnp.int32))


def decode_step(params, state: DecodeState, *, config: ModelConfig, sampling: SamplingConfig,
                eos_ids: tuple[int, ...], window: int | None = None, vocab_shards: int = 1,
                read_then_write: bool = False, turn_end_ids: tuple[int, ...] = ()):
    """Sample one token per slot from its logits, then run the model on it (attending to
    cache positions [0, window) only). vocab_shards: the logits' vocabulary shards
    (samplers.inverse_cdf); read_then_write: ada.models.forward's."""
    tokens_B, logprobs_B, valid_B, generated, active = sample_and_stop(
        state, sampling, eos_ids, vocab_shards, turn_end_ids)
    logits, cache = forward(
        params, config, tokens_B[:, None], state.positions[:, None], valid_B[:, None],
        state.cache, attend_len=window, read_then_write=read_then_write,
    )
    # Inactive slots do not advance, so an idle slot never runs off the end of its cache.
    cache = cache.replace(end=jnp.where(valid_B, cache.end, state.cache.end))
    new_state = state.replace(
        cache=cache,
        logits=logits[:, 0],
        positions=state.positions + valid_B.astype(jnp.int32),
        generated=generated,
        active=active,
    )
    return new_state, (tokens_B, logprobs_B, valid_B)


def generate_fn(params, state: DecodeState, *, config: ModelConfig, sampling: SamplingConfig,
                eos_ids: tuple[int, ...], num_steps: int, num_slots: int,
                window: int | None = None, constrain=None, vocab_shards: int = 1,
                read_then_write: bool = False, turn_end_ids: tuple[int, ...] = ()
                ) -> tuple[DecodeState, Chunk]:
    """K = num_steps decode steps for the first num_slots slots under lax.scan, attending
    to cache positions [0, window) (every live slot must end the chunk inside it)."""
    part = take_rows(state, num_slots) if num_slots < state.active.shape[0] else state

    def body(s, _):
        return decode_step(params, s, config=config, sampling=sampling, eos_ids=eos_ids,
                           window=window, vocab_shards=vocab_shards,
                           read_then_write=read_then_write, turn_end_ids=turn_end_ids)

    part, (tok_KxB, lp_KxB, valid_KxB) = jax.lax.scan(body, part, None, length=num_steps)
    new_state = put_rows(state, part)
    if constrain is not None:
        new_state = constrain(new_state)
    chunk = Chunk(tokens=tok_KxB.T, logprobs=lp_KxB.T, valid=valid_KxB.T, active=part.active,
                  window=state.cache.max_len if window is None else window)
    return new_state, chunk


# ----------------------------------------------------------------------------- the engine


class Engine(EngineBase):
    """Bucketed, jitted prefill / insert / generate for one model config.

    Args:
      config: the model config.
      num_slots: B, the decode pool size.
      max_prompt_len: longest prompt accepted (rounded up to a power-of-two bucket).
      max_new_tokens: the cap on any request's new tokens (sets the cache length).
      sampling: the SamplingConfig (static: one compile per setting).
      eos_ids: token ids that end a response (on the device).
      turn_end_ids: token ids that end a turn of a multi-turn request (a tool call's end
        marker): the slot stops there on the device and keeps its cache until the Driver
        extends it (`extend`) or ends it. () (the default): the programs are those without.
      chunk_size: K, decode steps per `generate` call.
      max_prefill_rows: the most prompts one prefill call takes (row buckets are the
        powers of two up to it).
      mesh: optional (data, fsdp, tensor) mesh (`ada.sharding.local_mesh` for a sampler);
        params and the decode state are laid out by ada.sharding's tables (slots like a
        batch).
      slot_bucketing: compile `generate` for power-of-two slot counts too, so the tail of
        a round runs on fewer slots (off where the mesh splits slots over data).
      num_windows: attention-window buckets of `generate`: the cache length S split into
        this many equal steps. A chunk whose live slots have filled at most w positions
        attends to the smallest window >= w + chunk_size instead of all S, so short
        responses in a long cache do not pay for its empty tail (decode attention is
        memory-bound). 1 turns it off. Compiles of `generate` are bounded by
        slot buckets x windows.
    """

    def __init__(self, config: ModelConfig, *, num_slots: int, max_prompt_len: int,
                 max_new_tokens: int, sampling: SamplingConfig | None = None, eos_ids=(),
                 chunk_size: int = 8, min_prompt_bucket: int = 16, mesh: Mesh | None = None,
                 slot_bucketing: bool = True, max_prefill_rows: int = 8, num_windows: int = 4,
                 turn_end_ids=()):
        problems = []
        for name, value in (("num_slots", num_slots), ("max_prompt_len", max_prompt_len),
                            ("max_new_tokens", max_new_tokens), ("chunk_size", chunk_size),
                            ("num_windows", num_windows)):
            if int(value) <= 0:
                problems.append(f"{name}={value} must be positive")
        eos_ids, turn_end_ids = check_stop_ids(eos_ids, turn_end_ids, config, problems)
        if problems:
            raise ValueError("invalid Engine settings: " + "; ".join(problems))
        self.config = config
        self.num_slots = int(num_slots)
        self.max_new_tokens = int(max_new_tokens)
        self.sampling = sampling = sampling or SamplingConfig()
        self.eos_ids, self.turn_end_ids = eos_ids, turn_end_ids
        self.chunk_size = int(chunk_size)
        self.mesh = mesh
        self.prompt_buckets = pow2_buckets(min(min_prompt_bucket, max_prompt_len), max_prompt_len)
        self.max_prompt_len = self.prompt_buckets[-1]
        self.cache_len = self.max_prompt_len + self.max_new_tokens
        # Slot buckets: powers of two up to B, on one batch shard only. Where slots are split
        # over data, the first b rows lie on the first shards, and a chunk on them moved every
        # layer's cache between chips (collective-permutes and all-gathers, compiled for
        # v5e); there a chunk always runs every slot.
        shards = 1
        if mesh is not None:
            shd.check_batch_size(self.num_slots, mesh, what="num_slots")
            shards = shd.batch_shards(mesh)
        slot_buckets = [b for b in pow2_buckets(1, self.num_slots)
                        if b < self.num_slots] if slot_bucketing and shards == 1 else []
        self.slot_buckets = tuple(slot_buckets) + (self.num_slots,)
        self.row_buckets = pow2_buckets(1, max(1, min(int(max_prefill_rows), self.num_slots)))
        step = -(-self.cache_len // int(num_windows))
        self.window_buckets = tuple(sorted({min(step * i, self.cache_len)
                                            for i in range(1, int(num_windows) + 1)}))

        self._prefill = jax.jit(functools.partial(prefill_fn, config=config))
        # A partial per engine: jit caches (and so compiles()) are per engine, not shared.
        self._insert = jax.jit(functools.partial(insert_fn), donate_argnums=(1,))
        self._insert_many = jax.jit(functools.partial(insert_many_fn), donate_argnums=(1,))
        self.insert_buckets = pow2_buckets(1, self.num_slots)
        self.append_buckets = pow2_buckets(self.prompt_buckets[0], self.cache_len)
        self._extend = jax.jit(functools.partial(
            extend_fn, config=config, constrain=self._constrain if mesh is not None else None),
            donate_argnums=(1,))
        self._move = jax.jit(functools.partial(move_fn), donate_argnums=(0,))
        self.choices, self.vocab_shards = sampler_layout(config, self.num_slots, mesh)
        self._generate = jax.jit(
            functools.partial(generate_fn, config=config, sampling=sampling, eos_ids=eos_ids,
                              turn_end_ids=turn_end_ids,
                              constrain=self._constrain if mesh is not None else None,
                              vocab_shards=self.vocab_shards,
                              read_then_write=self.choices.read_then_write),
            static_argnames=("num_steps", "num_slots", "window"), donate_argnums=(1,))
        self._request_key = jax.jit(request_key)
        self._jit_shared()

    def driver_backend(self, driver):
        """The Driver's host side over this engine: a prefix LRU, refills by insert_many,
        slot buckets and tail compaction (dense_host.DenseSlots)."""
        return DenseSlots(driver)

    # -- sharding ------------------------------------------------------------

    def state_shardings(self) -> DecodeState:
        """NamedShardings of the decode state from ada.sharding's tables: slots split like
        a batch (data x fsdp), KV heads and vocabulary over tensor where they divide."""
        assert self.mesh is not None
        c, B, S = self.config, self.num_slots, self.cache_len
        ns = lambda logical, shape: NamedSharding(self.mesh, shd.spec_for(logical, shape, self.mesh))
        kv_spec = ns(("batch", "kv_heads", "seq", "head_dim"), (B, c.num_kv_heads, S, c.head_dim))
        vec = ns(("batch",), (B,))
        L = c.num_layers
        return DecodeState(
            cache=KVCache(k=(kv_spec,) * L, v=(kv_spec,) * L, valid=ns(("batch", "seq"), (B, S)),
                          end=vec),
            logits=ns(("batch", "vocab"), (B, c.vocab_size)), positions=vec, generated=vec,
            max_new=vec, active=vec, keys=ns(("batch", None), (B, 2)),
        )

    # -- the contract (the rest is EngineBase's) ------------------------------

    def _empty_state(self) -> DecodeState:
        B, V = self.num_slots, self.config.vocab_size
        vec = lambda dtype=jnp.int32: jnp.zeros((B,), dtype)
        return DecodeState(cache=init_cache(self.config, B, self.cache_len),
                           logits=jnp.zeros((B, V), jnp.float32), positions=vec(),
                           generated=vec(), max_new=vec(), active=vec(bool),
                           keys=jnp.zeros((B, 2), jnp.uint32))

    def pad_prompts(self, prompts: list) -> tuple[np.ndarray, np.ndarray]:
        """Left-pad prompts into [N bucket, P bucket] tokens and mask (host side)."""
        for i, p in enumerate(prompts):
            why = self.check_prompt(p)
            if why:
                raise ValueError(f"prompt {i}: {why}")
        Pl = bucket_for(max(len(p) for p in prompts), self.prompt_buckets)
        if len(prompts) > self.row_buckets[-1]:
            raise ValueError(f"{len(prompts)} prompts in one prefill call; at most "
                             f"{self.row_buckets[-1]} (max_prefill_rows)")
        N = bucket_for(len(prompts), self.row_buckets)
        tokens = np.zeros((N, Pl), np.int32)
        mask = np.zeros((N, Pl), bool)
        mask[len(prompts):, -1] = True  # filler rows: one dummy token, never inserted
        for i, p in enumerate(prompts):
            tokens[i, Pl - len(p):] = p
            mask[i, Pl - len(p):] = True
        return tokens, mask

    def prefill(self, params, prompts: list) -> Prefix:
        """Prefill a list of prompts (token-id lists) once; row i is prompts[i]."""
        tokens, mask = self.pad_prompts(prompts)
        return self._prefill(params, tokens, mask)  # from the host to where params lie

    def insert(self, prefix: Prefix, state: DecodeState, slot: int, *, row: int = 0,
               key: jax.Array | None = None, max_new_tokens: int | None = None) -> DecodeState:
        """Insert prefix row `row` into `slot`. `key` is the request's base key
        (`request_key(step_key, prompt_id, sample_idx)`); `state` is donated."""
        if key is None:
            key = self.request_key(jax.random.PRNGKey(0), 0, 0)
        max_new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        return self._insert(prefix, state, jnp.int32(slot), jnp.int32(row), key,
                            jnp.int32(max_new))

    def insert_many(self, prefix: Prefix, state: DecodeState, slots, rows, step_key,
                    prompt_ids, sample_idxs, max_new_tokens) -> DecodeState:
        """insert() for many requests at once (equal to one insert each, in order), with
        the keys `request_key(step_key, prompt_ids[i], sample_idxs[i])`. The count is padded
        to a power of two by repeating the last request (an idempotent copy), so refills
        compile once per bucket."""
        n = len(slots)
        pad = bucket_for(n, self.insert_buckets) - n

        def arr(xs, dtype):
            xs = np.asarray(xs, dtype)
            return np.concatenate([xs, np.repeat(xs[-1:], pad)]) if pad else xs

        return self._insert_many(prefix, state, arr(slots, np.int32), arr(rows, np.int32),
                                 step_key, arr(prompt_ids, np.uint32),
                                 arr(sample_idxs, np.uint32), arr(max_new_tokens, np.int32))

    def request_key(self, step_key, prompt_id: int, sample_idx: int) -> jax.Array:
        return self._request_key(step_key, jnp.uint32(prompt_id), jnp.uint32(sample_idx))

    def generate(self, params, state: DecodeState, num_steps: int | None = None,
                 num_slots: int | None = None, filled: int | None = None
                 ) -> tuple[DecodeState, Chunk]:
        """Run a chunk of decode steps on the first `num_slots` slots (bucketed).

        filled: the most cache positions any live slot among them has filled (prompt
        bucket + tokens generated); the chunk then attends to the smallest window bucket
        holding filled + num_steps. None: the whole cache (no host bookkeeping needed).
        """
        K = self.chunk_size if num_steps is None else int(num_steps)
        b = bucket_for(self.num_slots if num_slots is None else max(1, num_slots),
                       self.slot_buckets)
        window = (self.cache_len if filled is None
                  else bucket_for(min(filled + K, self.cache_len), self.window_buckets))
        return self._generate(params, state, num_steps=K, num_slots=b, window=window)

    def extend(self, params, state: DecodeState, appends: dict, counts: list) -> DecodeState:
        """Append appends[slot] (token ids) to each slot's cache and resume it
        (slots.extend_fn); counts[i]: (generated, max_new) of the i-th slot's request, its
        tokens so far and its turn's end. Rows and lengths padded to power-of-two buckets."""
        slots, n = list(appends), len(appends)
        N = bucket_for(n, self.insert_buckets)
        T = bucket_for(max(map(len, appends.values())), self.append_buckets)
        tokens, lens = np.zeros((N, T), np.int32), np.zeros((N,), np.int32)
        slot_ids = np.full((N,), self.num_slots, np.int32)  # padding rows: no slot
        gen, max_new = np.zeros((2, N), np.int32)
        for i, slot in enumerate(slots):
            tokens[i, :len(appends[slot])], lens[i] = appends[slot], len(appends[slot])
            slot_ids[i], (gen[i], max_new[i]) = slot, counts[i]
        return self._extend(params, state, tokens, lens, slot_ids, gen, max_new)

    def move(self, state: DecodeState, src: int, dst: int) -> DecodeState:
        return self._move(state, jnp.int32(src), jnp.int32(dst))

    def compiles(self) -> dict[str, int]:
        """Compilations made so far, per function (jit's own cache sizes)."""
        out = {}
        for name in ("init", "prefill", "insert", "insert_many", "extend", "move", "generate"):
            fn = getattr(self, f"_{name}")
            out[name] = int(fn._cache_size())
        return out

    def num_buckets(self) -> dict[str, int]:
        """How many shape buckets each function can see (the bound on its compiles)."""
        return {"init": 1, "prefill": len(self.prompt_buckets) * len(self.row_buckets),
                "insert": len(self.prompt_buckets) * len(self.row_buckets),
                "insert_many": (len(self.prompt_buckets) * len(self.row_buckets)
                                * len(self.insert_buckets)),
                "extend": len(self.insert_buckets) * len(self.append_buckets),
                "move": 1, "generate": len(self.slot_buckets) * len(self.window_buckets)}
