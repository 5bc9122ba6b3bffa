"""Prometheus series of the dispatcher, with label children bound once (``.labels()`` is slow).

========================================== ========= =================================================
series                                     type      meaning
========================================== ========= =================================================
``rmqtrace_dispatch_slot_wait_seconds``    histogram accepted by ``submit`` → handler start (the hidden gap)
``rmqtrace_dispatch_submit_blocked_seconds`` histogram time ``submit`` spent blocked on back-pressure
                                                     (0 when it did not block; one per accepted submit)
``rmqtrace_dispatch_workers``              gauge     workers of live dispatchers
``rmqtrace_dispatch_busy_workers``         gauge     workers holding a message
``rmqtrace_dispatch_queued_messages``      gauge     accepted, not yet held by a worker
``rmqtrace_dispatch_messages_total``       counter   finished messages by ``outcome`` (success, failure,
                                                     timeout, skipped)
========================================== ========= =================================================

Every series has one label, ``policy``. The gauges are computed at scrape time from the live
dispatchers bound to a policy label (summed), so the hot path never touches them, and several
dispatchers may share one :class:`DispatchMetrics`. A registry can hold one ``DispatchMetrics``
(prometheus-client refuses duplicate series): build it once and share it, or use :meth:`shared`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ..path.stages import Outcome
from ..telemetry.metrics import DEFAULT_BUCKETS  # one bucket list for every duration family


class GaugeSource(Protocol):
    """What the gauges read from a live dispatcher (a :class:`.scheduler.Scheduler` fits)."""

    workers: int
    busy: int
    queued: int


class GaugeSources:
    """The live sources of one policy label; read at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: list[weakref.ReferenceType[GaugeSource]] = []

    def add(self, src: GaugeSource) -> None:
        with self._lock:
            self._refs.append(weakref.ref(src))

    def remove(self, src: GaugeSource) -> None:
        with self._lock:
            self._refs = [r for r in self._refs if r() is not None and r() is not src]

    def _live(self) -> list[GaugeSource]:
        with self._lock:
            out = [s for s in (r() for r in self._refs) if s is not None]
            if len(out) != len(self._refs):
                self._refs = [weakref.ref(s) for s in out]
            return out

    def workers(self) -> float:
        return float(sum(s.workers for s in self._live()))

    def busy(self) -> float:
        return float(sum(s.busy for s in self._live()))

    def queued(self) -> float:
        return float(sum(s.queued for s in self._live()))


class BoundDispatchMetrics:
    """The children of one ``policy`` label, ready for the hot path."""

    __slots__ = ("_source", "_sources", "outcomes", "policy", "slot_wait", "submit_blocked")

    def __init__(self, owner: DispatchMetrics, policy: str, source: GaugeSource) -> None:
        self.policy = policy
        self.slot_wait = owner.slot_wait.labels(policy=policy)
        self.submit_blocked = owner.submit_blocked.labels(policy=policy)
        self.outcomes = {o: owner.messages.labels(policy=policy, outcome=o.value) for o in Outcome}
        self._sources = owner.sources_for(policy)
        self._sources.add(source)
        self._source = source

    def unbind(self) -> None:
        """Stop counting this dispatcher in the gauges (``close`` calls it). Idempotent."""
        self._sources.remove(self._source)


_shared: weakref.WeakKeyDictionary[CollectorRegistry, DispatchMetrics] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


class DispatchMetrics:
    """The dispatcher series in ``registry`` (``None``: prometheus-client's global ``REGISTRY``)."""

    def __init__(self, registry: CollectorRegistry | None = None, buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        reg = REGISTRY if registry is None else registry
        self.registry = reg
        self.slot_wait = Histogram(
            "rmqtrace_dispatch_slot_wait_seconds",
            "Time from dispatcher enqueue (submit accepted) to handler start.",
            ["policy"], buckets=buckets, registry=reg,
        )  # fmt: skip
        self.submit_blocked = Histogram(
            "rmqtrace_dispatch_submit_blocked_seconds",
            "Time submit() spent blocked by back-pressure before the dispatcher accepted the message.",
            ["policy"], buckets=buckets, registry=reg,
        )  # fmt: skip
        self.workers = Gauge("rmqtrace_dispatch_workers", "Workers of live dispatchers.", ["policy"], registry=reg)
        self.busy = Gauge("rmqtrace_dispatch_busy_workers", "Workers holding a message.", ["policy"], registry=reg)
        self.queued = Gauge(
            "rmqtrace_dispatch_queued_messages", "Messages accepted but not yet held by a worker.", ["policy"],
            registry=reg,
        )  # fmt: skip
        self.messages = Counter(
            "rmqtrace_dispatch_messages", "Messages finished by the dispatcher, by outcome.", ["policy", "outcome"],
            registry=reg,
        )  # fmt: skip
        self._lock = threading.Lock()
        self._sources: dict[str, GaugeSources] = {}

    @classmethod
    def shared(cls, registry: CollectorRegistry | None = None) -> DispatchMetrics:
        """One instance per registry (built on first use, default buckets)."""
        reg = REGISTRY if registry is None else registry
        with _shared_lock:
            m = _shared.get(reg)
            if m is None:
                m = _shared[reg] = cls(reg)
            return m

    def sources_for(self, policy: str) -> GaugeSources:
        """The live gauge sources of ``policy`` (created, with its gauge children, on first use)."""
        with self._lock:
            src = self._sources.get(policy)
            if src is None:
                src = self._sources[policy] = GaugeSources()
                self.workers.labels(policy=policy).set_function(src.workers)
                self.busy.labels(policy=policy).set_function(src.busy)
                self.queued.labels(policy=policy).set_function(src.queued)
            return src

    def bind(self, policy: str, source: GaugeSource) -> BoundDispatchMetrics:
        """Children for ``policy``, with ``source`` counted in the gauges until ``unbind``."""
        return BoundDispatchMetrics(self, policy, source)


__all__ = ["DEFAULT_BUCKETS", "BoundDispatchMetrics", "DispatchMetrics", "GaugeSource", "GaugeSources"]
