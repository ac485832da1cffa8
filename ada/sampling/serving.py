"""A policy behind JetStream's gRPC server (`ada-serve`, ada/cli/serve.py): the run's tokenizer
as JetStream uses it, and the server over ada's engine (ada/sampling/jetstream_adapter.py).
Needs the extra `pip install 'ada[jetstream]'`, imported only when a server starts."""

from __future__ import annotations

from ada.templates import encode_prompt


class ServedTokenizer:
    """The run's tokenizer as JetStream uses it. A text is a problem rendered with the run's
    template, which adds BOS where the model wants one, so bos_id is None (ada's adapter
    then masks the BOS JetStream prepends). JetStream decodes one token at a time; decoding
    it after an anchor token keeps its leading space, which SentencePiece drops at the start
    of a text. Ids past the tokenizer (a padded embedding) are no text, as in the Driver."""

    bos_id = None

    def __init__(self, tokenizer, template: str):
        self.tokenizer, self.template = tokenizer, template
        self.eos_ids, self.pad_id = tokenizer.eos_ids, tokenizer.pad_id
        self.vocab_size = tokenizer.vocab_size
        self._anchor = next((i for i in range(self.vocab_size) if i not in tokenizer.special_ids
                             and _is_char(tokenizer.decode([i]))), None)
        self._skip = len(tokenizer.decode([self._anchor])) if self._anchor is not None else 0

    def encode(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, self.template, text)

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids if 0 <= i < self.vocab_size]
        if self._anchor is None:
            return self.tokenizer.decode(ids)
        return self.tokenizer.decode([self._anchor, *ids])[self._skip:]


def _is_char(text: str) -> bool:
    return len(text) == 1 and text.isalnum()


def serve(engine, params, tokenizer: ServedTokenizer, host: str, port: int, seed: int = 0,
          truncate: str | None = None):
    """Start JetStream's gRPC server (`server_lib.run`) on `engine` with `params`; returns
    the server. A prompt over the engine's max_prompt_len tokens is refused with
    INVALID_ARGUMENT, or with truncate="left" keeps its last tokens and the client is told
    (ada.sampling.jetstream_adapter.LimitedOrchestrator)."""
    import functools

    # The adapter first: it undoes the DEBUG logging JetStream's orchestrator turns on.
    from ada.sampling.jetstream_adapter import LimitedOrchestrator, jetstream_engine  # isort: skip
    from jetstream.core import config_lib, orchestrator, server_lib  # isort: skip

    jet = jetstream_engine(engine, params, tokenizer, step_key=seed)
    device = jet.mesh.devices.flat[0]
    server_config = config_lib.ServerConfig(interleaved_slices=(f"{device.platform}=1",),
                                            interleaved_engine_create_fns=(lambda _: jet,))
    # server_lib.run binds every interface ([::]) otherwise; an IPv6 address needs brackets.
    server_lib._HOST = f"[{host}]" if ":" in host and not host.startswith("[") else host
    # server_lib builds its servicer as orchestrator.LLMOrchestrator(driver=...): ours, while
    # it starts
    original = orchestrator.LLMOrchestrator
    orchestrator.LLMOrchestrator = functools.partial(
        LimitedOrchestrator, limit=engine.max_prompt_len, count=tokenizer.encode,
        truncate=truncate)
    try:
        return server_lib.run(port=port, config=server_config, devices=[device])
    finally:
        orchestrator.LLMOrchestrator = original
