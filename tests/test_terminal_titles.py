"""Piped output: rich wrapped a table's title into the table's own width, so a narrow table printed
its title as a column of words (issue 33). Every table of the demo and the report says its title on
lines as wide as the console."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest
from report_helpers import KNOWN, write_scenario_with_tracer
from rich.console import Console

from tracer.report.model import build_report
from tracer.report.sources import read_jsonl
from tracer.report.terminal import blame_table, job_table, slowest_table, stage_table, titled_table
from tracer.tools.cli import gap_table, policy_table
from tracer.tools.demo import DemoOptions, run_demo

WIDTH = 100


def _text(renderable: object) -> str:
    console = Console(file=io.StringIO(), width=WIDTH, force_terminal=False, color_system=None)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def _title_lines_as_wide_as_the_console(title: str, out: str) -> None:
    want = textwrap.wrap(title, WIDTH)
    got = [line.strip() for line in out.splitlines()[:len(want)]]
    assert got == want, (title, out[:600])


def _tables(tmp_path: Path) -> list[tuple[str, object]]:
    from opentelemetry.sdk.trace import TracerProvider
    from prometheus_client import CollectorRegistry

    report = build_report(read_jsonl(write_scenario_with_tracer(tmp_path / "spans.jsonl", KNOWN)))
    runs = run_demo(DemoOptions(groups=8, workers=2, case_ms=0.2, policies=("round_robin", "aggressive")),
                    tracer_provider=TracerProvider(), registry=CollectorRegistry())
    tables = [job_table(report), stage_table(report), slowest_table(report.groups[0], WIDTH),
              policy_table(runs), gap_table(runs)]
    if any(g.blame for g in report.groups):
        tables.append(blame_table(report))
    return [(t.own_title, t) for t in tables]


def test_every_table_title_wraps_at_the_console_not_the_table(tmp_path: Path) -> None:
    tables = _tables(tmp_path)
    assert len(tables) >= 5
    for title, table in tables:
        _title_lines_as_wide_as_the_console(title, _text(table))


@pytest.mark.parametrize("caption", [None, "a caption longer than this narrow table is wide, said once below it"])
def test_a_narrow_table_keeps_its_title_and_caption_whole(caption: str | None) -> None:
    t = titled_table("A title longer than the one narrow column of this table", caption=caption)
    t.add_column("n")
    t.add_row("1")
    out = _text(t)
    _title_lines_as_wide_as_the_console("A title longer than the one narrow column of this table", out)
    if caption:
        assert out.rstrip().splitlines()[-1].strip() == caption  # fails before: wrapped into the column
