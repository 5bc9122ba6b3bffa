"""Prometheus series of the dispatcher, with label children bound once (``.labels()`` is slow).

========================================== ========= =================================================
series                                     type      meaning
========================================== ========= =================================================
``rmqtrace_dispatch_slot_wait_seconds``    histogram accepted by ``submit`` → handler start (the hidden gap)
``rmqtrace_dispatch_submit_blocked_seconds`` histogram time ``submit`` spent blocked on back-pressure
                                                     (0 when it did not block; one per accepted submit)
``rmqtrace_dispatch_workers``              gauge     workers of live (not closed) dispatchers
``rmqtrace_dispatch_busy_workers``         gauge     workers holding a message
``rmqtrace_dispatch_queued_messages``      gauge     accepted, not yet held by a worker
``rmqtrace_dispatch_messages_total``       counter   finished messages by ``outcome`` (success, failure,
                                                     timeout, skipped, not_started)
``rmqtrace_dispatch_busy_worker_seconds_total`` counter ∫ busy dt (:mod:`.accrual`)
``rmqtrace_dispatch_hol_idle_worker_seconds_total`` counter ∫ min(idle, queued) dt: idle worker-seconds
                                                     messages waiting here could have used
========================================== ========= =================================================

Every series has the labels ``policy`` and ``consumer_group`` (the dispatcher's
``consumer_group=``, "" if none), so two consumers' dispatchers in one process are not summed into
one (a saturated group beside an idle one would read as head-of-line blocking; one group's failures
as the other's); Prometheus adds ``instance``. The gauges are computed at scrape time from the
live dispatchers bound to a (policy, consumer_group) pair (summed), so the hot path never touches
them, and several
dispatchers may share one :class:`DispatchMetrics`. A registry holds one ``DispatchMetrics``
(:class:`~tracer.telemetry.registration.OnePerRegistry`): build it once and share it, or use
:meth:`DispatchMetrics.shared`. Multiprocess mode: see :class:`DispatchMetrics`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Literal, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from ..bounds import NO_BOUND_S, seconds
from ..path.stages import Outcome
from ..telemetry.metrics import DEFAULT_BUCKETS  # one bucket list for every duration family
from ..telemetry.registration import OnePerRegistry, Refresher, multiprocess_dir


class GaugeSource(Protocol):
    """What the gauges read from a live dispatcher (an :class:`.accrual.Accrual` fits)."""

    @property
    def workers(self) -> int: ...
    @property
    def busy(self) -> int: ...
    @property
    def queued(self) -> int: ...
    def accrued(self) -> tuple[float, float]:
        """``(busy worker-seconds, head-of-line idle worker-seconds)`` so far."""
        ...


class GaugeSources:
    """The live sources of one (policy, consumer_group) pair; read at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: list[weakref.ReferenceType[GaugeSource]] = []
        # counters: what each source has contributed so far (keyed by id while it is live), and the
        # contributions of sources removed since the last advance, so closing one never lowers a total
        self._reported: dict[int, tuple[float, float]] = {}
        self._pending = (0.0, 0.0)

    def add(self, src: GaugeSource) -> None:
        with self._lock:
            self._refs.append(weakref.ref(src))
            self._reported[id(src)] = (0.0, 0.0)

    def remove(self, src: GaugeSource) -> None:
        with self._lock:
            if id(src) in self._reported and any(r() is src for r in self._refs):
                db, dh = self._delta(src)
                self._pending = (self._pending[0] + db, self._pending[1] + dh)
                del self._reported[id(src)]
            self._refs = [r for r in self._refs if r() is not None and r() is not src]

    def _delta(self, src: GaugeSource) -> tuple[float, float]:
        b0, h0 = self._reported.get(id(src), (0.0, 0.0))
        b, h = src.accrued()
        b, h = max(b, b0), max(h, h0)  # a running maximum: a counter never goes down
        self._reported[id(src)] = (b, h)
        return b - b0, h - h0

    def advance(self) -> tuple[float, float]:
        """``(busy_s, hol_s)`` accrued since the previous call, summed over the sources."""
        live = self._live()
        with self._lock:
            db, dh = self._pending
            self._pending = (0.0, 0.0)
            for s in live:
                if id(s) in self._reported:
                    b, h = self._delta(s)
                    db, dh = db + b, dh + h
            return db, dh

    def _live(self) -> list[GaugeSource]:
        with self._lock:
            out = [s for s in (r() for r in self._refs) if s is not None]
            if len(out) != len(self._refs):
                self._refs = [weakref.ref(s) for s in out]
                ids = {id(s) for s in out}
                self._reported = {k: v for k, v in self._reported.items() if k in ids}
            return out

    def workers(self) -> float:
        return float(sum(s.workers for s in self._live()))

    def busy(self) -> float:
        return float(sum(s.busy for s in self._live()))

    def queued(self) -> float:
        return float(sum(s.queued for s in self._live()))


class BoundDispatchMetrics:
    """The children of one (policy, consumer_group) pair, ready for the hot path."""

    __slots__ = ("_owner", "_source", "_sources", "outcomes", "policy", "slot_wait", "submit_blocked")

    def __init__(self, owner: DispatchMetrics, policy: str, source: GaugeSource, consumer_group: str = "") -> None:
        self.policy = policy
        self.slot_wait = owner.slot_wait.labels(policy=policy, consumer_group=consumer_group)
        self.submit_blocked = owner.submit_blocked.labels(policy=policy, consumer_group=consumer_group)
        self.outcomes = {o: owner.messages.labels(policy=policy, consumer_group=consumer_group, outcome=o.value)
                         for o in Outcome}
        self._owner = owner
        self._sources = owner.sources_for(policy, consumer_group)
        self._sources.add(source)
        self._source = source

    def unbind(self) -> None:
        """Stop counting this dispatcher in the gauges (``close`` calls it as it returns,
        whether or not every handler ended). Idempotent."""
        self._sources.remove(self._source)
        self._owner.flush()


class DispatchMetrics(OnePerRegistry):
    """The dispatcher series in ``registry`` (``None``: prometheus-client's global ``REGISTRY``);
    one per registry (a second is refused: use :meth:`shared`).

    Under ``PROMETHEUS_MULTIPROC_DIR`` the gauges, computed from live dispatchers, are written to
    this process's files every ``refresh_interval`` seconds and at every bind/unbind (a
    ``set_function`` gauge never reaches the files); they are ``livesum``: the aggregate is the
    sum over live processes.

    Raises:
        ValueError: the registry already holds these series, or the buckets are not increasing.
    """

    def __init__(self, registry: CollectorRegistry | None = None, buckets: Sequence[float] = DEFAULT_BUCKETS,
                 refresh_interval: float = 1.0) -> None:
        # checked here, not only by the refresher a multiprocess registry starts: a NaN fails either way
        refresh_interval = seconds(refresh_interval, "refresh_interval", maximum=NO_BOUND_S)
        reg = REGISTRY if registry is None else registry
        self.registry = reg
        self.multiprocess = multiprocess_dir() is not None
        pair = ["policy", "consumer_group"]  # every series: two groups' dispatchers never sum into one
        self.slot_wait = Histogram(
            "rmqtrace_dispatch_slot_wait_seconds",
            "Time from dispatcher enqueue (submit accepted) to handler start.",
            pair, buckets=buckets, registry=None,
        )  # fmt: skip
        self.submit_blocked = Histogram(
            "rmqtrace_dispatch_submit_blocked_seconds",
            "Time submit() spent blocked by back-pressure before the dispatcher accepted the message.",
            pair, buckets=buckets, registry=None,
        )  # fmt: skip
        mode: Literal["livesum"] = "livesum"  # multiprocess only: the sum over live processes
        self.workers = Gauge("rmqtrace_dispatch_workers", "Workers of live dispatchers.", pair, registry=None,
                             multiprocess_mode=mode)
        self.busy = Gauge("rmqtrace_dispatch_busy_workers", "Workers holding a message.", pair, registry=None,
                          multiprocess_mode=mode)
        self.queued = Gauge(
            "rmqtrace_dispatch_queued_messages", "Messages accepted but not yet held by a worker.", pair,
            registry=None, multiprocess_mode=mode,
        )  # fmt: skip
        self.busy_seconds = Counter(
            "rmqtrace_dispatch_busy_worker_seconds", "Worker-seconds spent holding a message.", pair, registry=None,
        )  # fmt: skip
        self.hol_seconds = Counter(
            "rmqtrace_dispatch_hol_idle_worker_seconds",
            "Idle worker-seconds that messages queued in the dispatcher could have used (min(idle, queued) dt).",
            pair, registry=None,
        )  # fmt: skip
        self.messages = Counter(
            "rmqtrace_dispatch_messages", "Messages finished by the dispatcher, by outcome.", [*pair, "outcome"],
            registry=None,
        )  # fmt: skip
        self._lock = threading.Lock()
        self._sources: dict[tuple[str, str], GaugeSources] = {}
        self._advance_lock = threading.Lock()
        self._refresher = Refresher(self, DispatchMetrics.flush, refresh_interval) if self.multiprocess else None
        self._register(reg, (self.slot_wait, self.submit_blocked, self.workers, self.busy, self.queued,
                             self.messages, _AdvancedFirst(self, self.busy_seconds),
                             _AdvancedFirst(self, self.hol_seconds)))

    def sources_for(self, policy: str, consumer_group: str = "") -> GaugeSources:
        """The live gauge sources of ``(policy, consumer_group)`` (created, with its gauge
        children, on first use)."""
        with self._lock:
            src = self._sources.get((policy, consumer_group))
            if src is None:
                src = self._sources[(policy, consumer_group)] = GaugeSources()
                labels = {"policy": policy, "consumer_group": consumer_group}
                self.busy_seconds.labels(**labels)
                self.hol_seconds.labels(**labels)
                if self._refresher is None:
                    self.workers.labels(**labels).set_function(src.workers)
                    self.busy.labels(**labels).set_function(src.busy)
                    self.queued.labels(**labels).set_function(src.queued)
            return src

    def advance(self) -> None:
        """Add the worker-seconds accrued since the last call to the counters (each scrape and
        multiprocess flush calls it)."""
        with self._lock:
            sources = list(self._sources.items())
        with self._advance_lock:  # one writer at a time: a delta must not be counted twice
            for (policy, group), src in sources:
                db, dh = src.advance()
                if db > 0:
                    self.busy_seconds.labels(policy=policy, consumer_group=group).inc(db)
                if dh > 0:
                    self.hol_seconds.labels(policy=policy, consumer_group=group).inc(dh)

    def bind(self, policy: str, source: GaugeSource, consumer_group: str = "") -> BoundDispatchMetrics:
        """Children for ``policy``, with ``source`` counted in the gauges of ``(policy,
        consumer_group)`` until ``unbind``."""
        bound = BoundDispatchMetrics(self, policy, source, consumer_group)
        if self._refresher is not None:
            self.flush()
            self._refresher.start()
        return bound

    def flush(self) -> None:
        """Multiprocess mode: write the gauges of every policy to this process's files now (the
        refresher does it every ``refresh_interval``). A no-op otherwise."""
        if self._refresher is None:
            return
        self.advance()
        with self._lock:
            sources = list(self._sources.items())
        for (policy, group), src in sources:
            labels = {"policy": policy, "consumer_group": group}
            self.workers.labels(**labels).set(src.workers())
            self.busy.labels(**labels).set(src.busy())
            self.queued.labels(**labels).set(src.queued())


class _AdvancedFirst:
    """A stock counter whose scrape first adds what accrued since the last one (single-process
    mode; under multiprocess the files are read instead and :meth:`DispatchMetrics.flush` advances)."""

    def __init__(self, owner: DispatchMetrics, counter: Counter) -> None:
        self._owner = owner
        self._counter = counter

    def describe(self) -> Iterable[Metric]:
        return self._counter.describe()

    def collect(self) -> Iterable[Metric]:
        self._owner.advance()
        return self._counter.collect()


__all__ = ["DEFAULT_BUCKETS", "BoundDispatchMetrics", "DispatchMetrics", "GaugeSource", "GaugeSources"]
