"""The report as rich tables: job view, stage percentiles, slowest messages."""

from __future__ import annotations

import functools
import os
from typing import Any, Sequence

from ..path.stages import GAPS, HEADLINE_GAP
from .blame import avoidable_cell
from .jobs import PRODUCED_LATE, SPLIT_PARTS
from .model import GroupStats, Report, group_line, notes
from .text import format_seconds, sent_order_words

STAGE_STYLE = {PRODUCED_LATE: "grey50", "send": "grey62", "broker_wait": "sky_blue2", "client_buffer": "orange1",
               "dispatch_wait": "red3", "handler": "green3"}


seconds = format_seconds


def hanging(console: Any, label: str, lines: Sequence[str]) -> None:
    """``label`` then each line, wrapped lines indented under their text: a grid, so the indent holds
    when piped too (rich wraps a plain print at column 0)."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for line in lines:
        grid.add_row(label, line)
    console.print(grid)


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


@functools.lru_cache(maxsize=1)
def _titled_class() -> Any:
    from rich.table import Table
    from rich.text import Text

    class TitledTable(Table):  # type: ignore[misc]
        """A table whose title and caption are lines of their own, as wide as the console: rich
        wraps a table's title into the table's width, so a piped narrow table printed its title as
        a column of words (issue 33)."""

        def __init__(self, *args: Any, title: str, caption: str | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.own_title, self.own_caption = title, caption

        def __rich_console__(self, console: Any, options: Any) -> Any:
            yield Text(self.own_title, style="bold")
            yield from super().__rich_console__(console, options)
            if self.own_caption:
                yield Text(self.own_caption, style="dim")

    return TitledTable


def titled_table(title: str, *, caption: str | None = None, **kwargs: Any) -> Any:
    """A rich ``Table`` whose ``title`` (and ``caption``) wrap at the console's width, not the table's."""
    return _titled_class()(title=title, caption=caption, **kwargs)


def _table(title: str) -> Any:
    from rich import box
    return titled_table(title, box=box.SIMPLE_HEAD, pad_edge=False)


def job_table(report: Report) -> Any:
    """One column per group and job, side by side."""
    jobs = [(g, j) for g in report.groups for j in g.jobs]
    t = _table("Job view: completion against the lower bound, and the message that finished last")
    t.add_column("", style="dim")
    for g, j in jobs:
        t.add_column(g.group if len(g.jobs) == 1 else f"{g.group} / {j.job_id}", justify="right")
    inferred = {g.group for g in report.groups if g.workers_source == "inferred"}
    rows: list[tuple[str, list[str]]] = [
        ("job", [j.job_id for _, j in jobs]),
        ("messages", [str(j.messages) for _, j in jobs]),
        ("workers", [f"{j.workers}{'*' if g.group in inferred else ''}" for g, j in jobs]),
        ("completion", [f"[bold]{seconds(j.completion_s)}[/]" for _, j in jobs]),
        ("lower bound", [seconds(j.lower_bound_s) for _, j in jobs]),
        ("× lower bound", [(f"[{'red' if (j.over_lb or 0) > 1.25 else 'green'}]{j.over_lb:.2f}[/]"
                            if j.over_lb else "—") for _, j in jobs]),
        ("workers busy", [f"{j.occupancy:.0%}" for _, j in jobs]),
        ("finished last", [j.critical.message.keys or j.critical.message.message_id[-12:] for _, j in jobs]),
        ("  not yet produced", [seconds(j.critical.split_s[PRODUCED_LATE]) for _, j in jobs]),
        ("  in the broker", [seconds(j.critical.broker_s) for _, j in jobs]),
        ("  waiting for worker", [seconds(j.critical.waiting_s) for _, j in jobs]),
        ("  working", [seconds(j.critical.working_s) for _, j in jobs]),
    ]
    if any(j.sent_order for _, j in jobs):  # the row only for jobs sent by send_job (rmqtrace.job.order)
        rows.insert(1, ("sent", [sent_order_words(j.sent_order) for _, j in jobs]))
    for label, cells in rows:
        t.add_row(label, *cells)
    return t


def critical_lines(report: Report) -> list[Any]:
    from rich.text import Text
    lines: list[Any] = []
    for g in report.groups:
        for j in g.jobs:
            c = j.critical
            m = c.message
            head = Text(f"{g.group}" + (f" / {j.job_id}" if len(g.jobs) > 1 else "") + ": ", style="bold")
            head.append(f"{m.message_id}{f' ({m.keys})' if m.keys else ''} finished last, {c.verdict}")
            lines.append(head)
            row = Text("  ")
            row.append_text(_split_bar(c.split_s, 30))
            row.append("  " + " · ".join(f"{p} {seconds(c.split_s[p])}" for p in SPLIT_PARTS if c.split_s[p] > 0))
            lines.append(row)
    return lines


def blame_table(report: Report, top: int = 5) -> Any:
    """Who blocked whom: per group the avoidable share, then its worst blockers by the wait they caused."""
    t = _table("Who blocked whom: consumer_wait while another worker was free (avoidable), and the messages "
               "that ran in front of it, by the avoidable wait they caused")
    for col in ("group", "avoidable", "hol/cap", "blocker", "ran", "held up", "victims"):
        t.add_column(col, justify="left" if col in ("group", "blocker") else "right", no_wrap=True)
    names = short_names([g.group for g in report.groups])
    for name, g in zip(names, report.groups):
        b = g.blame
        if b is None:
            continue
        # seconds first; the share only where it means something (Blame.material)
        avoidable = avoidable_cell(b.avoidable_s, b.wait_s, len(b.messages))
        head = [name, avoidable, f"{b.head_of_line}/{b.capacity}"]
        blockers = list(b.top[:top])
        if not blockers:
            why = ("— (too many overlaps: see the notes)" if b.note else
                   "— (worker ids inferred)" if not b.blockers_known and b.avoidable_s > 0 else
                   "— (no wait behind a message on its worker)" if b.avoidable_s > 0 else "—")
            t.add_row(*head, why, "", "", "", end_section=True)
            continue
        for i, x in enumerate(blockers):
            t.add_row(*(head if i == 0 else [""] * len(head)), x.label, seconds(x.handler_s),
                      seconds(x.held_up_s), str(x.victims), end_section=i == len(blockers) - 1)
    return t


def short_names(names: list[str]) -> list[str]:
    """Group names without the prefix they all share up to a ``-``, ``.`` or ``_`` (``demo-``)."""
    if len(names) < 2:
        return names
    prefix = os.path.commonprefix(names)
    cut = max(prefix.rfind(c) for c in "-._") + 1
    short = [n[cut:] for n in names]
    return short if all(short) else names


def stage_table(report: Report) -> Any:
    t = _table(f"Stage gaps: percentiles (nearest rank) and share of path time; {HEADLINE_GAP.name} = "
               "client_buffer + dispatch_wait")
    t.add_column("gap")
    if len(report.groups) > 1:
        t.add_column("group")
    for col in ("p50", "p95", "p99", "max", "share"):
        t.add_column(col, justify="right")
    names = short_names([g.group for g in report.groups])
    for gap in (HEADLINE_GAP, *(g for g in GAPS if g is not HEADLINE_GAP)):
        for i, g in enumerate(report.groups):
            s = g.stages[gap.name]
            label = f"[{STAGE_STYLE.get(gap.name, 'bold')}]{gap.name}[/]" if i == 0 else ""
            share = f"{s.share:.0%}" if gap.name != "end_to_end" else ""
            vals = [seconds(v) for v in (s.p50, s.p95, s.p99, s.max)] if s.count else ["—"] * 4
            t.add_row(label, *([names[i]] if len(report.groups) > 1 else []), *vals, share,
                      end_section=i == len(report.groups) - 1)
    return t


def slowest_table(g: GroupStats, width: int = 120) -> Any:
    """Keys and job columns only when they say something and the terminal has room."""
    t = _table(f"Slowest messages of {g.group} (end to end) and their largest stage")
    show_keys = width >= 96 and any(r.keys for r in g.slowest)
    show_job = len(g.jobs) > 1
    cols = ["#", "message"] + (["keys"] if show_keys else []) + (["job"] if show_job else []) + \
        ["worker", "end to end", "largest stage"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("message", "keys", "job", "largest stage") else "right",
                     no_wrap=col in ("message", "largest stage"))
    for i, r in enumerate(g.slowest, 1):
        crit = r.critical_stage
        t.add_row(str(i), r.message_id, *([r.keys or "—"] if show_keys else []), *([r.job_id] if show_job else []),
                  "—" if r.worker is None else str(r.worker), seconds(r.total_s),
                  f"[{STAGE_STYLE.get(crit, '')}]{crit}[/] {seconds(r.gap_s(crit))}" if crit else "—")
    return t


def render(report: Report, console: Any, *, top: int = 10) -> None:
    console.print(f"[bold]rmqtrace report[/] — {report.source}: {report.messages} messages in "
                  f"{len(report.groups)} consumer group(s), {report.spans} spans", soft_wrap=True)
    hanging(console, "  •", [group_line(g) for g in report.groups])
    # who blocked whom in one sentence per group: the demo prints the same one
    hanging(console, "  •", [g.blame.line(g.group) for g in report.groups if g.blame is not None])
    console.print(job_table(report))
    for line in critical_lines(report):
        console.print(line)
    console.print()
    if any(g.blame for g in report.groups):
        console.print(blame_table(report))
    console.print(stage_table(report))
    if top > 0:
        for g in report.groups:
            console.print(slowest_table(g, console.width))
    for n in notes(report):
        console.print(f"[dim]{n}[/]")
    legend = " ".join(f"[{STAGE_STYLE[p]}]█[/] {p}" for p in SPLIT_PARTS)
    console.print(f"[dim]stages:[/] {legend}")


__all__ = ["blame_table", "hanging", "job_table", "render", "seconds", "slowest_table", "stage_table", "titled_table"]
