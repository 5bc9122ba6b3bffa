"""Records: one :class:`MessageRecord` per ``process`` span, its stamps exact or rebuilt.

The first step of the report (definitions in :mod:`tracer.report.model`): which spans are
messages, which stamp attributes can be trusted, how a record's timing is rebuilt from span times
when they cannot, and which worker lane each record ran on. Pure functions, no I/O.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..path import names
from ..path.stages import PATH_GAPS, STAGES, Stage
from ..path.stamps import MISSING, GapValue, Stamps, compute_gaps, first_stamp, last_stamp, timeline
from ..telemetry.spanfile import SpanRecord

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

_HANDLER_START, _HANDLER_END = int(Stage.HANDLER_START), int(Stage.HANDLER_END)
_PROCESS_PREFIX = names.process_span_name("")
# The stamp attributes in stage order, and what record_from_fields' common case compares them to:
# it spells out six stages, times[0] <= … <= times[5].
_STAMP_NAMES: tuple[str, ...] = tuple(STAMP_ATTRS[s] for s in STAGES)
_SIX_INTS = (int,) * len(Stage)
assert len(_STAMP_NAMES) == 6


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
    # the first message key as recorded (a key may hold the "," that joins them in ``keys``): what
    # the producer's message_key reads, so what a learned cost table is keyed by
    key: str = ""
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

    @property
    def start_ns(self) -> int:
        """The first stamp (produce when present)."""
        return first_stamp(self.stamps.times)

    @property
    def end_ns(self) -> int:
        """Handler end, or the last stamp when the handler never ended."""
        return last_stamp(self.stamps.times)

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


def _consistent(stamps: Stamps, end_ns: int) -> bool:
    """The stamps' clamped timeline ends at ``end_ns``, the process span's end (when handler end is stamped)."""
    if not stamps.has(Stage.HANDLER_END):
        return True
    end = dict(timeline(stamps)).get(Stage.HANDLER_END)  # None only for stamps stamp_ns refuses (< 0)
    return end is not None and abs(end - end_ns) <= STAMP_TOLERANCE_NS


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


def _first_key(value: Any) -> str:
    """The first of the recorded message keys (a sequence, or one str), "" when none."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else ""
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _exact_stamps(attrs: dict[str, Any], end_ns: int) -> Stamps | None:
    """:func:`exact_stamps` of a process span given by its attributes and end: the definition."""
    stamps = _stamps_from_attributes(attrs)
    if stamps is None or not any(stamps.times) or not _consistent(stamps, end_ns):
        return None
    return stamps


def exact_stamps(span: SpanRecord) -> Stamps | None:
    """A process span's own stamp attributes when they are exact and agree with its end, else None
    (then its timing has to be rebuilt from its child spans and its producer's: :func:`messages_from_spans`)."""
    return _exact_stamps(span.attributes, span.end_ns)


def _record(trace_id: str, span_id: str, name: str, attrs: dict[str, Any], stamps: Stamps, timing: str,
            instance: str) -> MessageRecord:
    """The record of a process span given by its fields: the one place its attributes are read."""
    a = attrs
    # each conversion with the common case first (str of a str, an int as is): once per message read
    worker, cost, keys = a.get(WORKER_ATTR), a.get(names.COST), a.get(names.MESSAGE_KEYS)
    attempt = a.get(names.DELIVERY_ATTEMPT, a.get(names.LEGACY_DELIVERY_ATTEMPT))
    return MessageRecord(
        trace_id, span_id, str(a.get(GROUP_ATTR) or NO_GROUP),
        str(a.get(names.DESTINATION) or name.removeprefix(_PROCESS_PREFIX)),
        str(a.get(names.MESSAGE_ID) or span_id), str(a.get(JOB_ATTR) or NO_JOB), stamps, timing,
        worker if type(worker) is int else exact_int(worker), False, None if cost is None else _num(cost, float, None),
        str(a.get(names.OUTCOME) or ""), attempt if type(attempt) is int else _num(attempt, int, 1),
        _keys(keys), instance, _order(a.get(names.JOB_ORDER)), _first_key(keys))


def message_record(span: SpanRecord, stamps: Stamps, timing: str = "stamps") -> MessageRecord:
    """The record of one process span with the stamps it was given."""
    return _record(span.trace_id, span.span_id, span.name, span.attributes, stamps, timing, instance_of(span))


def instance_of(span: SpanRecord) -> str:
    """The consumer instance of a span: its resource's ``service.instance.id`` where the source
    names it, else its service (a span file: one service per instance, as the fleet view takes it)."""
    return span.instance or span.service or ""


def record_from_fields(trace_id: str, span_id: str, name: str, end_ns: int, attrs: dict[str, Any],
                       instance: str = "") -> MessageRecord | None:
    """``message_record(span, exact_stamps(span))`` for a process span given by its fields, without
    building the span; None where :func:`exact_stamps` is None. The span-file reader's path: the
    common case, what the tracer writes (every stamp an exact int, in stage order), is checked here
    without the general functions (no :func:`~tracer.path.stamps.causal` copy, no timeline); the
    rest goes through them (``test_the_fast_record_is_the_general_one`` in tests/test_report_spanread.py
    holds the two equal)."""
    times: list[Any] = list(map(attrs.get, _STAMP_NAMES))  # ints once checked
    if (tuple(map(type, times)) == _SIX_INTS and min(times) > MISSING and max(times) <= STAMP_MAX_NS
            and times[0] <= times[1] <= times[2] <= times[3] <= times[4] <= times[5]):
        # in order, so causal(times) is times and timeline() moves nothing: only the end is checked
        if abs(times[_HANDLER_END] - end_ns) > STAMP_TOLERANCE_NS:
            return None
        stamps: Stamps | None = Stamps(times)
    else:
        stamps = _exact_stamps(attrs, end_ns)
    return None if stamps is None else _record(trace_id, span_id, name, attrs, stamps, "stamps", instance)


def _order(value: Any) -> str:
    """A recorded send order, or "" (none, or not one of ours: a span file is anyone's input)."""
    return value if value is not None and value in names.JOB_ORDERS else ""


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
    """The order records are kept in: by :attr:`~MessageRecord.start_ns`, then message id."""
    return first_stamp(r.stamps.times), r.message_id


def starts_ends(records: Sequence[MessageRecord]) -> tuple[list[int], list[int]]:
    """Every record's :attr:`~MessageRecord.start_ns` and :attr:`~MessageRecord.end_ns`, as two lists."""
    times = [r.stamps.times for r in records]
    return [first_stamp(t) for t in times], [last_stamp(t) for t in times]


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


__all__ = [
    "starts_ends", "GAP_SPANS", "GROUP_ATTR", "JOB_ATTR", "MessageRecord", "NO_GROUP", "NO_JOB", "STAMP_ATTRS",
    "STAMP_MAX_NS", "STAMP_TOLERANCE_NS", "WORKER_ATTR", "by_start", "exact_int", "exact_stamps", "group_lanes",
    "infer_workers", "instance_of", "is_process_span", "message_record", "messages_from_spans",
    "record_from_fields", "stamp_ns"
]
