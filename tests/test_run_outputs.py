"""What a user reads about a run, checked against the run: docs/metrics.md names every key
metrics.jsonl holds, the cluster-log line with the bar off, ada-inspect on a run and on a
bad path, and --print_config's paged families against the model code's.

One tiny run through the real entry point (a stream with a KL term, so that every
conditional key is written), shared by the tests here.
"""

import json
import os
import re
import subprocess
import sys

import jax
import pytest

from ada.cli.inspect_model import main as inspect_main
from ada.metrics import read_jsonl
from ada.trajectory import env_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "metrics.md")
STEPS = 4
TINY = {
    "data.num_train": 64, "data.num_eval": 8, "data.prompts_per_step": 4,
    "adaptive.samples_per_round": 4, "adaptive.max_rounds": 2, "sampling.num_slots": 16,
    "sampling.max_new_tokens": 6, "train.steps": STEPS, "eval.every": 2, "eval.samples": 2,
    "eval.pass_k": "(1,2)", "checkpoint.every": 2, "warmstart.enabled": "false",
    "rl.max_staleness": 1, "loss.kl_coef": 0.01, "adaptive.allocation": "knapsack",
    "log.progress": "false", "log.every": 2, "log.tensorboard": "false", "log.plots": "false",
}
FOLDERS = {}  # the run's home and cache folders


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, the run's stderr). The run's home is an empty folder and its cache folder
    ($XDG_CACHE_HOME) another, so that test_the_run_writes_only_its_folders can look."""
    wd = str(tmp_path_factory.mktemp("run") / "w")
    home, cache = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("xdg-cache")
    cmd = [sys.executable, "-m", "ada.runner", "--workdir", wd,
           *(f"--config.{k}={v}" for k, v in TINY.items())]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, HOME=str(home),
               XDG_CACHE_HOME=str(cache))
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "MPLCONFIGDIR"):
        env.pop(var, None)  # as on a user's machine: only HOME and the cache folder are set
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    FOLDERS.update(home=home, cache=cache)
    return wd, r.stderr


def test_the_run_writes_only_its_folders(run):
    """A run writes its workdir and ada's cache under $XDG_CACHE_HOME/ada (the tokenizer it
    trained here), nothing under the home directory: the conftest's session folder, which is
    both for the suite, keeps every test's writes out of the user's home."""
    home, cache = FOLDERS["home"], FOLDERS["cache"]
    assert not list(home.iterdir()), sorted(map(str, home.rglob("*")))
    assert list((cache / "ada" / "tokenizers").glob("*.model"))


def documented_keys() -> set[str]:
    """The first column of docs/metrics.md's tables."""
    return set(re.findall(r"^\| `([^`]+)` \|", open(DOC).read(), re.M))


def doc_name(key: str) -> str:
    """A written key as the doc names it: the k of avg@k / pass@k, a difficulty level L."""
    return re.sub(r"level\d+$", "level<L>", re.sub(r"@\d+$", "@k", key))


def test_metrics_doc_lists_exactly_the_keys_a_run_writes(run):
    """Breaking it: a new key in a metrics row without a docs/metrics.md line, or a line for
    a key no longer written (the tiny run writes every conditional key: a stream, a KL term,
    a budget split, update diagnostics, evals on a task with difficulty levels; not LoRA's two
    keys)"""
    written = {doc_name(k) for r in read_jsonl(os.path.join(run[0], "metrics.jsonl")) for k in r}
    written.discard("step")
    assert written - documented_keys() == set(), "keys missing from docs/metrics.md"
    lora = {"lora_rank", "handoff_bytes"}  # LoRA runs' (tests/test_stream.py reads them)
    tools = set(env_metrics({}))  # tool runs' (env.tools: tests/test_trajectory.py)
    assert documented_keys() - written - lora - tools == set(), \
        "docs/metrics.md lists keys no run writes"


def test_bar_off_prints_a_line_every_log_every_steps(run):
    """With log.progress=false the run prints one line per log.every steps with the bar's
    numbers (breaking it: a silent cluster log, or a line per step)."""
    lines = [x for x in run[1].splitlines() if x.startswith("train step ")]
    assert [x.split()[2] for x in lines] == ["2/4", "4/4"], run[1][-2000:]
    for x in lines:
        assert re.search(r"\d+\.\d\ds/step eta \d+:\d\d:\d\d acc=\d\.\d{3} eval=\d\.\d{3} "
                         r"zero_var=\d\.\d{3} draws/p=\d+\.\d{3}", x), x
    assert "step/s" not in run[1] and "s/step]" not in run[1]  # no tqdm bar


def test_inspect_reads_a_run_its_checkpoints_and_one_checkpoint(run, capsys):
    """ada-inspect on a run describes its latest complete checkpoint's model without reading
    a weight, and names the export knob (breaking it: 'no model.safetensors', as before)."""
    from ada.checkpoint import Checkpointer

    wd = run[0]
    assert inspect_main([wd, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    params = Checkpointer(os.path.join(wd, "checkpoints")).restore_params(STEPS)[0]["params"]
    assert info["step"] == STEPS and info["method"] == "ada_balance"
    assert info["num_parameters"] == sum(x.size for x in jax.tree.leaves(params))
    assert info["vocab_size"] == params["embed"].shape[0] and info["family"] == "qwen2"
    assert "--config.checkpoint.export_hf=true" in info["hf"]
    assert inspect_main([os.path.join(wd, "checkpoints")]) == 0
    assert f"step               {STEPS}" in capsys.readouterr().out
    assert inspect_main([os.path.join(wd, "checkpoints", "2")]) == 0
    assert "step               2\n" in capsys.readouterr().out
    assert inspect_main([os.path.join(wd, "checkpoints", "3")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a complete checkpoint (complete steps: [2, 4])" in err


def test_inspect_bad_path_is_one_line_naming_both_kinds(tmp_path, capsys):
    """A path that is neither an HF checkpoint nor a run: one line, exit 2, that says a run
    is read too."""
    assert inspect_main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a directory" in err and "reads a run" in err


def test_print_config_lists_the_families_the_code_has():
    """--print_config's model.family and sampling.kv_cache lines name exactly the model
    families (paged serves every one: tests/test_paged.py runs each); breaking it: a family
    added to the code but not to the words, or paged said to cover fewer."""
    from ada import config as C
    from ada.models.model_config import FAMILIES

    text = C.describe(C.build_config(os.path.join(ROOT, "configs", "default.py"), []))
    for knob in ("model.family", "sampling.kv_cache"):
        line = next(x for x in text.splitlines() if x.startswith(f"{knob} ="))
        named = re.findall(r"\b(?:qwen|llama|gemma)\d*\b", line.split("#", 1)[1])
        assert named == list(FAMILIES), line
