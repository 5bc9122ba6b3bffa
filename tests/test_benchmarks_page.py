"""BENCHMARKS.md is the current figures, not a lab notebook (issue 33, item 9).

It had grown to 1,343 lines of measurement rounds. It opens with one table — what, the command, the
ratio, the target, whether it is met, and when and on what it was measured — every command in it one
that runs as written, every bench of `rmqtrace bench` in it, and every earlier round in
docs/benchmarks-history.md under the titles the page cites.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
from conftest import REPO

from tracer.tools.cli import build_parser

PAGE = REPO / "BENCHMARKS.md"
HISTORY = REPO / "docs" / "benchmarks-history.md"
HEADER = ["what", "command", "ratio", "target", "met", "measured"]


def tables(text: str) -> list[tuple[int, list[list[str]]]]:
    """(first line, rows of cells) of every Markdown table, the separator row dropped."""
    found: list[tuple[int, list[list[str]]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|"):
            start = i
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r"-+", c) for c in cells):
                    rows.append(cells)
                i += 1
            found.append((start + 1, rows))
        i += 1
    return found


TEXT = PAGE.read_text(encoding="utf-8")
TABLES = tables(TEXT)
ROWS = TABLES[0][1][1:] if TABLES else []


def test_the_page_opens_with_its_one_table_of_current_figures() -> None:
    assert len(TABLES) == 1, f"BENCHMARKS.md has {len(TABLES)} tables at lines {[t[0] for t in TABLES]}: one"
    first, rows = TABLES[0]
    assert first <= 25, f"the table starts at line {first}: the page opens with it"
    assert "```" not in "\n".join(TEXT.splitlines()[:first]), "nothing but prose before the table"
    assert [h.split(":")[0].split(" ")[0] for h in rows[0]] == HEADER, rows[0]
    assert all(len(r) == len(HEADER) and all(r) for r in rows[1:]), [r[0] for r in rows if len(r) != len(HEADER)]
    machine = TEXT[:TEXT.index("\n|")]
    assert "`nproc` = 2" in machine and "CPython 3." in machine, "the machine is said above the table"


def test_the_page_keeps_no_history() -> None:
    """Its sections are the table and how to run the benches; every round lives in the history."""
    headings = re.findall(r"^(#+) (.*)$", TEXT, re.M)
    assert [h for level, h in headings if level != "#"] == ["Current figures", "Running the benchmarks"], headings
    assert len(TEXT.splitlines()) <= 120, "BENCHMARKS.md is growing into a notebook again: move rounds to the history"


def _commands(cell: str) -> list[str]:
    return [c for c in re.findall(r"`([^`]+)`", cell) if c.startswith(("rmqtrace ", "python -m "))]


def command_problem(command: str) -> str | None:
    """None when ``command`` runs as written (its arguments parsed, its module found), else why not."""
    words = command.split()
    if words[0] == "rmqtrace" or words[:3] == ["python", "-m", "tracer"]:
        args = words[1:] if words[0] == "rmqtrace" else words[3:]
        try:
            build_parser().parse_args(args)
        except SystemExit:
            return f"rmqtrace refuses {args}"
        return None
    if words[:2] == ["python", "-m"]:
        return None if importlib.util.find_spec(words[2]) else f"no module {words[2]}"
    return f"not a command this page runs: {command}"


@pytest.mark.parametrize("row", ROWS, ids=[r[0][:40] for r in ROWS])
def test_every_row_names_a_command_that_exists_and_when_it_was_measured(row: list[str]) -> None:
    what, command, *_, measured = row
    commands = _commands(command)
    assert commands or command == "same", f"{what}: no command"
    assert [(c, command_problem(c)) for c in commands if command_problem(c)] == []
    assert re.search(r"session \d+|\d{4}-\d\d-\d\d|^same |as above", measured, re.I), f"{what}: when? {measured}"


def test_every_bench_has_a_row() -> None:
    benches = build_parser().parse_args(["bench"]).benchmarks
    named = {c.split()[2] for r in ROWS for c in _commands(r[1]) if c.startswith("rmqtrace bench ")}
    assert set(benches) <= named, f"no current figure for rmqtrace bench {sorted(set(benches) - named)}"


def test_every_section_the_page_cites_is_in_the_history() -> None:
    titles = {t for level, t in re.findall(r"^(#+) (.*)$", HISTORY.read_text(encoding="utf-8"), re.M)}
    cited = {" ".join(c.split()) for c in re.findall(r'"([A-Z][^"]{2,60})"', TEXT)}
    missing = sorted(c for c in cited if not any(t.startswith(c) for t in titles))
    assert cited and missing == [], f"cited by BENCHMARKS.md, no such section in docs/benchmarks-history.md: {missing}"
