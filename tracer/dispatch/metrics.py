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
========================================== ========= =================================================

Every series has one label, ``policy``. The gauges are computed at scrape time from the live
dispatchers bound to a policy label (summed), so the hot path never touches them, and several
dispatchers may share one :class:`DispatchMetrics`. A registry holds one ``DispatchMetrics``
(:class:`~tracer.telemetry.registration.OnePerRegistry`): build it once and share it, or use
:meth:`DispatchMetrics.shared`. Multiprocess mode: see :class:`DispatchMetrics`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Literal, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ..path.stages import Outcome
from ..telemetry.metrics import DEFAULT_BUCKETS  # one bucket list for every duration family
from ..telemetry.registration import OnePerRegistry, Refresher, multiprocess_dir


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

    __slots__ = ("_owner", "_source", "_sources", "outcomes", "policy", "slot_wait", "submit_blocked")

    def __init__(self, owner: DispatchMetrics, policy: str, source: GaugeSource) -> None:
        self.policy = policy
        self.slot_wait = owner.slot_wait.labels(policy=policy)
        self.submit_blocked = owner.submit_blocked.labels(policy=policy)
        self.outcomes = {o: owner.messages.labels(policy=policy, outcome=o.value) for o in Outcome}
        self._owner = owner
        self._sources = owner.sources_for(policy)
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
        reg = REGISTRY if registry is None else registry
        self.registry = reg
        self.multiprocess = multiprocess_dir() is not None
        self.slot_wait = Histogram(
            "rmqtrace_dispatch_slot_wait_seconds",
            "Time from dispatcher enqueue (submit accepted) to handler start.",
            ["policy"], buckets=buckets, registry=None,
        )  # fmt: skip
        self.submit_blocked = Histogram(
            "rmqtrace_dispatch_submit_blocked_seconds",
            "Time submit() spent blocked by back-pressure before the dispatcher accepted the message.",
            ["policy"], buckets=buckets, registry=None,
        )  # fmt: skip
        mode: Literal["livesum"] = "livesum"  # multiprocess only: the sum over live processes
        self.workers = Gauge("rmqtrace_dispatch_workers", "Workers of live dispatchers.", ["policy"], registry=None,
                             multiprocess_mode=mode)
        self.busy = Gauge("rmqtrace_dispatch_busy_workers", "Workers holding a message.", ["policy"], registry=None,
                          multiprocess_mode=mode)
        self.queued = Gauge(
            "rmqtrace_dispatch_queued_messages", "Messages accepted but not yet held by a worker.", ["policy"],
            registry=None, multiprocess_mode=mode,
        )  # fmt: skip
        self.messages = Counter(
            "rmqtrace_dispatch_messages", "Messages finished by the dispatcher, by outcome.", ["policy", "outcome"],
            registry=None,
        )  # fmt: skip
        self._lock = threading.Lock()
        self._sources: dict[str, GaugeSources] = {}
        self._refresher = Refresher(self, DispatchMetrics.flush, refresh_interval) if self.multiprocess else None
        self._register(reg, (self.slot_wait, self.submit_blocked, self.workers, self.busy, self.queued,
                             self.messages))

    def sources_for(self, policy: str) -> GaugeSources:
        """The live gauge sources of ``policy`` (created, with its gauge children, on first use)."""
        with self._lock:
            src = self._sources.get(policy)
            if src is None:
                src = self._sources[policy] = GaugeSources()
                if self._refresher is None:
                    self.workers.labels(policy=policy).set_function(src.workers)
                    self.busy.labels(policy=policy).set_function(src.busy)
                    self.queued.labels(policy=policy).set_function(src.queued)
            return src

    def bind(self, policy: str, source: GaugeSource) -> BoundDispatchMetrics:
        """Children for ``policy``, with ``source`` counted in the gauges until ``unbind``."""
        bound = BoundDispatchMetrics(self, policy, source)
        if self._refresher is not None:
            self.flush()
            self._refresher.start()
        return bound

    def flush(self) -> None:
        """Multiprocess mode: write the gauges of every policy to this process's files now (the
        refresher does it every ``refresh_interval``). A no-op otherwise."""
        if self._refresher is None:
            return
        with self._lock:
            sources = list(self._sources.items())
        for policy, src in sources:
            self.workers.labels(policy=policy).set(src.workers())
            self.busy.labels(policy=policy).set(src.busy())
            self.queued.labels(policy=policy).set(src.queued())


__all__ = ["DEFAULT_BUCKETS", "BoundDispatchMetrics", "DispatchMetrics", "GaugeSource", "GaugeSources"]
