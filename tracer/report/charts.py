"""The report's charts as inline SVG: the stage split bars, the job comparison, the waterfall, the
wait heatmap and the occupancy steps, with their axes, colours and legends (:mod:`tracer.report.html`
lays them out on the page)."""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

from ..path.stages import GAP_BY_NAME, PATH_GAPS
from ..path.stamps import timeline
from .jobs import PRODUCED_LATE, SPLIT_PARTS
from .model import GroupStats, Report
from .records import MessageRecord
from .stats import Heatmap, step_means
from .text import format_seconds

__all__ = [
    "CHART_W", "EMPTY_CELL", "HEAT", "MAX_ROWS", "MAX_STEPS", "PAGE_W", "STAGE_COLOR", "STAGE_LABEL",
    "chart_width", "compare_svg", "fmt_s", "heat_legend", "heatmap_svg", "legend", "nice_ticks", "occupancy_svg",
    "sample_rows", "split_svg", "visible_rows", "waterfall_svg"
]


MAX_ROWS = 300
MAX_STEPS = 4000  # occupancy steps drawn exactly up to this many, else averaged per pixel column
STAGE_COLOR = {PRODUCED_LATE: "#d9d9d9", "send": "#9e9e9e", "broker_wait": "#56b4e9", "client_buffer": "#e69f00",
               "dispatch_wait": "#d55e00", "handler": "#009e73"}
STAGE_LABEL = {PRODUCED_LATE: "not yet produced", "send": "send", "broker_wait": "broker wait",
               "client_buffer": "client buffer", "dispatch_wait": "dispatch wait", "handler": "handler"}
HEAT = ("#f7fcfd", "#bfd3e6", "#8c96c6", "#8c6bb1", "#88419d", "#4d004b")  # light → dark, for counts
EMPTY_CELL = "#f1f1f1"
CHART_W = 640  # default chart width (px); render_html fits it to the number of side-by-side columns
PAGE_W = 1600  # the viewport the layout is sized for (and the PNG's width)


# -- small helpers ---------------------------------------------------------------------------
fmt_s = format_seconds


def _n(v: float) -> str:
    """A compact SVG coordinate."""
    return f"{v:.2f}".rstrip("0").rstrip(".") if v != int(v) else str(int(v))


def nice_ticks(limit: float, target: int = 6) -> list[float]:
    """Round tick values from 0 to ``limit``."""
    if limit <= 0:
        return [0.0]
    raw = limit / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = int(limit / step + 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def _tick_label(v: float) -> str:
    return f"{v:g} s"


def _heat_color(count: int, top: int) -> str:
    if count <= 0:
        return EMPTY_CELL
    if top <= 1:
        return HEAT[-1]
    x = math.log(count) / math.log(top)  # 1 → lightest non-empty, top → darkest
    pos = 1 + x * (len(HEAT) - 2)
    i = min(len(HEAT) - 2, int(pos))
    return _mix(HEAT[i], HEAT[i + 1], pos - i)


def _mix(a: str, b: str, t: float) -> str:
    ca = [int(a[i:i + 2], 16) for i in (1, 3, 5)]
    cb = [int(b[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb, strict=True))


def _ink(background: str) -> str:
    """Text colour readable on ``background`` (#rrggbb)."""
    r, g, b = (int(background[i:i + 2], 16) for i in (1, 3, 5))
    return "#1d1d1f" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"


def _wait_label(v: float) -> str:
    if v == 0:
        return "0"
    if v < 1e-3:
        return f"{v * 1e6:g} µs"
    if v < 1:
        return f"{v * 1e3:g} ms"
    return f"{v:g} s"


def _wait_range(lo: float, hi: float) -> str:
    """``50–100 ms``, ``500 ms–1 s``: the unit once when both ends share it."""
    a, b = _wait_label(lo), _wait_label(hi)
    ua, ub = a.rsplit(" ", 1)[-1], b.rsplit(" ", 1)[-1]
    return f"{a.rsplit(' ', 1)[0]}–{b}" if ua == ub else f"{a}–{b}"


def legend() -> str:
    return '<div class="legend">' + "".join(
        f'<span><span class="sw" style="background:{STAGE_COLOR[p]}"></span>{STAGE_LABEL[p]}'
        f'{" — " + escape(GAP_BY_NAME[p].meaning) if p in GAP_BY_NAME else " — produced after the job began"}</span>'
        for p in SPLIT_PARTS) + "</div>"


class _X:
    """Seconds since the group's start → SVG x."""

    def __init__(self, axis_s: float, left: float, width: float) -> None:
        self.axis_s = axis_s or 1.0
        self.left = left
        self.width = width

    def __call__(self, t_s: float) -> float:
        return self.left + max(0.0, min(1.0, t_s / self.axis_s)) * self.width


def _axis(x: _X, y: float, height_above: float) -> list[str]:
    out = ['<g class="axis">', f'<line x1="{_n(x.left)}" y1="{_n(y)}" x2="{_n(x.left + x.width)}" y2="{_n(y)}"/>']
    for t in nice_ticks(x.axis_s):
        px = x(t)
        out.append(f'<line class="grid" x1="{_n(px)}" y1="{_n(y - height_above)}" x2="{_n(px)}" y2="{_n(y + 4)}"/>')
        out.append(f'<text x="{_n(px)}" y="{_n(y + 15)}" text-anchor="middle">{_tick_label(t)}</text>')
    out.append("</g>")
    return out


# -- job view --------------------------------------------------------------------------------
def split_svg(split: dict[str, float], total: float, w: int = CHART_W) -> str:
    h = 26
    x = 0.0
    parts = []
    scale = w / total if total else 0.0
    for p in SPLIT_PARTS:
        seg = split.get(p, 0.0) * scale
        if seg <= 0:
            continue
        parts.append(f'<rect x="{_n(x)}" y="0" width="{_n(max(seg, 0.8))}" height="{h}" fill="{STAGE_COLOR[p]}">'
                     f'<title>{STAGE_LABEL[p]}: {fmt_s(split[p])}</title></rect>')
        if seg > 70:
            parts.append(f'<text x="{_n(x + 4)}" y="17" style="fill:{_ink(STAGE_COLOR[p])};font-weight:600">'
                         f"{fmt_s(split[p])}</text>")
        x += seg
    return (f'<svg class="split" width="{w}" viewBox="0 0 {w} {h}" role="img" aria-label="critical path split">'
            + "".join(parts) + "</svg>")


def compare_svg(report: Report) -> str:
    """Completion (bar) against the lower bound (tick) for every job, on one scale."""
    jobs = [(g, j) for g in report.groups for j in g.jobs]
    top = max([j.completion_s for _, j in jobs] + [j.lower_bound_s for _, j in jobs] + [1e-9])
    label_w, row_h, w, head = 200, 26, 1100, 22
    x = _X(top * 1.05, label_w, w - label_w - 130)
    h = head + len(jobs) * row_h + 30
    out = [f'<svg id="compare" width="{w}" viewBox="0 0 {w} {h}" role="img" aria-label="completion vs lower bound">',
           f'<rect x="{label_w}" y="4" width="14" height="10" fill="#5b6b82"/><text x="{label_w + 20}" y="13">'
           f'completion</text><line x1="{label_w + 112}" y1="2" x2="{label_w + 112}" y2="16" stroke="#d55e00" '
           f'stroke-width="3"/><text x="{label_w + 120}" y="13">lower bound: no schedule on these workers finishes '
           "sooner</text>"]
    for i, (g, j) in enumerate(jobs):
        y = head + i * row_h + 4
        ratio = f"{j.over_lb:.2f}× LB" if j.over_lb else ""
        out.append(f'<text x="0" y="{y + 15}">{escape(g.group)}{" / " + escape(j.job_id) if len(g.jobs) > 1 else ""}'
                   "</text>")
        out.append(f'<rect class="completion" x="{label_w}" y="{y + 3}" width="{_n(x(j.completion_s) - label_w)}" '
                   f'height="{row_h - 10}" fill="#5b6b82"><title>completion {fmt_s(j.completion_s)}</title></rect>')
        lb = x(j.lower_bound_s)
        out.append(f'<line class="mark" x1="{_n(lb)}" y1="{y}" x2="{_n(lb)}" y2="{y + row_h - 4}" stroke="#d55e00" '
                   f'stroke-width="3"><title>lower bound {fmt_s(j.lower_bound_s)}</title></line>')
        out.append(f'<text x="{_n(x(j.completion_s) + 6)}" y="{y + 15}">{fmt_s(j.completion_s)} · {ratio}</text>')
    out += _axis(x, head + len(jobs) * row_h + 8, len(jobs) * row_h + 4)
    out.append("</svg>")
    return "".join(out)


# -- waterfall -------------------------------------------------------------------------------
def sample_rows(g: GroupStats, max_rows: int) -> list[MessageRecord]:
    """All messages when they fit; else the last finisher of each job, the slowest, and an even
    sample of the rest, sorted by start."""
    recs = g.records
    if len(recs) <= max_rows:
        return list(recs)
    keep = {id(j.critical.message): j.critical.message for j in g.jobs}
    for r in g.slowest:
        if len(keep) < max_rows:
            keep.setdefault(id(r), r)
    rest = [r for r in recs if id(r) not in keep]
    room = max_rows - len(keep)
    for i in range(room):
        r = rest[i * len(rest) // room]
        keep[id(r)] = r
    return sorted(keep.values(), key=lambda r: (r.start_ns, r.message_id))


def _row_title(r: MessageRecord, t0: int) -> str:
    parts = [f"{r.message_id} {r.keys} job={r.job_id} worker={'—' if r.worker is None else r.worker}",
             f"start +{(r.start_ns - t0) / 1e9:.3f} s, end to end {fmt_s(r.total_s)}"]
    parts += [f"{g.name} {fmt_s(r.gaps[g.name].seconds)}" for g in PATH_GAPS if g.name in r.gaps]
    return escape(" · ".join(parts))


def waterfall_svg(g: GroupStats, axis_s: float, max_rows: int = MAX_ROWS, width: int = CHART_W) -> tuple[str, int]:
    rows = sample_rows(g, max_rows)
    rh = max(2.0, min(12.0, 600 / max(1, len(rows))))
    top, left, right = 22, 12, 50  # the right margin holds the "◀ last" label
    x = _X(axis_s, left, width - left - right)
    plot_h = len(rows) * rh
    h = top + plot_h + 24
    last = {id(j.critical.message) for j in g.jobs}
    out = [f'<svg class="waterfall" width="{width}" viewBox="0 0 {width} {_n(h)}" role="img" '
           f'aria-label="waterfall of {escape(g.group)}">']
    out += _axis(x, top + plot_h + 2, plot_h + 2)
    for i, r in enumerate(rows):
        y = top + i * rh
        fixed = dict(timeline(r.stamps))
        segs = []
        for gap in PATH_GAPS:
            if gap.start not in fixed or gap.end not in fixed:
                continue
            a, b = x((fixed[gap.start] - g.start_ns) / 1e9), x((fixed[gap.end] - g.start_ns) / 1e9)
            wd = b - a
            if gap.name == "handler":
                wd = max(wd, 0.8)
            elif wd < 0.25:
                continue
            segs.append(f'<rect x="{_n(a)}" y="{_n(y)}" width="{_n(wd)}" height="{_n(max(1.0, rh - 0.4))}" '
                        f'fill="{STAGE_COLOR[gap.name]}"/>')
        crit = id(r) in last
        cls = ' class="crit"' if crit else ""
        out.append(f"<g{cls}><title>{_row_title(r, g.start_ns)}</title>{''.join(segs)}</g>")
        if crit:
            a = x((r.start_ns - g.start_ns) / 1e9)
            b = x((r.end_ns - g.start_ns) / 1e9)
            out.append(f'<rect x="{_n(a - 1)}" y="{_n(y - 1.5)}" width="{_n(b - a + 2)}" height="{_n(rh + 3)}" '
                       'fill="none" stroke="#111" stroke-width="1.2"/>')
            out.append(f'<text x="{_n(b + 4)}" y="{_n(y + rh / 2 + 4)}" style="font-weight:600">◀ last</text>')
    for j in g.jobs:
        done = x((j.end_ns - g.start_ns) / 1e9)
        lb = x((j.start_ns - g.start_ns) / 1e9 + j.lower_bound_s)
        out.append(f'<line class="mark" x1="{_n(lb)}" y1="12" x2="{_n(lb)}" y2="{_n(top + plot_h)}" stroke="#d55e00" '
                   f'stroke-dasharray="4 3"><title>job {escape(j.job_id)}: lower bound {fmt_s(j.lower_bound_s)}'
                   "</title></line>")
        out.append(f'<text x="{_n(lb)}" y="10" text-anchor="middle" style="fill:#d55e00">LB</text>')
        out.append(f'<line class="mark" x1="{_n(done)}" y1="12" x2="{_n(done)}" y2="{_n(top + plot_h)}" '
                   f'stroke="#111"><title>job {escape(j.job_id)} done after {fmt_s(j.completion_s)}</title></line>')
        out.append(f'<text x="{_n(min(done, width - 20))}" y="10" text-anchor="middle">done</text>')
    out.append("</svg>")
    return "".join(out), len(rows)


# -- heatmap ---------------------------------------------------------------------------------
def visible_rows(maps: Sequence[Heatmap]) -> int:
    """Wait buckets up to the highest non-empty one in any group (at least two rows)."""
    top = 0
    for hm in maps:
        for j, row in enumerate(hm.counts):
            if any(row):
                top = max(top, j)
    return max(2, top + 1)


def heatmap_svg(hm: Heatmap, rows: int, top_count: int, axis_s: float, group: str, width: int = CHART_W) -> str:
    left, cell_h, top = 92, 16, 6
    buckets = len(hm.counts[0]) if hm.counts else 0
    plot_w = width - left - 10
    cw = plot_w / max(1, buckets)
    x = _X(axis_s, left, plot_w)
    h = top + rows * cell_h + 24
    out = [f'<svg class="heat" width="{width}" viewBox="0 0 {width} {h}" role="img" '
           f'aria-label="{escape(hm.gap)} heatmap of {escape(group)}">']
    edges = hm.wait_edges_s
    for j in range(rows):
        y = top + (rows - 1 - j) * cell_h  # longest waits on top
        lo = edges[j]
        label = f"≥ {_wait_label(lo)}" if j + 1 >= len(edges) else (
            f"< {_wait_label(edges[1])}" if j == 0 else _wait_range(lo, edges[j + 1]))
        out.append(f'<text x="{left - 4}" y="{_n(y + cell_h - 4)}" text-anchor="end">{label}</text>')
        for i in range(buckets):
            c = hm.counts[j][i]
            hi = _wait_label(edges[j + 1]) if j + 1 < len(edges) else "∞"
            title = (f"<title>{c} message(s) began waiting {i * hm.bucket_s:.2f}–{(i + 1) * hm.bucket_s:.2f} s "
                     f"after the start and waited {_wait_label(lo)}–{hi}</title>") if c else ""
            out.append(f'<rect x="{_n(left + i * cw)}" y="{_n(y)}" width="{_n(cw - 0.6)}" height="{cell_h - 0.6}" '
                       f'fill="{_heat_color(c, top_count)}"{" data-count=" + chr(34) + str(c) + chr(34) if c else ""}>'
                       f"{title}</rect>")
    out += _axis(x, top + rows * cell_h + 1, 0)
    out.append("</svg>")
    return "".join(out)


def heat_legend(top_count: int) -> str:
    steps = [1] + sorted({max(1, round(top_count ** f)) for f in (0.25, 0.5, 0.75)} - {1}) + [top_count]
    steps = sorted(set(steps))
    return ('<div class="legend">messages per cell: ' + "".join(
        f'<span><span class="sw" style="background:{_heat_color(s, top_count)};border:1px solid #ccc"></span>{s}'
        "</span>" for s in steps) + "</div>")


# -- occupancy -------------------------------------------------------------------------------
def occupancy_svg(g: GroupStats, axis_s: float, y_max: int, width: int = CHART_W) -> str:
    occ = g.occupancy
    assert occ is not None
    left, top, ph = 30, 16, 140
    x = _X(axis_s, left, width - left - 10)
    ymax = max(1, y_max)

    def y(v: float) -> float:
        return top + ph - v / ymax * ph

    out = [f'<svg class="occupancy" width="{width}" viewBox="0 0 {width} {top + ph + 24}" role="img" '
           f'aria-label="busy workers of {escape(g.group)}">']
    for v in sorted({0, ymax // 2, ymax}):
        out.append(f'<line class="grid" x1="{left}" y1="{_n(y(v))}" x2="{width - 10}" y2="{_n(y(v))}"/>'
                   f'<text x="{left - 4}" y="{_n(y(v) + 4)}" text-anchor="end">{v}</text>')
    steps: Sequence[tuple[float, float]] = occ.steps
    if len(steps) > MAX_STEPS:  # one point per pixel column is all a screen can show
        cols = int(x.width)
        steps = [(i * axis_s / cols, m) for i, m in enumerate(step_means(occ.steps, axis_s, cols))]
    d = [f"M{_n(x(0))},{_n(y(0))}"]
    prev: float = 0
    for t, busy in steps:
        px = x(t)
        d.append(f"L{_n(px)},{_n(y(prev))}L{_n(px)},{_n(y(busy))}")
        prev = busy
    d.append(f"L{_n(x(axis_s))},{_n(y(prev))}L{_n(x(axis_s))},{_n(y(0))}Z")
    mean = sum(r.handler_s for r in g.records) / (g.workers * g.duration_s) if g.workers and g.duration_s else 0.0
    out.append(f'<path d="{"".join(d)}" fill="#009e73" fill-opacity="0.55" stroke="#00704f" stroke-width="0.8">'
               f"<title>handlers running; {mean:.0%} of {g.workers} workers × {fmt_s(g.duration_s)}</title></path>")
    out.append(f'<line class="mark" x1="{left}" y1="{_n(y(g.workers))}" x2="{width - 10}" y2="{_n(y(g.workers))}" '
               f'stroke="#111" stroke-dasharray="5 3"/><text x="{width - 12}" y="{_n(y(g.workers) - 3)}" '
               f'text-anchor="end">{g.workers} workers</text>')
    for j in g.jobs:
        done = x((j.end_ns - g.start_ns) / 1e9)
        out.append(f'<line class="mark" x1="{_n(done)}" y1="{top}" x2="{_n(done)}" y2="{top + ph}" stroke="#111"/>')
    out += _axis(x, top + ph, 0)
    out.append("</svg>")
    return "".join(out)


def chart_width(groups: int, page_w: int = PAGE_W) -> int:
    """Chart width (px) so that ``groups`` columns side by side fit a ``page_w`` viewport at 1:1.

    Narrower windows scale the charts down (``max-width: 100%``); they are never blown up.
    """
    cols = max(1, min(groups, 4))
    content = page_w - 2 * 28  # body padding
    col = (content - 16 * (cols - 1)) / cols - 30  # grid gap, card padding and border
    return int(max(330, min(1100, col)))
