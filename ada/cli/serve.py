"""`ada-serve` / `python -m ada.serve`: a trained run's policy, or a Hugging Face model,
behind JetStream's gRPC server (optional extra: `pip install 'ada[jetstream]'`).

    ada-serve --workdir runs/default --port 9000          # the run's latest checkpoint
    ada-serve --workdir runs/q7b --step 300 --port 9000
    ada-serve --model /models/Qwen2.5-Math-1.5B --template qwen25_math --port 9000

A text request is a problem: it is rendered with the run's prompt template and encoded by
the run's tokenizer, as training prompts were. A token request is prefilled as given and
answered with token ids. Decoding is greedy unless --temperature is set, on the engine ada
samples with (`ada.sampling.backends.make_engine`: this host's devices as the run's sampling.mesh, or
--mesh, lays them out) through `ada.sampling.serving`.
Bad input (no run or model, no checkpoint at --step, a port in use, the extra missing) ends
the command with one line `error: ...` and exit code 2 before any weight is read. A request
whose prompt is longer than the engine takes is refused with INVALID_ARGUMENT naming the
limit, or under --truncate=left keeps its last tokens and says so in its initial metadata.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import signal
import socket
import threading
from collections.abc import Sequence
from typing import Any

from ada import config as cfglib
from ada import paths
from ada.cli import args as cli_args
from ada.config import DEFAULT_CONFIG, ConfigError, fail
from ada.sampling.paged_config import KV_CACHES

EXAMPLE_PROBLEM = "What is 12 + 34?"
EPILOG = """examples:
  ada-serve --workdir runs/default --port 9000         # the run's latest checkpoint
  ada-serve --workdir runs/q7b --step 300 --port 9000
  ada-serve --model /models/Qwen2.5-Math-1.5B --template qwen25_math --port 9000

Text requests are problems, rendered with the run's template (or --template); it prints
a one-line client command once it listens. """ + cli_args.ALIASES


def parser() -> argparse.ArgumentParser:
    p = cli_args.Parser(
        prog="ada-serve", description="Serve a run's checkpoint or a Hugging Face model with "
                                      "JetStream's gRPC server (pip install 'ada[jetstream]').",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--workdir", help="a run directory (its config.json and checkpoints/)")
    what.add_argument("--model", help="a Hugging Face model directory instead of a run")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--config", default="",
                   help="with --model: its config file (default: configs/default.py)")
    p.add_argument("--template", default="",
                   help="prompt template for text requests (default: the run's / config's)")
    p.add_argument("--port", type=int, default=9000, help="TCP port to listen on (default 9000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default loopback; 0.0.0.0 or [::] serves the network)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help="cap on any request's new tokens (default: the run's "
                        "sampling.max_new_tokens)")
    p.add_argument("--max_prompt_len", type=int, default=None,
                   help="longest prompt in tokens (default: the run's data.max_prompt_len, "
                        "rounded up to the engine's prompt bucket); a longer one is refused "
                        "with INVALID_ARGUMENT naming the limit (see --truncate)")
    p.add_argument("--truncate", choices=["left"], default=None,
                   help="left: keep a too-long prompt's last tokens instead of refusing it; "
                        "the response's initial metadata then says ada-prompt-truncated: N->LIMIT")
    p.add_argument("--num_slots", type=int, default=16, help="requests decoded at once")
    p.add_argument("--mesh", default="",
                   help="DATA,TENSOR: the engine's mesh over this host's devices, e.g. "
                        "--mesh=1,8 (default: the run's sampling.mesh; DATA -1: all of them)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    p.add_argument("--kv_cache", choices=KV_CACHES, default=None,
                   help="the KV cache to serve from (default: the run's sampling.kv_cache); "
                        "paged reserves every slot's worst case: JetStream cannot defer")
    return p


@dataclasses.dataclass
class Served:
    engine: Any  # ada.sampling.engine.Engine
    params: Any
    tokenizer: Any  # ada.sampling.serving.ServedTokenizer
    label: str  # what is served, for the banner


def resolve(args) -> tuple[Any, str, int | None]:
    """(config, label, checkpoint step or None): every check on the command line's paths,
    before any weight is read."""
    if args.workdir:
        wd = args.workdir
        if args.config:
            raise ConfigError("--config is for --model; a run is served with its own config.json")
        if not paths.path(wd).joinpath("config.json").is_file():
            raise ConfigError(f"--workdir {wd} is not a run directory (no config.json); train one "
                              f"with python -m ada.runner --workdir {wd}, or pass --model HF_DIR")
        from ada.checkpoint import Checkpointer

        config = cfglib.load_run_config(wd)
        ckpt = Checkpointer(paths.join(wd, "checkpoints"))
        try:
            step = ckpt.pick_step(args.step)
        except FileNotFoundError as e:
            raise ConfigError(f"{e}; pass one of them, or no --step for the latest") from None
        if step is None:
            raise ConfigError(f"{ckpt.directory} holds no complete checkpoint yet; wait for the "
                              f"first (every checkpoint.every={config.checkpoint.every} steps) "
                              "or pass --model HF_DIR")
        return config, f"{wd} step {step}", step
    if not args.model:
        raise ConfigError("nothing to serve; pass --workdir RUN_DIR or --model HF_DIR")
    if args.step is not None:
        raise ConfigError("--step needs --workdir (a run's checkpoint); an HF model has none")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        raise ConfigError(f"--model {args.model} is not a Hugging Face model directory (no "
                          "config.json); pass the folder with config.json, the weights and the "
                          "tokenizer files")
    config = cfglib.load_config(args.config or DEFAULT_CONFIG)
    config.model.path = args.model
    return config, args.model, None


def check_port(host: str, port: int) -> None:
    """Bind the port once, without SO_REUSEPORT (gRPC sets it, and would then share a port
    another server holds), so a port in use is refused now rather than after loading."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is not a TCP port; pass one in 1..65535")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror or e}); the port is in "
                          "use or the address is not this host's: pass another --port or --host"
                          ) from None


def load_served(args, config, label: str, step: int | None) -> Served:
    """The engine, weights and tokenizer to serve (`resolve(args)` gives config, label and
    step), built as the run samples."""
    from ada.run.saved import load_run
    from ada.sampling.backends import make_engine
    from ada.sampling.serving import ServedTokenizer
    from ada.templates import get_template

    template = args.template or config.tokenizer.template
    try:
        get_template(template)
    except ValueError as e:
        raise ConfigError(f"--template: {e}") from None
    cli_args.check_values(args, ("num_slots", "max_new_tokens", "max_prompt_len"))
    config.sampling.num_slots = args.num_slots
    if args.mesh:
        try:
            config.sampling.mesh = tuple(int(x) for x in args.mesh.split(","))
        except ValueError:
            raise ConfigError(f"--mesh {args.mesh}: write DATA,TENSOR, e.g. 1,8") from None
    max_new = args.max_new_tokens or config.sampling.max_new_tokens
    # One more position for the BOS JetStream prepends (masked out); its buckets start at 16.
    config.data.max_prompt_len = max(16, (args.max_prompt_len or config.data.max_prompt_len) + 1)
    # JetStream's orchestrator fills slots itself (insert / generate) and cannot defer a
    # request: the paged cache is served with every slot's worst case reserved
    # (jetstream_adapter.PagedJetStreamEngine)
    config.sampling.kv_cache = args.kv_cache or config.sampling.kv_cache
    config.sampling.num_pages = 0
    try:  # a ValueError here is an unreadable tokenizer, model config or weights
        run = load_run(args.workdir, step, config=config)
        engine = make_engine(config, run.model_cfg, run.tokenizer,
                                   temperature=args.temperature, max_new_tokens=max_new)
    except (ValueError, OSError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    return Served(engine, run.params, ServedTokenizer(run.tokenizer, template),
                  f"{label} (template {template!r})")


def client_example(host: str, port: int, text: str = EXAMPLE_PROBLEM, max_tokens: int = 16) -> str:
    """A one-line Python command that sends `text` to the server and prints the answer."""
    target = "127.0.0.1" if host.strip("[]") in ("0.0.0.0", "::", "") else host
    return ("python -c \"import grpc; from jetstream.core.proto import jetstream_pb2 as pb, "
            "jetstream_pb2_grpc as rpc; "
            f"stub = rpc.OrchestratorStub(grpc.insecure_channel('{target}:{port}')); "
            f"req = pb.DecodeRequest(text_content=pb.DecodeRequest.TextContent(text='{text}'), "
            f"max_tokens={max_tokens}); "
            "print(''.join(s.text for r in stub.Decode(req, wait_for_ready=True, timeout=300) "
            "for s in r.stream_content.samples))\"")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from ada import quiet

    quiet.quiet_start()
    try:
        if importlib.util.find_spec("jetstream") is None:
            raise ConfigError("ada-serve needs JetStream (google-jetstream), which is not "
                              "installed; install the extra: pip install 'ada[jetstream]'")
        resolved = resolve(args)
        check_port(args.host, args.port)
        served = load_served(args, *resolved)
    except ConfigError as e:
        return fail(e)
    with quiet.native_stderr_held():  # JetStream loads TensorFlow, whose libraries print
        import ada.sampling.jetstream_adapter  # noqa: F401
    from ada.sampling.serving import serve

    server = serve(served.engine, served.params, served.tokenizer, args.host, args.port,
                   args.seed, truncate=args.truncate)
    limit = served.engine.max_prompt_len
    longer = (f"longer ones keep their last {limit} (--truncate=left; metadata "
              "ada-prompt-truncated)" if args.truncate else "longer ones are refused")
    print(f"ada-serve: {served.label} on {args.host}:{args.port} (JetStream gRPC, "
          f"{'greedy' if args.temperature == 0 else f'temperature {args.temperature}'}, at most "
          f"{served.engine.max_new_tokens} new tokens, prompts up to {limit} tokens: {longer}); "
          "Ctrl-C stops it", flush=True)
    print(f"client: {client_example(args.host, args.port)}", flush=True)
    stop = threading.Event()  # a handler that only sets it cannot interrupt JetStream midway
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    print("ada-serve: stopped", flush=True)
    return 0
