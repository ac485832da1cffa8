"""The package's shape: no import cycles, no upward imports, no oversized module, commands
only in ada/cli/.

Layers, bottom up (a module imports only from its own layer or below, at module level or
inside a function):

  foundations   errors, tokenizer, templates, models, data, rewards, envs, sharding,
                meshes, metrics, checkpoint, ... (anything not listed in LAYERS)
  core          sampling, adaptive, rl, warmstart (pure functions and their jitted forms)
  method        methods (the table), rollout (sampling for the loop), evaluation,
                trajectory (multi-turn sampling with tools)
  config        config (loads and validates a whole run: reads the method table)
  run           run/ (build: config -> pieces; trainer, state, folder, saved: a saved run
                -> its policy), step (one RL step), stream (the sampler across steps)
  loop          loop (the training loop), planner (a config on a TPU slice), roofline,
                memory (what a run holds per chip, phase by phase)
  commands      ada/cli/: every command line

docs/design.md's table is this one; configs/ import no part of ada (test_configs_are_leaves).

The `python -m` paths of the commands (ada.runner, ada.evaluate, ...) are one-line shims
that only call their ada/cli module; no other module has a `__main__` block or argparse.
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYERS = {
    "ada.sampling": 1, "ada.adaptive": 1, "ada.rl": 1, "ada.warmstart": 1,
    "ada.methods": 2, "ada.rollout": 2, "ada.evaluation": 2, "ada.trajectory": 2,
    "ada.config": 3,
    "ada.run": 4, "ada.step": 4, "ada.stream": 4,
    "ada.loop": 5, "ada.planner": 5, "ada.roofline": 5, "ada.memory": 5,
    "ada.cli": 6,
}
SHIMS = {"ada.runner": "ada.cli.train", "ada.evaluate": "ada.cli.eval", "ada.serve": "ada.cli.serve",
         "ada.plan": "ada.cli.plan", "ada.data.difficulty": "ada.cli.difficulty"}
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


def is_main_block(node) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def imports(path: str, known, self_name: str = "") -> set[str]:
    """Every ada module `path` imports, at module level or inside a function or class (a
    shim's `__main__` block is the command it calls, checked by test_shims_are_one_call)."""
    deps = set()
    tree = ast.parse(open(path).read())
    skip = {id(n) for n in tree.body if is_main_block(n)}
    stack = [n for n in tree.body if id(n) not in skip]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            deps.add(node.module)
            deps.update(f"{node.module}.{a.name}" for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return {d for d in deps if d in known and d not in ("ada", self_name)}


@pytest.fixture(scope="module")
def graph():
    mods = modules()
    return {m: imports(p, mods, m) for m, p in mods.items()}


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


def test_configs_are_leaves():
    """configs/*.py import no part of ada, as big_vision's import only ml_collections: a
    config file is read before anything of the library needs to be (knobs, --print_config),
    and a config importing ada would stack the library's floors on top of the knob table."""
    found = []
    for f in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if f.endswith(".py"):
            tree = ast.parse(open(os.path.join(ROOT, "configs", f)).read())
            found += [f"configs/{f}: {ast.unparse(n)}" for n in ast.walk(tree)
                      if isinstance(n, ast.Import | ast.ImportFrom)
                      and any((getattr(n, "module", None) or a.name).split(".")[0] == "ada"
                              for a in n.names)]
    assert not found, "\n".join(found)


def test_modules_are_small():
    big = {m: n for m, p in modules().items() if (n := len(open(p).read().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_shims_are_one_call():
    """`python -m ada.plan` and friends: a docstring and a `__main__` block calling the
    command's main, nothing else; the other modules hold no command line."""
    mods = modules()
    for m, path in mods.items():
        text = open(path).read()
        tree = ast.parse(text)
        mains = [n for n in tree.body if is_main_block(n)]
        if m in SHIMS:
            body = [n for n in tree.body if not (isinstance(n, ast.Expr)
                                                 and isinstance(n.value, ast.Constant))]
            assert body == mains and len(mains) == 1, f"{m} must be a docstring and a main block"
            assert f"from {SHIMS[m]} import main" in ast.unparse(mains[0]), m
        elif not m.startswith("ada.cli"):
            assert not mains, f"{m} has a __main__ block; commands live in ada/cli/"
            assert "argparse" not in text, f"{m} parses a command line; commands live in ada/cli/"


@pytest.mark.slow
@pytest.mark.parametrize("module", [*SHIMS, "ada.cli.train", "ada.cli.inspect_model", "ada.loop"])
def test_entry_points_import_first(module):
    """Each entry point imports on its own in a fresh interpreter (what `python -m` does)."""
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-2000:]
