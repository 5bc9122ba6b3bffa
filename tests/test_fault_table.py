"""RELIABILITY.md's fault table names only what exists: no empty cell, and every rule, invariant or
test a cell names is defined in ``tests/`` (or is an invariant an assertion message names)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMISES = 7  # the table's columns after the fault class


def _fault_table() -> list[list[str]]:
    text = (ROOT / "RELIABILITY.md").read_text()
    section = text.split("## The fault table (issue #30)", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| fault class") or not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == PROMISES + 1:
            rows.append(cells)
    return rows


def _defined_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        source = path.read_text(errors="replace")
        names.update(re.findall(r"^\s*def (\w+)", source, re.MULTILINE))
        names.update(re.findall(r"invariant (\w+):", source))
    return names


def test_the_fault_table_has_every_class_and_no_empty_cell() -> None:
    rows = _fault_table()
    assert len(rows) >= 25, f"the fault table has {len(rows)} rows: it was not found or lost some"
    for row in rows:
        for cell in row[1:]:
            assert cell, f"an empty cell in the row {row[0]!r}"
            assert cell.startswith("n/a:") or "`" in cell or cell.startswith("*open"), (
                f"a cell names nothing and says no n/a reason, row {row[0]!r}: {cell!r}")


def test_every_name_in_the_fault_table_exists_in_the_tests() -> None:
    defined = _defined_names()
    # a backticked lowercase identifier is a name (API spellings carry `()`, `=` or a dot)
    named = {name for row in _fault_table() for cell in row for name in re.findall(r"`([a-z][a-z0-9_]*)`", cell)}
    assert len(named) > 20, named
    missing = sorted(named - defined)
    assert not missing, f"the fault table names what no test defines: {missing}"
