"""OpenTelemetry metrics of the message path, for users who export OTLP instead of scraping.

With a ``MeterProvider`` installed (the global one, as ``opentelemetry-instrument`` sets it up, or
one given to :class:`MessagingMeters`) every send and every finished message records:

======================================= ========= ============ ==========================================
instrument                              kind      unit         attributes
======================================= ========= ============ ==========================================
``messaging.client.operation.duration`` histogram ``s``        send: ``messaging.system``,
                                                               ``messaging.operation.name`` / ``.type``
                                                               (``send``), ``messaging.destination.name``,
                                                               ``error.type`` when it failed; a pull
                                                               consumer's ``receive`` (type ``receive``),
                                                               ``ack`` and ``change_invisible_duration``
                                                               (type ``settle``): the same plus
                                                               ``messaging.consumer.group.name``; receive
                                                               names the topic only when every message
                                                               of the batch had it
``messaging.client.sent.messages``      counter   ``{message}`` the same
``messaging.process.duration``          histogram ``s``        client pull → handler end (the ``process``
                                                               span): ``messaging.system``,
                                                               ``messaging.operation.name`` / ``.type``
                                                               (``process``), ``messaging.destination.name``,
                                                               ``messaging.consumer.group.name``,
                                                               ``error.type`` unless it succeeded
``messaging.client.consumed.messages``  counter   ``{message}`` once per message handed to the application,
                                                               counted when its handling ends; the
                                                               ``process`` attributes without ``error.type``
``rmqtrace.stage.duration``             histogram ``s``        every stage gap: ``rmqtrace.stage``,
                                                               ``messaging.destination.name``,
                                                               ``messaging.consumer.group.name``
======================================= ========= ============ ==========================================

The semantic-convention histograms advise the spec's buckets (:data:`SEMCONV_BUCKETS`); the stage
histogram advises the same buckets as the Prometheus one. Topics and groups pass the same joint
cap as the Prometheus labels (:class:`~tracer.telemetry.metrics.PairLabels`).

Without a meter provider a message costs a counter increment: the global provider is looked up on
the first call and then on every :data:`RECHECK_EVERY`-th (the lookup reads ``os.environ``, which
would cost more than the rest of the Prometheus path), so a provider set after messages began to
flow is picked up within that many calls.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple, Sequence

from opentelemetry import metrics
from opentelemetry.metrics import Counter, Histogram, MeterProvider, NoOpMeterProvider

from ..path import names as n
from ..path.stages import GAP_INDEX, GAPS, Outcome, Stage
from ..version import __version__
from .metrics import DEFAULT_BUCKETS, PairLabels

__all__ = ["GLOBAL_METERS", "RECHECK_EVERY", "SEMCONV_BUCKETS", "MessagingMeters"]

RECHECK_EVERY = 256  # a power of two
_MAX_OP_ATTRS = 4096

# The spec's advised boundaries for messaging.client.operation.duration and messaging.process.duration.
SEMCONV_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_SEND = {n.SYSTEM: n.SYSTEM_VALUE, n.OPERATION_NAME: n.SEND, n.OPERATION_TYPE: n.SEND}
_PROCESS = {n.SYSTEM: n.SYSTEM_VALUE, n.OPERATION_NAME: n.PROCESS, n.OPERATION_TYPE: n.PROCESS}
_PULL, _END = int(Stage.CLIENT_PULL), int(Stage.HANDLER_END)
_SUCCESS = Outcome.SUCCESS  # a module constant: an Enum member off its class costs a descriptor call


class _Instruments(NamedTuple):
    operation: Histogram
    sent: Counter
    process: Histogram
    consumed: Counter
    stage: Histogram
    avoidable: Counter


class _PairAttrs(NamedTuple):
    """Attribute sets of one (topic, group), built once: the SDK hashes them on every record."""

    send: dict[str, Any]
    process: dict[str, Any]
    gaps: tuple[dict[str, Any], ...]


def _real(provider: MeterProvider) -> bool:
    """False for the API's own stand-ins (the proxy used until a provider is set, the no-op)."""
    return not isinstance(provider, NoOpMeterProvider) and not type(provider).__module__.startswith("opentelemetry.metrics")


class MessagingMeters:
    """Records the message path into a meter provider; ``meter_provider=None`` follows the global one."""

    def __init__(self, meter_provider: MeterProvider | None = None, label_limit: int = 64) -> None:
        self._provider = meter_provider
        self._instruments: _Instruments | None = None
        self._misses = 0  # calls without a provider; racy by design, it only spaces the look-ups
        self._lock = threading.Lock()
        self._pairs = PairLabels(label_limit)
        self._attrs: dict[tuple[str, str], _PairAttrs] = {}
        self._op_attrs: dict[tuple[str, str, str | None, str], dict[str, Any]] = {}

    @property
    def recording(self) -> bool:
        """Whether a meter provider has been found (and the instruments built)."""
        return self._instruments is not None

    def _resolve(self) -> _Instruments | None:
        found = self._instruments
        if found is not None:
            return found
        self._misses += 1
        if (self._misses - 1) & (RECHECK_EVERY - 1):
            return None
        provider = self._provider or metrics.get_meter_provider()
        if not _real(provider):
            return None  # looked up again next time: the global provider may be set later
        with self._lock:
            if self._instruments is None:
                meter = provider.get_meter("rmqtrace", __version__, schema_url=n.SCHEMA_URL)
                self._instruments = _Instruments(
                    meter.create_histogram("messaging.client.operation.duration", unit="s",
                                           description="Duration of messaging operation initiated by a producer "
                                                       "or consumer client.",
                                           explicit_bucket_boundaries_advisory=SEMCONV_BUCKETS),
                    meter.create_counter("messaging.client.sent.messages", unit="{message}",
                                         description="Number of messages producer attempted to send to the broker."),
                    meter.create_histogram("messaging.process.duration", unit="s",
                                           description="Duration of processing operation.",
                                           explicit_bucket_boundaries_advisory=SEMCONV_BUCKETS),
                    meter.create_counter("messaging.client.consumed.messages", unit="{message}",
                                         description="Number of messages that were delivered to the application."),
                    meter.create_histogram("rmqtrace.stage.duration", unit="s",
                                           description="Time a message spent in each stage gap.",
                                           explicit_bucket_boundaries_advisory=DEFAULT_BUCKETS),
                    meter.create_counter("rmqtrace.consumer.avoidable_wait", unit="s",
                                         description="Time messages waited in a dispatcher while one of its "
                                                     "workers was idle (live blame)."),
                )
            return self._instruments

    def _attrs_for(self, topic: str, group: str) -> _PairAttrs:
        found = self._attrs.get((topic, group))
        if found is not None:
            return found
        t, g = self._pairs(topic, group)
        found = self._attrs.get((t, g))
        if found is None:
            where = {n.DESTINATION: t}
            if g:
                where[n.CONSUMER_GROUP] = g
            found = _PairAttrs({**_SEND, n.DESTINATION: t}, {**_PROCESS, **where},
                               tuple({n.STAGE: gap.name, **where} for gap in GAPS))
            with self._lock:
                self._attrs[(t, g)] = found
        return found

    def sent(self, topic: str, duration_ns: int, error: BaseException | None = None) -> None:
        """One send that took ``duration_ns`` (negative is recorded as 0)."""
        inst = self._instruments or self._resolve()
        if inst is None:
            return
        attrs = self._attrs_for(topic, "").send
        if error is not None:
            attrs = {**attrs, n.ERROR_TYPE: type(error).__qualname__}
        inst.operation.record(max(0, duration_ns) / 1e9, attrs)
        inst.sent.add(1, attrs)

    def operation(self, name: str, kind: str, topic: str | None, group: str, duration_ns: int,
                  error: BaseException | None = None) -> None:
        """One consumer client operation (``receive``, or a settle: ``ack``,
        ``change_invisible_duration``) into ``messaging.client.operation.duration``. ``topic``
        None: the operation spanned several topics (no ``messaging.destination.name``)."""
        inst = self._instruments or self._resolve()
        if inst is None:
            return
        key = (name, kind, topic, group)
        attrs = self._op_attrs.get(key)
        if attrs is None:
            t, g = self._pairs(topic or "", group)  # the same joint cap as every other series
            attrs = {n.SYSTEM: n.SYSTEM_VALUE, n.OPERATION_NAME: name, n.OPERATION_TYPE: kind}
            if topic is not None:
                attrs[n.DESTINATION] = t
            if g:
                attrs[n.CONSUMER_GROUP] = g
            with self._lock:
                if len(self._op_attrs) < _MAX_OP_ATTRS:  # topics are capped; this bounds the cache too
                    self._op_attrs[key] = attrs
        if error is not None:
            attrs = {**attrs, n.ERROR_TYPE: type(error).__qualname__}
        inst.operation.record(max(0, duration_ns) / 1e9, attrs)

    def avoidable(self, topic: str, group: str, policy: str, seconds: float) -> None:
        """One message's avoidable wait (live blame) under its dispatcher's ``policy``."""
        inst = self._instruments or self._resolve()
        if inst is None:
            return
        inst.avoidable.add(seconds if seconds > 0 else 0.0, {**self._attrs_for(topic, group).process, n.DISPATCH_POLICY: policy})

    def finished(self, topic: str, group: str, times: Sequence[int], outcome: Outcome,
                 error: BaseException | None = None) -> None:
        """One message whose handling ended: process duration, consumed count, every stage gap."""
        inst = self._instruments
        if inst is None:
            # _resolve's own spacing, inline: without a meter provider this is every message's path
            if self._misses & (RECHECK_EVERY - 1):
                self._misses += 1
                return
            inst = self._resolve()
            if inst is None:
                return
        attrs = self._attrs_for(topic, group)
        inst.consumed.add(1, attrs.process)
        a, b = times[_PULL], times[_END]
        if a and b:
            process = attrs.process
            if outcome is not _SUCCESS:
                # the exception's class; without one (a failure result, a timeout) the outcome, as the span has
                process = {**process, n.ERROR_TYPE: type(error).__qualname__ if error is not None else outcome.value}
            inst.process.record((b - a) / 1e9 if b > a else 0.0, process)
        stage = inst.stage
        for gi, start, end in GAP_INDEX:
            a, b = times[start], times[end]
            if a and b:
                stage.record((b - a) / 1e9 if b > a else 0.0, attrs.gaps[gi])


# What every MessageTracer records into unless given another: the global provider, once set.
GLOBAL_METERS = MessagingMeters()
