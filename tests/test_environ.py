"""One function reads rmqtrace's settings from the environment: tracer.environ.environment.

Every ``os.environ``/``os.getenv`` in the package is found from the source: outside that function,
a read of an ``RMQTRACE_*`` or ``OTEL_*`` variable fails here, and so does any use of the whole
mapping (``os.environ if env is None else env``: a parser reading behind the snapshot), except the
few listed below with their reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

from tracer.environ import PREFIXES, environment

ROOT = REPO / "tracer"
READER = ("tracer/environ.py", "environment")
# (module, function): a use of the whole environment that is not a settings read
WHOLE_MAPPING_ALLOWED = {
    ("tracer/telemetry/exportchild.py", "__init__"): "the export child inherits the parent's whole environment",
}


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _name_read(parent: ast.AST | None, node: ast.AST) -> str | None:
    """The variable name when ``node`` (os.environ / os.getenv) is read by a literal name, else None."""
    if isinstance(parent, ast.Subscript) and isinstance(parent.slice, ast.Constant):
        return str(parent.slice.value)
    if isinstance(parent, ast.Attribute) and parent.attr in ("get", "pop", "setdefault"):
        parent = getattr(parent, "_parent", None)
    if isinstance(parent, ast.Call) and parent.args and isinstance(parent.args[0], ast.Constant):
        return str(parent.args[0].value)
    return None


def environment_uses(path: Path) -> list[tuple[str, str | None, int]]:
    """(enclosing function, the variable read or None for the whole mapping, line) of each use."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child._parent = node  # type: ignore[attr-defined]
    found = []
    for node in ast.walk(tree):
        if _is_environ(node):
            func = node
            while func is not None and not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                func = getattr(func, "_parent", None)
            found.append((func.name if func is not None else "<module>",
                          _name_read(getattr(node, "_parent", None), node), node.lineno))
    return found


def stray_reads() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        for func, name, line in environment_uses(path):
            if (rel, func) == READER:
                continue
            if name is None and (rel, func) not in WHOLE_MAPPING_ALLOWED:
                out.append(f"{rel}:{line} in {func}(): the whole environment")
            elif name is not None and name.startswith(PREFIXES):
                out.append(f"{rel}:{line} in {func}(): {name}")
    return out


def test_only_environment_reads_rmqtrace_and_otel_variables() -> None:
    found = stray_reads()
    assert not found, "read them through tracer.environ.environment(): " + "; ".join(found)


def test_the_scan_sees_a_literal_read_a_getenv_and_a_whole_mapping(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("import os\n"
                    "def f(env=None):\n    e = os.environ if env is None else env\n    return os.getenv('OTEL_X')\n"
                    "SHAPE = os.environ.get('RMQTRACE_TRACE_SHAPE')\nHOME = os.environ['HOME']\n")
    assert set(environment_uses(path)) == {("<module>", "HOME", 6), ("<module>", "RMQTRACE_TRACE_SHAPE", 5),
                                           ("f", None, 3), ("f", "OTEL_X", 4)}


def test_environment_is_a_snapshot_of_the_prefixed_variables(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("RMQTRACE_TRACE_SHAPE", "compact")
    monkeypatch.setenv("HOME_NOT_OURS", "x")
    snap = environment()
    monkeypatch.setenv("RMQTRACE_TRACE_SHAPE", "full")
    assert snap["RMQTRACE_TRACE_SHAPE"] == "compact" and "HOME_NOT_OURS" not in snap
