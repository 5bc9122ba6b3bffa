"""The fleet view in words and on a page: per job its lines (terminal), lanes of handler runs per
instance and worker (HTML), and ``rmqtrace report --fleet`` (:func:`cli_fleet`). The numbers are
:mod:`tracer.report.fleet`'s.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any, Iterable, Sequence

from .fleet import BAR_COLOR, HELD_COLOR, TERMINAL_BLOCKERS, VIEW_W, FleetCollector, FleetJob, FleetSection
from .fleetblame import FleetBlocker
from .fleetread import read_jaeger_fleet
from .text import fleet_verdict

__all__ = ["blocker_name", "cli_fleet", "fleet_lines", "fleet_page"]


def fleet_lines(jobs: Iterable[FleetJob]) -> list[str]:
    """The fleet view as terminal lines, one block per job."""
    out: list[str] = []
    for j in jobs:
        c = j.critical
        out.append(f"Fleet: job {j.job}, {j.messages} messages over {len(j.instances)} instances: completed in "
                   f"{j.completion_s:.2f} s; {j.idle_while_held_s:.1f} idle worker-s while another instance held "
                   f"unstarted messages, {j.inprocess_idle_while_held_s:.1f} inside instances")
        out.append(f"  critical path: the last message ended on {c['instance']} at +{c['ended_s']:.2f} s — "
                   f"received +{c['received_s']:.2f} s, waited {c['waited_unstarted_s']:.2f} s unstarted there, "
                   f"handler {c['handler_s']:.2f} s")
        a = j.avoidable
        if a.get("consumer_wait_s"):
            out.append(f"  avoidable: {fleet_verdict(a, j.messages)}")
        out += _blocker_lines(j)
        width = max(len(i.name) for i in j.instances)
        out.append(f"  {'instance':<{width}}  messages   busy  workers  most held  held while others idled")
        for i in sorted(j.instances, key=lambda i: -i.held_while_others_idled_s):
            w = f"{i.workers}{'?' if i.workers_inferred else ''}"
            out.append(f"  {i.name:<{width}}  {i.messages:>8}  {i.busy_share:>4.0%}  {w:>7}  {i.max_held:>9}  "
                       f"{i.held_while_others_idled_s:>8.1f} worker-s")
        if any(i.workers_inferred for i in j.instances):
            out.append("  ?: no rmqtrace.worker on the spans; workers = the most handlers that overlapped (a lower bound)")
    return out


def blocker_name(b: FleetBlocker) -> str:
    """How a blocker is printed: its keys and its message id (the id alone when it has no keys)."""
    return b.message_id if b.label in ("", b.message_id) else f"{b.label} ({b.message_id})"


def _blocker_lines(j: FleetJob) -> list[str]:
    if not j.blockers:
        return [f"  no blocker named: {j.blockers_note}"] if j.blockers_note else []
    out = [f"  who held it up (fleet-avoidable wait caused = victims × seconds; top {min(len(j.blockers), TERMINAL_BLOCKERS)}):"]
    for b in j.blockers[:TERMINAL_BLOCKERS]:
        out.append(f"    {blocker_name(b)} on {b.instance}, worker {b.worker}, handler {b.handler_s:.3f} s: held up "
                   f"{b.victims} message{'s' if b.victims != 1 else ''} for {b.held_up_s:.3f} s")
    return out


def _lanes_svg(sec: FleetSection, span: int, width: int = VIEW_W) -> str:
    """One section's lanes on the shared time axis: a labelled tick every nice step (gridlines through
    every lane), per instance the held line over its own 0…peak scale, then one lane per worker."""
    from .charts import nice_ticks

    t0 = min(x.pull_ns for x in sec.records)
    lane_h, held_h, gap, left, right = 10, 36, 16, 170, 16
    plot_w = width - left - right
    scale = plot_w / span
    rows: list[str] = []
    y = 8
    for i, name in enumerate(sec.instances):
        mine = sorted((x for x in sec.records if x.instance == i), key=lambda x: x.start_ns)
        ev = sorted([(min(x.pull_ns, x.start_ns), 1) for x in mine] + [(x.start_ns, -1) for x in mine])
        peak = max(1, sec.max_held[i] if i < len(sec.max_held) else 1)
        pts, cur = [f"{left},{y + held_h}"], 0
        for t, d in ev:
            px = left + (t - t0) * scale
            pts.append(f"{px:.1f},{y + held_h - cur * held_h / peak:.1f}")
            cur += d
            pts.append(f"{px:.1f},{y + held_h - cur * held_h / peak:.1f}")
        rows.append(f'<polyline fill="none" stroke="{HELD_COLOR}" stroke-width="1.4" points="{" ".join(pts)}"/>')
        # the held line's scale: 0 at the band's foot, the peak at its top
        rows.append(f'<g class="held-scale" fill="{HELD_COLOR}" font-size="12" text-anchor="end">'
                    f'<line x1="{left - 2}" y1="{y}" x2="{left - 2}" y2="{y + held_h}" stroke="{HELD_COLOR}"/>'
                    f'<text x="{left - 6}" y="{y + 10}">{peak if mine else 0}</text>'
                    f'<text x="{left - 6}" y="{y + held_h}">0</text></g>')
        rows.append(f'<text x="4" y="{y + 14}" font-size="14" font-weight="600">{escape(name)}</text>'
                    f'<text x="4" y="{y + 31}" font-size="12" fill="{HELD_COLOR}">held ≤ {peak if mine else 0}</text>')
        y += held_h + 4
        n_lanes = max(1, sec.workers[i])
        lane_of: dict[int, int] = {}
        free = [0] * n_lanes  # packed lanes: a worker's bars never overlap
        for x in mine:
            if sec.by_worker and x.message >= 0:
                lane = lane_of.setdefault(x.message, len(lane_of) % n_lanes)
            else:
                lane = next((k for k, f in enumerate(free) if f <= x.start_ns), min(range(n_lanes), key=free.__getitem__))
                free[lane] = x.end_ns
            rows.append(f'<rect x="{left + (x.start_ns - t0) * scale:.1f}" y="{y + lane * lane_h}" '
                        f'width="{max(0.6, (x.end_ns - x.start_ns) * scale):.1f}" height="{lane_h - 2}" fill="{BAR_COLOR}">'
                        f'<title>waited {(x.start_ns - x.pull_ns) / 1e9:.3f} s unstarted, handler '
                        f'{(x.end_ns - x.start_ns) / 1e9:.3f} s</title></rect>')
        rows.append(f'<text x="4" y="{y + min(n_lanes, 2) * lane_h - 1}" font-size="12" fill="#555">'
                    f'{n_lanes} worker{"s" if n_lanes != 1 else ""}</text>')
        y += n_lanes * lane_h + gap
    axis = ['<g class="axis" font-size="12" fill="#444" text-anchor="middle">',
            f'<line x1="{left}" y1="{y}" x2="{left + plot_w}" y2="{y}" stroke="#888"/>']
    for tick in nice_ticks(span / 1e9):
        at = left + tick * 1e9 * scale
        axis.append(f'<line class="grid" x1="{at:.1f}" y1="4" x2="{at:.1f}" y2="{y + 4}" stroke="#d5d8dc" '
                    f'stroke-width="0.8"/><text x="{at:.1f}" y="{y + 18}">{tick:g} s</text>')
    axis.append(f'<text x="{left + plot_w}" y="{y + 34}" text-anchor="end">seconds after the first pull</text></g>')
    height = y + 42
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'font-family="system-ui, DejaVu Sans, sans-serif" role="img" aria-label="{escape(sec.title)}">'
            f'{"".join(axis[:2])}{"".join(axis[2:])}{"".join(rows)}</svg>')


def _blockers_table(blockers: Sequence[FleetBlocker]) -> str:
    """The section's top blockers: the runs that held up waits another worker of the fleet could have taken."""
    if not blockers:
        return ""
    rows = "".join(f"<tr><td>{escape(blocker_name(b))}</td><td>{escape(b.instance)}</td><td>{b.worker}</td>"
                   f"<td>{b.handler_s:.3f} s</td><td>{b.victims}</td><td>{b.held_up_s:.3f} s</td></tr>" for b in blockers)
    return ("<table class='blockers'><caption>Who held it up: the runs behind which messages waited while a worker of "
            "the fleet was free (held up = victims × seconds)</caption><tr><th>message</th><th>instance</th>"
            f"<th>worker</th><th>handler</th><th>victims</th><th>held up</th></tr>{rows}</table>")


def fleet_page(title: str, sections: Sequence[FleetSection], *, width: int = VIEW_W) -> str:
    """A self-contained HTML page: per section, one lane group per instance — the messages it held
    received but not started (red step line, on its own 0…peak scale) over one lane per worker, a bar
    per handler. All sections share one time axis, so a longer job draws longer; the drawing is
    ``width`` units wide and scales to the window."""
    drawn = [s for s in sections if s.records]
    span = max([1] + [max(x.end_ns for x in s.records) - min(x.pull_ns for x in s.records) for s in drawn])
    legend = (f'<div class="legend"><span><span class="sw" style="background:{BAR_COLOR}"></span>a handler running '
              f'(one lane per worker; hover a bar for its wait)</span><span><span class="sw" style="background:'
              f'{HELD_COLOR}"></span>held: messages the consumer had received but not started, on the scale at the '
              "left of its band (0 at the foot, its peak at the top)</span></div>")
    parts = [f"<!doctype html><meta charset='utf-8'><meta name='viewport' content='width=device-width, initial-scale=1'>"
             f"<title>{escape(title)}</title>",
             "<style>body{font-family:system-ui,'DejaVu Sans',sans-serif;margin:24px;font-size:15px}"
             "h2{margin-bottom:2px}p{margin-top:2px;color:#444;max-width:1100px}"
             "svg{display:block;width:100%;height:auto;margin:8px 0 18px}"
             ".legend{display:flex;flex-wrap:wrap;gap:6px 22px;margin:8px 0 12px}"
             ".sw{display:inline-block;width:14px;height:10px;margin-right:6px;vertical-align:0}"
             "table.blockers{border-collapse:collapse;margin:0 0 24px}table.blockers caption{text-align:left;color:#444;"
             "padding-bottom:4px}table.blockers td,table.blockers th{padding:2px 10px;text-align:left;"
             "border-bottom:1px solid #ddd}</style>",
             f"<h1>{escape(title)}</h1>",
             "<p>Per consumer instance: the red line is how many messages it held received but not started; below it "
             "one lane per worker, one bar per handler. Every section shares one time axis.</p>", legend]
    for sec in drawn:
        parts.append(f"<h2>{escape(sec.title)}</h2><p>{escape(sec.subtitle)}</p>{_lanes_svg(sec, span, width)}"
                     f"{_blockers_table(sec.blockers)}"
                     + (f"<p>No blocker named: {escape(sec.blockers_note)}</p>" if sec.blockers_note else ""))
    return "".join(parts)


def cli_fleet(args: Any) -> int:
    """``rmqtrace report --jaeger URL --fleet``: every trace of ``--service`` in ``--lookback``, paged
    (``rmqtrace report SPANS.jsonl --fleet``: every process span of the file, its ``service`` as the
    instance); the fleet view per job on stdout (``--json``: as JSON), ``--html FILE``: the lanes per
    instance."""
    import sys
    from pathlib import Path

    from .sources import SourceError, parse_duration

    spans = getattr(args, "spans", None)
    if not args.jaeger and not spans:
        print("rmqtrace report: --fleet reads Jaeger or a span file: give --jaeger URL or SPANS.jsonl", file=sys.stderr)
        return 2
    if spans:
        collector = FleetCollector()
        try:
            collector.add_span_file(spans)
        except SourceError as exc:
            print(f"rmqtrace report: {exc}", file=sys.stderr)
            return 1
        collector.api = f"spans file {spans}"
        where = f"in {spans}"
    else:
        try:
            lookback = parse_duration(args.lookback)
        except ValueError as exc:
            print(f"rmqtrace report: {exc}", file=sys.stderr)
            return 2
        try:
            collector = read_jaeger_fleet(args.jaeger, args.service, lookback_s=lookback, timeout=args.timeout,
                                          grpc_target=getattr(args, "jaeger_grpc", None))
        except (OSError, ValueError, SourceError) as exc:
            print(f"rmqtrace report: reading Jaeger at {args.jaeger}: {exc}", file=sys.stderr)
            return 1
        where = f"of service {args.service!r} in the last {args.lookback}"
    jobs = [j for j in collector.job_views() if not args.job or j.job == args.job]
    if not jobs:
        print(f"rmqtrace report: no handled consumer spans {where} ({collector.traces} traces read)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"traces": collector.traces, "pages": collector.pages, "api": collector.api,
                          "jobs": [j.as_dict() for j in jobs]}))
    else:
        print("\n".join(fleet_lines(jobs)))
        print(f"read {collector.traces} traces in {collector.pages} pages from {args.jaeger or spans} ({collector.api})")
    if args.html:
        page = Path(args.html)
        try:  # checked before the work (report/cli.py _unwritable); the disk can still fill
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(fleet_page(f"Fleet of {args.service}", [j.section for j in jobs if j.section]),
                            encoding="utf-8")
        except OSError as exc:
            print(f"rmqtrace report: --html {page}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"html: open {page.resolve().as_uri()}", file=sys.stderr if args.json else sys.stdout)
    return 0
