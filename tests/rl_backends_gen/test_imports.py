"""The package's import graph: every module imports first in a fresh interpreter, and no module of
rl_backends_gen imports (at module level or inside a function) one that imports it back."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rl_backends_gen

PACKAGE_DIR = Path(rl_backends_gen.__file__).parent


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imported_package_modules(module: str) -> set[str]:
    """The rl_backends_gen modules that ``module`` imports anywhere in its body (lazy imports count)."""
    known = set(module_names())
    path = PACKAGE_DIR.parent / (module.replace(".", "/") + ("/__init__.py" if module in _packages() else ".py"))
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            candidates = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in candidates if name in known and name != module)
    return found


def _packages() -> set[str]:
    return {".".join(p.parent.relative_to(PACKAGE_DIR.parent).parts) for p in PACKAGE_DIR.rglob("__init__.py")}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path [a, b, ..., a], or None. A package importing its own submodules
    (``rl_backends_gen`` -> ``rl_backends_gen.factory``) is the normal layout, not a cycle."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if node.startswith(nxt + "."):  # a submodule importing its parent package's names
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_find_cycle_sees_a_lazy_cycle():
    assert find_cycle({"a": {"b"}, "b": {"a"}, "c": set()}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_inside_the_package():
    graph = {module: imported_package_modules(module) for module in module_names()}
    assert find_cycle(graph) is None
    assert "rl_backends_gen.local" in graph["rl_backends_gen.ray_group"]  # the scan sees lazy imports


def test_each_module_imports_first_in_a_fresh_interpreter():
    """One child interpreter; before each module, every rl_backends_gen module is dropped from
    sys.modules, so each one is imported first (torch and the rest stay loaded, which saves seconds)."""
    script = (
        "import importlib, sys\n"
        f"for name in {module_names()!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'rl_backends_gen' or m.startswith('rl_backends_gen.')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "    print('ok', name)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split().count("ok") == len(module_names())
