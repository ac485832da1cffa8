"""The package's shape: no import cycles, no upward imports, no oversized module.

Layers, bottom up (a module imports only from its own layer or below):

  foundations   tokenizer, templates, models, data sources, rewards, sharding, metrics, ...
  core          sampling, adaptive, rl (pure functions and their jitted forms)
  method        methods (the table), rollout (sampling for the loop), evaluate
  config        config (loads and validates a whole run: reads the method table)
  run           setup (config -> pieces), step (one RL step)
  loop          loop (the training loop)
  entry points  cli, runner and the other command-line tools
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYERS = {
    "ada.sampling": 1, "ada.adaptive": 1, "ada.rl": 1, "ada.warmstart": 1,
    "ada.methods": 2, "ada.rollout": 2, "ada.evaluate": 2,
    "ada.config": 3,
    "ada.setup": 4, "ada.step": 4,
    "ada.loop": 5,
    "ada.cli": 6, "ada.runner": 6, "ada.data.difficulty": 6, "ada.plan": 6,
    "ada.models.inspect": 6, "ada.serve": 6,
}
ENTRY_POINTS = ("ada.cli", "ada.runner", "ada.evaluate", "ada.data.difficulty", "ada.loop",
                "ada.serve")
MAX_LINES = 500


def layer(module: str) -> int:
    """The layer of the longest LAYERS prefix; anything unlisted is a foundation (0)."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in LAYERS:
            return LAYERS[".".join(parts[:k])]
    return 0


def modules() -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "ada")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def module_level_imports(path: str, known) -> set[str]:
    """ada modules imported when `path` is imported (function bodies and the
    `if __name__ == "__main__"` block do not run then)."""
    deps = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(node.orelse)
    visit(ast.parse(open(path).read()).body)
    return {d for d in deps if d in known and d != "ada"}


@pytest.fixture(scope="module")
def graph():
    mods = modules()
    return {m: module_level_imports(p, mods) for m, p in mods.items()}


def test_no_import_cycles(graph):
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def dfs(m, path):
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d):] + [d]))
            if d not in state:
                dfs(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m, [m])


def test_no_upward_imports(graph):
    up = [f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
          for m, deps in sorted(graph.items()) for d in sorted(deps) if layer(d) > layer(m)]
    assert not up, "\n".join(up)


def test_modules_are_small():
    big = {m: n for m, p in modules().items() if (n := len(open(p).read().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_entry_points_import_first(module):
    """Each entry point imports on its own in a fresh interpreter (what `python -m` does)."""
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-2000:]
