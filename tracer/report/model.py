"""Spans in, numbers out: per-message records, per-group stage statistics and the job view.

Pure functions over :class:`~tracer.spanfile.SpanRecord`; no I/O, no clock. The gap arithmetic
is :func:`tracer.stamps.compute_gaps`'s, so every number here matches the spans and histograms.

Definitions (also in ``docs/report.md``):

* **message**: one ``process {topic}`` span (kind CONSUMER) — one delivery. Its stamps come
  from the ``rmqtrace.stamp.<stage>_ns`` attributes; when those are missing or not exact
  integers (a trace store that turned them into floats) they are rebuilt from the span's own
  times and its child gap spans (``broker_wait``, ``client_buffer``, ``dispatch_wait``,
  ``handler``) and the producer's ``send`` span, at the store's resolution (µs for Jaeger).
* **group**: ``messaging.consumer.group.name`` — in the demo one group per dispatch policy.
* **job**: ``rmqtrace.job.id``; messages without one form the job ``(no job id)``.
* **completion**: last handler end − first produce of the job's messages.
* **lower bound** (LB): ``max(total handler time / workers, longest handler time)`` — no
  schedule on that many workers can finish the job sooner
  (:func:`tracer.dispatch.simulate.lower_bound`, the one the demo and the benchmarks use).
* **consumer wait** (the headline, :data:`tracer.path.stages.HEADLINE_GAP`): client pull →
  handler start = client_buffer + dispatch_wait, the time a message waited inside the consumer.
* **critical path**: the message that finished last, and how the job's completion splits
  across its stages: produced late, send, broker wait, client buffer, dispatch wait, handler.
* **workers**: distinct (instance, ``rmqtrace.worker``) pairs — each consumer instance numbers
  its workers from 0, so a group run by several instances has the sum of theirs (the instance is
  the span's ``service.instance.id``; a span file names the service, which stands for it, as in
  the fleet view); a record's ``worker`` is then its lane in the group. When a group's spans do
  not carry that attribute, workers are inferred per instance by greedy interval packing of the
  handler intervals (sorted by start, each into the lowest-numbered lane free at that moment).
  That yields the fewest lanes that fit — the peak number of concurrent handlers, a lower bound
  on the real pool size.
* **percentiles**: nearest rank — ``pq`` is the smallest value with at least ``q·n`` values at
  or below it (:func:`percentile`; the demo and the benchmarks use it too).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

from ..path.stages import HEADLINE_GAP, Stage
from ..path.stamps import MISSING
from ..telemetry.spanfile import SpanRecord
from .blame import MAX_OVERLAPS, Blame, Run, TooManyOverlaps, blame
from .jobs import MIXED_ORDER, PRODUCED_LATE, SPLIT_PARTS, WAITING_PARTS, CriticalPath, JobStats, job_stats, sent_order
from .records import (
    GAP_SPANS,
    GROUP_ATTR,
    JOB_ATTR,
    NO_GROUP,
    NO_JOB,
    STAMP_ATTRS,
    STAMP_MAX_NS,
    STAMP_TOLERANCE_NS,
    WORKER_ATTR,
    MessageRecord,
    by_start,
    exact_int,
    exact_stamps,
    group_lanes,
    infer_workers,
    instance_of,
    is_process_span,
    message_record,
    messages_from_spans,
    record_from_fields,
    stamp_ns,
    starts_ends,
)
from .stats import (
    PERCENTILES,
    GapColumns,
    Heatmap,
    Occupancy,
    StageStats,
    bucket_index,
    busy_intervals,
    heatmap,
    mean_busy,
    occupancy,
    percentile,
    stage_stats,
    step_means,
    wait_edges,
)
from .text import NEAR_LOWER_BOUND, format_seconds, sent_order_words, where_time_went_line

BLAME_TOP = 10  # blockers ranked per group (independent of --top, the slowest table's length)

_HANDLER_START, _HANDLER_END = int(Stage.HANDLER_START), int(Stage.HANDLER_END)
_new_run = tuple.__new__  # Run's own __new__ is a Python function around this one

# -- groups and the whole report -------------------------------------------------------------
@dataclass
class GroupStats:
    group: str
    records: list[MessageRecord]
    workers: int
    workers_source: str  # "attribute", "inferred" or "given"
    start_ns: int
    end_ns: int
    stages: dict[str, StageStats]
    jobs: list[JobStats]
    slowest: list[MessageRecord]
    occupancy: Occupancy | None = None
    heatmaps: dict[str, Heatmap] = field(default_factory=dict)
    blame: Blame | None = None  # who blocked whom (tracer.report.blame)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def from_spans(self) -> int:
        return sum(1 for r in self.records if r.timing == "spans")

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group, "messages": len(self.records), "workers": self.workers,
            "workers_source": self.workers_source, "duration_s": self.duration_s,
            "timing_from_spans": self.from_spans,
            "stages": {k: v.as_dict() for k, v in self.stages.items()},
            "jobs": [j.as_dict() for j in self.jobs],
            "slowest": [r.as_dict() for r in self.slowest],
            "occupancy": self.occupancy.as_dict() if self.occupancy else None,
            "heatmaps": {k: v.as_dict() for k, v in self.heatmaps.items()},
            "blame": self.blame.as_dict() if self.blame else None,
        }


@dataclass
class Report:
    groups: list[GroupStats]
    axis_s: float  # the shared time axis of every group's charts: the longest group's duration
    source: str = ""
    spans: int = 0

    @property
    def messages(self) -> int:
        return sum(len(g.records) for g in self.groups)

    def group(self, name: str) -> GroupStats:
        return next(g for g in self.groups if g.group == name)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "spans": self.spans, "messages": self.messages, "axis_s": self.axis_s,
                "groups": [g.as_dict() for g in self.groups]}


# -- the sentences that read a built group or report (the others: tracer.report.text) ----------
def group_line(g: GroupStats) -> str:
    """:func:`where_time_went_line` for a group; its job's ratio and busy share when it ran one job."""
    shares = {name: s.share for name, s in g.stages.items()}
    job = g.jobs[0] if len(g.jobs) == 1 else None
    return where_time_went_line(g.group, shares, job.over_lb if job else None, job.occupancy if job else None)


def notes(report: Report) -> list[str]:
    """Caveats about how the numbers were got (plain text; the terminal and the page both show them)."""
    out = []
    inferred = [g.group for g in report.groups if g.workers_source == "inferred"]
    if inferred:
        out.append("* workers of " + ", ".join(inferred) + " were inferred: the spans carry no rmqtrace.worker, so "
                   "handler intervals were packed greedily into lanes (by start, each into the lowest free lane). "
                   "That count is the peak number of concurrent handlers — a lower bound on the pool size, so the "
                   "lower bound shown may be a little high.")
    out += [f"* blockers of {g.group} not named: {g.blame.note}" for g in report.groups if g.blame and g.blame.note]
    rebuilt = sum(g.from_spans for g in report.groups)
    if rebuilt:
        out.append(f"{rebuilt} message(s) carried no exact stamps; their timing was rebuilt from span start/end "
                   "times (the trace store's resolution).")
    return out


def build_group(group: str, records: list[MessageRecord], *, top: int = 10, workers: int | None = None,
                columns: GapColumns | None = None, intervals: list[tuple[int, int]] | None = None) -> GroupStats:
    """One group's statistics; ``columns`` (:class:`GapColumns`) and ``intervals`` (:func:`busy_intervals`)
    are its records' when the caller has them (every pass over 10⁵ records costs its cache misses)."""
    cols = columns if columns is not None else GapColumns(records)
    handled = [r for r, v in zip(records, cols.seconds["handler"]) if v is not None]
    if workers:
        source = "given"
        group_lanes(handled)
    elif all(r.worker is not None and not r.worker_inferred for r in handled):
        source = "attribute"
        workers = group_lanes(handled)
    else:
        source = "inferred"
        by_instance: dict[str, list[MessageRecord]] = {}
        for r in records:
            by_instance.setdefault(r.instance, []).append(r)
        workers = 0
        for _, rs in sorted(by_instance.items()):  # each instance's own peak, lanes numbered on
            lanes = infer_workers(rs)
            for r in rs:
                if r.worker_inferred and r.worker is not None:
                    r.worker += workers
            workers += lanes
    if intervals is None:
        intervals = busy_intervals(records)
    jobs: dict[str, list[MessageRecord]] = {}
    for r in records:
        jobs.setdefault(r.job_id, []).append(r)
    starts, ends = starts_ends(records)
    one = len(jobs) == 1  # then the job's records are the group's, in the same order
    job_list = [job_stats(group, j, rs, workers, intervals, cols if one else None, (starts, ends) if one else None)
                for j, rs in jobs.items()]
    job_list.sort(key=lambda j: j.start_ns)
    # MessageRecord.total_s of each, then the top by it (nsmallest is sorted()[:top], ties in record order)
    total = [max(0, e - a) / 1e9 if v is None else v for v, a, e in zip(cols.seconds["end_to_end"], starts, ends)]
    slowest = [records[k] for k in heapq.nsmallest(max(0, top), range(len(records)), key=lambda k: (-total[k], starts[k]))]
    return GroupStats(group, records, workers, source, min(starts), max(ends), stage_stats(records, cols), job_list,
                      slowest, blame=group_blame(records, workers, source))


def group_blame(records: Sequence[MessageRecord], workers: int, workers_source: str, *, top: int = BLAME_TOP,
                max_overlaps: int | None = None) -> Blame | None:
    """Who blocked whom in one group (:mod:`tracer.report.blame`); blockers are named only when the
    worker ids are the spans' own. None when no message was handled.

    Naming them takes up to ``max_overlaps`` (victim, run) steps (default the shared
    :data:`~tracer.report.blame.MAX_OVERLAPS`, as the fleet view's jobs): past that the shares are
    given without names, and ``note`` says why — a group whose waits are long and mostly avoidable
    (``--workers`` above the worker ids seen) would otherwise take victims × runs per wait."""
    runs: list[Run] = []
    pull_i, enqueue_i = int(Stage.CLIENT_PULL), int(Stage.DISPATCH_ENQUEUE)
    for r in records:
        times = r.stamps.times
        start, end = times[_HANDLER_START], times[_HANDLER_END]
        if start == MISSING or end == MISSING or r.worker is None:
            continue
        enqueued = times[enqueue_i]  # put in a worker's buffer (or the shared queue) then
        waited = times[pull_i] or enqueued or start
        runs.append(_new_run(Run, (r.message_id, r.keys or r.message_id, r.worker, waited if waited < start else start,
                                   start, end, enqueued if enqueued != MISSING else None)))
    if not runs:
        return None
    ids = len({r.worker for r in runs})
    known = workers_source != "inferred" and not any(r.worker_inferred for r in records)
    bound = MAX_OVERLAPS if max_overlaps is None else max_overlaps  # at call time: a test may lower it
    try:
        return blame(runs, max(workers, ids), blockers_known=known, top=top, max_overlaps=bound)
    except TooManyOverlaps as exc:  # the shares take no steps: give them, and say why no name is given
        shares = blame(runs, max(workers, ids), blockers_known=False, top=top)
        return replace(shares, blockers_known=known,
                       note=f"{exc}; read one --job or --group, or fewer --workers")


HEATMAP_GAPS: tuple[str, ...] = (HEADLINE_GAP.name,)


def build_report(spans: Iterable[SpanRecord], *, group: str | None = None, job: str | None = None, top: int = 10,
                 workers: int | None = None, time_buckets: int = 40, source: str = "") -> Report:
    """Everything the terminal, HTML and JSON views show, from a collection of spans."""
    span_list = list(spans)
    return report_from_messages(messages_from_spans(span_list), len(span_list), group=group, job=job, top=top,
                                workers=workers, time_buckets=time_buckets, source=source)


def report_from_messages(records: list[MessageRecord], spans: int, *, group: str | None = None,
                         job: str | None = None, top: int = 10, workers: int | None = None, time_buckets: int = 40,
                         source: str = "") -> Report:
    """:func:`build_report` from the message records (:func:`messages_from_spans`, by start) and
    the number of spans they came from."""
    if group is not None:
        records = [r for r in records if r.group == group]
    if job is not None:
        records = [r for r in records if r.job_id == job]
    by_group: dict[str, list[MessageRecord]] = {}
    for r in records:
        by_group.setdefault(r.group, []).append(r)
    columns = {g: GapColumns(rs) for g, rs in by_group.items()}
    intervals = {g: busy_intervals(rs) for g, rs in by_group.items()}
    groups = [build_group(g, rs, top=top, workers=workers, columns=columns[g], intervals=intervals[g])
              for g, rs in by_group.items()]
    groups.sort(key=lambda g: g.start_ns)  # stable: a tie keeps the order the spans came in
    axis_s = max((g.duration_s for g in groups), default=0.0)
    for name in HEATMAP_GAPS:
        longest = max((v for g in groups for v in columns[g.group].or_zero(name)), default=0.0)  # of gap_s
        edges = wait_edges(longest)
        for g in groups:
            g.heatmaps[name] = heatmap(g.records, name, g.start_ns, axis_s, time_buckets, edges, columns[g.group])
    for g in groups:
        g.occupancy = occupancy(g.records, g.start_ns, axis_s, time_buckets, g.workers, intervals[g.group])
    return Report(groups, axis_s, source, spans)


# the names of the four modules above, importable from here as before the split
__all__ = [
    "BLAME_TOP", "CriticalPath", "GAP_SPANS", "GROUP_ATTR", "GapColumns", "GroupStats", "HEATMAP_GAPS", "Heatmap",
    "JOB_ATTR", "JobStats", "MIXED_ORDER", "MessageRecord", "NEAR_LOWER_BOUND", "NO_GROUP", "NO_JOB", "Occupancy",
    "PERCENTILES", "PRODUCED_LATE", "Report", "SPLIT_PARTS", "STAMP_ATTRS", "STAMP_MAX_NS", "STAMP_TOLERANCE_NS",
    "StageStats", "WAITING_PARTS", "WORKER_ATTR", "bucket_index", "build_group", "build_report", "busy_intervals",
    "by_start", "exact_int", "exact_stamps", "format_seconds", "group_blame", "group_lanes", "group_line",
    "heatmap", "infer_workers", "instance_of", "is_process_span", "job_stats", "mean_busy", "message_record",
    "messages_from_spans", "notes", "occupancy", "percentile", "record_from_fields", "report_from_messages",
    "sent_order", "sent_order_words", "stage_stats", "stamp_ns", "step_means", "wait_edges",
    "where_time_went_line"
]
