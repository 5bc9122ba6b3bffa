"""The report as one self-contained HTML page: inline CSS and SVG drawn here, no script, no network.

Sections (stable ids, one column per consumer group side by side, every chart on the same time
axis so policies compare at a glance):

* ``#job-view`` — completion against the lower bound, and the message that finished last with
  its stage split;
* ``#stages`` — p50/p95/p99/max of every gap;
* ``#waterfall`` — one row per message (sorted by start) with a coloured segment per stage;
* ``#heatmap`` — messages by when they reached the consumer (x) and how long they waited inside it
  (y, log): the headline gap ``consumer_wait`` = client_buffer + dispatch_wait;
* ``#occupancy`` — handlers running over time;
* ``#slowest`` — the slowest messages and their largest stage.

Hovering any row or cell shows its numbers (SVG ``<title>``).
"""

from __future__ import annotations

import datetime as _dt
from html import escape
from pathlib import Path

from ..path.stages import GAPS, HEADLINE_GAP, PATH_GAPS
from .blame import GRACE_NS
from .charts import (
    MAX_ROWS,
    STAGE_COLOR,
    STAGE_LABEL,
    chart_width,
    compare_svg,
    fmt_s,
    heat_legend,
    heatmap_svg,
    legend,
    nice_ticks,
    occupancy_svg,
    sample_rows,
    split_svg,
    visible_rows,
    waterfall_svg,
)
from .jobs import SPLIT_PARTS
from .model import GroupStats, Report, build_report, group_line, notes
from .text import sent_order_words

__all__ = ["MAX_ROWS", "chart_width", "heatmap_svg", "nice_ticks", "occupancy_svg", "render_html",
           "sample_rows", "waterfall_svg", "write_demo_report", "write_html"]


CSS = """
:root { --fg:#1d1d1f; --muted:#5f6368; --line:#d0d4da; --bg:#ffffff; --card:#f7f8fa; }
* { box-sizing: border-box; }
body { margin: 0; padding: 20px 28px 40px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto,
       "DejaVu Sans", sans-serif; color: var(--fg); background: var(--bg); }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 6px; border-bottom: 1px solid var(--line);
padding-bottom: 4px; } h3 { font-size: 15px; margin: 0 0 8px; }
.meta, .help, .note { color: var(--muted); } .help { margin: 0 0 10px; max-width: 1100px; }
.note { font-size: 12.5px; margin: 6px 0 0; }
nav a { margin-right: 14px; color: #1a5fb4; text-decoration: none; } nav a:hover { text-decoration: underline; }
.legend { margin: 10px 0 0; display: flex; flex-wrap: wrap; gap: 6px 16px; font-size: 13px; }
.sw { display: inline-block; width: 12px; height: 12px; border-radius: 2px; vertical-align: -1px; margin-right: 5px; }
/* min(…, 100%): a column never asks for more than its container has, so nothing runs past a card */
.cols { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(360px, 100%), 1fr)); gap: 16px;
        align-items: start; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; min-width: 0; }
.jobs { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(360px, 100%), 1fr)); gap: 10px 24px; }
.job, .card > * { min-width: 0; }
.card svg, svg#compare { display: block; max-width: 100%; height: auto; }
/* the charts fill their card at any window (drawn for PAGE_W; at 1920 px a fixed width left a third
   of each card empty); small inline drawings such as the split bars keep their own size */
svg#compare, .card svg.waterfall, .card svg.heat, .card svg.occupancy { width: 100%; }
.big { font-size: 26px; font-weight: 650; } .big small { font-size: 14px; font-weight: 400; color: var(--muted); }
.bad { color: #b3261e; } .ok { color: #1e7a34; }
.verdict { margin: 8px 0; padding: 6px 10px; border-left: 4px solid #d55e00; background: #fff; }
.verdict.ok { border-left-color: #1e7a34; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 8px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { background: #eef0f3; font-weight: 600; } .gs { border-left: 2px solid #c4c7cc; } td.l, th.l { text-align: left; }
table.kv { width: 100%; } table.kv td:first-child { text-align: left; color: var(--muted); width: 34%; }
table.kv td, table.wide td.l { white-space: normal; overflow-wrap: anywhere; }
table.wide { width: 100%; } table.wide th { white-space: normal; } table.wide td, table.wide th { padding: 3px 5px; }
table.stages tr.gs td { border-top: 2px solid #c4c7cc; }
.headline { margin: 0 0 10px; padding: 6px 10px; border-left: 4px solid #b3261e; background: #fff; }
.mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; overflow-wrap: anywhere; }
/* Slowest messages: a message id or a stage name is one token, never broken; wider cards (two per
   row at 1280 px, three at 1920) leave room for a 32-character id next to the other columns. */
#slowest .cols { grid-template-columns: repeat(auto-fit, minmax(min(580px, 100%), 1fr)); }
#slowest .mono, #slowest .stage { white-space: nowrap; overflow-wrap: normal; }
svg text { font: 12px system-ui, "DejaVu Sans", sans-serif; fill: #3c4043; }
svg .axis line, svg .grid { stroke: #c4c7cc; stroke-width: 0.6; }
svg .mark { stroke-width: 1.2; }
footer { margin-top: 30px; color: var(--muted); font-size: 12.5px; max-width: 1100px; }
"""


def _job_card(g: GroupStats, width: int) -> str:
    out = [f'<div class="card" data-group="{escape(g.group)}"><h3>{escape(g.group)}</h3>'
           f'<p class="headline">{escape(group_line(g).split(": ", 1)[-1])}</p>']
    wait = g.stages[HEADLINE_GAP.name]
    wsrc = {"attribute": "from rmqtrace.worker", "inferred": "inferred: peak concurrent handlers",
            "given": "given with --workers"}[g.workers_source]
    out.append('<div class="jobs">')
    for j in g.jobs:
        c = j.critical
        m = c.message
        ratio = j.over_lb or 0.0
        cls = "bad" if ratio > 1.25 else "ok"
        out.append(f'<div class="job" data-job="{escape(j.job_id)}">')
        out.append(f'<div class="big">{fmt_s(j.completion_s)} <span class="{cls}">{ratio:.2f}× LB</span></div>'
                   f'<p class="note" style="margin:0 0 6px">to finish job {escape(j.job_id)}; lower bound '
                   f'{fmt_s(j.lower_bound_s)}</p>')
        out.append('<table class="kv">')
        rows = [
            ("messages", f"{j.messages}"),
            ("workers", f"{j.workers} ({wsrc})"),
            (f"waiting inside the consumer ({HEADLINE_GAP.name})",
             f"{wait.share:.0%} of path time · p99 {fmt_s(wait.p99)} · max {fmt_s(wait.max)}"),
            ("workers busy", f"{j.occupancy:.0%} of workers × completion"),
            ("total handler time", f"{fmt_s(j.total_handler_s)} ÷ {j.workers} workers = "
                                   f"{fmt_s(j.total_handler_s / j.workers if j.workers else 0)}"),
            ("longest message", f"{fmt_s(j.longest_handler_s)} ({escape(j.longest_message_id)})"),
            ("finished last", f'<span class="mono">{escape(m.message_id)}</span> {escape(m.keys)}'
                              f'{"" if m.worker is None else f" · worker {m.worker}"}'),
        ]
        if j.sent_order:  # only for a job sent by send_job (rmqtrace.job.order)
            rows.insert(0, ("sent", escape(sent_order_words(j.sent_order))))
        out += [f"<tr><td>{k}</td><td class='l'>{v}</td></tr>" for k, v in rows]
        out.append("</table>")
        out.append('<p class="note">Where the job\'s time went on the path of the message that finished last:</p>')
        out.append(split_svg(c.split_s, j.completion_s, width if len(g.jobs) == 1 else min(width, 380)))
        out.append('<div class="note">' + " · ".join(
            f'<span class="sw" style="background:{STAGE_COLOR[p]}"></span>{STAGE_LABEL[p]} {fmt_s(c.split_s[p])}'
            for p in SPLIT_PARTS if c.split_s[p] > 0) + "</div>")
        out.append(f'<div class="verdict {cls}">{escape(c.verdict)}</div></div>')  # the accent follows the ratio
    out.append("</div></div>")
    return "".join(out)


def _job_view(report: Report, width: int) -> str:
    return ('<section id="job-view"><h2>Job view</h2><p class="help">Completion = first produce → last handler end. '
            "Lower bound (LB) = max(total handler time ÷ workers, longest message): no schedule on these workers "
            "finishes sooner. The split shows the message that finished last: was it waiting for a worker, "
            "or working?</p>" + compare_svg(report)
            + '<div class="cols">' + "".join(_job_card(g, width) for g in report.groups) + "</div></section>")


# -- stage table -----------------------------------------------------------------------------
def _stages(report: Report) -> str:
    """One row per gap and group (the headline first): seven columns, whatever the number of groups."""
    names = [escape(g.group) for g in report.groups]
    rows = []
    for gap in (HEADLINE_GAP, *(g for g in GAPS if g is not HEADLINE_GAP)):
        sw = f'<span class="sw" style="background:{STAGE_COLOR.get(gap.name, "#444")}"></span>'
        for i, g in enumerate(report.groups):
            s = g.stages[gap.name]
            share = f"{s.share:.0%}" if gap in PATH_GAPS or gap is HEADLINE_GAP else ""
            cells = [fmt_s(s.p50), fmt_s(s.p95), fmt_s(s.p99), fmt_s(s.max), share] if s.count else ["—"] * 4 + [""]
            first = (f'<td class="l" rowspan="{len(report.groups)}"><b>{sw}{gap.name}</b><br>'
                     f'<span class="note">{escape(gap.meaning)}</span></td>') if i == 0 else ""
            cls = ' class="gs"' if i == 0 else ""
            rows.append(f"<tr{cls}>{first}<td class='l'>{names[i]}</td>" + "".join(f"<td>{c}</td>" for c in cells)
                        + "</tr>")
    return ('<section id="stages"><h2>Stage gaps</h2><p class="help">Per gap between stamps: percentiles (nearest '
            f"rank) and the share of all path time (send … handler) it took. {HEADLINE_GAP.name} — the time a "
            "message waited inside the consumer — is client_buffer + dispatch_wait.</p>"
            '<table class="wide stages"><tr><th class="l">gap</th><th class="l">consumer group</th><th>p50</th>'
            f'<th>p95</th><th>p99</th><th>max</th><th>share</th></tr>{"".join(rows)}</table></section>')


def _waterfall(report: Report, max_rows: int, width: int) -> str:
    cards = []
    for g in report.groups:
        svg, shown = waterfall_svg(g, report.axis_s, max_rows, width)
        note = (f"all {shown} messages" if shown == len(g.records) else
                f"{shown} of {len(g.records)} messages: the last to finish, the slowest and an even sample of the "
                "rest")
        cards.append(f'<div class="card" data-group="{escape(g.group)}"><h3>{escape(g.group)}</h3>{svg}'
                     f'<p class="note">{note}, sorted by start; hover a row for its numbers.</p></div>')
    return ('<section id="waterfall"><h2>Waterfall</h2><p class="help">One row per message, sorted by when it was '
            "produced; each coloured segment is a stage. The framed row finished last; the dashed line is where the "
            "job could have finished (lower bound), the solid one where it did.</p>"
            + legend() + '<div class="cols">' + "".join(cards) + "</div></section>")


def _heatmap_block(report: Report, gap: str, width: int) -> str:
    maps = [g.heatmaps[gap] for g in report.groups if gap in g.heatmaps]
    if not maps:
        return ""
    rows = visible_rows(maps)
    top_count = max((c for hm in maps for row in hm.counts for c in row), default=0)
    cards = "".join(
        f'<div class="card" data-group="{escape(g.group)}"><h3>{escape(g.group)}</h3>'
        f"{heatmap_svg(g.heatmaps[gap], rows, top_count, report.axis_s, g.group, width)}"
        f'<p class="note">{g.heatmaps[gap].total} messages · p99 {fmt_s(g.stages[gap].p99)} · '
        f"max {fmt_s(g.stages[gap].max)}</p></div>" for g in report.groups)
    return heat_legend(top_count) + '<div class="cols">' + cards + "</div>"


def _heatmap(report: Report, width: int) -> str:
    name = HEADLINE_GAP.name
    return (f'<section id="heatmap"><h2>Consumer-wait heatmap</h2><p class="help">Messages counted by when their '
            "wait inside the consumer ended — their handler started (x, seconds after the group's first produce) — and "
            f"how long that wait was (y, log scale): {name} = client_buffer (in the client's local cache) + "
            "dispatch_wait (for a free worker). A band rising to the right means messages were taken in early and "
            "queued behind busy workers; compare it with the occupancy below to see whether other workers sat idle "
            "meanwhile.</p>"
            + _heatmap_block(report, name, width) + "</section>")


def _occupancy(report: Report, width: int) -> str:
    y_max = max((max((b for _, b in g.occupancy.steps), default=0) if g.occupancy else 0 for g in report.groups),
                default=1)
    y_max = max([y_max] + [g.workers for g in report.groups])
    cards = []
    for g in report.groups:
        mean = sum(r.handler_s for r in g.records) / (g.workers * g.duration_s) if g.workers and g.duration_s else 0
        cards.append(f'<div class="card" data-group="{escape(g.group)}"><h3>{escape(g.group)}</h3>'
                     f'{occupancy_svg(g, report.axis_s, y_max, width)}<p class="note">workers busy {mean:.0%} of the '
                     f"time until the last message finished ({fmt_s(g.duration_s)}).</p></div>")
    return ('<section id="occupancy"><h2>Worker occupancy</h2><p class="help">Handlers running at each moment. '
            "A gap under the dashed line while the heatmap or waterfall shows messages waiting is time a worker "
            "sat idle next to queued work.</p><div class=\"cols\">" + "".join(cards) + "</div></section>")


# -- who blocked whom -------------------------------------------------------------------------
def _blame(report: Report, top: int = 5) -> str:
    """Per group: the avoidable share of consumer_wait and the messages that held others up."""
    cards = []
    for g in report.groups:
        b = g.blame
        if b is None:
            continue
        rows = "".join(
            f"<tr><td class='l'><span class='mono'>{escape(x.label)}</span><br><span class='note mono'>"
            f"{escape(x.message_id)}</span></td><td>{x.worker}</td><td>{fmt_s(x.handler_s)}</td>"
            f"<td>{fmt_s(x.held_up_s)}</td><td>{x.victims}</td></tr>" for x in b.top[:top])
        table = ('<table class="wide"><tr><th class="l">blocker</th><th>worker</th><th>handler</th><th>held up</th>'
                 f"<th>victims</th></tr>{rows}</table>") if rows else (
            f"<p class='note'>No blocker named: {escape(b.note)}.</p>" if b.note else
            "<p class='note'>No blocker named: the worker ids were inferred.</p>" if not b.blockers_known
            and b.avoidable_s > 0 else
            "<p class='note'>No blocker named: no message waited behind another on its worker.</p>"
            if b.avoidable_s > 0 else "")  # nobody waited avoidably: the verdict above says so
        verdict = b.verdict()  # the one sentence the terminal and the demo print too
        cards.append(f'<div class="card" data-group="{escape(g.group)}"><h3>{escape(g.group)}</h3>'
                     f"<p><b>{escape(verdict[0].upper() + verdict[1:])}</b>; {b.head_of_line} head-of-line, "
                     f"{b.capacity} capacity waits</p>{table}</div>")
    return ('<section id="blame"><h2>Who blocked whom</h2><p class="help">Avoidable: the part of a message\'s '
            f"consumer_wait during which another worker of its consumer was free (the first {GRACE_NS / 1e6:g} ms of a "
            "wait and of "
            "an idle spell are the hand-over, not blamed). A blocker ran on the worker its victims waited for; "
            "held up is the avoidable wait it caused.</p>"
            '<div class="cols">' + "".join(cards) + "</div></section>")


# -- slowest ---------------------------------------------------------------------------------
def _slowest(report: Report) -> str:
    cards = []
    for g in report.groups:
        rows = []
        for i, r in enumerate(g.slowest, 1):
            crit = r.critical_stage
            sw = f'<span class="sw" style="background:{STAGE_COLOR.get(crit, "#444")}"></span>' if crit else ""
            keys = f"<br><span class='note'>{escape(r.keys)}</span>" if r.keys else ""
            job = f"<br><span class='note'>job {escape(r.job_id)}</span>" if len(g.jobs) > 1 else ""
            rows.append(f"<tr><td>{i}</td><td class='l'><span class='mono'>{escape(r.message_id)}</span>{keys}{job}"
                        f"</td><td>{'—' if r.worker is None else r.worker}</td><td>{fmt_s(r.total_s)}</td>"
                        f"<td class='l'>{sw}<span class='stage'>{crit}</span><br>"
                        f"<span class='note'>{fmt_s(r.gap_s(crit))}</span></td></tr>")
        cards.append(f'<div class="card" data-group="{escape(g.group)}"><h3>{escape(g.group)}</h3>'
                     '<table class="wide"><tr><th>#</th><th class="l">message · keys</th>'
                     f'<th>worker</th><th>end to end</th><th class="l">largest stage</th></tr>{"".join(rows)}'
                     "</table></div>")
    return ('<section id="slowest"><h2>Slowest messages</h2><p class="help">By end-to-end time, with the stage that '
            'took longest.</p><div class="cols">' + "".join(cards) + "</div></section>")


def render_html(report: Report, *, title: str = "rmqtrace report", max_rows: int = MAX_ROWS,
                generated: _dt.datetime | None = None) -> str:
    when = (generated or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y-%m-%d %H:%M:%S UTC")
    groups = ", ".join(escape(g.group) for g in report.groups)
    body = [
        f"<header><h1>{escape(title)}</h1><p class='meta'>"
        + " · ".join(x for x in (escape(report.source), f"{report.messages} messages in {len(report.groups)} "
                                 f"consumer group(s): {groups}", f"generated {when}") if x) + "</p>",
        '<nav><a href="#job-view">Job view</a><a href="#stages">Stage gaps</a><a href="#blame">Who blocked whom</a>'
        '<a href="#waterfall">Waterfall</a>'
        '<a href="#heatmap">Heatmap</a><a href="#occupancy">Occupancy</a><a href="#slowest">Slowest</a></nav>'
        + legend() + "</header>",
    ]
    if not report.groups:
        body.append('<section id="job-view"><h2>Job view</h2><p>No consumer spans (<code>process …</code>) found.'
                    "</p></section>")
    else:
        w = chart_width(len(report.groups))
        body += [_job_view(report, w), _stages(report), _blame(report), _waterfall(report, max_rows, w), _heatmap(report, w),
                 _occupancy(report, w), _slowest(report)]
    caveats = "".join(f"<p>{escape(n.removeprefix('* '))}</p>" for n in notes(report))
    body.append(f"<footer>{caveats}<p>All charts of a section share one time axis: seconds after each group's first "
                "produce. Gaps crossing clocks (producer → broker → consumer) are clamped at zero when the clocks "
                "disagree. Made by rmqtrace; this page loads nothing from the network.</p></footer>")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>{escape(title)}</title><style>{CSS}</style>'
            f"</head><body>{''.join(body)}</body></html>\n")


def write_html(report: Report, path: str | Path, **kwargs: object) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_html(report, **kwargs), encoding="utf-8")  # type: ignore[arg-type]
    return p


def write_demo_report(spans_file: Path, out_dir: Path) -> Path:
    """The demo's report: every policy's group side by side in ``out_dir/report.html``."""
    from .sources import read_jsonl
    report = build_report(read_jsonl(spans_file), source=f"spans file {spans_file}")
    return write_html(report, Path(out_dir) / "report.html", title="rmqtrace demo: dispatch policies side by side")
