"""Test-wide settings: offline Hugging Face, 8 fake CPU devices for sharding tests, and every
cache in one temporary folder per test session.

These must be set before jax is imported anywhere, hence at the top of conftest. They are
environment variables, so pytest-xdist's workers and every subprocess a test starts (a
run, a second process of a multi-host pair) inherit them.

The session folder (`ADA_TEST_HOME`) is made once by the controlling process and shared by
its workers: it is `HOME` and the XDG cache and config folders (so ada's warm-start,
tokenizer and pass-rate caches, matplotlib's, W&B's, TFDS' and Hugging Face's all land
there), and it holds JAX's persistent compilation cache (unless one is given), so a program compiled by one test
or one subprocess is loaded, not compiled again, by the next one that builds it (the tiny
runs of the suite share most of theirs). It is removed when the session ends.
`pytest_sessionfinish` fails the session when a test wrote a file under the real home
directory.
"""

import os
import shutil
import tempfile

REAL_HOME = os.path.expanduser("~")
_owner = "ADA_TEST_HOME" not in os.environ  # the process that made the folder removes it
if _owner:
    os.environ["ADA_TEST_HOME"] = tempfile.mkdtemp(prefix="ada-test-home-")
_home = os.environ["ADA_TEST_HOME"]
os.environ.update(
    HOME=_home,
    XDG_CACHE_HOME=os.path.join(_home, ".cache"),
    XDG_CONFIG_HOME=os.path.join(_home, ".config"),
    XDG_DATA_HOME=os.path.join(_home, ".local", "share"),
    MPLCONFIGDIR=os.path.join(_home, ".config", "matplotlib"),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
)
# .ci/run shares one cache across its passes
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_home, "jax-compilation-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# CI runs the property tests on a fixed example sequence, so a submission's result does not
# depend on the draw; locally hypothesis explores new examples on every run.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


# Not walked: installed toolchains (pyenv's Pythons and their site-packages, cargo, maven,
# npm) and editors' state, which other programs may write while the tests run; no test
# installs anything.
_SKIP = {".pyenv", ".cargo", ".rustup", ".m2", ".npm", ".claude", ".vscode-server"}


def _home_files() -> dict:
    files = {}
    for root, dirs, names in os.walk(REAL_HOME):
        if root == REAL_HOME:
            dirs[:] = [d for d in dirs if d not in _SKIP]
        for n in names:
            p = os.path.join(root, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            files[p] = (st.st_mtime_ns, st.st_size)
    return files


def pytest_sessionstart(session):
    if _owner:
        session.config._ada_home_before = _home_files()


def pytest_sessionfinish(session, exitstatus):
    if not _owner:
        return
    before = session.config._ada_home_before
    written = sorted(p for p, st in _home_files().items() if before.get(p) != st)
    shutil.rmtree(_home, ignore_errors=True)
    if written:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"tests wrote {len(written)} file(s) under {REAL_HOME}, outside the session's "
                 f"temporary folder (point that cache at $HOME or $XDG_CACHE_HOME):"]
        lines += [f"  {p}" for p in written[:20]]
        if reporter:
            reporter.write_line("\n".join(lines), red=True)
        session.exitstatus = 1
