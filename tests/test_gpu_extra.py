"""The gpu extra (pyproject.toml, `pip install -e '.[gpu]'`): it names jax[cuda12] at the
pinned jax, and that resolves on the package index (a dry run: nothing is installed or
cached)."""

import json
import os
import subprocess
import sys
import tomllib

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNREACHABLE = ("Could not fetch URL", "NewConnectionError", "Failed to establish a new connection",
               "Temporary failure in name resolution", "Network is unreachable")


def gpu_extra() -> list[str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]["gpu"]


def test_the_gpu_extra_is_jax_cuda12_at_the_pinned_jax():
    assert gpu_extra() == [f"jax[cuda12]=={jax.__version__}"] == ["jax[cuda12]==0.10.2"]


@pytest.mark.slow  # ~40 s: pip resolves the CUDA wheels against the index
def test_the_gpu_extra_resolves_on_the_index():
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                        "--no-cache-dir", "--ignore-installed", "--report", "-", *gpu_extra()],
                       capture_output=True, text=True, timeout=600)
    if r.returncode and any(s in r.stderr for s in UNREACHABLE):
        pytest.skip(f"the package index is unreachable: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-3000:]
    names = {p["metadata"]["name"]: p["metadata"]["version"]
             for p in json.loads(r.stdout)["install"]}
    assert names["jax"] == names["jaxlib"] == names["jax-cuda12-plugin"] == "0.10.2"
