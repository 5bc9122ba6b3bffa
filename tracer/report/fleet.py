"""The fleet view: one job across every consumer instance, read from Jaeger page by page.

Spans tell instances apart by their resource's ``service.instance.id`` (host:pid unless set; see
:mod:`tracer.config`). For every ``process {topic}`` span this module keeps one compact record —
instance, job, worker, message id, the receive / dispatch enqueue / handler start / handler end
stamps — and drops the span, so memory grows with the number of messages (~130 bytes each beside
its message id string, tracemalloc at 10⁵), never with the spans or pages read.

From the records, per job:

* **completion and critical path across instances**: first receive → last handler end, and the
  message that ended last: on which instance, how long it waited there unstarted, its handler;
* **worker occupancy per instance**: messages, busy worker-seconds and share, workers seen (distinct
  ``rmqtrace.worker`` values; else the most handlers that overlapped — a lower bound);
* **where the job waited**: the exact sweep of the stamps, ∫ min(idle workers of instances holding
  nothing, messages held unstarted elsewhere) dt, and per holding instance its part of that.
* **who held it up**: the consumer_wait avoidable inside the instance and in the fleet, and the
  runs behind which messages waited while a worker of the fleet was free, ranked by the wait they
  caused (:func:`tracer.report.fleetblame.fleet_blame`).

Read from Jaeger by :func:`tracer.report.fleetread.read_jaeger_fleet`; shown by
:mod:`tracer.report.fleetview` (terminal lines, the HTML lanes, ``rmqtrace report --fleet``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

from ..path import names
from ..path.stages import Stage
from .blame import GRACE_NS, MAX_OVERLAPS, Run, TooManyOverlaps, pack_lanes
from .fleetblame import FleetBlocker, fleet_avoidable, fleet_blame
from .records import STAMP_MAX_NS, exact_int, stamp_ns
from .sources import INSTANCE_KEY, any_value, jaeger_instance
from .text import fleet_verdict

__all__ = ["FLEET_BLAME_TOP", "FleetCollector", "FleetInstance", "FleetJob", "FleetSection", "Handled", "sweep_waits"]

_PULL, _START, _END = (names.STAMP_ATTRS[s] for s in (Stage.CLIENT_PULL, Stage.HANDLER_START, Stage.HANDLER_END))
_PRODUCE, _ENQUEUE = (names.STAMP_ATTRS[s] for s in (Stage.PRODUCE, Stage.DISPATCH_ENQUEUE))
# what :meth:`FleetCollector.add` reads: the stamps, job and worker, and what names a blocker
_RECORD_KEYS = frozenset((_PULL, _START, _END, _PRODUCE, _ENQUEUE, names.WORKER, names.JOB_ID, names.MESSAGE_ID))
FLEET_BLAME_TOP = 10  # blockers named per job


class Handled(NamedTuple):
    """One handled message: which message, on which instance (an index), its three consumer stamps."""

    message: int
    instance: int
    pull_ns: int
    start_ns: int
    end_ns: int


def sweep_waits(records: Sequence[Handled], workers: Sequence[int], t0_ns: int,
                busy_only: Sequence[Handled] = ()) -> dict[str, Any]:
    """Exact, from the stamps: fleet idle worker-seconds while another instance held unstarted
    messages (and each holder's part of it), idle-while-held inside instances, the most each held.
    ``busy_only``: other runs that held workers meanwhile (another job's messages): they make a
    worker busy, and are not held messages of this view.

    Raises:
        ValueError: a record names an instance ``workers`` has no count for.
    """
    n = len(workers)
    # (time, order, instance, d_held, d_busy): at one instant receipts, then ends, then starts
    events: list[tuple[int, int, int, int, int]] = []
    for r in records:
        if not 0 <= r.instance < n:
            raise ValueError(f"record of instance {r.instance}, but worker counts for {n} instances")
        events.append((min(r.pull_ns, r.start_ns), 0, r.instance, +1, 0))
        events.append((r.start_ns, 2, r.instance, -1, +1))
        events.append((r.end_ns, 1, r.instance, 0, -1))
    for r in busy_only:
        if not 0 <= r.instance < n:
            raise ValueError(f"record of instance {r.instance}, but worker counts for {n} instances")
        events.append((r.start_ns, 2, r.instance, 0, +1))
        events.append((r.end_ns, 1, r.instance, 0, -1))
    events.sort()
    held, busy, most = [0] * n, [0] * n, [0] * n
    caused = [0.0] * n
    fleet = inproc = 0.0
    last = t0_ns
    for t, _order, i, dh, db in events:
        if t > last:
            dt = (t - last) / 1e9
            total = sum(held)
            if total:
                starved = sum(max(0, workers[k] - busy[k]) for k in range(n) if held[k] == 0)
                lost = min(starved, total) * dt
                fleet += lost
                for k in range(n):
                    caused[k] += lost * held[k] / total
                inproc += sum(min(max(0, workers[k] - busy[k]), held[k]) for k in range(n)) * dt
            last = t
        held[i] += dh
        busy[i] += db
        most[i] = max(most[i], held[i])
    return {"fleet_idle_while_held_s": fleet, "inprocess_idle_while_held_s": inproc, "max_held": most,
            "caused_s": caused}


@dataclass
class FleetInstance:
    name: str
    messages: int
    busy_s: float
    busy_share: float
    workers: int
    workers_inferred: bool
    max_held: int
    held_while_others_idled_s: float


@dataclass
class FleetJob:
    job: str
    messages: int
    completion_s: float
    instances: list[FleetInstance]
    idle_while_held_s: float
    inprocess_idle_while_held_s: float
    critical: dict[str, Any]
    section: FleetSection | None = field(default=None, repr=False)  # what the HTML lanes draw
    # consumer_wait and the parts avoidable inside the instance / elsewhere in the fleet (tracer.report.blame)
    avoidable: dict[str, float] = field(default_factory=dict)
    # the runs that held up the fleet-avoidable waits, largest first (tracer.report.fleetblame.fleet_blame)
    blockers: list[FleetBlocker] = field(default_factory=list)
    blockers_note: str = ""  # why none are named although some wait was avoidable ("" when they are)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "messages": self.messages, "completion_s": round(self.completion_s, 3),
                "idle_worker_seconds_while_held_elsewhere": round(self.idle_while_held_s, 3),
                "idle_worker_seconds_while_held_inside": round(self.inprocess_idle_while_held_s, 3),
                "critical_path": self.critical,
                "avoidable_wait": {k: round(v, 6) for k, v in self.avoidable.items()},
                "top_blockers": [b.as_dict() for b in self.blockers], "blockers_note": self.blockers_note,
                "instances": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(i).items()}
                              for i in self.instances]}


class _Rec(NamedTuple):
    instance: int
    produce_ns: int
    pull_ns: int
    start_ns: int
    end_ns: int
    worker: int
    enqueue_ns: int  # dispatch enqueue (0: not stamped): from then on it waited in one worker's buffer
    # what a blocker is named by; not its keys: a second string per message (~6 MiB at 10⁵) and an
    # array attribute to convert per span, for a name the message id already gives
    message_id: str


@dataclass
class FleetCollector:
    """Keeps one compact record per process span; feed it spans page by page."""

    instances: list[str] = field(default_factory=list)
    jobs: dict[str, list[_Rec]] = field(default_factory=dict)
    traces: int = 0
    spans: int = 0
    pages: int = 0
    api: str = ""
    max_overlaps: int = MAX_OVERLAPS  # per job: see tracer.report.blame.blame
    _index: dict[str, int] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)
    _process_ids: set[bytes] = field(default_factory=set)

    def add_jaeger_page(self, payload: dict[str, Any]) -> None:
        """One ``/api/traces`` answer; traces already added are skipped."""
        self.pages += 1
        for trace in payload.get("data") or ():
            tid = str(trace.get("traceID", ""))
            if tid in self._seen:
                continue
            self._seen.add(tid)
            self.traces += 1
            processes = trace.get("processes") or {}
            for span in trace.get("spans") or ():
                self.spans += 1
                if str(span.get("operationName", "")).startswith(names.PROCESS + " "):
                    tags = {t.get("key"): t.get("value") for t in span.get("tags") or ()}
                    self.add(_instance_of(processes.get(str(span.get("processID"))) or {}), tags)

    def add_otlp_trace(self, traces_data: Any, seen: set[bytes], page: dict[bytes, int]) -> None:
        """One ``TracesData`` of api_v3 ``FindTraces`` (read raw, without Jaeger's adjusters): all
        its trace ids go into ``page``, each with its earliest span start; spans of traces in
        ``seen`` (read in an earlier page) are skipped, and so is a process span whose id this
        trace already had (a span exported twice, which Jaeger's de-duplicating adjuster drops)."""
        prefix = names.PROCESS + " "
        for rs in traces_data.resource_spans:
            instance: str | None = None
            for ss in rs.scope_spans:
                for span in ss.spans:
                    tid = span.trace_id
                    start = span.start_time_unix_nano
                    first = page.get(tid)
                    if first is None:  # every trace of the answer: a full page must look full
                        page[tid] = start
                        if tid not in seen:
                            self.traces += 1
                    elif start < first:
                        page[tid] = start
                    if tid in seen:
                        continue
                    self.spans += 1
                    if span.name.startswith(prefix):
                        key = tid + span.span_id
                        if key in self._process_ids:
                            continue
                        self._process_ids.add(key)
                        if instance is None:
                            instance = _instance_of_resource(rs.resource)
                        self.add(instance, {kv.key: any_value(kv.value) for kv in span.attributes
                                            if kv.key in _RECORD_KEYS})

    def add_span_file(self, path: str) -> None:
        """Every process span of a JSON-lines span file. Such a file names no
        ``service.instance.id`` (the exporter writes the service name only): each ``service`` is
        taken as one instance, so one process's file is a fleet of one."""
        from .spanread import process_spans

        traces: set[str] = set()
        for trace_id, _span_id, service, attrs in process_spans(path):
            if trace_id not in traces:
                traces.add(trace_id)
                self.traces += 1
            self.spans += 1
            self.add(service or "?", attrs)
        self.pages += 1

    def add(self, instance: str, attrs: dict[str, Any]) -> None:
        """One process span's attributes (its stamps, job, worker) on ``instance``."""
        # the report's rule for a stamp (tracer.report.model.stamp_ns): one that is negative, out of
        # int64 range or not a number is not trusted, as if missing
        pull, start, end = _stamp(attrs.get(_PULL)), _stamp(attrs.get(_START)), _stamp(attrs.get(_END))
        if not (pull and start and end):
            return  # a message whose handler never ran (or whose stamps cannot be trusted): no place in the occupancy
        if instance not in self._index:
            self._index[instance] = len(self.instances)
            self.instances.append(instance)
        worker = exact_int(attrs.get(names.WORKER))
        message_id = str(attrs.get(names.MESSAGE_ID) or "")
        self.jobs.setdefault(str(attrs.get(names.JOB_ID) or "(no job id)"), []).append(
            _Rec(self._index[instance], _stamp(attrs.get(_PRODUCE)), pull, start, end,
                 worker if worker is not None else -1, _stamp(attrs.get(_ENQUEUE)), message_id))

    def job_views(self) -> list[FleetJob]:
        """One view per job. Every instance seen in the window counts as up for every job (an idle
        instance writes no spans, so a job it took no part in still shows it, with 0 messages);
        its workers are counted over all its spans."""
        self._canonical()
        n = len(self.instances)
        seen: list[set[int]] = [set() for _ in range(n)]
        mine: list[list[_Rec]] = [[] for _ in range(n)]
        for recs in self.jobs.values():
            for r in recs:
                mine[r.instance].append(r)
                if r.worker >= 0:
                    seen[r.instance].add(r.worker)
        workers = [len(seen[i]) if seen[i] else _max_overlap(mine[i]) for i in range(n)]
        inferred = [not seen[i] for i in range(n)]
        # a worker busy with another job's message is busy for this job too (not idle)
        windows = [_Occupancy(mine[i], inferred[i]) for i in range(n)]
        return [self._view(job, recs, workers, inferred, windows) for job, recs in sorted(self.jobs.items())]

    def _canonical(self) -> None:
        """Instances by name and each job's records by time: the views must not depend on the order
        a store returned the traces in (api_v3 and /api/traces page differently)."""
        order = sorted(range(len(self.instances)), key=self.instances.__getitem__)
        new_index = {old: new for new, old in enumerate(order)}
        self.instances = [self.instances[i] for i in order]
        self._index = {name: i for i, name in enumerate(self.instances)}
        for job, recs in self.jobs.items():
            self.jobs[job] = sorted((r._replace(instance=new_index[r.instance]) for r in recs),
                                    key=lambda r: (r.pull_ns, r.start_ns, r.end_ns, r.instance, r.worker, r.produce_ns,
                                                   r.message_id))

    def _view(self, job: str, recs: list[_Rec], workers: list[int], inferred: list[bool],
              windows: list[_Occupancy]) -> FleetJob:
        n = len(self.instances)
        t0 = min(r.pull_ns for r in recs)
        t1 = max(r.end_ns for r in recs)
        handled = [Handled(k, r.instance, r.pull_ns, r.start_ns, r.end_ns) for k, r in enumerate(recs)]
        ours = {id(r) for r in recs}
        occupied: list[list[Run]] = []
        others: list[Handled] = []
        for w in windows:  # only what overlaps the job: a fleet view reads every job of a window
            ks = w.overlapping(t0 - GRACE_NS, t1)
            occupied.append([w.runs[k] for k in ks])
            others += [Handled(-1, r.instance, r.pull_ns, r.start_ns, r.end_ns) for r in (w.recs[k] for k in ks)
                       if id(r) not in ours]
        waits = sweep_waits(handled, workers, t0, others)
        busy = [0.0] * n
        count = [0] * n
        for r in recs:
            busy[r.instance] += (r.end_ns - r.start_ns) / 1e9
            count[r.instance] += 1
        total = sum(busy)
        last = max(recs, key=lambda r: r.end_ns)
        critical = {
            "instance": self.instances[last.instance],
            "received_s": round((last.pull_ns - t0) / 1e9, 3),
            "waited_unstarted_s": round((last.start_ns - last.pull_ns) / 1e9, 3),
            "handler_s": round((last.end_ns - last.start_ns) / 1e9, 3),
            "ended_s": round((last.end_ns - t0) / 1e9, 3),
        }
        lanes = [Handled(r.worker, r.instance, r.pull_ns, r.start_ns, r.end_ns) for r in recs]
        avoidable, blockers, note = _job_blame(recs, self.instances, workers, inferred, max_overlaps=self.max_overlaps,
                                               occupied=occupied)
        section = FleetSection(
            f"job {job}", f"{len(recs)} messages, completed in {(last.end_ns - t0) / 1e9:.2f} s; "
            f"{waits['fleet_idle_while_held_s']:.1f} idle worker-s while another instance held unstarted messages; "
            f"{fleet_verdict(avoidable, len(recs))}",
            list(self.instances), workers, lanes, waits["max_held"], by_worker=True, blockers=list(blockers),
            blockers_note=note)
        return FleetJob(job, len(recs), (last.end_ns - t0) / 1e9, [
            FleetInstance(self.instances[i], count[i], busy[i], busy[i] / total if total else 0.0, workers[i],
                          inferred[i], waits["max_held"][i], waits["caused_s"][i])
            for i in range(n)], waits["fleet_idle_while_held_s"], waits["inprocess_idle_while_held_s"],
            critical, section, avoidable, list(blockers), note)


class _Occupancy:
    """Every run of one instance, whatever its job, by handler start: what held its workers
    (packed lanes where the spans carry no worker id, as for one job's runs)."""

    def __init__(self, recs: Sequence[_Rec], inferred: bool) -> None:
        self.recs = sorted(recs, key=lambda r: (r.start_ns, r.end_ns))
        packed = inferred or any(r.worker < 0 for r in self.recs)
        lanes = pack_lanes([(r.start_ns, r.end_ns) for r in self.recs]) if packed else None
        self.runs = [Run(r.message_id, r.message_id, lanes[k] if lanes else r.worker, min(r.pull_ns, r.start_ns),
                         r.start_ns, r.end_ns) for k, r in enumerate(self.recs)]
        self.starts = [r.start_ns for r in self.recs]
        self.longest = max((r.end_ns - r.start_ns for r in self.recs), default=0)

    def overlapping(self, lo: int, hi: int) -> list[int]:
        """Indexes of the runs that overlap [lo, hi)."""
        first = bisect.bisect_left(self.starts, lo - self.longest)
        last = bisect.bisect_left(self.starts, hi)
        return [k for k in range(first, last) if self.recs[k].end_ns > lo]


def _job_blame(recs: Sequence[_Rec], instances: Sequence[str], workers: Sequence[int], inferred: Sequence[bool],
               *, top: int = FLEET_BLAME_TOP, max_overlaps: int = MAX_OVERLAPS,
               occupied: Sequence[Sequence[Run]] | None = None,
               ) -> tuple[dict[str, float], tuple[FleetBlocker, ...], str]:
    """How much of the job's consumer_wait was avoidable inside its instance and in the fleet, and
    the runs that held up the fleet-avoidable part (:func:`tracer.report.fleetblame.fleet_blame`). An
    instance without worker ids gets packed lanes and names no blocker (lanes are not the workers
    messages queued for); a record carries its dispatch enqueue, so the backlog and buffer rules are
    the single-consumer report's."""
    per: list[list[_Rec]] = [[] for _ in instances]
    for r in recs:
        per[r.instance].append(r)
    runs: list[list[Run]] = []
    known: list[bool] = []
    for i, mine in enumerate(per):
        packed = any(r.worker < 0 for r in mine)
        lanes = pack_lanes([(r.start_ns, r.end_ns) for r in mine]) if packed else None
        runs.append([Run(r.message_id, r.message_id, lanes[k] if lanes else r.worker, min(r.pull_ns, r.start_ns),
                         r.start_ns, r.end_ns, r.enqueue_ns if r.enqueue_ns else None) for k, r in enumerate(mine)])
        known.append(not packed and not inferred[i])
    counts = [max(w, len({x.worker for x in rs}), 1) for w, rs in zip(workers, runs)]
    if occupied is not None:
        counts = [max(c, len({x.worker for x in rs})) for c, rs in zip(counts, occupied)]
    try:
        shares, blockers = fleet_blame(runs, counts, instances, blockers_known=known, top=top, max_overlaps=max_overlaps,
                                       occupied=occupied)
    except TooManyOverlaps as exc:  # the share is cheap; say why the names are missing rather than run for hours
        return fleet_avoidable(runs, counts, occupied=occupied), (), f"{exc}; read one job (--job) or a shorter window"
    unknown = [instances[i] for i, mine in enumerate(per) if mine and not known[i]]
    if not blockers and shares["avoidable_fleet_s"] and unknown:
        return shares, (), (f"the spans of {', '.join(unknown)} carry no rmqtrace.worker (packed lanes are not the "
                            "workers messages queued for)")
    return shares, blockers, ""


def _stamp(value: Any) -> int:
    """A stamp as read (an int, or digits in a string from /api/traces), 0 when absent or not one
    to trust (:func:`tracer.report.model.stamp_ns`). Unlike the report, which rebuilds such a
    message from its span times, the fleet has only these stamps: a float within range is kept (to
    the double's 256 ns at today's epoch), as before."""
    if type(value) is float:
        return int(value) if 0 <= value <= STAMP_MAX_NS else 0  # NaN and ±inf compare False
    return stamp_ns(value) or 0


def _max_overlap(recs: Sequence[_Rec]) -> int:
    edges = sorted([(r.start_ns, 1) for r in recs] + [(r.end_ns, -1) for r in recs], key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _t, d in edges:
        cur += d
        best = max(best, cur)
    return best


_instance_of = jaeger_instance  # the group report reads instances the same way


def _instance_of_resource(resource: Any) -> str:
    """:func:`_instance_of` for an OTLP resource (Jaeger's process tags are its attributes)."""
    found: dict[str, Any] = {}
    for kv in resource.attributes:
        if kv.key in (INSTANCE_KEY, "hostname", "service.name"):
            found[kv.key] = kv.value.string_value or None
    return str(found.get(INSTANCE_KEY) or found.get("hostname") or found.get("service.name") or "?")


V3_DEPTH = 100_000  # traces per api_v3 page: streamed, so a page costs no memory; Jaeger's memory store caps it


TERMINAL_BLOCKERS = 5


HELD_COLOR, BAR_COLOR = "#c0392b", "#2e86c1"
VIEW_W = 1200  # the drawing's own width; the page scales it to the window (width: 100%)


@dataclass
class FleetSection:
    """One block of the fleet page: a job (or a demo mode) over its instances. With ``by_worker``
    a record's ``message`` field is its worker id (its lane); otherwise lanes are packed."""

    title: str
    subtitle: str
    instances: list[str]
    workers: list[int]
    records: list[Handled]
    max_held: list[int]
    by_worker: bool = False
    blockers: list[FleetBlocker] = field(default_factory=list)  # listed under the lanes
    blockers_note: str = ""  # why none are named (FleetJob.blockers_note)
