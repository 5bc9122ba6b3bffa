"""Worker occupancy of one consumer, integrated exactly over time: head-of-line blocking as a number.

A consumer holds messages it has received but not started (a prefetch buffer, a push consumer's
cache, a dispatcher's queue) and runs them on a fixed number of workers. Head-of-line blocking is
a worker idling while such a message waits inside the same consumer. :class:`Occupancy` keeps the
piecewise-constant counts (busy workers, unstarted messages) and, at every change and every read,
adds the elapsed time times the counts to running integrals, so the totals are exact for the
events it was told about, whatever the scrape interval:

* ``busy_s``  = ∫ busy dt, ``idle_s`` = ∫ (workers − busy) dt, in worker-seconds;
* ``hol_s``   = ∫ min(workers − busy, unstarted) dt: idle worker-seconds that messages waiting in
  this consumer could have used (a worker idle while nothing waits is not blocked);
* ``holding_s`` = ∫ [unstarted > 0] dt.

Feeding: a seam calls :meth:`Occupancy.received` when a message enters the consumer,
:meth:`~Occupancy.started` / :meth:`~Occupancy.ended` around its handler and
:meth:`~Occupancy.discarded` when it leaves unstarted. A seam that learns of a receipt before the
message is traced (the push consumer's receive, seen by ``announce``) announces it once; the
next ``received`` calls consume the announcement instead of counting the message twice.

:class:`OccupancyMetrics` is the Prometheus collector (``registry=`` as in prometheus-client; one
per registry, :meth:`OccupancyMetrics.shared`, one :meth:`~OccupancyMetrics.track` per consumer);
values are read at scrape time, so the hot path never touches a metric object (multiprocess mode:
see the class):

====================================================== ======= ==========================================
series                                                 type    meaning
====================================================== ======= ==========================================
``rmqtrace_consumer_workers``                          gauge   declared workers
``rmqtrace_consumer_busy_workers``                     gauge   workers running a handler
``rmqtrace_consumer_unstarted_messages``               gauge   received, handler not started
``rmqtrace_consumer_oldest_unstarted_age_seconds``     gauge   age of the oldest of those (0 if none)
``rmqtrace_consumer_busy_worker_seconds_total``        counter ∫ busy dt
``rmqtrace_consumer_idle_worker_seconds_total``        counter ∫ idle dt
``rmqtrace_consumer_hol_idle_worker_seconds_total``    counter ∫ min(idle, unstarted) dt
``rmqtrace_consumer_holding_seconds_total``            counter time with at least one unstarted message
====================================================== ======= ==========================================

Every series has one label, ``consumer_group``; trackers of the same group in one process are
summed (the oldest age is their maximum). The instance is the scrape's ``instance`` label.
"""

from __future__ import annotations

import heapq
import threading
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..callables import require_plain
from ..path.clock import MonotonicClock, default_clock, require_clock, shared_clock
from .metrics import BoundedLabel
from .registration import OnePerRegistry, Refresher, multiprocess_dir

__all__ = ["Occupancy", "OccupancyMetrics", "OccupancySnapshot", "OccupancyStats"]


@dataclass(frozen=True, slots=True)
class OccupancyStats:
    """The state of one tracker at ``now_ns`` (its monotonic clock), with its integrals brought up to that instant."""

    now_ns: int
    workers: int
    busy: int
    unstarted: int
    oldest_unstarted_ns: int | None  # receive time of the oldest unstarted message (monotonic)
    busy_s: float
    idle_s: float
    hol_s: float
    holding_s: float

    @property
    def idle(self) -> int:
        return max(0, self.workers - self.busy)

    @property
    def oldest_unstarted_age_s(self) -> float:
        if self.oldest_unstarted_ns is None:
            return 0.0
        return max(0, self.now_ns - self.oldest_unstarted_ns) / 1e9


OccupancySnapshot = OccupancyStats  # its name before issue 36 (one kind of snapshot: ``*Stats``)


class Occupancy:
    """Busy workers and unstarted messages of one consumer, and their exact time integrals.

    Thread-safe; every method is O(log n) in the number of unstarted messages. Times are
    durations on ``clock``'s monotonic timeline (a :class:`~tracer.path.clock.ManualClock` in
    tests; the tracer's, which passes each message's pull on it), so a wall-clock step adds
    nothing; a clock that went back anyway would add nothing rather than a negative amount.

    Raises:
        ValueError: ``workers`` is negative.
        TypeError: ``clock`` has no ``monotonic_ns()``.
    """

    def __init__(self, workers: int, *, clock: MonotonicClock | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        _check_workers(workers)
        require_plain(on_close, "on_close", optional=True)
        if clock is not None:
            require_clock(clock, "Occupancy(clock=)", monotonic=True)
        self.clock: MonotonicClock = clock or default_clock()
        self._clock_pinned = clock is not None
        self._on_close = on_close  # its collector writes the final totals (multiprocess mode)
        self._lock = threading.Lock()
        self._workers = workers
        self._busy = 0
        self._unstarted = 0
        self._announced = 0
        # Receive times of unstarted messages: a heap for the oldest, a multiset for removals
        # (invariant: sum(_times.values()) == _unstarted; heap entries not in _times are stale).
        self._heap: list[int] = []
        self._times: Counter[int] = Counter()
        self._last = self.clock.monotonic_ns()
        self._busy_s = self._idle_s = self._hol_s = self._holding_s = 0.0
        self._closed = False

    def share_clock(self, clock: MonotonicClock) -> None:
        """Integrate on ``clock``, the tracer's (it passes receive times read on it).

        Raises:
            ValueError: this tracker runs on another clock, given or taken before.
        """
        with self._lock:
            self.clock = shared_clock(self.clock, self._clock_pinned, clock, "Occupancy(clock=)")
            self._clock_pinned = True

    # -- events ---------------------------------------------------------------------------------
    def announce(self, n: int = 1, at_ns: int | None = None) -> None:
        """``n`` messages entered the consumer; the seam that traces them will call
        :meth:`received` for each later, which then counts nothing new."""
        if n <= 0:
            return
        with self._lock:
            now = self._accrue()
            self._add(n, at_ns or now)
            self._announced += n

    def received(self, at_ns: int | None = None) -> int:
        """One message entered the consumer at ``at_ns`` (default now); returns the receive
        time to pass to :meth:`started` or :meth:`discarded`."""
        with self._lock:
            now = self._accrue()
            if self._announced:
                self._announced -= 1
                return at_ns or now
            t = min(at_ns, now) if at_ns else now
            self._add(1, t)
            return t

    def started(self, received_ns: int | None = None) -> None:
        """A worker took an unstarted message (the one received at ``received_ns``; if that time
        is unknown here, the oldest — a FIFO pool, like the push consumer's, takes that one)."""
        with self._lock:
            self._accrue()
            self._remove(received_ns)
            self._busy += 1

    def ended(self) -> None:
        """A worker finished its handler and is free again."""
        with self._lock:
            self._accrue()
            self._busy = max(0, self._busy - 1)

    def discarded(self, received_ns: int | None = None) -> None:
        """An unstarted message left the consumer without a handler (nacked, expired, shut down)."""
        with self._lock:
            self._accrue()
            self._remove(received_ns)

    def set_workers(self, workers: int) -> None:
        """The consumer resized its pool."""
        _check_workers(workers)
        with self._lock:
            self._accrue()
            self._workers = workers

    def close(self) -> None:
        """The consumer stopped: nothing accrues from now on; the totals stay readable (and, in
        multiprocess mode, are written to the directory now, not at the next refresh)."""
        with self._lock:
            self._accrue()
            first = not self._closed
            self._closed = True
        if first and self._on_close is not None:
            self._on_close()

    # -- reading --------------------------------------------------------------------------------
    def statistics(self) -> OccupancyStats:
        """The counts now and the integrals brought up to now, frozen."""
        with self._lock:
            now = self._accrue()
            return OccupancyStats(
                now_ns=now, workers=0 if self._closed else self._workers, busy=self._busy,
                unstarted=self._unstarted, oldest_unstarted_ns=self._oldest(),
                busy_s=self._busy_s, idle_s=self._idle_s, hol_s=self._hol_s, holding_s=self._holding_s)

    def snapshot(self) -> OccupancyStats:
        """Deprecated: :meth:`statistics` (one snapshot verb for every stateful object)."""
        warnings.warn("Occupancy.snapshot() is deprecated; use Occupancy.statistics()", DeprecationWarning,
                      stacklevel=2)
        return self.statistics()

    # -- internals (caller holds the lock) ------------------------------------------------------
    def _accrue(self) -> int:
        now = self.clock.monotonic_ns()
        dt_ns = now - self._last
        if dt_ns > 0 and not self._closed:
            dt = dt_ns / 1e9
            idle = max(0, self._workers - self._busy)
            self._busy_s += self._busy * dt
            self._idle_s += idle * dt
            if self._unstarted:
                self._hol_s += min(idle, self._unstarted) * dt
                self._holding_s += dt
        if dt_ns > 0:
            self._last = now
        return max(now, self._last)

    def _add(self, n: int, t: int) -> None:
        self._unstarted += n
        self._times[t] += n
        heapq.heappush(self._heap, t)

    def _remove(self, t: int | None) -> None:
        if not self._unstarted:
            return  # a start nobody announced (e.g. a seam that traces only at handler start)
        if t is None or not self._times.get(t):
            t = self._oldest()
            assert t is not None
        self._unstarted -= 1
        self._times[t] -= 1
        if not self._times[t]:
            del self._times[t]

    def _oldest(self) -> int | None:
        heap = self._heap
        while heap and not self._times.get(heap[0]):
            heapq.heappop(heap)
        return heap[0] if heap else None


def _check_workers(workers: int) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be a non-negative int, got {workers!r}")


# (key, name, help, kind); kind "gauge" is summed over trackers and processes, "max" takes the
# maximum, "counter" is an integral (summed).
_SERIES: tuple[tuple[str, str, str, str], ...] = (
    ("workers", "rmqtrace_consumer_workers", "Workers the consumer runs handlers on.", "gauge"),
    ("busy", "rmqtrace_consumer_busy_workers", "Workers running a handler.", "gauge"),
    ("unstarted", "rmqtrace_consumer_unstarted_messages",
     "Messages received by the consumer whose handler has not started.", "gauge"),
    ("age", "rmqtrace_consumer_oldest_unstarted_age_seconds",
     "Age of the oldest received, not started message (0 when there is none).", "max"),
    ("busy_s", "rmqtrace_consumer_busy_worker_seconds", "Worker-seconds spent running handlers.", "counter"),
    ("idle_s", "rmqtrace_consumer_idle_worker_seconds", "Worker-seconds spent idle.", "counter"),
    ("hol_s", "rmqtrace_consumer_hol_idle_worker_seconds",
     "Idle worker-seconds while received messages waited in the same consumer "
     "(min(idle workers, unstarted messages) integrated over time): head-of-line blocking.", "counter"),
    ("holding_s", "rmqtrace_consumer_holding_seconds",
     "Seconds during which the consumer held at least one unstarted message.", "counter"),
)
_LABELS = ["consumer_group"]


def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    return {key: (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, help_, labels=_LABELS)
            for key, name, help_, kind in _SERIES}


class _Collector:
    """The scrape-time collector of one :class:`OccupancyMetrics` (single-process mode)."""

    def __init__(self, owner: OccupancyMetrics) -> None:
        self._owner = owner

    def describe(self) -> list[Metric]:
        return list(_families().values())  # the real names: a registry refuses a clashing collector

    def collect(self) -> Iterator[Metric]:
        fams = _families()
        for group, acc in self._owner.totals().items():
            for key, fam in fams.items():
                fam.add_metric([group], acc[key])
        yield from fams.values()


class OccupancyMetrics(OnePerRegistry):
    """The ``rmqtrace_consumer_*`` series of every tracker made by :meth:`track`.

    ``registry=None`` registers on the global registry, like prometheus-client's metrics. One
    ``OccupancyMetrics`` per registry: a second is refused (use :meth:`shared`, and one
    :meth:`track` per consumer).

    Values are read at scrape time, so the hot path never touches a metric object. Under
    ``PROMETHEUS_MULTIPROC_DIR`` a scrape reads the directory's files, not this process: the
    values are then written into stock multiprocess metrics every ``refresh_interval`` seconds,
    when a tracker is made (:meth:`track`) and closed (:meth:`Occupancy.close`), at the
    interpreter's exit, and by :meth:`flush` — a worker that lives less than a refresh interval
    shows, and none loses its last interval at exit; the gauges are ``livesum`` (the oldest age ``livemax``), so a dead
    process's gauges leave the aggregate and its counters stay in it. The group label's cap is
    then shared by every process of the directory.

    Raises:
        ValueError: the registry already holds these series, or ``refresh_interval`` <= 0.
    """

    def __init__(self, registry: CollectorRegistry | None = None, label_limit: int = 64,
                 refresh_interval: float = 1.0) -> None:
        self._label = BoundedLabel(label_limit, shared="occupancy_groups")
        self._lock = threading.Lock()
        self._trackers: list[tuple[str, Occupancy]] = []
        reg = DEFAULT_REGISTRY if registry is None else registry
        self.registry = reg
        self.multiprocess = multiprocess_dir() is not None
        self._stock: dict[str, Gauge | PromCounter] = {}
        self._written: dict[tuple[str, str], float] = {}  # counters: (key, group) -> total written
        self._flush_lock = threading.Lock()
        self._refresher: Refresher | None = None
        collectors: list[Any]
        if self.multiprocess:
            for key, name, help_, kind in _SERIES:
                if kind == "counter":
                    self._stock[key] = PromCounter(name, help_, _LABELS, registry=None)
                else:
                    self._stock[key] = Gauge(name, help_, _LABELS, registry=None,
                                             multiprocess_mode="livemax" if kind == "max" else "livesum")
            collectors = list(self._stock.values())
            self._refresher = Refresher(self, OccupancyMetrics.flush, refresh_interval)
        else:
            if not refresh_interval > 0:
                raise ValueError(f"refresh interval must be positive, got {refresh_interval!r}")
            collectors = [_Collector(self)]
        self._register(reg, collectors)
        if self._refresher is not None:
            self._refresher.start()

    def track(self, consumer_group: str, workers: int, *, clock: MonotonicClock | None = None) -> Occupancy:
        """A new tracker whose values this collector exports under ``consumer_group`` (in
        multiprocess mode written at once, and again when it is closed)."""
        occ = Occupancy(workers, clock=clock, on_close=self.flush if self._stock else None)
        with self._lock:
            self._trackers.append((self._label(consumer_group), occ))
        self.flush()  # its series exist from now on, not from the first refresh
        return occ

    def totals(self) -> dict[str, dict[str, float]]:
        """Every series' value per group label, brought up to now (what a scrape shows)."""
        with self._lock:
            trackers = list(self._trackers)
        sums: dict[str, dict[str, float]] = {}
        for group, occ in trackers:
            s = occ.statistics()
            acc = sums.setdefault(group, {key: 0.0 for key, *_ in _SERIES})
            acc["workers"] += s.workers
            acc["busy"] += s.busy
            acc["unstarted"] += s.unstarted
            acc["age"] = max(acc["age"], s.oldest_unstarted_age_s)
            acc["busy_s"] += s.busy_s
            acc["idle_s"] += s.idle_s
            acc["hol_s"] += s.hol_s
            acc["holding_s"] += s.holding_s
        return sums

    def flush(self) -> None:
        """Multiprocess mode: write the current values to this process's files now (the refresher
        does it every ``refresh_interval``). A no-op in single-process mode."""
        if not self._stock:
            return
        with self._flush_lock:  # one writer at a time: the counter deltas must not be counted twice
            for group, acc in self.totals().items():
                for key, *_ in _SERIES:
                    metric = self._stock[key].labels(group)
                    if isinstance(metric, PromCounter):
                        delta = acc[key] - self._written.get((key, group), 0.0)
                        if delta > 0:
                            metric.inc(delta)
                            self._written[(key, group)] = acc[key]
                    else:
                        metric.set(acc[key])
