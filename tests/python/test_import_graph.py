"""The layout of the Python package: its import graph is a DAG, and no module outgrows a file.

The graph is read from the source (ast), not from an import: every ``import`` and ``from ...
import`` of an x_jobs module counts, at module level or in a function, under TYPE_CHECKING too,
since a cycle there still means a type lives in the wrong module. A package's ``__init__``
imports its submodules; a submodule that imports a name back from its package's ``__init__``
is an edge like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "x_jobs"

#: The most lines a module may have: past it, a concern has outgrown its file.
MAX_LINES = 800


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name a ``from`` import names (a relative one from ``module``'s package)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(module: str, path: Path, known: set[str], source: str | None = None) -> set[str]:
    """The x_jobs modules that ``module`` (at ``path``) imports: a ``from x_jobs import steps``
    names the module x_jobs.steps; ``from x_jobs.steps import Steps`` names x_jobs.steps."""
    found: set[str] = set()
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    found.add(f"{target}.{alias.name}")
                elif target in known:
                    found.add(target)
    found.discard(module)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules along it (first = last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_cycle_finder_names_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_every_kind_of_import() -> None:
    known = {"x_jobs", "x_jobs.a", "x_jobs.b", "x_jobs.c", "x_jobs.d", "x_jobs.p", "x_jobs.p.q"}
    source = """
from typing import TYPE_CHECKING
import x_jobs.a
from x_jobs import b
from . import p
if TYPE_CHECKING:
    from x_jobs.c import C
def f():
    from .d import D
"""
    found = _imports("x_jobs.m", PACKAGE / "m.py", known, source)
    assert found == {"x_jobs.a", "x_jobs.b", "x_jobs.c", "x_jobs.d", "x_jobs.p"}
    # Relative to a package's __init__, and the real graph: a function-level import (outbox
    # imports webhooks when a webhook sink is made) and a submodule of a package.
    inner = _imports("x_jobs.p", PACKAGE / "p" / "__init__.py", known, "from .q import Q")
    assert inner == {"x_jobs.p.q"}
    graph = _graph()
    assert "x_jobs.webhooks" in graph["x_jobs.outbox"]
    assert "x_jobs.worker.settle" in graph["x_jobs.worker"]


def test_the_package_imports_form_no_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_is_over_the_line_limit() -> None:
    long = {
        name: lines
        for name, path in _modules().items()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
