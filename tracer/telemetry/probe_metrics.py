"""Prometheus series of probes (:mod:`tracer.clients.probe`), apart from the real messages' series.

A probe is a small marked message a :class:`~tracer.clients.probe.ProbeSender` sends every few
seconds; every rmqtrace seam settles it right where the user's handler would start. Its gaps are
what a new message would wait right now inside that consumer, so they get series of their own —
mixed into ``rmqtrace_stage_duration_seconds`` they would dilute the real messages' percentiles.

Consumer side, per (topic, consumer_group), both capped jointly as in :class:`TracerMetrics`:

- ``rmqtrace_probe_stage_duration_seconds{stage,...}``: histogram of every gap up to the handler's
  start (``send``, ``broker_wait``, ``client_buffer``, ``dispatch_wait``, ``consumer_wait``, and
  ``end_to_end``, which for a probe ends at that start). No ``handler``: a probe runs none.
- ``rmqtrace_probe_last_stage_duration_seconds{stage,...}``: the latest probe's gaps (the "now").
- ``rmqtrace_probe_last_seen_timestamp_seconds``: when the latest probe was settled (consumer
  wall clock); ``time() - it`` is the age, so a consumer that stopped taking messages shows.
- ``rmqtrace_probe_received_total``.

Sender side, per topic: ``rmqtrace_probe_sent_total{topic,outcome}`` (``success``/``failure``)
and ``rmqtrace_probe_last_sent_timestamp_seconds{topic}``, so an alert can tell "no probe sent"
from "probes sent, none taken".
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Sequence

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..path.stages import GAPS, Gap
from ..path.stamps import MISSING
from .metrics import DEFAULT_BUCKETS, BoundedLabel, OnePerRegistry, PairLabels

__all__ = ["PROBE_GAPS", "ProbeMetrics", "ProbeReading"]

# Every gap that ends no later than the handler's start (end_to_end ends there for a probe).
PROBE_GAPS: tuple[Gap, ...] = tuple(g for g in GAPS if g.name != "handler")



class ProbeReading(NamedTuple):
    """One settled probe: its label pair, its gaps in seconds (clamped at 0), when it was settled."""

    topic: str
    consumer_group: str
    gaps: dict[str, float]
    seen_s: float


class ProbeMetrics(OnePerRegistry):
    """The probe series on one registry (``registry=None``: the global one); one per registry,
    like :class:`~tracer.telemetry.metrics.TracerMetrics` (see :meth:`shared`).

    Raises:
        ValueError: the registry already holds these series (use :meth:`shared`), or the buckets
            are not strictly increasing (prometheus-client's check).
    """

    def __init__(self, registry: CollectorRegistry | None = None, buckets: Sequence[float] = DEFAULT_BUCKETS,
                 label_limit: int = 64) -> None:
        reg = DEFAULT_REGISTRY if registry is None else registry
        self.registry = reg
        pair = ["topic", "consumer_group"]
        self.stage = Histogram("rmqtrace_probe_stage_duration_seconds",
                               "Gaps of probe messages up to where the handler would start: the wait a new "
                               "message meets now.", ["stage", *pair], buckets=buckets, registry=None)
        self.last_stage = Gauge("rmqtrace_probe_last_stage_duration_seconds", "Gaps of the latest probe message.",
                                ["stage", *pair], registry=None, multiprocess_mode="mostrecent")
        self.last_seen = Gauge("rmqtrace_probe_last_seen_timestamp_seconds",
                               "When this consumer settled its latest probe (Unix seconds, consumer clock).",
                               pair, registry=None, multiprocess_mode="max")
        self.received = Counter("rmqtrace_probe_received", "Probe messages settled (acked, handler skipped).",
                                pair, registry=None)
        self.sent = Counter("rmqtrace_probe_sent", "Probe messages sent, by outcome.", ["topic", "outcome"],
                            registry=None)
        self.last_sent = Gauge("rmqtrace_probe_last_sent_timestamp_seconds",
                               "When the latest probe was sent successfully (Unix seconds, sender clock).",
                               ["topic"], registry=None, multiprocess_mode="max")
        self._collectors = (self.stage, self.last_stage, self.last_seen, self.received, self.sent, self.last_sent)
        self._pairs = PairLabels(label_limit, shared="probe")
        self._topics = BoundedLabel(label_limit, shared="probe_sent_topics")
        self._latest: dict[tuple[str, str], ProbeReading] = {}
        self._lock = threading.Lock()
        self._register(reg, self._collectors)

    # -- consumer side ---------------------------------------------------------------------
    def record(self, topic: str, consumer_group: str, times: Sequence[int], seen_ns: int) -> ProbeReading:
        """One settled probe: ``times`` its stamps (indexed by Stage, 0 = missing), ``seen_ns``
        when it was settled. Negative cross-clock gaps count as 0, as for real messages."""
        t, g = self._pairs(topic, consumer_group)
        gaps: dict[str, float] = {}
        for gap in PROBE_GAPS:
            a, b = times[gap.start], times[gap.end]
            if a == MISSING or b == MISSING:
                continue
            v = (b - a) / 1e9 if b > a else 0.0
            gaps[gap.name] = v
            self.stage.labels(gap.name, t, g).observe(v)
            self.last_stage.labels(gap.name, t, g).set(v)
        reading = ProbeReading(t, g, gaps, seen_ns / 1e9)
        self.last_seen.labels(t, g).set(reading.seen_s)
        self.received.labels(t, g).inc()
        with self._lock:
            self._latest[(t, g)] = reading
        return reading

    def latest(self) -> dict[tuple[str, str], ProbeReading]:
        """The latest reading per (topic, consumer_group) label pair (a copy)."""
        with self._lock:
            return dict(self._latest)

    # -- sender side -----------------------------------------------------------------------
    def sent_one(self, topic: str, ok: bool, at_ns: int) -> None:
        t = self._topics(topic)
        self.sent.labels(t, "success" if ok else "failure").inc()
        if ok:
            self.last_sent.labels(t).set(at_ns / 1e9)
