"""Serve an ada policy with JetStream: `jetstream.engine.engine_api.Engine` over ada's engine.

Optional extra (`pip install ada[jetstream]`, google-jetstream 0.2.2); jetstream is imported
only when this module is. The mapping onto ada.sampling.engine:

  prefill   JetStream hands a right-padded [T] prompt (T a power of two >= 16) and its
            true length; it is rolled to ada's left padding on the device and prefilled
            into a 1-row prefix. A BOS JetStream prepends is masked out when the tokenizer
            has none (bos_id -1), so Qwen-style prompts stay as given.
  insert    ada's insert, with the request's key fold_in(fold_in(step_key, n), 0) where n
            counts prefills (JetStream requests carry no prompt id).
  generate  one decode step for every slot (chunk of 1), returned as ResultTokens
            [B, token | valid | length]; EOS / the engine's max new tokens end a slot on the
            device (valid=False after), and JetStream's max_tokens is applied by its
            detokenizer.

The paged engine (sampling.kv_cache=paged, `ada-serve --kv_cache paged`) is served by
`PagedJetStreamEngine`, with every slot's worst case reserved; `jetstream_engine` picks.

A prompt longer than the engine's prefill (its max_prompt_len) is refused by
`LimitedOrchestrator`, JetStream's gRPC servicer with a length check before a request is
queued: INVALID_ARGUMENT naming the limit; or, under truncate="left" (ada-serve
--truncate=left), JetStream keeps its last tokens and the response's initial metadata says so
(`ada-prompt-truncated: N->LIMIT`). JetStream alone keeps the end silently.

Compat: jetstream 0.2.2's orchestrator calls `jax.tree_map`, removed from current jax;
importing this module points its `delete_pytree` at `jax.tree.leaves`, and removes the
DEBUG stdout handler the orchestrator installs on the root logger at import.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

_root_level = logging.getLogger().level
import grpc  # noqa: E402
from jetstream.core import orchestrator as _orchestrator  # noqa: E402
from jetstream.engine import engine_api, token_utils, tokenizer_api, tokenizer_pb2  # noqa: E402

from ada.sampling.engine import Engine, Prefix, prefill_fn  # noqa: E402


def _delete_pytree(p):
    for leaf in jax.tree.leaves(p):
        if isinstance(leaf, jax.Array):
            leaf.delete()


if not hasattr(jax, "tree_map"):
    _orchestrator.delete_pytree = _delete_pytree
# The orchestrator module adds a DEBUG stdout handler to the root logger on import; undo it.
logging.getLogger().removeHandler(getattr(_orchestrator, "handler", None))
logging.getLogger().setLevel(_root_level)


@struct.dataclass
class JetPrefix:
    prefix: Prefix  # one row
    key: jax.Array  # [2] uint32: the request's base key


class TokenizerAdapter(tokenizer_api.Tokenizer):
    """JetStream's tokenizer API over an ada tokenizer (decode, eos_ids, pad_id, optional
    encode and bos_id)."""

    def __init__(self, tokenizer, max_prefill_length: int):
        self._tok = tokenizer
        self._max = max_prefill_length

    def encode(self, s: str, **kwargs):
        if not hasattr(self._tok, "encode"):
            raise ValueError("text requests need a tokenizer with encode(); send token ids")
        ids = np.asarray(self._tok.encode(s), np.int32)
        return token_utils.pad_tokens(
            ids, self.bos_id, self.pad_id, is_bos=kwargs.get("is_bos", True),
            max_prefill_length=kwargs.get("max_prefill_length", self._max),
            jax_padding=kwargs.get("jax_padding", True))

    def decode(self, token_ids: list[int], **kwargs) -> str:
        return self._tok.decode(list(token_ids))

    @property
    def pad_id(self) -> int:
        return int(getattr(self._tok, "pad_id", 0) or 0)

    @property
    def eos_id(self) -> int:
        eos = tuple(getattr(self._tok, "eos_ids", ()))
        return eos[0] if eos else -1

    @property
    def bos_id(self) -> int:
        bos = getattr(self._tok, "bos_id", None)
        return -1 if bos is None else int(bos)  # -1: masked out by prefill

    @property
    def stop_tokens(self) -> set[int]:
        return set(getattr(self._tok, "eos_ids", ()))


def _prefill_right_padded(params, tokens_T, true_length, *, config):
    """Roll a right-padded prompt to left padding; negative ids (a missing BOS) are masked."""
    T = tokens_T.shape[0]
    shift = T - true_length
    tokens = jnp.roll(tokens_T, shift)
    mask = (jnp.arange(T) >= shift) & (tokens >= 0)
    tokens = jnp.where(mask, tokens, 0)
    return prefill_fn(params, tokens[None], mask[None], config=config)


class JetStreamEngine(engine_api.Engine):
    """A JetStream Engine backed by an ada `Engine` (samples_per_slot = 1)."""

    def __init__(self, engine: Engine, params, tokenizer, step_key: Any = 0):
        self.engine = engine
        self._params = params
        self._tokenizer = tokenizer
        if isinstance(step_key, int | np.integer):
            step_key = jax.random.PRNGKey(int(step_key))
        self.step_key = step_key
        self._counter = itertools.count()
        self._mesh = engine.mesh or Mesh(np.asarray(jax.devices()[:1]), ("data",))
        self._prefill = jax.jit(
            lambda p, t, n: _prefill_right_padded(p, t, n, config=engine.config))
        self._key = jax.jit(lambda k, n: jax.random.fold_in(jax.random.fold_in(k, n), 0))

    def load_params(self, *args, **kwargs):
        return self.engine.prepare_params(self._params)

    def prefill(self, *, params, existing_prefix=None, padded_tokens, true_length: int) -> JetPrefix:
        if existing_prefix is not None:
            raise NotImplementedError("prefix continuation (existing_prefix) is not supported")
        if int(true_length) < 1:
            raise ValueError(f"true_length={true_length} must be >= 1")
        # JetStream keeps the last T tokens of a longer prompt but reports its full length;
        # clamp it (a raise here would end the server).
        true_length = min(int(true_length), padded_tokens.shape[-1])
        prefix = self._prefill(params, jnp.asarray(padded_tokens, jnp.int32), jnp.int32(true_length))
        key = self._key(self.step_key, jnp.uint32(next(self._counter)))
        return JetPrefix(prefix=prefix, key=key)

    def insert(self, prefix: JetPrefix, decode_state, slot: int):
        return self.engine.insert(prefix.prefix, decode_state, slot, key=prefix.key)

    def generate(self, params, decode_state):
        state, chunk = self.engine.generate(params, decode_state, num_steps=1,
                                            num_slots=self.engine.num_slots)
        data = jnp.concatenate(
            [chunk.tokens, chunk.valid.astype(jnp.int32), state.generated[:, None]], axis=-1)
        return state, engine_api.ResultTokens(
            data=data, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3),
            samples_per_slot=1)

    def init_decode_state(self, *args, **kwargs):
        return self.engine.init_decode_state()

    def get_prefix_destination_sharding(self) -> Any:
        return NamedSharding(self._mesh, P())

    def get_tokenizer(self) -> tokenizer_pb2.TokenizerParameters:
        return tokenizer_pb2.TokenizerParameters(path="ada", extra_ids=0)

    def build_tokenizer(self, metadata) -> TokenizerAdapter:
        return TokenizerAdapter(self._tokenizer, self.max_prefill_length)

    @property
    def max_concurrent_decodes(self) -> int:
        return self.engine.num_slots

    @property
    def samples_per_slot(self) -> int:
        return 1

    @property
    def max_prefill_length(self) -> int:
        return self.engine.max_prompt_len

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def colocated_cpus(self):
        return None


@struct.dataclass
class PagedJetPrefix:
    tokens: jax.Array  # [T] int32: the prompt, right-padded
    length: jax.Array  # [] int32: its true length
    number: jax.Array  # [] uint32: the request's number (its key: request_key(step_key, n, 0))


class PagedJetStreamEngine(JetStreamEngine):
    """JetStream over a paged.PagedEngine (sampling.kv_cache=paged). JetStream's
    orchestrator picks a slot and inserts into it with no say over memory, so the engine's
    default pool reserves every slot's worst case (nothing is ever deferred or preempted).
    `prefill` only reads the prompt (a slot's pages live in the decode state, which a
    prefill does not see); `insert` takes the slot's pages back from its last request,
    prefills the prompt into pages of the slot's data shard and attaches the slot to them
    (paged.PagedEngine.prefill / attach, the Driver's own calls). The keys are the dense
    adapter's: request n draws with request_key(step_key, n, 0)."""

    def __init__(self, engine, params, tokenizer, step_key: Any = 0):
        from ada.sampling.pages import PageAllocator

        if not engine.full_reservation:
            raise ValueError("serving the paged cache needs its default pool (num_pages=0): "
                             "JetStream cannot defer a request whose pages do not fit")
        super().__init__(engine, params, tokenizer, step_key)
        self.alloc = PageAllocator(engine.num_pages, engine.page_size, engine.num_slots,
                                   engine.pages_per_slot, shards=engine.pool_shards)
        self._prepared = None

    def load_params(self, *args, **kwargs):
        self._prepared = self.engine.prepare_params(self._params)  # insert has no params
        return self._prepared

    def prefill(self, *, params, existing_prefix=None, padded_tokens,
                true_length: int) -> PagedJetPrefix:
        if existing_prefix is not None:
            raise NotImplementedError("prefix continuation (existing_prefix) is not supported")
        if int(true_length) < 1:
            raise ValueError(f"true_length={true_length} must be >= 1")
        tokens = np.asarray(padded_tokens, np.int32)
        n = min(int(true_length), tokens.shape[-1])
        return PagedJetPrefix(tokens=tokens, length=np.int32(n),
                              number=np.uint32(next(self._counter)))

    def insert(self, prefix: PagedJetPrefix, decode_state, slot: int):
        e, a = self.engine, self.alloc
        tokens = np.asarray(prefix.tokens)[:int(prefix.length)]
        prompt = [int(t) for t in tokens if t >= 0]  # a BOS JetStream prepends as -1: none
        if a.num_held[slot]:
            a.free(slot)
        pages = a.alloc_prompt(len(prompt), a.shard_of(slot))
        state, logits = e.prefill(self._prepared, decode_state, [prompt], [pages])
        state = e.attach(state, logits, a.attach(slot, pages, e.max_new_tokens), [slot], [0],
                         [len(prompt)], self.step_key, [int(prefix.number)], [0],
                         [e.max_new_tokens])
        a.release_prompt(pages)  # the slot keeps its references
        return state

    def generate(self, params, decode_state):
        e = self.engine
        state, chunk = e.generate(params, decode_state, self.alloc.table, e.cache_len,
                                  num_steps=1)
        data = jnp.concatenate(
            [chunk.tokens, chunk.valid.astype(jnp.int32), state.generated[:, None]], axis=-1)
        return state, engine_api.ResultTokens(
            data=data, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3),
            samples_per_slot=1)


def jetstream_engine(engine, params, tokenizer, step_key: Any = 0) -> JetStreamEngine:
    """The JetStream Engine over either of ada's engines (dense or paged)."""
    from ada.sampling.paged import PagedEngine

    cls = PagedJetStreamEngine if isinstance(engine, PagedEngine) else JetStreamEngine
    return cls(engine, params, tokenizer, step_key)


TRUNCATED_KEY = "ada-prompt-truncated"  # initial metadata of a truncated request: "N->LIMIT"


class LimitedOrchestrator(_orchestrator.LLMOrchestrator):
    """JetStream's servicer that refuses (INVALID_ARGUMENT) a prompt of more than `limit`
    tokens (`count(text)` for a text request), or under truncate="left" lets JetStream keep
    its last `limit` tokens and tells the client in the initial metadata."""

    def __init__(self, driver, *, limit: int, count, truncate: str | None = None):
        super().__init__(driver=driver)
        self.limit, self.count, self.truncate = int(limit), count, truncate

    async def Decode(self, request, context=None):  # noqa: N802 - gRPC's name
        which = request.WhichOneof("content")
        n = (len(self.count(request.text_content.text)) if which == "text_content" else
             len(request.token_content.token_ids))
        if n > self.limit:
            if self.truncate != "left":
                await _orchestrator._abort_or_raise(
                    context=context, code=grpc.StatusCode.INVALID_ARGUMENT,
                    details=f"the prompt has {n} tokens; this server takes at most {self.limit} "
                            "(ada-serve --max_prompt_len); shorten it, or start the server with "
                            f"--truncate=left to keep its last {self.limit} tokens")
                return
            if context is not None:
                await context.send_initial_metadata(((TRUNCATED_KEY, f"{n}->{self.limit}"),))
        async for response in super().Decode(request, context):
            yield response
