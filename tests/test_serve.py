"""`ada-serve`: a run's checkpoint behind JetStream's gRPC server, on 127.0.0.1 with a tiny
model; answers checked against the Driver, bad input refused in one line."""

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import pytest
from helpers import free_port

from ada import config as C
from ada.cli import serve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
ENV = dict(os.environ, JAX_PLATFORMS="cpu")
START_TIMEOUT_S = 240  # the server's imports, restore and first compile on a 2-core CPU

needs_jetstream = pytest.mark.skipif(
    importlib.util.find_spec("jetstream") is None,
    reason="google-jetstream (ada[jetstream]) is not installed")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory with two checkpoints (steps 3 and 5) of a tiny random policy."""
    from ada.checkpoint import Checkpointer
    from ada.data.task import load_task
    from ada.models import init_params
    from ada.run.policy import load_tokenizer_for, model_config_for

    tmp = tmp_path_factory.mktemp("serverun")
    cfg = C.build_config(DEFAULT, [("warmstart.enabled", "false"), ("data.num_train", "64"),
                                   ("data.num_eval", "8"), ("sampling.max_new_tokens", "8"),
                                   ("warmstart.cache_dir", str(tmp / "cache"))])
    wd = tmp / "run"
    wd.mkdir()
    with open(wd / "config.json", "w") as f:
        json.dump(cfg.to_dict(), f)
    tok = load_tokenizer_for(cfg, load_task(cfg))
    model_cfg = model_config_for(cfg, tok)
    ckpt = Checkpointer(str(wd / "checkpoints"))
    for step, seed in ((3, 1), (5, 2)):  # std 0.3: outputs differ between prompts
        ckpt.save(step, {"params": init_params(model_cfg, jax.random.key(seed), std=0.3)}, {})
    ckpt.close()
    return wd


def _policy(argv):
    args = serve.parser().parse_args(argv)
    return serve.load_served(args, *serve.resolve(args))


def _wait_for_banner(proc, out_path, err_path):
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        text = out_path.read_text()
        if "client: " in text:
            return text
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    pytest.fail(f"ada-serve did not start (rc={proc.poll()}):\n{err_path.read_text()[-3000:]}")


def _start(argv, tmp_path):
    """ada-serve in a subprocess: (process, its stdout file, its stderr file)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen([sys.executable, "-m", "ada.serve", *argv], stdout=fo, stderr=fe,
                                env=ENV, cwd=ROOT)
    return proc, out, err


def _decode(stub, request):
    ids, text = [], []
    call = stub.Decode(request, timeout=120)
    for response in call:
        for sample in response.stream_content.samples:
            ids.extend(sample.token_ids)
            text.append(sample.text)
    _decode.metadata.append(dict(call.initial_metadata()))
    return ids, "".join(text)


_decode.metadata = []


@pytest.mark.slow
@needs_jetstream
def test_serves_a_run_like_the_driver_and_stops_cleanly(run_dir, tmp_path):
    import grpc
    from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc

    from ada.sampling.driver import Driver, Request
    from ada.templates import encode_prompt

    port = free_port()
    argv = ["--workdir", str(run_dir), "--step", "3", "--port", str(port), "--host", "127.0.0.1",
            "--mesh=2,2",  # slots over 2 of the 8 test devices, heads over 2
            "--truncate=left"]  # the 100-token prompt keeps its end (default: refused)
    proc, out, err = _start(argv, tmp_path)
    try:
        # The expected answers, from the same engine and weights (step 3, not the latest 5),
        # computed while the server starts.
        policy = _policy(argv)
        assert dict(policy.engine.mesh.shape) == {"data": 2, "fsdp": 1, "tensor": 2}
        tok, template = policy.tokenizer.tokenizer, policy.tokenizer.template
        problems = [(serve.EXAMPLE_PROBLEM, 16), ("What is 5 - 7?", 5), ("What is 40 + 87?", 3)]
        rng = np.random.default_rng(0)
        token_prompts = [(rng.integers(3, tok.vocab_size, n).tolist(), m)
                         for n, m in ((5, 8), (11, 4), (100, 6))]  # 100: over the prompt limit
        limit, cap = policy.engine.max_prompt_len, policy.engine.max_new_tokens
        requests = [Request(encode_prompt(tok, template, p), i, 0, min(m, cap))
                    for i, (p, m) in enumerate(problems)]
        requests += [Request(ids[-limit:], len(requests) + i, 0, min(m, cap))  # JetStream
                     for i, (ids, m) in enumerate(token_prompts)]  # keeps a long prompt's end
        expected = Driver(policy.engine, policy.params, tokenizer=tok).generate_all(requests)
        assert all(e.finish_reason != "error" for e in expected)
        assert len({tuple(e.token_ids) for e in expected}) > 1  # the prompts are told apart

        banner = _wait_for_banner(proc, out, err)
        assert f"127.0.0.1:{port}" in banner and "step 3" in banner
        assert f"client: {serve.client_example('127.0.0.1', port)}" in banner

        stub = jetstream_pb2_grpc.OrchestratorStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        R = jetstream_pb2.DecodeRequest
        sent = [R(text_content=R.TextContent(text=p), max_tokens=m) for p, m in problems]
        sent += [R(token_content=R.TokenContent(token_ids=ids), max_tokens=m)
                 for ids, m in token_prompts]
        with ThreadPoolExecutor(len(sent)) as pool:  # concurrently: several slots in use
            got = list(pool.map(lambda r: _decode(stub, r), sent))
        for (ids, text), exp, req in zip(got, expected, sent, strict=True):
            want = exp.token_ids[:-1] if exp.finish_reason == "eos" else exp.token_ids
            assert ids == want
            if req.HasField("text_content"):  # token requests are answered with ids only
                # The served text keeps the first token's leading space, which a
                # SentencePiece decode of the response alone drops.
                assert text.lstrip() == exp.text.lstrip() and text.strip()
        # the client is told which prompt was truncated (and only that one)
        told = [m.get("ada-prompt-truncated") for m in _decode.metadata]
        assert sorted(told, key=str) == [f"100->{limit}"] + [None] * (len(sent) - 1), told

        # The printed client example (the README's, on another port) returns that text.
        r = subprocess.run(serve.client_example("127.0.0.1", port), shell=True, env=ENV,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == got[0][1].strip(), r.stderr[-2000:]

        proc.terminate()  # SIGTERM: the server stops its driver and gRPC server, exits 0
        assert proc.wait(timeout=60) == 0, err.read_text()[-3000:]
        assert out.read_text().rstrip().endswith("ada-serve: stopped")
        # quiet: no TensorFlow start-up lines, no JetStream INFO on the root logger (before:
        # "Could not find cuda drivers" twice, then ten "root: ..." lines)
        noise = [ln for ln in err.read_text().splitlines()
                 if re.search(r"cudart_stub|absl::InitializeLog|^I0000 |"
                              r" root: (Kicking off|Loaded all weights|Starting server)", ln)]
        assert not noise, noise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.slow
@needs_jetstream
def test_serves_the_paged_cache(run_dir, tmp_path):
    """--kv_cache paged on a (2, 2) mesh (pages split over data with their slots): a gRPC
    client gets the Driver's answers over the same paged engine, concurrently."""
    import grpc
    from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc

    from ada.sampling.driver import Driver, Request
    from ada.sampling.paged import PagedEngine

    port = free_port()
    argv = ["--workdir", str(run_dir), "--port", str(port), "--host", "127.0.0.1",
            "--mesh=2,2", "--kv_cache", "paged"]
    proc, out, err = _start(argv, tmp_path)
    try:
        policy = _policy(argv)
        assert isinstance(policy.engine, PagedEngine) and policy.engine.pool_shards == 2
        tok, cap = policy.tokenizer.tokenizer, policy.engine.max_new_tokens
        rng = np.random.default_rng(1)
        prompts = [(rng.integers(3, tok.vocab_size, n).tolist(), min(m, cap))
                   for n, m in ((7, 6), (13, 5), (4, 7))]
        expected = Driver(policy.engine, policy.params, tokenizer=tok).generate_all(
            [Request(ids, i, 0, m) for i, (ids, m) in enumerate(prompts)])
        _wait_for_banner(proc, out, err)
        stub = jetstream_pb2_grpc.OrchestratorStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        R = jetstream_pb2.DecodeRequest
        sent = [R(token_content=R.TokenContent(token_ids=ids), max_tokens=m) for ids, m in prompts]
        with ThreadPoolExecutor(len(sent)) as pool:
            got = list(pool.map(lambda r: _decode(stub, r), sent))
        for (ids, _), exp in zip(got, expected, strict=True):
            assert ids == (exp.token_ids[:-1] if exp.finish_reason == "eos" else exp.token_ids)
        proc.terminate()
        assert proc.wait(timeout=60) == 0, err.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_serves_an_hf_export_of_the_run(run_dir, tmp_path):
    """The run's export serves as the run; and transformers, given the export's chat template
    and greedy decoding, answers as ada-serve does (its Driver: test above). Without the
    template in the export, apply_chat_template raised; on raw text the model answered
    something else."""
    import torch
    import transformers

    from ada.export import export_hf
    from ada.sampling.driver import Driver, Request

    run = _policy(["--workdir", str(run_dir)])  # latest: step 5
    assert "step 5" in run.label
    tok, template = run.tokenizer.tokenizer, run.tokenizer.template
    export_hf(run.params, run.engine.config, tok, tmp_path / "hf", template)
    hf = _policy(["--model", str(tmp_path / "hf")])
    jax.tree.map(np.testing.assert_array_equal, hf.params, run.params)
    text = "What is 1 + 2?"
    assert hf.tokenizer.encode(text) == run.tokenizer.encode(text)

    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf",
                                                              dtype=torch.float32)
    problems = [serve.EXAMPLE_PROBLEM, "What is 5 - 7?", "What is 40 + 87?"]
    served = Driver(run.engine, run.params, tokenizer=tok).generate_all(
        [Request(run.tokenizer.encode(p), i, 0, run.engine.max_new_tokens)
         for i, p in enumerate(problems)])
    for problem, want in zip(problems, served, strict=True):
        ids = hf_tok.apply_chat_template([{"role": "user", "content": problem}],
                                         add_generation_prompt=True, return_tensors="pt")
        assert ids["input_ids"][0].tolist() == run.tokenizer.encode(problem)
        out = model.generate(**ids, max_new_tokens=run.engine.max_new_tokens, do_sample=False)
        got = out[0, ids["input_ids"].shape[1]:].tolist()
        assert got == want.token_ids, (problem, got, want.token_ids)


@pytest.mark.parametrize("case", ["no run", "no model", "no step", "port in use", "no jetstream"])
def test_bad_input_is_one_line(run_dir, tmp_path, capsys, monkeypatch, case):
    port = free_port()
    argv = {"no run": ["--workdir", str(tmp_path / "nope")],
            "no model": ["--model", str(tmp_path / "nope")],
            "no step": ["--workdir", str(run_dir), "--step", "4"],
            "port in use": ["--workdir", str(run_dir)],
            "no jetstream": ["--workdir", str(run_dir)]}[case]
    want = {"no run": "is not a run directory", "no model": "not a Hugging Face model directory",
            "no step": "--step 4: no complete checkpoint", "port in use": f"127.0.0.1:{port}",
            "no jetstream": "pip install 'ada[jetstream]'"}[case]
    if case == "no jetstream":
        monkeypatch.setitem(sys.modules, "jetstream", None)  # makes find_spec say "absent"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        assert serve.main([*argv, "--port", str(port)]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], lines
    if case == "no step":
        assert "[3, 5]" in lines[0]
    if case == "port in use":
        assert "--port" in lines[0]


def test_help_and_core_imports_stay_light():
    r = subprocess.run([sys.executable, "-m", "ada.serve", "--help"], capture_output=True,
                       text=True, env=ENV, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "--workdir" in r.stdout and "--step" in r.stdout, r.stderr
    code = ("import sys, ada.run.build, ada.run.saved, ada.cli.serve, ada.serve; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'tensorflow', 'tensorflow_datasets', 'jetstream', 'grpc'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr[-2000:]


def test_readme_client_example_is_the_printed_one():
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "ada-serve --workdir runs/default --port 9000 &" in readme
    assert serve.client_example("127.0.0.1", 9000) in readme
