"""A life-cycle field is written only by its own transition methods (issue #36, item 2).

The dispatcher's ``Core.phase`` (:class:`tracer.dispatch.DispatchPhase`) and the export child's
``_phase`` (:class:`tracer.telemetry.exportchild.ExportPhase`) move only forward because every
write goes through a method that refuses to move them back. An engine (or any other function in
their folder) assigning the field directly would bypass that: this test finds every assignment to
the field's name, by AST, and fails on one outside the constructor and the transitions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

# (where the field's name is searched, the field, the file that owns it, the functions that may write it)
LIFE_CYCLES: dict[str, tuple[str, str, str, frozenset[str]]] = {
    "DispatchPhase": ("tracer/dispatch", "phase", "tracer/dispatch/core.py",
                      frozenset({"__init__", "close_locked", "stop_locked"})),
    "ExportPhase": ("tracer/telemetry/exportchild.py", "_phase", "tracer/telemetry/exportchild.py",
                    frozenset({"__init__", "_shut_locked", "_flush_started", "_abandon"})),
}


def _writes(path: Path, attr: str) -> list[tuple[str, int]]:
    """Every assignment to ``<anything>.<attr>`` in ``path``: (enclosing function, line)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            targets: list[ast.expr] = []
            if isinstance(child, ast.Assign):
                targets = child.targets
            elif isinstance(child, (ast.AnnAssign, ast.AugAssign)):
                targets = [child.target]
            found.extend((name, child.lineno) for t in targets if isinstance(t, ast.Attribute) and t.attr == attr)
            visit(child, name)

    visit(ast.parse(path.read_text(), str(path)), "<module>")
    return found


@pytest.mark.parametrize("life", sorted(LIFE_CYCLES))
def test_a_life_cycle_is_written_only_by_its_transitions(life: str) -> None:
    where, attr, owner, allowed = LIFE_CYCLES[life]
    root = REPO / where
    paths = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    writes = [(str(p.relative_to(REPO)), fn, line) for p in paths for fn, line in _writes(p, attr)]
    assert writes, f"no write of .{attr} found under {where}: the table is stale"
    stray = [f"{path}:{line} ({fn})" for path, fn, line in writes if path != owner or fn not in allowed]
    assert not stray, f"{life} (.{attr}) written outside {owner}'s {sorted(allowed)}: {stray}"
    assert {fn for path, fn, _ in writes} == allowed, f"{life}: a listed transition no longer writes .{attr}"
