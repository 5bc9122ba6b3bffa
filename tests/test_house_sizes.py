"""Issue 36's done-when, read from the source: few long library functions, few big modules.

A function's length runs from its ``def`` line to its last line (decorators not counted); the
library is ``tracer/`` without ``tracer/tools`` (the commands and benchmarks). A module's length is
its line count, over all of ``tracer/``. The limits are the issue's: a new offender past them is a
function or module to split by naming its stages, not a number to raise.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

ROOT = REPO / "tracer"
MAX_FUNCTION_LINES = 60
MAX_LONG_FUNCTIONS = 2
MAX_MODULE_LINES = 500
MAX_BIG_MODULES = 6


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """Every function and method (nested ones too) with its length in lines."""
    found: list[tuple[str, int]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            found.append((prefix + node.name, node.end_lineno - node.lineno + 1))
            found += _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, f"{prefix}{node.name}.")
        else:
            found += _functions(node, prefix)
    return found


def _modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def long_functions() -> list[str]:
    out = []
    for path in _modules():
        rel = path.relative_to(REPO)
        if rel.parts[:2] == ("tracer", "tools"):
            continue
        for name, lines in _functions(ast.parse(path.read_text(), str(path))):
            if lines > MAX_FUNCTION_LINES:
                out.append(f"{rel}:{name} ({lines} lines)")
    return out


def big_modules() -> list[str]:
    out = []
    for path in _modules():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            out.append(f"{path.relative_to(REPO)} ({lines} lines)")
    return out


def test_at_most_two_library_functions_run_over_sixty_lines() -> None:
    found = long_functions()
    assert len(found) <= MAX_LONG_FUNCTIONS, (
        f"{len(found)} library functions over {MAX_FUNCTION_LINES} lines (at most {MAX_LONG_FUNCTIONS}): "
        + "; ".join(found))


def test_at_most_six_modules_run_over_five_hundred_lines() -> None:
    found = big_modules()
    assert len(found) <= MAX_BIG_MODULES, (
        f"{len(found)} modules over {MAX_MODULE_LINES} lines (at most {MAX_BIG_MODULES}): " + "; ".join(found))


def test_the_counter_sees_a_long_method_and_a_nested_function() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(60))
    source = f"class C:\n    def m(self):\n{body}\n        def inner():\n            return 1\n        return inner\n"
    found = dict(_functions(ast.parse(source)))
    assert found["C.m"] == 64 and found["C.m.inner"] == 2
