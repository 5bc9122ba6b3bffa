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

:func:`read_jaeger_fleet` reads windows of time, each at most a page of traces; a full page means
the window may hold more, so it is split in halves and read again. Traces seen twice (a trace
whose spans straddle two windows, or one of a full page read again in a half) are skipped by id.
Two read paths: Jaeger's ``api_v3`` gRPC ``FindTraces`` (OTLP protobuf streamed one trace at a
time, so a page can be the whole window: default when ``grpcio`` is installed and the service
answers), else the HTTP JSON ``/api/traces`` the UI uses (``page_limit`` traces per page, each
page parsed whole). BENCHMARKS.md ("bench report") has the numbers behind the choice.
"""

from __future__ import annotations

import bisect
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from html import escape
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from ..path import names
from ..path.stages import Stage
from .blame import (
    GRACE_NS,
    MAX_OVERLAPS,
    Run,
    TooManyOverlaps,
    fleet_verdict,
    pack_lanes,
)
from .fleetblame import FleetBlocker, fleet_avoidable, fleet_blame
from .records import STAMP_MAX_NS, exact_int, stamp_ns
from .sources import INSTANCE_KEY, any_value, jaeger_instance

__all__ = ["FleetCollector", "FleetInstance", "FleetJob", "FleetSection", "Handled", "cli_fleet", "fleet_lines",
           "fleet_page", "read_jaeger_fleet", "sweep_waits"]

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


def read_jaeger_fleet(base_url: str, service: str, *, start_s: float | None = None, end_s: float | None = None,
                      lookback_s: float = 3600.0, page_limit: int = 500, timeout: float = 30.0,
                      get: Callable[[str, float], dict[str, Any]] | None = None, api: str = "auto",
                      grpc_target: str | None = None, depth: int = V3_DEPTH) -> FleetCollector:
    """Every trace of ``service`` in [start, end] (default: the last ``lookback_s`` seconds) into a
    :class:`FleetCollector`; ``collector.api`` says which read path was used.

    ``api``: ``"v3"`` (api_v3 gRPC at ``grpc_target``, default: for a URL on port 16686 its host on
    port 16685; pages of ``depth`` traces), ``"http"`` (``/api/traces``, pages of ``page_limit``
    traces, fetched by ``get`` when given) or ``"auto"``: v3 unless ``get`` is given, no gRPC
    address is known, grpcio is missing or nothing answers there; then http.

    Raises:
        ValueError: ``page_limit`` or ``depth`` < 2, an empty window or an unknown ``api``.
        SourceError: the v3 service failed after it had answered (``api="v3"``: also when it is
            unreachable).
    """
    from .sources import paused_gc

    with paused_gc():  # the collector's records: no cycles (see paused_gc)
        return _read_fleet(base_url, service, start_s=start_s, end_s=end_s, lookback_s=lookback_s,
                           page_limit=page_limit, timeout=timeout, get=get, api=api, grpc_target=grpc_target,
                           depth=depth)


def _read_fleet(base_url: str, service: str, *, start_s: float | None, end_s: float | None, lookback_s: float,
                page_limit: int, timeout: float, get: Callable[[str, float], dict[str, Any]] | None, api: str,
                grpc_target: str | None, depth: int) -> FleetCollector:
    from .sources import SourceError, v3_target

    if page_limit < 2 or depth < 2:
        raise ValueError(f"page_limit and depth must be at least 2, got {page_limit} and {depth}")
    if api not in ("auto", "v3", "http"):
        raise ValueError(f"api must be auto, v3 or http, got {api!r}")
    end = time.time() if end_s is None else end_s
    start = end - lookback_s if start_s is None else start_s
    if end <= start:
        raise ValueError(f"empty time window: start {start} >= end {end}")
    collector = FleetCollector()
    base = base_url.rstrip("/")
    target = v3_target(base, grpc_target)
    if api == "v3" and target is None:
        raise ValueError(f"api v3: give grpc_target (host:port); {base_url} is not on Jaeger's default port 16686")
    if target is not None and (api == "v3" or (api == "auto" and get is None)):
        try:
            _read_v3(collector, target, service, int(start * 1e9), int(end * 1e9), depth, timeout)
            collector.api = f"api_v3 gRPC {target}"
            return collector
        except ImportError:
            if api == "v3":
                raise
        except SourceError:
            if api == "v3" or collector.pages or collector.traces:
                raise
        collector = FleetCollector()  # auto: nothing answered at the v3 port; read the HTTP API
    for payload in _pages(base, service, int(start * 1e6), int(end * 1e6), page_limit, timeout, get or _get_json):
        collector.add_jaeger_page(payload)
    collector.api = f"HTTP JSON {base}/api/traces"
    return collector


def _read_v3(collector: FleetCollector, target: str, service: str, start_ns: int, end_ns: int, depth: int,
             timeout: float) -> None:
    """Windows of at most ``depth`` traces, streamed into ``collector``. A full page is kept (its
    traces are complete) and its window read again in two parts, where those traces are skipped:
    split at the median start of the page's traces, not at the window's middle, since a job's
    traces crowd a few seconds of an hour's window (a midpoint split re-read all 10⁵ six times)."""
    from .sources import SearchDepthTooLarge, find_traces_v3

    seen: set[bytes] = set()
    windows = [(start_ns, end_ns)]
    while windows:
        a, b = windows.pop()
        page: dict[bytes, int] = {}
        try:
            for traces_data in find_traces_v3(target, service, a, b, depth=depth, timeout=timeout, raw=True):
                collector.add_otlp_trace(traces_data, seen, page)
        except SearchDepthTooLarge:
            if page or depth <= 2:
                raise
            depth //= 2  # the store caps the depth (memory: max_traces): smaller pages, same window
            windows.append((a, b))
            continue
        collector.pages += 1
        seen.update(page)
        if len(page) >= depth and b - a > 1:
            starts = sorted(page.values())
            mid = starts[len(starts) // 2]
            if not a < mid < b:
                mid = (a + b) // 2
            windows += [(mid, b), (a, mid)]


def _pages(base: str, service: str, start_us: int, end_us: int, limit: int, timeout: float,
           fetch: Callable[[str, float], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    windows = [(start_us, end_us)]
    while windows:
        a, b = windows.pop()
        query = urllib.parse.urlencode({"service": service, "limit": limit, "start": a, "end": b})
        payload = fetch(f"{base}/api/traces?{query}", timeout)
        if len(payload.get("data") or ()) >= limit and b - a > 1:
            mid = (a + b) // 2  # the window may hold more than one page: read both halves instead
            windows += [(mid, b), (a, mid)]
            continue
        yield payload


def _get_json(url: str, timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the user's own Jaeger
        data = json.load(resp)
    if not isinstance(data, dict):
        raise ValueError(f"unexpected answer from {url}: {str(data)[:200]}")
    return data


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


TERMINAL_BLOCKERS = 5


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


HELD_COLOR, BAR_COLOR = "#c0392b", "#2e86c1"
VIEW_W = 1200  # the drawing's own width; the page scales it to the window (width: 100%)


def _lanes_svg(sec: FleetSection, span: int, width: int = VIEW_W) -> str:
    """One section's lanes on the shared time axis: a labelled tick every nice step (gridlines through
    every lane), per instance the held line over its own 0…peak scale, then one lane per worker."""
    from .html import nice_ticks

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
