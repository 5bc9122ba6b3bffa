"""Nothing in the suite depends on state outside the clone (issue 33's Done-when: two fresh-clone
`make test` runs in a row pass on a loaded machine).

A fixed path outside the clone (``/tmp/x``, ``~/x``) is shared by every clone and every run on the
machine and outlives them: two runs at once write into each other, and a run finds what an earlier
one left. Caches and state belong in the clone's ``.cache`` (a fresh clone fetches and builds them;
``make clean`` does not touch them), a test's files in its ``tmp_path``.

What stays outside, on purpose: system packages the scripts install (Prometheus, Alertmanager,
chromium: apt), the build tools' own caches (Maven's ``~/.m2``, Go's module and build caches: a cold
one is only slower), and the services' fixed ports (services/README.md; a second stack on the machine
makes ``make test`` stop at ``services-up`` with one line naming the port).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import REPO

OUTSIDE = re.compile(r"^(/tmp|/var/tmp|/home|/root|~)(/|$)")
# a call that reads the user's home directory: a test must not write there
HOME_CALLS = {"expanduser", "home"}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def outside_paths(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant of ``source`` (docstrings aside) that names a fixed
    path outside the clone, and every call of ``expanduser``/``Path.home``."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if OUTSIDE.match(node.value):
                found.append((node.lineno, node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in HOME_CALLS:
            found.append((node.lineno, f"{node.func.attr}()"))
    return sorted(found)


# this file names such paths on purpose, as the check's own example
TEST_FILES = sorted(p for p in (REPO / "tests").rglob("*.py") if p != Path(__file__).resolve())


@pytest.mark.parametrize("path", TEST_FILES, ids=[str(p.relative_to(REPO)) for p in TEST_FILES])
def test_no_test_names_a_fixed_path_outside_the_clone(path: Path) -> None:
    assert outside_paths(path.read_text(encoding="utf-8")) == [], f"{path.relative_to(REPO)}: use tmp_path or .cache"


def test_the_check_finds_a_fixed_tmp_path_and_a_home_directory() -> None:
    code = ('"""Writes /tmp/x."""\nimport os\nrun(["--out", "/tmp/rmqtrace-demo"])\n'
            'os.path.expanduser("~/logs")\nprint("/tmpfile is not a path", "12 /tmp/Python-3.11/ceval.c")\n')
    assert outside_paths(code) == [(3, "/tmp/rmqtrace-demo"), (4, "expanduser()"), (4, "~/logs")]


SCRIPTS = sorted([*(REPO / "services").rglob("*.sh"), *(REPO / ".ci").iterdir(), REPO / "Makefile"])
ASSIGNMENT = re.compile(r"^\s*(?:export\s+|local\s+)?([A-Za-z_]+)\s*:?=\s*(.*)$")


@pytest.mark.parametrize("path", SCRIPTS, ids=[str(p.relative_to(REPO)) for p in SCRIPTS])
def test_every_place_a_script_keeps_state_is_in_the_clone(path: Path) -> None:
    """Each variable a script sets (its default, when an environment variable may override it)
    names no fixed directory outside the clone: state and caches default to the clone's .cache."""
    bad = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = ASSIGNMENT.match(re.sub(r"\$\{\w+:\?[^}]*\}", "", line.split(" #")[0]))  # ${1:?usage …}: a message
        if m and re.search(r"(^|[\"'=:\-\s(])(/tmp|/var/tmp|/home/|/root|~/|\$HOME|\$\{HOME)", m.group(2)):
            bad.append((n, line.strip()))
    assert bad == [], f"{path.relative_to(REPO)} keeps state outside the clone: {bad}"
