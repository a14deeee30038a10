# SPDX-License-Identifier: Apache-2.0
"""The package's imports run one way.

Every import statement of every module is read (function-local ones included), and
the graph they make has no circle; the algorithms never import the vLLM glue; inside
the plugin, ``runner`` imports neither ``attention`` nor ``proposers``, and
``attention`` does not import ``proposers``. And every plugin module imports on its
own in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import vllm_echo

PACKAGE_DIR = Path(vllm_echo.__file__).parent
ROOT = PACKAGE_DIR.parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The package modules an import statement names (a ``from X import y`` names
    X.y when that is a module, else X)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in MODULES]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".")
        base = base[:len(base) - node.level + (1 if is_package else 0)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = []
    for alias in node.names:
        name = f"{source}.{alias.name}"
        if name in MODULES:
            out.append(name)
        elif source in MODULES:
            out.append(source)
    return out


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        graph[module] = {t for node in ast.walk(tree)
                         for t in _targets(node, module, is_package) if t != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph (its modules, first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_reads_function_local_imports():
    graph = import_graph()
    # register() imports register_patches inside the function
    assert "vllm_echo.plugin.register_patches" in graph["vllm_echo.plugin"]


def test_no_import_circle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


@pytest.mark.parametrize("lower, upper", [
    ("vllm_echo.algos", "vllm_echo.plugin"),
    ("vllm_echo.ops", "vllm_echo.plugin"),
    ("vllm_echo.plugin.runner", "vllm_echo.plugin.attention"),
    ("vllm_echo.plugin.runner", "vllm_echo.plugin.proposers"),
    ("vllm_echo.plugin.attention", "vllm_echo.plugin.proposers"),
])
def test_imports_run_one_way(lower, upper):
    upward = [(m, t) for m, targets in import_graph().items() if m.startswith(lower)
              for t in targets if t.startswith(upper)]
    assert not upward, upward


def test_the_algorithms_never_import_vllm():
    offenders = []
    for module, path in MODULES.items():
        if not module.startswith("vllm_echo.algos"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [(module, n) for n in names if n.split(".")[0] == "vllm"]
    assert not offenders, offenders


def test_every_plugin_module_imports_on_its_own():
    plugin_modules = [m for m in MODULES if m.startswith("vllm_echo.plugin")]

    def fresh_import(module: str) -> tuple[str, int, str]:
        done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        return module, done.returncode, done.stderr[-2000:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [r for r in pool.map(fresh_import, plugin_modules) if r[1] != 0]
    assert not failed, failed


def test_the_front_end_path_loads_no_numba():
    """What the front end imports before an engine starts (the plugin's registration and
    the speculative config's rewrite) must not load numba: vLLM's start-up scan for
    Triton kernels then trips over numba's llvmlite wrapper in that process, for every
    method (kernel_scan_guard guards it only if llvmlite was loaded before ``register``)."""
    front_end = ["vllm_echo.plugin", "vllm_echo.plugin.register_patches",
                 "vllm_echo.plugin.config_shim", "vllm_echo.plugin.tenancy",
                 "vllm_echo.plugin.predicted_outputs", "vllm_echo.plugin.predicted_outputs_patches",
                 "vllm_echo.plugin.metrics", "vllm_echo.config", "vllm_echo.engines"]
    code = (f"import sys\nfor m in {front_end!r}:\n    __import__(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout[:300]
