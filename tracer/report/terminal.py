"""The report as rich tables: job view, stage percentiles, slowest messages."""

from __future__ import annotations

from typing import Any

from ..stages import GAP_BY_NAME, GAPS
from .model import PRODUCED_LATE, SPLIT_PARTS, GroupStats, Report

STAGE_STYLE = {PRODUCED_LATE: "grey50", "send": "grey62", "broker_wait": "sky_blue2", "client_buffer": "orange1",
               "dispatch_wait": "red3", "handler": "green3"}


def seconds(v: float | None) -> str:
    if v is None:
        return "—"
    if v == 0:
        return "0"
    if v < 0.001:
        return f"{v * 1e6:.0f} µs"
    if v < 1:
        return f"{v * 1e3:.1f} ms"
    return f"{v:.2f} s"


def _split_bar(split: dict[str, float], width: int = 40) -> Any:
    from rich.text import Text
    total = sum(split.values()) or 1.0
    bar = Text()
    used = 0
    for part in SPLIT_PARTS:
        n = round(split.get(part, 0.0) / total * width)
        n = min(n, width - used)
        if n > 0:
            bar.append("█" * n, style=STAGE_STYLE[part])
            used += n
    return bar


def job_table(report: Report) -> Any:
    from rich.table import Table
    t = Table(title="Job view: completion against the lower bound, and the message that finished last",
              title_justify="left", expand=False)
    for col, just in (("group", "left"), ("job", "left"), ("msgs", "right"), ("workers", "right"),
                      ("completion", "right"), ("lower bound", "right"), ("× LB", "right"), ("busy", "right"),
                      ("last message", "left"), ("waited for worker", "right"), ("worked", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for g in report.groups:
        for j in g.jobs:
            c = j.critical
            t.add_row(g.group, j.job_id, str(j.messages), f"{j.workers}{'*' if g.workers_source == 'inferred' else ''}",
                      seconds(j.completion_s), seconds(j.lower_bound_s),
                      f"{j.over_lb:.2f}" if j.over_lb else "—", f"{j.occupancy:.0%}",
                      c.message.message_id, seconds(c.waiting_s), seconds(c.working_s))
    return t


def critical_lines(report: Report) -> list[Any]:
    from rich.text import Text
    lines: list[Any] = []
    for g in report.groups:
        for j in g.jobs:
            c = j.critical
            head = Text(f"{g.group} / {j.job_id}: ", style="bold")
            head.append(f"{c.message.message_id} ({c.message.keys or 'no keys'}) — {c.verdict}")
            lines.append(head)
            row = Text("  ")
            row.append_text(_split_bar(c.split_s))
            row.append("  " + " · ".join(f"{p} {seconds(c.split_s[p])}" for p in SPLIT_PARTS if c.split_s[p] > 0))
            lines.append(row)
    return lines


def stage_table(report: Report) -> Any:
    from rich.table import Table
    t = Table(title="Stage gaps: p50 / p95 / p99 / max (share of path time)", title_justify="left")
    t.add_column("gap")
    t.add_column("meaning", style="dim")
    for g in report.groups:
        t.add_column(g.group, justify="right")
    for gap in GAPS:
        cells = []
        for g in report.groups:
            s = g.stages[gap.name]
            if not s.count:
                cells.append("—")
                continue
            share = f" ({s.share:.0%})" if gap.name != "end_to_end" else ""
            cells.append(" / ".join(seconds(v) for v in (s.p50, s.p95, s.p99, s.max)) + share)
        t.add_row(gap.name, gap.meaning, *cells)
    return t


def slowest_table(g: GroupStats) -> Any:
    from rich.table import Table
    t = Table(title=f"Slowest messages of {g.group} (end to end) and their largest stage", title_justify="left")
    for col, just in (("#", "right"), ("message", "left"), ("keys", "left"), ("job", "left"),
                      ("worker", "right"), ("end to end", "right"), ("largest stage", "left"), ("", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for i, r in enumerate(g.slowest, 1):
        crit = r.critical_stage
        t.add_row(str(i), r.message_id, r.keys, r.job_id, "—" if r.worker is None else str(r.worker),
                  seconds(r.total_s), f"[{STAGE_STYLE.get(crit, '')}]{crit}[/]" if crit else "—",
                  seconds(r.gap_s(crit)) if crit else "")
    return t


def notes(report: Report) -> list[str]:
    out: list[str] = []
    if any(g.workers_source == "inferred" for g in report.groups):
        out.append("* workers inferred from overlapping handler intervals (no rmqtrace.worker attribute): "
                   "the peak concurrency, a lower bound on the pool size")
    rebuilt = sum(g.from_spans for g in report.groups)
    if rebuilt:
        out.append(f"{rebuilt} message(s) had no exact stamps; their timing was rebuilt from span times")
    return out


def render(report: Report, console: Any, *, top: int = 10) -> None:
    console.print(f"[bold]rmqtrace report[/] — {report.source}: {report.messages} messages in "
                  f"{len(report.groups)} group(s), {report.spans} spans")
    console.print(job_table(report))
    for line in critical_lines(report):
        console.print(line)
    console.print()
    console.print(stage_table(report))
    if top > 0:
        for g in report.groups:
            console.print(slowest_table(g))
    for n in notes(report):
        console.print(f"[dim]{n}[/]")
    legend = " ".join(f"[{STAGE_STYLE[p]}]█[/] {p}" for p in SPLIT_PARTS)
    console.print(f"[dim]stages:[/] {legend}")
    console.print(f"[dim]{GAP_BY_NAME['dispatch_wait'].name}: {GAP_BY_NAME['dispatch_wait'].meaning}; "
                  f"{GAP_BY_NAME['client_buffer'].name}: {GAP_BY_NAME['client_buffer'].meaning}[/]")


__all__ = ["job_table", "render", "seconds", "slowest_table", "stage_table"]
