"""The evaluate and difficulty commands as a user starts them: quiet (ada's lines and real
errors only, with JAX_PLATFORMS unset as on a user's machine), reading the files training
reads, refusing in one line what they cannot honour, and saying in the summary what they used."""

import json
import os
import re
import subprocess
import sys

import pytest
from test_cli import run_dir  # noqa: F401 - a run directory with no checkpoint (initial params)

from ada import config as C
from ada.cli import eval as ev

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
# as a user starts a command: no JAX_PLATFORMS (the command picks the CPU itself)
USER_ENV = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
# what the libraries print when a command starts loudly: absl / orbax / JetStream INFO
# records, libtpu's probe (E0000 ... TPU worker hostnames, "Unable to initialize backend"),
# TensorFlow's native start-up lines
NOISE = re.compile(r"^[IEW]0000 |TPU worker hostnames|Unable to initialize backend|"
                   r"absl::InitializeLog|cudart_stub|TensorFlow|"
                   r"^\d{4}-\d\d-\d\d [\d:,]+ (?!ada[.:])[\w.]+: ")


@pytest.fixture(scope="module")
def gsm8k_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gsm") / "gsm.jsonl"
    rows = [{"question": "What is 2+2?", "answer": "2 and 2 #### 4"},
            {"question": "What is 1+3?", "answer": "1 and 3 #### 4"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _noise(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if NOISE.search(ln)]


@pytest.mark.slow
def test_evaluate_reads_a_gsm8k_file_quietly_and_says_what_it_used(run_dir, gsm8k_file):
    """A question/answer file through the columns training and the filter take (a dashed
    alias among them); stderr holds no library noise; the summary records the sampling it
    used. Before: the file was refused (only a `problem` column), and the summary did not say
    its temperature, samples or lengths."""
    r = subprocess.run(
        [sys.executable, "-m", "ada.evaluate", "--workdir", str(run_dir), "--benchmark",
         str(gsm8k_file), "--problem-key", "question", "--answer_format", "gsm8k",
         "--samples", "2", "--temperature", "0.5", "--max_new_tokens", "3"],
        capture_output=True, text=True, env=USER_ENV, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not _noise(r.stderr), r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert (out["num_prompts"], out["samples"], out["temperature"], out["max_new_tokens"],
            out["pass_k"]) == (2, 2, 0.5, 3, [1, 2])
    assert out["max_prompt_len"] == C.load_run_config(str(run_dir)).data.max_prompt_len


@pytest.mark.slow
def test_difficulty_is_quiet(run_dir, tmp_path):
    """The filter's one summary line and ada's own log lines, nothing else (before: ~35 lines
    of absl / orbax INFO and libtpu's E0000 probe around them)."""
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"problem": "What is 2+2?", "answer": "4"}) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "ada.data.difficulty", "--workdir", str(run_dir), "--input",
         str(inp), "--output", str(tmp_path / "out.jsonl"), "--k", "1", "--max_pass_rate", "1",
         "--no-require-one-correct"],
        capture_output=True, text=True, env=USER_ENV, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not _noise(r.stderr), r.stderr[-3000:]
    assert json.loads(r.stdout)["kept"] == 1


@pytest.mark.parametrize("argv,want", [
    (["--samples", "4", "--pass_k", "1,8"],
     "--pass_k 1,8: pass@k needs 1 <= k <= --samples (4), not 8"),
    (["--samples", "0"], "--samples must be >= 1 (got 0)"),
    (["--max_prompt_len", "0"], "--max_prompt_len must be >= 1 (got 0)"),
    (["--temperature", "-1"], "--temperature -1.0 must be >= 0"),
    (["--pass_k", "1,x"], "--pass_k 1,x: write comma-separated integers"),
    (["--config", DEFAULT], "--config is for --model"),
    (["--problem_key", "question"], "--problem_key / --answer_key / --answer_format read a "
                                    "--benchmark file"),
])
def test_evaluate_refuses_what_it_cannot_honour(run_dir, capsys, argv, want):
    """One line, exit 2, before anything loads. Before, --pass_k above --samples was dropped
    (rc 0, no pass@8) and a 0 or a --config beside --workdir were ignored."""
    assert ev.main(["--workdir", str(run_dir), *argv]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], lines


def test_evaluate_run_pass_k_above_samples_is_said_and_recorded(run_dir, capsys):
    """The run's own eval.pass_k (1, 2) under --samples 1: pass@2 is left out with one line."""
    args = ev.eval_parser().parse_args(["--workdir", str(run_dir), "--samples", "1"])
    assert ev.eval_config(args).eval.pass_k == (1,)
    err = capsys.readouterr().err
    assert "eval.pass_k [2] exceed --samples 1" in err and len(err.splitlines()) == 1


def test_evaluate_file_errors_name_the_flag_and_the_path_once(run_dir, gsm8k_file, capsys):
    """A missing column names the flag that picks it; the path is printed once (before:
    `--benchmark PATH: PATH: ...`, and evaluate had no column flag)."""
    assert ev.main(["--workdir", str(run_dir), "--benchmark", str(gsm8k_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count(str(gsm8k_file)) == 1 and len(err.splitlines()) == 1
    assert err.startswith(f"error: --benchmark {gsm8k_file}: line 1: missing column 'problem'")
    assert err.endswith("pass --problem_key with the column that holds it")
    assert ev.main(["--workdir", str(run_dir), "--benchmark", str(gsm8k_file) + ".no"]) == 2
    assert capsys.readouterr().err.strip() == f"error: --benchmark {gsm8k_file}.no: no such file"


def test_evaluate_help_says_every_default():
    """Each value flag of `python -m ada.evaluate --help` says what it does and its default
    (before: --samples, --temperature and --max_new_tokens said neither)."""
    with_default = {"step", "config", "benchmark", "samples", "temperature", "max_new_tokens",
                    "max_prompt_len", "pass_k", "limit", "problem_key", "answer_key"}
    for action in ev.eval_parser()._actions:
        assert action.help, action.dest
        assert action.dest not in with_default or "default" in action.help, action.dest


def test_evaluate_takes_the_flag_its_unknown_token_hint_names(run_dir, tmp_path, capsys):
    """The <unk> warning suggests --config.tokenizer.path; evaluate accepts it (and any
    --config.a.b override) where it used to stop at 'unrecognized arguments'."""
    from ada.data.encode import unknown_tokens_message

    class Tok:
        unk_id = 0
        id_to_piece = staticmethod(lambda i: "<unk>")

    hint = unknown_tokens_message("prompts", [{"prompt_tokens": [0, 0, 5]}], Tok())
    assert "--config.tokenizer.path" in hint
    (tmp_path / "t.model").write_bytes(b"")
    overrides, rest = C.parse_override_args(["--workdir", str(run_dir),
                                             f"--config.tokenizer.path={tmp_path}/t.model"])
    config = ev.eval_config(ev.eval_parser().parse_args(rest), overrides)
    assert config.tokenizer.path == f"{tmp_path}/t.model"
    assert ev.main(["--workdir", str(run_dir), "--config.tokenizer.nope=1"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "tokenizer.nope" in err and "unrecognized" not in err
