"""The package's layers, read from the source (every import, also those inside functions): the
library never imports tracer.tools (tracer/__init__.py, docs/layout.md), and the command-line side
(tools, report) has no import cycle. tools/bench/report.py imported the parser from tools/cli.py,
which imports it back (issue 33); report/cli.py took its argument types from tools/."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

ROOT = REPO / "tracer"


def _modules() -> dict[str, Path]:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = list(f.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                name = ".".join(base + ([node.module] if node.module else []))
                for target in (name, *(f"{name}.{a.name}" for a in node.names)):
                    if target in mods and target != mod:
                        graph[mod].add(target)
            elif isinstance(node, ast.Import):
                graph[mod].update(a.name for a in node.names if a.name in mods and a.name != mod)
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _is_package_of(a: str, b: str) -> bool:  # a package importing its own submodule, and back, is not a layer cycle
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_the_library_never_imports_the_tools() -> None:
    graph = _graph()
    entry = "tracer.__main__"  # `python -m tracer` is the command itself
    upward = sorted(f"{m} -> {t}" for m, ts in graph.items() if not m.startswith("tracer.tools") and m != entry
                    for t in ts if t.startswith("tracer.tools"))
    assert upward == []


def test_the_command_line_side_has_no_import_cycle() -> None:
    graph = _graph()
    cli_side = [m for m in graph if m.startswith(("tracer.tools", "tracer.report"))]
    cycles = sorted(f"{m} -> {t}" for m in cli_side for t in graph[m]
                    if not _is_package_of(m, t) and _reaches(graph, t, m))
    assert cycles == []  # fails before: tracer.tools.bench.report <-> tracer.tools.cli
