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

import bisect
import heapq
import math
import operator
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from ..dispatch.simulate import lower_bound
from ..path import names
from ..path.stages import GAP_BY_NAME, GAPS, HEADLINE_GAP, PATH_GAPS, Stage
from ..path.stamps import MISSING, GapValue, Stamps, causal, compute_gaps, in_order, timeline
from ..telemetry.spanfile import SpanRecord
from .blame import MAX_OVERLAPS, Blame, Run, TooManyOverlaps, blame

NO_JOB = "(no job id)"
NO_GROUP = "(no group)"
GROUP_ATTR = names.CONSUMER_GROUP
JOB_ATTR = names.JOB_ID
WORKER_ATTR = names.WORKER
STAMP_ATTRS: dict[Stage, str] = names.STAMP_ATTRS
# Child spans written by tracer.telemetry: name -> the stages bounding it.
GAP_SPANS: dict[str, tuple[Stage, Stage]] = {
    **{g.name: (g.start, g.end) for g in names.GAP_SPANS},
    names.HANDLER_SPAN: (Stage.HANDLER_START, Stage.HANDLER_END),
}
# Stamps must agree with the process span's end this closely; beyond it they are not trusted.
# Jaeger keeps µs: start and duration are each truncated, so 2 µs is the honest slack.
STAMP_TOLERANCE_NS = 5_000
BLAME_TOP = 10  # blockers ranked per group (independent of --top, the slowest table's length)
PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))
# The critical path split: what happened before the message existed, then the path gaps.
PRODUCED_LATE = "produced_late"
SPLIT_PARTS: tuple[str, ...] = (PRODUCED_LATE,) + tuple(g.name for g in PATH_GAPS)
# The path gaps the headline gap is made of: waiting for a worker, inside the consumer.
WAITING_PARTS: tuple[str, ...] = tuple(g.name for g in PATH_GAPS
                                       if g.start >= HEADLINE_GAP.start and g.end <= HEADLINE_GAP.end)


_HANDLER_START, _HANDLER_END = int(Stage.HANDLER_START), int(Stage.HANDLER_END)


# -- per message -----------------------------------------------------------------------------
@dataclass(slots=True)
class MessageRecord:
    """One delivery of one message, with its stamps and gaps."""

    trace_id: str
    span_id: str
    group: str
    topic: str
    message_id: str
    job_id: str
    stamps: Stamps
    timing: str = "stamps"  # "stamps": exact attribute stamps; "spans": rebuilt from span times
    worker: int | None = None
    worker_inferred: bool = False
    cost: float | None = None
    outcome: str = ""
    attempt: int = 1
    keys: str = ""
    instance: str = ""  # the consumer instance that handled it (instance_of); worker ids are per instance
    order: str = ""  # the job's send order (rmqtrace.job.order, set by send_job), "" when not recorded
    # compute_gaps(stamps), made when first asked for: the report's tables read the stamps'
    # columns instead (gap_columns), and seven GapValues and a dict per message were a sixth of the read
    _gaps: dict[str, GapValue] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def gaps(self) -> dict[str, GapValue]:
        """Every gap whose two stamps are present, by name (:func:`~tracer.path.stamps.compute_gaps`)."""
        g = self._gaps
        if g is None:
            g = self._gaps = {v.gap.name: v for v in compute_gaps(self.stamps)}
        return g

    def t(self, stage: Stage) -> int:
        return self.stamps.times[stage]

    def gap_s(self, name: str) -> float:
        g = self.gaps.get(name)
        return g.seconds if g is not None else 0.0

    # start_ns, end_ns and handled run several times per message in a report: plain loops and
    # indexes, no generator (a third of their cost at 10⁴ messages)
    @property
    def start_ns(self) -> int:
        """The first stamp (produce when present)."""
        for ns in self.stamps.times:
            if ns != MISSING:
                return ns
        return MISSING

    @property
    def end_ns(self) -> int:
        """Handler end, or the last stamp when the handler never ended."""
        for ns in reversed(self.stamps.times):
            if ns != MISSING:
                return ns
        return MISSING

    @property
    def handled(self) -> bool:
        times = self.stamps.times
        return times[_HANDLER_START] != MISSING and times[_HANDLER_END] != MISSING

    @property
    def handler_s(self) -> float:
        return self.gap_s("handler")

    @property
    def total_s(self) -> float:
        """End to end when produce was stamped, else first stamp to last."""
        if "end_to_end" in self.gaps:
            return self.gaps["end_to_end"].seconds
        return max(0, self.end_ns - self.start_ns) / 1e9

    @property
    def critical_stage(self) -> str:
        """The largest of the path gaps (send … handler)."""
        present = [g for g in PATH_GAPS if g.name in self.gaps]
        if not present:
            return ""
        return max(present, key=lambda g: self.gaps[g.name].seconds).name

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id, "message_id": self.message_id, "group": self.group, "job": self.job_id,
            "topic": self.topic, "keys": self.keys, "instance": self.instance, "worker": self.worker,
            "worker_inferred": self.worker_inferred,
            "attempt": self.attempt, "outcome": self.outcome, "cost": self.cost, "timing": self.timing,
            "stamps_ns": self.stamps.as_dict(), "gaps_s": {k: v.seconds for k, v in self.gaps.items()},
            "total_s": self.total_s, "critical_stage": self.critical_stage,
        }


def is_process_span(span: SpanRecord) -> bool:
    if span.attributes.get(names.OPERATION_TYPE) == names.PROCESS:
        return True
    return span.name.startswith(names.process_span_name("")) and span.kind.upper() == "CONSUMER"


def exact_int(value: Any) -> int | None:
    """An int that is exactly what was written: ints and digit strings; floats are not exact."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            try:
                return int(text)
            except ValueError:  # digits to isdigit, not to int: "--5", "²", past 4300 digits
                return None
    return None


# A stamp is ns since the epoch in an int64 (what OTLP and Jaeger carry): below 0 or past it the
# writer or a store mangled it, and the stage order and the gaps made of it would be garbage.
STAMP_MAX_NS = 2**63 - 1


def stamp_ns(value: Any) -> int | None:
    """A stamp attribute as it can be trusted: an exact int (:func:`exact_int`: an int, or digits
    in a string as ``/api/traces`` writes int64) in ``[0, 2^63)``, ``0`` meaning not stamped.
    None for anything else — a float (not exact), a negative or out-of-range number, text."""
    ns = value if type(value) is int else exact_int(value)
    return ns if ns is not None and 0 <= ns <= STAMP_MAX_NS else None


def _stamps_from_attributes(attrs: dict[str, Any]) -> Stamps | None:
    """The exact stamps, or None when any stamp attribute is present but not a stamp (:func:`stamp_ns`)."""
    st = Stamps()
    for stage, key in STAMP_ATTRS.items():
        if key not in attrs:
            continue
        ns = stamp_ns(attrs[key])
        if ns is None:
            return None
        st.times[stage] = ns
    return st


def _stamps_from_spans(process: SpanRecord, children: Sequence[SpanRecord], parent: SpanRecord | None) -> Stamps:
    """Stamps rebuilt from span times (the gap spans are drawn from the clamped timeline)."""
    st = Stamps()
    t = st.times
    for child in children:
        bounds = GAP_SPANS.get(child.name)
        if bounds is None:
            continue
        a, b = bounds
        t[a] = t[a] or child.start_ns
        t[b] = t[b] or child.end_ns
    if parent is not None and parent.kind.upper() == "PRODUCER":
        t[Stage.PRODUCE] = parent.start_ns  # taken just before the produce stamp
    if t[Stage.HANDLER_END] == MISSING:
        t[Stage.HANDLER_END] = process.end_ns
    if not any(t[s] for s in (Stage.BROKER_STORE, Stage.CLIENT_PULL, Stage.DISPATCH_ENQUEUE, Stage.HANDLER_START)):
        t[Stage.CLIENT_PULL] = process.start_ns
    return st


def _consistent(stamps: Stamps, process: SpanRecord) -> bool:
    """The stamps' clamped timeline ends where the process span ends (when handler end is stamped)."""
    if not stamps.has(Stage.HANDLER_END):
        return True
    end = dict(timeline(stamps)).get(Stage.HANDLER_END)  # None only for stamps stamp_ns refuses (< 0)
    return end is not None and abs(end - process.end_ns) <= STAMP_TOLERANCE_NS


def _num(value: Any, kind: type, default: Any) -> Any:
    try:
        return kind(value) if value is not None and value != "" else default
    except (TypeError, ValueError):
        return default


def _keys(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        try:
            return ",".join(value)  # the usual: a list of strings
        except TypeError:
            return ",".join(str(v) for v in value)
    return str(value) if value is not None else ""


def exact_stamps(span: SpanRecord) -> Stamps | None:
    """A process span's own stamp attributes when they are exact and agree with its end, else None
    (then its timing has to be rebuilt from its child spans and its producer's: :func:`messages_from_spans`)."""
    stamps = _stamps_from_attributes(span.attributes)
    if stamps is None or not any(stamps.times) or not _consistent(stamps, span):
        return None
    return stamps


def message_record(span: SpanRecord, stamps: Stamps, timing: str = "stamps") -> MessageRecord:
    """The record of one process span with the stamps it was given."""
    a = span.attributes
    return MessageRecord(
        trace_id=span.trace_id, span_id=span.span_id,
        group=str(a.get(GROUP_ATTR) or NO_GROUP),
        topic=str(a.get(names.DESTINATION) or span.name.removeprefix(names.process_span_name(""))),
        message_id=str(a.get(names.MESSAGE_ID) or span.span_id),
        job_id=str(a.get(JOB_ATTR) or NO_JOB), stamps=stamps, timing=timing, worker=exact_int(a.get(WORKER_ATTR)),
        cost=_num(a.get(names.COST), float, None), outcome=str(a.get(names.OUTCOME) or ""),
        attempt=_num(a.get(names.DELIVERY_ATTEMPT, a.get(names.LEGACY_DELIVERY_ATTEMPT)), int, 1),
        keys=_keys(a.get(names.MESSAGE_KEYS)), instance=instance_of(span), order=_order(a.get(names.JOB_ORDER)),
    )


def instance_of(span: SpanRecord) -> str:
    """The consumer instance of a span: its resource's ``service.instance.id`` where the source
    names it, else its service (a span file: one service per instance, as the fleet view takes it)."""
    return span.instance or span.service or ""


_STAMP_KEYS: tuple[tuple[int, str], ...] = tuple((int(stage), key) for stage, key in STAMP_ATTRS.items())
_STAMP_NAMES: tuple[str, ...] = tuple(key for _, key in _STAMP_KEYS)
_SIX_INTS = (int,) * len(Stage)
assert [i for i, _ in _STAMP_KEYS] == list(range(len(Stage))) == [0, 1, 2, 3, 4, 5]  # the fast path spells them out
_GAP_INDEX: tuple[tuple[str, int, int], ...] = tuple((g.name, int(g.start), int(g.end)) for g in GAPS)
_PROCESS_PREFIX = names.process_span_name("")
_new_run = tuple.__new__  # Run's own __new__ is a Python function around this one
_STAGE_GETTERS = tuple(operator.itemgetter(int(stage)) for stage in Stage)


def record_from_fields(trace_id: str, span_id: str, name: str, end_ns: int, attrs: dict[str, Any],
                       instance: str = "") -> MessageRecord | None:
    """``message_record(span, exact_stamps(span))`` for a process span given by its fields, without
    building the span; None where :func:`exact_stamps` is None. The span-file reader's path: the
    common case (stamps in stage order) takes no :func:`~tracer.path.stamps.causal` copy, the rest
    goes through the general functions, so the numbers are theirs."""
    times: list[Any] = list(map(attrs.get, _STAMP_NAMES))  # ints once checked
    if (tuple(map(type, times)) == _SIX_INTS and min(times) > MISSING and max(times) <= STAMP_MAX_NS
            and times[0] <= times[1] <= times[2] <= times[3] <= times[4] <= times[5]):
        # what the tracer writes: every stamp, exact and in stage order; the checks of exact_stamps
        # are then only the end's (causal(times) is times, timeline() moves nothing)
        if abs(times[_HANDLER_END] - end_ns) > STAMP_TOLERANCE_NS:
            return None
        stamps = Stamps(times)
    else:
        times = [MISSING] * len(Stage)
        for i, key in _STAMP_KEYS:
            v = attrs.get(key)
            if v is None:
                if key in attrs:
                    return None
                continue
            v = stamp_ns(v)
            if v is None:
                return None
            times[i] = v
        if not any(times):
            return None  # no stamp at all
        stamps = Stamps(times)
        if in_order(times):
            if times[_HANDLER_END] != MISSING and abs(times[_HANDLER_END] - end_ns) > STAMP_TOLERANCE_NS:
                return None
        elif not _consistent(stamps, SpanRecord(trace_id, span_id, None, name, "CONSUMER", MISSING, end_ns)):
            return None
    a = attrs
    # message_record's conversions, each with the common case first (str of a str, an int as is)
    worker, cost, keys = a.get(WORKER_ATTR), a.get(names.COST), a.get(names.MESSAGE_KEYS)
    attempt = a.get(names.DELIVERY_ATTEMPT, a.get(names.LEGACY_DELIVERY_ATTEMPT))
    return MessageRecord(
        trace_id, span_id, str(a.get(GROUP_ATTR) or NO_GROUP),
        str(a.get(names.DESTINATION) or name.removeprefix(_PROCESS_PREFIX)),
        str(a.get(names.MESSAGE_ID) or span_id), str(a.get(JOB_ATTR) or NO_JOB), stamps, "stamps",
        worker if type(worker) is int else exact_int(worker), False, None if cost is None else _num(cost, float, None),
        str(a.get(names.OUTCOME) or ""), attempt if type(attempt) is int else _num(attempt, int, 1),
        _keys(keys), instance, _order(a.get(names.JOB_ORDER)))


def _order(value: Any) -> str:
    """A recorded send order, or "" (none, or not one of ours: a span file is anyone's input)."""
    return value if value is not None and value in names.JOB_ORDERS else ""


MIXED_ORDER = "mixed"  # a job whose messages say different send orders (or some say none)
_ORDER_WORDS = {"longest_first": "longest first", "arrival": "in arrival order",
                MIXED_ORDER: "mixed orders", "": "not recorded"}


def sent_order_words(order: str) -> str:
    """How the report and the demo say a send order: "longest first", "in arrival order", …"""
    return _ORDER_WORDS.get(order, order)


def sent_order(records: Iterable[MessageRecord]) -> str:
    """The order a job was sent in, from its messages: one of :data:`~tracer.path.names.JOB_ORDERS`,
    :data:`MIXED_ORDER`, or "" when none of them recorded one (sent one at a time)."""
    orders = {r.order for r in records}
    if len(orders) == 1:
        return orders.pop()
    return MIXED_ORDER if orders else ""


def messages_from_spans(spans: Iterable[SpanRecord]) -> list[MessageRecord]:
    """One record per ``process`` span (duplicates by trace and span id are dropped), by start."""
    by_id: dict[tuple[str, str], SpanRecord] = {}
    for s in spans:
        by_id.setdefault((s.trace_id, s.span_id), s)
    children: dict[tuple[str, str], list[SpanRecord]] | None = None
    out: list[MessageRecord] = []
    for key, span in by_id.items():
        if not is_process_span(span):
            continue
        stamps = exact_stamps(span)
        if stamps is not None:
            out.append(message_record(span, stamps))
            continue
        if children is None:  # only a message without exact stamps needs the other spans
            children = {}
            for s in by_id.values():
                if s.parent_span_id:
                    children.setdefault((s.trace_id, s.parent_span_id), []).append(s)
        parent = by_id.get((span.trace_id, span.parent_span_id)) if span.parent_span_id else None
        out.append(message_record(span, _stamps_from_spans(span, children.get(key, []), parent), "spans"))
    out.sort(key=by_start)
    return out


def by_start(r: MessageRecord) -> tuple[int, str]:
    """The order records are kept in: by :attr:`~MessageRecord.start_ns`, then message id (the
    property spelled out: this runs once per record of every read)."""
    t = r.stamps.times
    return t[0] or t[1] or t[2] or t[3] or t[4] or t[5], r.message_id


def group_lanes(records: Sequence[MessageRecord]) -> int:
    """Number the group's workers across its instances and return how many there are: every
    instance numbers its own workers from 0 (``rmqtrace.worker``), so worker 0 of instance a and
    worker 0 of instance b are two workers. ``worker`` becomes the group's lane, one per
    (instance, worker) pair in that order; a group of one instance keeps its ids."""
    pairs = sorted({(r.instance, r.worker) for r in records if r.worker is not None})
    if len({i for i, _ in pairs}) > 1:
        lane = {p: k for k, p in enumerate(pairs)}
        for r in records:
            if r.worker is not None:
                r.worker = lane[(r.instance, r.worker)]
    return len(pairs)


def infer_workers(records: Sequence[MessageRecord]) -> int:
    """Assign worker lanes by greedy interval packing of the handler intervals; returns the lane count.

    Records are taken by handler start; each goes to the lowest-numbered lane whose previous
    handler ended at or before this one starts. For intervals this first-fit order is optimal:
    the lane count equals the peak number of overlapping handlers.
    """
    busy: list[tuple[int, int]] = []  # (end_ns, lane)
    free: list[int] = []
    lanes = 0
    handled = sorted((r for r in records if r.handled),
                     key=lambda r: (r.t(Stage.HANDLER_START), r.t(Stage.HANDLER_END)))
    for r in handled:
        start = r.t(Stage.HANDLER_START)
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = lanes
            lanes += 1
        r.worker = lane
        r.worker_inferred = True
        heapq.heappush(busy, (max(start, r.t(Stage.HANDLER_END)), lane))
    return lanes


# -- statistics ------------------------------------------------------------------------------
def format_seconds(v: float | None) -> str:
    """A duration for people: µs, ms or s with sensible precision; ``—`` when unknown."""
    if v is None:
        return "—"
    if v == 0:
        return "0"
    if v < 0.001:
        return f"{v * 1e6:.0f} µs"
    if v < 1:
        return f"{v * 1e3:.1f} ms"
    return f"{v:.2f} s"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q·n`` of the values at or below it."""
    return _ranked(sorted(values), q)


def _ranked(ordered: Sequence[float], q: float) -> float:
    """:func:`percentile` of values already sorted."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q * len(ordered) - 1e-9))
    return ordered[min(len(ordered), rank) - 1]


@dataclass
class StageStats:
    gap: str
    count: int
    p50: float
    p95: float
    p99: float
    max: float
    mean: float
    total: float
    share: float  # of all path time (send … handler) in the group; path gaps and the headline only
    clamped: int  # gaps that came out negative (clock skew) and were reported as 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class GapColumns:
    """Per gap, its seconds for every record, in record order (None where a stamp is missing), and
    how many came out negative: what :func:`~tracer.path.stamps.compute_gaps` gives record by
    record, computed from the stamps' columns — no GapValue per message (the tables need only these)."""

    __slots__ = ("seconds", "clamped")

    def __init__(self, records: Sequence[MessageRecord]) -> None:
        raw = [r.stamps.times for r in records]
        # column by column (zip(*raw) takes twice as long: an iterator per record, interleaved)
        tcols = [list(map(getter, raw)) for getter in _STAGE_GETTERS]
        # every stamp present and each column at or below the next (map over the columns, in C):
        # in_order for all, so causal() is the stamps themselves; else record by record
        ordered = all(all(col) for col in tcols) and all(all(map(operator.le, a, b)) for a, b in zip(tcols, tcols[1:]))
        if not ordered:
            fixed = [causal(t) for t in raw]  # t itself when in stage order
            ordered = all(c is t for c, t in zip(fixed, raw))
        ccols = tcols if ordered else [list(map(getter, fixed)) for getter in _STAGE_GETTERS]
        self.seconds: dict[str, list[float | None]] = {}
        self.clamped: dict[str, int] = {}
        for name, a, b in _GAP_INDEX:
            ta, tb = tcols[a], tcols[b]
            if ordered:  # no gap is negative: compute_gaps' seconds are (b - a) / 1e9
                self.seconds[name] = [(y - x) / 1e9 if x and y else None for x, y in zip(ta, tb)]
                self.clamped[name] = 0
                continue
            self.seconds[name] = [
                None if not (x and y) else (cy - cx) / 1e9 if y >= x else max(0.0, (cy - cx) / 1e9)
                for x, y, cx, cy in zip(ta, tb, ccols[a], ccols[b])]
            self.clamped[name] = sum(1 for x, y in zip(ta, tb) if x and y and y < x)

    def present(self, gap: str) -> list[float]:
        """The gap's seconds where both its stamps are, in record order."""
        return [v for v in self.seconds[gap] if v is not None]

    def or_zero(self, gap: str) -> list[float]:
        """The gap's seconds per record, 0.0 where a stamp is missing (:meth:`MessageRecord.gap_s`)."""
        return [0.0 if v is None else v for v in self.seconds[gap]]


def stage_stats(records: Sequence[MessageRecord], columns: GapColumns | None = None) -> dict[str, StageStats]:
    # each gap's values in record order (the sums do not depend on how they were gathered, only on
    # that order), each gap's values sorted once for all its percentiles
    cols = columns if columns is not None else GapColumns(records)
    # the path gaps' seconds in the order record by record, gap by gap
    path_total = sum(v for row in zip(*(cols.seconds[g.name] for g in PATH_GAPS)) for v in row if v is not None)
    out: dict[str, StageStats] = {}
    for g in GAPS:
        mine = cols.present(g.name)
        total = sum(mine)
        ordered = sorted(mine)
        p50, p95, p99, top = (_ranked(ordered, q) for _, q in PERCENTILES)
        out[g.name] = StageStats(
            g.name, len(mine), p50, p95, p99, top, mean=total / len(mine) if mine else 0.0, total=total,
            share=total / path_total if path_total and (g in PATH_GAPS or g is HEADLINE_GAP) else 0.0,
            clamped=cols.clamped[g.name])
    return out


def busy_intervals(records: Iterable[MessageRecord]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for r in records:  # r.handled and r.t() inlined: twice per group over every record
        times = r.stamps.times
        start, end = times[_HANDLER_START], times[_HANDLER_END]
        if start != MISSING and end != MISSING:
            out.append((start, end))
    return out


def mean_busy(intervals: Sequence[tuple[int, int]], a_ns: int, b_ns: int) -> float | None:
    """Average number of handlers running over ``[a, b)``; None for an empty window."""
    if b_ns <= a_ns:
        return None
    covered = 0
    for s, e in intervals:  # comparisons, not min/max calls: this runs over every handler, twice per job
        lo = s if s > a_ns else a_ns
        hi = e if e < b_ns else b_ns
        if hi > lo:
            covered += hi - lo
    return covered / (b_ns - a_ns)


@dataclass
class Occupancy:
    """Busy workers over time, relative to the group's start (seconds)."""

    workers: int
    steps: list[tuple[float, int]]  # (t_s, busy from t on), starting at (0, 0)
    bucket_s: float
    mean_busy: list[float]  # per bucket of ``bucket_s``

    def as_dict(self) -> dict[str, Any]:
        return {"workers": self.workers, "bucket_s": self.bucket_s, "mean_busy": self.mean_busy}


def occupancy(records: Sequence[MessageRecord], t0_ns: int, axis_s: float, buckets: int, workers: int,
              intervals: Sequence[tuple[int, int]] | None = None) -> Occupancy:
    """Busy workers over time; ``intervals`` are the records' :func:`busy_intervals` when the caller has them."""
    if intervals is None:
        intervals = busy_intervals(records)
    # each event one int, 2·ns + 1 for a start, 2·ns for an end: sorted as ints (not pairs), they
    # come by time with ends before starts at the same instant
    events = [2 * s + 1 for s, _ in intervals] + [2 * e for _, e in intervals]
    events.sort()
    steps: list[tuple[float, int]] = [(0.0, 0)]
    busy = 0
    last_t = 0.0
    for x in events:
        ns = x >> 1  # floor: 2·ns + 1 >> 1 is ns, negative ns too
        busy += 1 if x & 1 else -1
        t = (ns - t0_ns) / 1e9
        if last_t == t:
            steps[-1] = (t, busy)
        else:
            steps.append((t, busy))
            last_t = t
    width = axis_s / buckets if buckets and axis_s > 0 else 0.0
    return Occupancy(workers, steps, width, step_means(steps, axis_s, buckets) if width > 0 else [])


def step_means(steps: Sequence[tuple[float, int]], axis_s: float, buckets: int) -> list[float]:
    """The mean of a step function (``(t, level from t on)``, sorted) over ``buckets`` equal
    slices of ``[0, axis_s)``; one sweep, so it stays cheap for any number of steps."""
    width = axis_s / buckets
    means: list[float] = []
    k, n = 0, len(steps)
    for i in range(buckets):
        a, b = i * width, (i + 1) * width
        while k + 1 < n and steps[k + 1][0] <= a:
            k += 1
        area, cur, j = 0.0, a, k
        while True:
            level = steps[j][1] if steps[j][0] <= cur else 0
            nxt = steps[j + 1][0] if j + 1 < n else math.inf
            end = min(b, nxt)
            area += level * (end - cur)
            if nxt >= b:
                break
            cur, j = nxt, j + 1
        means.append(area / width)
    return means


def wait_edges(max_s: float, floor_s: float = 1e-4) -> list[float]:
    """Log-scale wait bucket edges: 0, then 0.1 ms and 1-2-5 steps from 1 ms up past ``max_s``."""
    edges = [0.0, floor_s]
    decade = 1e-3
    while edges[-1] <= max_s:
        for m in (1, 2, 5):
            edges.append(round(m * decade, 9))
            if edges[-1] > max_s:
                break
        decade *= 10
    return edges


def bucket_index(edges: Sequence[float], value: float) -> int:
    """Index i with ``edges[i] <= value < edges[i+1]`` (the last bucket is open-ended)."""
    return min(max(bisect.bisect_right(edges, value) - 1, 0), max(len(edges) - 1, 0))


@dataclass
class Heatmap:
    """Counts of messages by when their wait ended (x) and how long it lasted (y, log buckets).

    x is the gap's end (handler start for consumer_wait), not its start: a prefetching consumer takes
    every message in at once, and by its start the map would be one column at x=0."""

    gap: str
    bucket_s: float  # time bucket width; bucket i covers [i·w, (i+1)·w) after the group start
    wait_edges_s: list[float]  # wait bucket j covers [edges[j], edges[j+1]); the last is open
    counts: list[list[int]]  # counts[j][i]

    @property
    def total(self) -> int:
        return sum(map(sum, self.counts))

    def as_dict(self) -> dict[str, Any]:
        return {"gap": self.gap, "bucket_s": self.bucket_s, "wait_edges_s": self.wait_edges_s, "counts": self.counts}


def heatmap(records: Sequence[MessageRecord], gap: str, t0_ns: int, axis_s: float, buckets: int,
            edges: Sequence[float], columns: GapColumns | None = None) -> Heatmap:
    end_stage = int(GAP_BY_NAME[gap].end)
    counts = [[0] * buckets for _ in edges]
    width = axis_s / buckets if buckets and axis_s > 0 else 1.0
    last, top = buckets - 1, max(len(edges) - 1, 0)
    seconds = (columns if columns is not None else GapColumns(records)).seconds[gap]
    right = bisect.bisect_right
    for r, v in zip(records, seconds):  # bucket_index and the clamps inlined: once per record
        if v is None:
            continue
        i = int((r.stamps.times[end_stage] - t0_ns) / 1e9 / width)
        i = last if i > last else 0 if i < 0 else i
        j = right(edges, v) - 1
        counts[top if j > top else 0 if j < 0 else j][i] += 1
    return Heatmap(gap, width, list(edges), counts)


# -- jobs ------------------------------------------------------------------------------------
@dataclass
class CriticalPath:
    """The message that finished last and where the job's completion went on its way."""

    message: MessageRecord
    split_s: dict[str, float]  # SPLIT_PARTS -> seconds; they add up to the job's completion
    waiting_s: float  # client_buffer + dispatch_wait: queued inside the consumer for a worker
    working_s: float  # its handler
    broker_s: float  # send + broker_wait
    idle_workers: float | None  # workers idle on average while it waited inside the consumer
    idle_in_broker: float | None  # workers idle on average while it waited in the broker
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return {"message": self.message.as_dict(), "split_s": self.split_s, "waiting_s": self.waiting_s,
                "working_s": self.working_s, "broker_s": self.broker_s, "idle_workers": self.idle_workers,
                "idle_in_broker": self.idle_in_broker, "verdict": self.verdict}


@dataclass
class JobStats:
    group: str
    job_id: str
    messages: int
    workers: int
    start_ns: int
    end_ns: int
    completion_s: float
    total_handler_s: float
    longest_handler_s: float
    longest_message_id: str
    lower_bound_s: float
    occupancy: float  # total handler / (workers × completion)
    critical: CriticalPath
    sent_order: str = ""  # sent_order() of its messages: longest_first, arrival, mixed, or "" (not recorded)

    @property
    def over_lb(self) -> float | None:
        return self.completion_s / self.lower_bound_s if self.lower_bound_s else None

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "critical"}
        d["over_lb"] = self.over_lb
        d["critical"] = self.critical.as_dict()
        return d


def _idle(intervals: Sequence[tuple[int, int]], workers: int, a_ns: int, b_ns: int) -> float | None:
    if not a_ns or not b_ns:
        return None
    busy = mean_busy(intervals, a_ns, b_ns)
    return None if busy is None else max(0.0, workers - busy)


def _verdict(split: dict[str, float], idle: float | None, idle_broker: float | None, workers: int) -> str:
    parts = {"waiting for a worker inside the consumer": sum(split[p] for p in WAITING_PARTS),
             "working (its own handler)": split["handler"],
             "waiting in the broker": split["send"] + split["broker_wait"],
             "not yet produced": split[PRODUCED_LATE]}
    what, secs = max(parts.items(), key=lambda kv: kv[1])
    line = f"mostly {what}: {secs:.3f} s of {sum(split.values()):.3f} s"
    window_idle = idle if what.startswith("waiting for") else idle_broker if what.endswith("broker") else None
    if window_idle is not None:
        line += f", while on average {window_idle:.1f} of {workers} workers were idle"
    return line


def _starts_ends(records: Sequence[MessageRecord]) -> tuple[list[int], list[int]]:
    """Every record's :attr:`~MessageRecord.start_ns` and :attr:`~MessageRecord.end_ns` (the first
    and the last stamp present: MISSING is 0), without two property calls per record."""
    times = [r.stamps.times for r in records]
    return ([t[0] or t[1] or t[2] or t[3] or t[4] or t[5] for t in times],
            [t[5] or t[4] or t[3] or t[2] or t[1] or t[0] for t in times])


assert len(Stage) == 6 and MISSING == 0  # what _starts_ends spells out


def job_stats(group: str, job_id: str, records: Sequence[MessageRecord], workers: int,
              group_intervals: Sequence[tuple[int, int]], columns: GapColumns | None = None,
              bounds: tuple[list[int], list[int]] | None = None) -> JobStats:
    """The job view of one job's records; ``group_intervals`` are every handler run of the group;
    ``columns`` and ``bounds`` (every record's start and end) the records' when the caller has them."""
    column = (columns if columns is not None else GapColumns(records)).seconds["handler"]
    ran = [k for k, v in enumerate(column) if v is not None]  # handled: both handler stamps present
    handled = [records[k] for k in ran]
    starts, ends = bounds if bounds is not None else _starts_ends(records)
    start, end = min(starts), max(ends)
    completion = (end - start) / 1e9
    handler_s: list[float] = [column[k] for k in ran]  # type: ignore[misc]  # not None there
    total_h = sum(handler_s)
    longest = handled[max(range(len(handled)), key=handler_s.__getitem__)] if handled else None  # the first of the longest
    longest_s = longest.handler_s if longest else 0.0
    lb = lower_bound(handler_s, workers) if workers else longest_s
    last = records[max(range(len(records)), key=lambda k: (ends[k], starts[k]))]
    split = {PRODUCED_LATE: max(0, last.start_ns - start) / 1e9}
    split.update({g.name: last.gap_s(g.name) for g in PATH_GAPS})
    idle = idle_broker = None
    if last.handled:
        pulled = last.t(Stage.CLIENT_PULL) or last.t(Stage.DISPATCH_ENQUEUE)
        idle = _idle(group_intervals, workers, pulled, last.t(Stage.HANDLER_START))
        idle_broker = _idle(group_intervals, workers, last.t(Stage.BROKER_STORE) or last.t(Stage.PRODUCE), pulled)
    critical = CriticalPath(
        last, split, waiting_s=sum(split[p] for p in WAITING_PARTS), working_s=split["handler"],
        broker_s=split["send"] + split["broker_wait"], idle_workers=idle, idle_in_broker=idle_broker,
        verdict=_verdict(split, idle, idle_broker, workers))
    return JobStats(group, job_id, len(records), workers, start, end, completion, total_h, longest_s,
                    longest.message_id if longest else "", lb,
                    total_h / (workers * completion) if workers and completion else 0.0, critical,
                    sent_order(records))


# -- the sentences both the demo and the report print ------------------------------------------
# A job within 10% of its lower bound: the wait inside the consumer, however large its share, did not lengthen it.
NEAR_LOWER_BOUND = 1.10


def where_time_went_line(name: str, shares: Mapping[str, float], over_lb: float | None, busy: float | None) -> str:
    """Where a consumer group's (a demo policy's) time went, in one line led by the headline gap.

    ``shares`` maps gap names to their part of all path time (send … handler, i.e. end to end);
    ``over_lb`` is the job's completion over its lower bound, ``busy`` the workers' busy share.
    """
    wait = shares.get(HEADLINE_GAP.name, 0.0)
    parts = " + ".join(f"{p} {shares.get(p, 0.0):.0%}" for p in WAITING_PARTS)
    line = f"{name}: {HEADLINE_GAP.name} (waiting inside the consumer) was {wait:.0%} of end-to-end time ({parts})"
    if over_lb:
        line += f"; job took {over_lb:.2f}× the lower bound"
    if busy is not None:
        line += f", workers busy {busy:.0%} of the time"
    broker = shares.get("send", 0.0) + shares.get("broker_wait", 0.0)
    handler = shares.get("handler", 0.0)
    if wait >= max(broker, handler) and over_lb and over_lb < NEAR_LOWER_BOUND:
        return line + (f" — messages waited inside the consumer, yet the job finished within {over_lb - 1:.0%} of its "
                       "lower bound: here the wait did not make it longer")
    if wait >= max(broker, handler):
        return line + " — messages queued inside the consumer, where no other consumer could take them"
    if broker >= handler:
        return line + " — most of the wait was in the broker, where any free consumer can take a message"
    return line + " — most of the time was the handlers' own work"


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
    starts, ends = _starts_ends(records)
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


__all__ = [
    "HEATMAP_GAPS", "NO_GROUP", "NO_JOB", "PERCENTILES", "PRODUCED_LATE", "SPLIT_PARTS", "STAMP_MAX_NS", "WAITING_PARTS",
    "CriticalPath", "GapColumns", "GroupStats", "Heatmap", "JobStats", "MessageRecord", "Occupancy", "Report", "StageStats",
    "build_group", "build_report", "by_start", "exact_int", "exact_stamps", "format_seconds", "group_blame", "group_line",
    "heatmap", "infer_workers", "is_process_span", "mean_busy", "message_record", "messages_from_spans", "notes",
    "occupancy", "percentile", "record_from_fields", "report_from_messages", "stage_stats", "stamp_ns", "step_means",
    "wait_edges", "where_time_went_line", "group_lanes", "instance_of", "MIXED_ORDER", "sent_order", "sent_order_words",
]
