"""The package's modules import downward only: no import cycle, counting every import.

Issue 31: ``clients/listener.py`` ↔ ``official.py`` ↔ ``probe.py`` was the one circle (probe
imported ``official.ReceivedTraces`` under ``TYPE_CHECKING``). A cycle hidden behind
``TYPE_CHECKING`` or a function-level import is still a cycle of meaning: two modules that each
need the other. The graph here is read from the source (``ast``), so every kind of import counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "tracer"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("tracer"):
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tracer"))
    return found


def _graph(under: str) -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if not name.startswith(under):
            continue
        # a package's __init__ re-exports: an edge to it is an edge to what it re-exports, not a layer
        graph[name] = {t for t in _imports(path, name) if t in modules and t != name and t.startswith(under)
                       and modules[t].name != "__init__.py"}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (found := visit(t)) is not None:
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


@pytest.mark.parametrize("layer", ["tracer.clients", "tracer.telemetry", "tracer.dispatch", "tracer.path",
                                   "tracer.report"])
def test_a_layer_imports_downward_only(layer: str) -> None:
    cycle = _cycle(_graph(layer))
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"
