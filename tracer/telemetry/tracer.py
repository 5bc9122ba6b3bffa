"""The message path: stamps in, spans and histograms out.

``MessageTracer`` is configured once per process (or per consumer); it hands out a
``MessageTrace`` for every received message and a ``SendTrace`` for every send. A message trace
collects the six stamps as the message moves, and on :meth:`MessageTrace.finish` turns them
into one ``process {topic}`` span (child of the producer's ``send {topic}`` span) with one child
span per consumer-side gap, and one histogram observation per gap.

Only two spans are live while the message is handled — ``process`` and ``handler``, so that spans
the user's handler starts nest under it; the gap spans are written after the fact with explicit
start and end times. Unsampled messages cost only the stamps and the histograms.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode, TracerProvider

from ..path.clock import Clock, default_clock
from ..path.message import MessageInfo
from .metrics import TracerMetrics
from .otel_metrics import GLOBAL_METERS, MessagingMeters
from .occupancy import Occupancy
from ..path.propagation import Carried, PropagationErrors, extract, inject, plausible_ns
from .spans import DeferredSpan, SpanWriter, span_writer
from ..path.stages import CROSS_CLOCK_GAPS, Outcome, Stage
from ..path.stamps import MISSING, SkewTracker, Stamps, timeline
from ..version import __version__

log = logging.getLogger(__name__)

SYSTEM = "rocketmq"
# Consumer-side gaps drawn as child spans of `process`, with the stage pair bounding each.
_GAP_SPANS: tuple[tuple[str, Stage, Stage], ...] = (
    ("broker_wait", Stage.BROKER_STORE, Stage.CLIENT_PULL),
    ("client_buffer", Stage.CLIENT_PULL, Stage.DISPATCH_ENQUEUE),
    ("dispatch_wait", Stage.DISPATCH_ENQUEUE, Stage.HANDLER_START),
)
_STAMP_ATTRS: tuple[tuple[int, str], ...] = tuple((int(s), f"rmqtrace.stamp.{s.name.lower()}_ns") for s in Stage)
BODY_ATTR = "rmqtrace.message.body"
# Message fields become span attributes and names: a hostile message must not make a span huge
# (queued spans would hold it, and an export batch could outgrow what a backend takes).
MAX_ATTR_CHARS = 256
MAX_KEYS = 32


class MessageTracer:
    """Turns stamps into spans and histograms for one consumer group (or one producer).

    ``tracer_provider=None`` uses the global provider (so ``opentelemetry-instrument`` and any
    SDK setup the application did apply); ``metrics=None`` records no histograms.

    Message bodies are never recorded unless ``capture_body`` > 0: then the first ``capture_body``
    bytes of a body passed to :meth:`start_message` go on the ``process`` span as
    ``rmqtrace.message.body`` (UTF-8, undecodable bytes replaced).
    """

    def __init__(
        self,
        *,
        consumer_group: str = "",
        tracer_provider: TracerProvider | None = None,
        metrics: TracerMetrics | None = None,
        clock: Clock | None = None,
        worker_attr: bool = True,
        listeners: Sequence[Callable[[MessageTrace, Outcome], None]] = (),
        capture_body: int = 0,
        occupancy: Occupancy | None = None,
    ) -> None:
        self.consumer_group = consumer_group
        # Fed from the stamps: client_pull = received, handler start/end = a worker busy.
        self.occupancy = occupancy
        self.capture_body = max(0, int(capture_body))
        self.clock: Clock = clock or default_clock()
        self.metrics = metrics
        self.meters: MessagingMeters = GLOBAL_METERS  # OTel metrics: the global MeterProvider's
        self._provider = tracer_provider
        self.tracer = trace.get_tracer("rmqtrace", __version__, tracer_provider=tracer_provider)
        self._writer: SpanWriter | None = None
        self._writer_resolved = False
        self.skew = SkewTracker()
        self.errors = PropagationErrors(metrics.count_propagation_error if metrics else None)
        self.worker_attr = worker_attr
        # Called after every finished message, e.g. by the demo to collect its stamps.
        self.listeners: list[Callable[[MessageTrace, Outcome], None]] = list(listeners)
        self._hook_failures: set[str] = set()
        self._hook_lock = threading.Lock()

    # -- producer side -------------------------------------------------------------------
    def start_send(self, topic: str, set_property: Callable[[str, str], object], *,
                   tag: str | None = None, keys: Sequence[str] = (), message_group: str | None = None,
                   job_id: str | None = None, cost: float | None = None,
                   body_size: int | None = None) -> SendTrace:
        """Open the ``send {topic}`` span and write trace context + produce stamp into the message."""
        topic = _cap(topic)
        span = self.tracer.start_span(f"send {topic}", kind=SpanKind.PRODUCER)
        if span.is_recording():
            attrs: dict[str, Any] = {
                "messaging.system": SYSTEM,
                "messaging.operation.name": "send",
                "messaging.operation.type": "send",
                "messaging.destination.name": topic,
            }
            _message_attrs(attrs, tag, keys, message_group, body_size)
            if job_id:
                attrs["rmqtrace.job.id"] = job_id
            span.set_attributes(attrs)
        produce_ns = self.clock.now_ns()
        try:
            inject(set_property, produce_ns, trace.set_span_in_context(span), job_id=job_id, cost=cost)
        except Exception as exc:  # noqa: BLE001 - a read-only message must not fail the send
            self.errors.count("inject_failed", repr(exc))
        return SendTrace(span, produce_ns, self, topic)

    # -- consumer side -------------------------------------------------------------------
    def start_message(self, info: MessageInfo, pulled_ns: int | None = None,
                      body: bytes | bytearray | str | None = None) -> MessageTrace:
        """A trace for one received message, stamped with produce, broker store and client pull.

        ``body`` is read only when ``capture_body`` is on. Timestamps that cannot be real (before
        2000, over a day ahead) are ignored and counted as ``timestamp_out_of_range``.
        """
        now = self.clock.now_ns()
        carried = extract(info.properties, self.errors, now, info.system_trace_context)
        t = MessageTrace(self, info, carried)
        times = t.stamps.times
        times[Stage.PRODUCE] = carried.produce_ns
        if info.store_ms:
            store_ns = info.store_ms * 1_000_000
            if plausible_ns(store_ns, now):
                times[Stage.BROKER_STORE] = store_ns
            else:
                self.errors.count("timestamp_out_of_range", f"store_ms={info.store_ms}")
        if pulled_ns and not plausible_ns(pulled_ns, now):
            self.errors.count("timestamp_out_of_range", f"pulled_ns={pulled_ns}")
            pulled_ns = None
        times[Stage.CLIENT_PULL] = pulled_ns if pulled_ns else now
        if self.occupancy is not None:
            self.occupancy.received(times[Stage.CLIENT_PULL])
        if self.capture_body and isinstance(body, (bytes, bytearray, str)):
            t.body = body
        return t

    def writer(self) -> SpanWriter | None:
        """The span writer for the SDK provider, resolved on first use (the global provider may
        be installed after this tracer was built, e.g. by ``opentelemetry-instrument``)."""
        if self._writer_resolved:
            return self._writer
        provider = self._provider or trace.get_tracer_provider()
        self._writer = span_writer(provider.get_tracer("rmqtrace", __version__))
        self._writer_resolved = not isinstance(provider, trace.ProxyTracerProvider)
        return self._writer

    def hook_failed(self, where: str, exc: BaseException) -> None:
        """Log a failure of our own code once per place; the user's message flow goes on."""
        with self._hook_lock:
            first = where not in self._hook_failures
            self._hook_failures.add(where)
        if first:
            log.error("rmqtrace: %s failed; tracing for it is skipped (logged once)", where, exc_info=exc)


class SendTrace:
    """The live ``send {topic}`` span; end it with the receipt or the exception."""

    __slots__ = ("span", "produce_ns", "_tracer", "_topic")

    def __init__(self, span: Span, produce_ns: int, tracer: MessageTracer | None = None, topic: str = "") -> None:
        self.span = span
        self.produce_ns = produce_ns
        self._tracer = tracer
        self._topic = topic

    def end(self, message_id: str | None = None, error: BaseException | None = None) -> None:
        span = self.span
        if span.is_recording():
            if message_id:
                span.set_attribute("messaging.message.id", str(message_id))
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
                span.set_attribute("error.type", type(error).__qualname__)
        span.end()
        if self._tracer is not None:
            self._tracer.meters.sent(self._topic, self._tracer.clock.now_ns() - self.produce_ns, error)


class MessageTrace:
    """Stamps of one received message and, while its handler runs, its live handler span."""

    __slots__ = ("_tracer", "info", "carried", "stamps", "worker", "body", "_ctx", "_handler", "_token", "_done",
                 "_scope_start")

    def __init__(self, tracer: MessageTracer, info: MessageInfo, carried: Carried) -> None:
        self._tracer = tracer
        self.info = info
        self.carried = carried
        self.stamps = Stamps()
        self.worker: int | None = None
        self.body: bytes | bytearray | str | None = None  # set only when body capture is on
        self._ctx: SpanContext | None = None  # the process span's, once sampled
        self._handler: Span | None = None
        self._token: object | None = None
        self._done = False
        self._scope_start: int | None = None

    def mark(self, stage: Stage, ns: int | None = None) -> None:
        self.stamps.times[stage] = ns if ns else self._tracer.clock.now_ns()

    @property
    def trace_id(self) -> int:
        return self._ctx.trace_id if self._ctx is not None else 0

    def handler_scope(self, start_ns: int | None = None) -> MessageTrace:
        """``with trace.handler_scope():`` stamps handler start/end; the handler span is current inside.

        ``start_ns`` dates the handler start back, for seams that learn of the handler only at
        its end (an ack with no scope around the handler)."""
        self._scope_start = start_ns
        return self

    def __enter__(self) -> Span | None:
        self._begin_handler()
        return self._handler

    def __exit__(self, *exc: object) -> None:
        self._end_handler()

    def _begin_handler(self) -> None:
        times = self.stamps.times
        times[Stage.HANDLER_START] = self._scope_start or self._tracer.clock.now_ns()
        if times[Stage.DISPATCH_ENQUEUE] == MISSING:
            # No dispatcher stamped it: the client's own pool dispatched from its cache.
            times[Stage.DISPATCH_ENQUEUE] = times[Stage.CLIENT_PULL]
        if self._tracer.occupancy is not None:
            self._tracer.occupancy.started(times[Stage.CLIENT_PULL])
        writer = self._tracer.writer()
        if writer is None:
            return
        try:
            ctx = writer.root_context(self.carried.parent, f"process {_cap(self.info.topic)}", SpanKind.CONSUMER)
            if ctx is None:
                return
            self._ctx = ctx
            handler = DeferredSpan(writer, "handler", writer.child_context(ctx), ctx, times[Stage.HANDLER_START])
            self._handler = handler
            self._token = otel_context.attach(trace.set_span_in_context(handler))
        except Exception as exc:  # noqa: BLE001
            self._tracer.hook_failed("starting the handler span", exc)

    def _end_handler(self) -> None:
        self.stamps.times[Stage.HANDLER_END] = self._tracer.clock.now_ns()
        if self._tracer.occupancy is not None:
            self._tracer.occupancy.ended()
        if self._token is not None:
            try:
                otel_context.detach(self._token)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001
                self._tracer.hook_failed("detaching the handler context", exc)
            self._token = None

    def finish(self, outcome: Outcome, error: BaseException | None = None) -> None:
        """Write spans, observe every gap, count the outcome. Idempotent; never raises."""
        if self._done:
            return
        self._done = True
        occupancy = self._tracer.occupancy
        if occupancy is not None and self.stamps.times[Stage.HANDLER_START] == MISSING:
            occupancy.discarded(self.stamps.times[Stage.CLIENT_PULL])
        try:
            self._finish(outcome, error)
        except Exception as exc:  # noqa: BLE001
            self._tracer.hook_failed("finishing a message trace", exc)

    def _finish(self, outcome: Outcome, error: BaseException | None) -> None:
        mt = self._tracer
        times = self.stamps.times
        metrics = mt.metrics
        ctx = self._ctx
        if metrics is not None:
            exemplar = {"trace_id": f"{ctx.trace_id:032x}"} if ctx is not None and ctx.trace_flags.sampled else None
            metrics.observe(self.info.topic, mt.consumer_group, times, outcome, exemplar)
        mt.meters.finished(self.info.topic, mt.consumer_group, times, outcome, error)
        for gap in CROSS_CLOCK_GAPS:
            a, b = times[gap.start], times[gap.end]
            if a == MISSING or b == MISSING:
                continue
            raw = b - a
            if mt.skew.observe(gap.peer, raw) and metrics is not None:
                metrics.skew_bound.labels(gap.peer).set(raw / 1e9)
            if -raw > gap.tolerance_ns and metrics is not None:
                metrics.clamped(gap.name)
        if ctx is not None:
            self._write_spans(ctx, outcome, error)
        for listener in mt.listeners:
            try:
                listener(self, outcome)
            except Exception as exc:  # noqa: BLE001
                mt.hook_failed("a finish listener", exc)

    def _write_spans(self, ctx: SpanContext, outcome: Outcome, error: BaseException | None) -> None:
        writer = self._tracer.writer()
        assert writer is not None
        fixed = dict(timeline(self.stamps))
        end_ns = fixed.get(Stage.HANDLER_END) or self._tracer.clock.now_ns()
        handler = self._handler
        if handler is not None:
            if error is not None:
                handler.record_exception(error)
                handler.set_status(Status(StatusCode.ERROR, type(error).__name__))
            handler.end(end_time=end_ns)
        for name, a, b in _GAP_SPANS:
            if a in fixed and b in fixed:
                writer.emit(name, writer.child_context(ctx), ctx, fixed[a], fixed[b], attributes={"rmqtrace.stage": name})
        status = None
        attrs = self._process_attributes(outcome)
        if outcome is not Outcome.SUCCESS:
            status = Status(StatusCode.ERROR, outcome.value)
            if error is not None:
                attrs["error.type"] = type(error).__qualname__
        parent_sc = self.carried.parent
        start_ns = next((ns for st, ns in fixed.items() if st >= Stage.BROKER_STORE), end_ns)
        writer.emit(f"process {_cap(self.info.topic)}", ctx, parent_sc if parent_sc and parent_sc.is_valid else None,
                    start_ns, end_ns, kind=SpanKind.CONSUMER, attributes=attrs, status=status)

    def _process_attributes(self, outcome: Outcome) -> dict[str, Any]:
        info = self.info
        times = self.stamps.times
        attrs: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": _cap(info.topic),
            "rmqtrace.outcome": outcome.value,
        }
        if self._tracer.consumer_group:
            attrs["messaging.consumer.group.name"] = self._tracer.consumer_group
        if info.message_id:
            attrs["messaging.message.id"] = _cap(info.message_id)
        if info.delivery_attempt and info.delivery_attempt < 2**31:  # the broker's is an int32
            attrs["messaging.rocketmq.message.delivery_attempt"] = info.delivery_attempt
        _message_attrs(attrs, info.tag, info.keys, info.message_group, info.body_size)
        if self.carried.job_id:
            attrs["rmqtrace.job.id"] = self.carried.job_id
        if self.carried.cost is not None:
            attrs["rmqtrace.cost"] = self.carried.cost
        if self.worker is not None and self._tracer.worker_attr:
            attrs["rmqtrace.worker"] = self.worker
        for i, name in _STAMP_ATTRS:
            if times[i] != MISSING:
                attrs[name] = times[i]
        if self.body is not None:
            attrs[BODY_ATTR] = body_preview(self.body, self._tracer.capture_body)
        return attrs


def _cap(value: str) -> str:
    return value if len(value) <= MAX_ATTR_CHARS else value[:MAX_ATTR_CHARS]


def body_preview(body: bytes | bytearray | str, limit: int) -> str:
    """The first ``limit`` bytes of a body as text: valid UTF-8 whatever the bytes were."""
    raw = body[:limit].encode("utf-8", "replace") if isinstance(body, str) else bytes(body[:limit])
    return raw[:limit].decode("utf-8", "replace")


def _message_attrs(attrs: dict[str, Any], tag: str | None, keys: Sequence[str],
                   group: str | None, body_size: int | None) -> None:
    if tag:
        attrs["messaging.rocketmq.message.tag"] = _cap(tag)
    if keys:
        attrs["messaging.rocketmq.message.keys"] = [_cap(k) for k in keys[:MAX_KEYS]]
    if group:
        attrs["messaging.rocketmq.message.group"] = _cap(group)
        attrs["messaging.rocketmq.message.type"] = "fifo"
    if body_size is not None:
        attrs["messaging.message.body.size"] = body_size

