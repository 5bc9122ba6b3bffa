"""The message path: stamps in, spans and histograms out.

``MessageTracer`` is configured once per process (or per consumer); it hands out a
``MessageTrace`` for every received message and a ``SendTrace`` for every send. A message trace
collects the six stamps as the message moves, and on :meth:`MessageTrace.finish` turns them
into spans and one histogram observation per gap. The tree (docs/semconv.md)::

    send {topic}            PRODUCER  producer: the send call
    └─ process {topic}      CONSUMER  broker_store ────────────────────── handler_end
       ├─ broker_wait                 broker_store ─ client_pull
       ├─ client_buffer               client_pull ─ dispatch_enqueue
       ├─ dispatch_wait               dispatch_enqueue ─ handler_start
       └─ handler                     handler_start ─ handler_end
          └─ the user's spans

``process`` also links to the creation (send) context. It starts at the broker's store time (the
pull when there is none), so every child lies inside it and no span of ours starts before its
parent (Jaeger's clock-skew check); ``messaging.process.duration`` is still measured from the pull,
the consumer's processing time (docs/semconv.md tables the difference).

Two spans are live while the message is handled — ``process`` and ``handler``, so that spans the
user's handler starts nest under it; the gap spans are written after the fact with explicit start
and end times. Unsampled messages cost the stamps, the histograms and one sampling decision; the
message's context stays current in the handler (as a non-recording span), so the user's spans
follow the same decision instead of starting traces of their own.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TracerProvider

from ..path import names as n
from ..path.clock import Clock, default_clock
from ..path.message import ClientFacts, MessageInfo, message_type
from ..path.propagation import Carried, PropagationErrors, extract, inject, plausible_ns, resolve_parent
from ..path.stages import CROSS_CLOCK_GAPS, Outcome, Stage
from ..path.stamps import MISSING, SkewTracker, Stamps, causal, store_stamp, timeline
from ..version import __version__
from .adopt import keep_for
from .hold import HoldingSpanProcessor
from .keep import PENDING, KeepPolicy
from .metrics import TracerMetrics
from .occupancy import Occupancy
from .otel_metrics import GLOBAL_METERS, MessagingMeters
from .spans import DeferredSpan, SpanWriter, span_writer

__all__ = ["BODY_ATTR", "MAX_ATTR_CHARS", "MAX_KEYS", "MessageTrace", "MessageTracer", "SendTrace", "body_preview"]

log = logging.getLogger(__name__)

# The gap spans under `process`: (name, first stage, last stage, attributes), from names.GAP_SPANS.
_GAP_SPANS: tuple[tuple[str, Stage, Stage, dict[str, Any]], ...] = tuple(
    (g.name, g.start, g.end, {n.STAGE: g.name}) for g in n.GAP_SPANS)
_STAMP_ATTRS: tuple[tuple[int, str], ...] = tuple((int(s), key) for s, key in n.STAMP_ATTRS.items())
BODY_ATTR = n.BODY
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
    ``rmqtrace.message.body`` (UTF-8, undecodable bytes replaced). ``messaging.message.body.size``
    is opt-in in the conventions: recorded only with ``record_body_size=True``.

    ``client_id`` (``messaging.client.id``), ``namespace`` (``messaging.rocketmq.namespace``) and
    ``server_address``/``server_port`` describe the client this tracer serves; a received
    message's own namespace and endpoint win over them.
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
        client_id: str | None = None,
        namespace: str | None = None,
        server_address: str | None = None,
        server_port: int | None = None,
        record_body_size: bool = False,
        keep: KeepPolicy | None = None,
        hold: HoldingSpanProcessor | None = None,
    ) -> None:
        # No keep=/hold=: RMQTRACE_KEEP_* decides, for the provider we write into (the one
        # configure_tracing built, or one opentelemetry-instrument set up: see telemetry.adopt).
        self._keep_from_env = keep is None and hold is None
        if self._keep_from_env:
            provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
            if not isinstance(provider, trace.ProxyTracerProvider):  # else once the real one is set
                self._keep_from_env = False
                found = keep_for(provider)
                if found is not None:
                    keep, hold = found
        if keep is not None and hold is None:
            raise ValueError("keep= needs hold=, the HoldingSpanProcessor on the tracer provider: without it "
                             "the handler's spans of dropped messages would still be exported")
        # Head-dropped messages get a held trace of their own, kept or dropped at finish (keep.py).
        self.keep = keep
        self.hold = hold
        if keep is not None and hold is not None:
            hold.attach(keep)  # settled by time and at the provider's force_flush/shutdown
        if server_port is not None and not (isinstance(server_port, int) and 0 < server_port < 65536):
            raise ValueError(f"server_port must be a TCP port (1..65535), not {server_port!r}")
        self.consumer_group = consumer_group
        self.client_id = client_id
        self.namespace = namespace
        self.record_body_size = bool(record_body_size)
        self._server: dict[str, Any] = {}
        if server_address:
            self._server[n.SERVER_ADDRESS] = server_address
            if server_port is not None:
                self._server[n.SERVER_PORT] = server_port
        # Fed from the stamps: client_pull = received, handler start/end = a worker busy.
        self.occupancy = occupancy
        self.capture_body = max(0, int(capture_body))
        self.clock: Clock = clock or default_clock()
        self.metrics = metrics
        self.meters: MessagingMeters = GLOBAL_METERS  # OTel metrics: the global MeterProvider's
        self._provider = tracer_provider
        self.tracer = trace.get_tracer("rmqtrace", __version__, tracer_provider=tracer_provider,
                                       schema_url=n.SCHEMA_URL)
        self._writer: SpanWriter | None = None
        self._writer_resolved = False
        # A provider that records but is not the OpenTelemetry SDK (a vendor's): we write no
        # consumer spans into it, but the message's context is made current for the user's spans.
        self.foreign_provider = False
        self.skew = SkewTracker()
        self.errors = PropagationErrors(metrics.count_propagation_error if metrics else None)
        self.worker_attr = worker_attr
        # Called after every finished message, e.g. by the demo to collect its stamps.
        self.listeners: list[Callable[[MessageTrace, Outcome], None]] = list(listeners)
        self._hook_failures: set[str] = set()
        self._hook_lock = threading.Lock()
        # Orders a handler's end (worker thread) against a watchdog's finish (another thread).
        self._end_lock = threading.Lock()

    def describe_client(self, facts: ClientFacts) -> None:
        """Fill what was not given at construction from a client's own facts (the wrappers call
        this with :func:`tracer.path.message.client_facts` of the client they wrap)."""
        if self.client_id is None and facts.client_id:
            self.client_id = facts.client_id
        if self.namespace is None and facts.namespace is not None:
            self.namespace = facts.namespace
        if not self._server and facts.server_address:
            server: dict[str, Any] = {n.SERVER_ADDRESS: facts.server_address}
            if facts.server_port is not None:
                server[n.SERVER_PORT] = facts.server_port
            self._server = server

    # -- producer side -------------------------------------------------------------------
    def start_send(self, topic: str, set_property: Callable[[str, str], object], *,
                   tag: str | None = None, keys: Sequence[str] = (), message_group: str | None = None,
                   job_id: str | None = None, cost: float | None = None,
                   body_size: int | None = None, delivery_ms: int | None = None) -> SendTrace:
        """Open the ``send {topic}`` span and write trace context + produce stamp into the message.

        Every attribute is known before the send, so all go to ``start_span``: the sampler sees
        them, as the conventions ask for the sampling-relevant ones."""
        topic = _cap(topic)
        attrs: dict[str, Any] = {
            n.SYSTEM: n.SYSTEM_VALUE,
            n.OPERATION_NAME: n.SEND,
            n.OPERATION_TYPE: n.SEND,
            n.DESTINATION: topic,
            **self._server,
        }
        self._client_attrs(attrs, self.namespace)
        _message_attrs(attrs, tag, keys, message_group, body_size if self.record_body_size else None)
        attrs[n.MESSAGE_TYPE] = message_type(None, message_group, delivery_ms)
        if delivery_ms:
            attrs[n.DELIVERY_TIMESTAMP] = delivery_ms
        if job_id:
            attrs[n.JOB_ID] = job_id
        # One clock for the send span and the produce stamp: the consumer's spans are drawn from
        # the stamps, and broker_wait (a child of send) must not start before it.
        produce_ns = self.clock.now_ns()
        span = self.tracer.start_span(n.send_span_name(topic), kind=SpanKind.PRODUCER, attributes=attrs,
                                      start_time=produce_ns)
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
        # The traceparent is parsed only if a span is written or the context made current
        # (MessageTrace.carried): a message only measured costs no parse (BENCHMARKS.md).
        carried = extract(info.properties, self.errors, now, info.system_trace_context, defer_parent=True)
        t = MessageTrace(self, info, carried)
        times = t.stamps.times
        times[Stage.PRODUCE] = carried.produce_ns
        if pulled_ns and not plausible_ns(pulled_ns, now):
            self.errors.count("timestamp_out_of_range", f"pulled_ns={pulled_ns}")
            pulled_ns = None
        pulled = times[Stage.CLIENT_PULL] = pulled_ns if pulled_ns else now
        if info.store_ms:
            if plausible_ns(info.store_ms * 1_000_000, now):
                # millisecond resolution: placed within its millisecond (tracer.path.stamps)
                times[Stage.BROKER_STORE] = store_stamp(info.store_ms, times[Stage.PRODUCE], pulled)
            else:
                self.errors.count("timestamp_out_of_range", f"store_ms={info.store_ms}")
        if self.occupancy is not None:
            self.occupancy.received(times[Stage.CLIENT_PULL])
        if self.capture_body and isinstance(body, (bytes, bytearray, str)):
            t.body = body
        return t

    def _client_attrs(self, attrs: dict[str, Any], namespace: str | None) -> None:
        if namespace is not None:
            attrs[n.NAMESPACE] = _cap(namespace)
        if self.client_id:
            attrs[n.CLIENT_ID] = self.client_id

    def process_sampling_attributes(self, info: MessageInfo) -> dict[str, Any]:
        """What the sampler sees when it decides a ``process`` span (the spec's sampling-relevant set)."""
        attrs: dict[str, Any] = {
            n.SYSTEM: n.SYSTEM_VALUE,
            n.OPERATION_NAME: n.PROCESS,
            n.OPERATION_TYPE: n.PROCESS,
            n.DESTINATION: _cap(info.topic),
        }
        if self.consumer_group:
            attrs[n.CONSUMER_GROUP] = self.consumer_group
        if info.server_address:
            attrs[n.SERVER_ADDRESS] = _cap(info.server_address)
            if info.server_port:
                attrs[n.SERVER_PORT] = info.server_port
        elif self._server:
            attrs.update(self._server)
        return attrs

    def writer(self) -> SpanWriter | None:
        """The span writer for the SDK provider, resolved on first use (the global provider may
        be installed after this tracer was built, e.g. by ``opentelemetry-instrument``)."""
        if self._writer_resolved:
            return self._writer
        provider = self._provider or trace.get_tracer_provider()
        self._writer = span_writer(provider.get_tracer("rmqtrace", __version__))
        self._writer_resolved = not isinstance(provider, trace.ProxyTracerProvider)
        if self._writer_resolved and self._keep_from_env:
            self._keep_from_env = False
            try:
                found = keep_for(provider)
            except ValueError as exc:  # a bad RMQTRACE_KEEP_* found this late: say it, trace on
                self.hook_failed("reading RMQTRACE_KEEP_*", exc)
                found = None
            if found is not None:
                self.keep, self.hold = found
                found[1].attach(found[0])
        self.foreign_provider = self._writer is None and not isinstance(
            provider, (trace.NoOpTracerProvider, trace.ProxyTracerProvider))
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
                span.set_attribute(n.MESSAGE_ID, str(message_id))
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
                span.set_attribute(n.ERROR_TYPE, type(error).__qualname__)
        mt = self._tracer
        if mt is None:
            span.end()
            return
        now = mt.clock.now_ns()
        span.end(end_time=now)
        mt.meters.sent(self._topic, now - self.produce_ns, error)


class MessageTrace:
    """Stamps of one received message and, while its handler runs, its live handler span."""

    __slots__ = ("_tracer", "info", "_carried", "_parent", "_parsed", "stamps", "worker", "body", "_ctx", "_process",
                 "_handler", "_token", "_done", "_scope_start", "_held", "_head_held", "_overrun", "_late_end",
                 "_open_handler")

    def __init__(self, tracer: MessageTracer, info: MessageInfo, carried: Carried) -> None:
        self._tracer = tracer
        self.info = info
        self._carried = carried
        # the producer's context once parsed (see `carried`); the hot path reads only this
        self._parent: SpanContext | None = None
        self._parsed = False
        self.stamps = Stamps()
        self.worker: int | None = None
        self.body: bytes | bytearray | str | None = None  # set only when body capture is on
        self._ctx: SpanContext | None = None  # the process span's, once sampled
        self._process: DeferredSpan | None = None
        self._handler: DeferredSpan | None = None
        self._token: object | None = None
        self._done = False
        self._scope_start: int | None = None
        self._held = False  # a keep policy's trace, undecided until finish
        # a head-sampled trace held too (kept at finish): a message never finished must not leave
        # its handler's spans exported without ours; the hold's age limit drops them then
        self._head_held = False
        # Finished (a watchdog's timeout) while the handler still ran: handler_end was stamped at the
        # finish; the handler span ends when the handler really returns, at _late_end.
        self._overrun = False
        self._late_end = 0
        self._open_handler: DeferredSpan | None = None  # written, waiting for the late handler end

    @property
    def carried(self) -> Carried:
        """What the producer carried, the traceparent parsed (on first read; bad values counted then)."""
        carried = self._carried
        if carried.traceparent is not None:
            carried = self._carried = Carried(self._producer_context(), carried.produce_ns, carried.job_id,
                                              carried.cost, carried.context)
        return carried

    def _producer_context(self) -> SpanContext | None:
        """The producer's span context, parsed on the first call (a bad one counted then, once)."""
        if not self._parsed:
            self._parent = resolve_parent(self._carried, self._tracer.errors)
            self._parsed = True
        return self._parent

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
            if self._tracer.foreign_provider:
                # the user's spans, recorded by another SDK, join the producer's trace
                found = self._producer_context()
                if self._carried.context is not None:
                    self._token = otel_context.attach(self._carried.context)
                elif found is not None:
                    self._token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(found)))
            return
        try:
            # process starts at the broker's store (else the pull): broker_wait is its first child
            self._token = otel_context.attach(self._open_spans(
                writer, min(times[Stage.BROKER_STORE] or times[Stage.CLIENT_PULL], times[Stage.CLIENT_PULL]),
                times[Stage.HANDLER_START]))
        except Exception as exc:  # noqa: BLE001
            self._tracer.hook_failed("starting the handler span", exc)

    def _open_spans(self, writer: SpanWriter, pulled_ns: int, start_ns: int) -> otel_context.Context:
        """Decide sampling, open ``process`` and ``handler``; the context to make current."""
        parent = self._producer_context()
        if parent is not None and not parent.is_valid:
            parent = None
        base = self._carried.context  # the extracted context (baggage), when there is more than `parent`
        name = n.process_span_name(_cap(self.info.topic))
        links = (Link(parent),) if parent is not None else ()  # the creation context, as the spec asks
        attrs = self._tracer.process_sampling_attributes(self.info)
        ctx, start_attrs = writer.decide(parent, base, name, SpanKind.CONSUMER, attrs, links)
        if start_attrs is None and self._tracer.keep is not None:
            # Dropped by the head, judged at finish: a new trace linked to the producer's (a
            # child of the unrecorded send span would be an orphan; see tracer.telemetry.keep).
            assert self._tracer.hold is not None
            ctx, parent, start_attrs, self._held = self._tracer.hold.open_trace(writer.tracer.id_generator), None, attrs, True
        elif start_attrs is not None and self._tracer.hold is not None and self._tracer.keep is not None:
            self._tracer.hold.hold(ctx.trace_id)
            self._head_held = True
        current = base if base is not None else otel_context.get_current()  # read once, used twice
        if start_attrs is None:
            # Dropped: the message's context stays current so the handler's spans share the
            # decision instead of starting root traces of their own (as contrib does).
            return trace.set_span_in_context(NonRecordingSpan(ctx), current)
        self._ctx = ctx
        process = DeferredSpan(writer, name, ctx, parent, pulled_ns, kind=SpanKind.CONSUMER,
                               attributes=start_attrs, links=links)
        writer.started(process, base)
        self._process = process
        handler = DeferredSpan(writer, n.HANDLER_SPAN, writer.child_context(ctx), ctx, start_ns)
        writer.started(handler, trace.set_span_in_context(process, current))
        self._handler = handler
        return trace.set_span_in_context(handler, current)

    def _end_handler(self) -> None:
        now = self._tracer.clock.now_ns()
        handler: DeferredSpan | None = None
        with self._tracer._end_lock:
            late = self._overrun  # finished already: the stamps are the finish's, the span waits for us
            if late:
                self._late_end = now
                handler, self._open_handler = self._open_handler, None
            else:
                self.stamps.times[Stage.HANDLER_END] = now
        if late and handler is not None:
            try:
                handler.end(end_time=now)  # joins its trace, kept at the finish
            except Exception as exc:  # noqa: BLE001
                self._tracer.hook_failed("ending a late handler span", exc)
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
        times = self.stamps.times
        occupancy = self._tracer.occupancy
        if occupancy is not None and times[Stage.HANDLER_START] == MISSING:
            occupancy.discarded(times[Stage.CLIENT_PULL])
        if times[Stage.HANDLER_START] != MISSING and times[Stage.HANDLER_END] == MISSING:
            # A watchdog reports a timeout while the handler still runs: it ran at least until
            # now, so the message is measured (handler, end_to_end, process duration) and judged.
            now = self._tracer.clock.now_ns()
            with self._tracer._end_lock:
                if times[Stage.HANDLER_END] == MISSING:
                    times[Stage.HANDLER_END] = now
                    self._overrun = True
        try:
            self._finish(outcome, error)
        except Exception as exc:  # noqa: BLE001
            self._tracer.hook_failed("finishing a message trace", exc)

    def _finish(self, outcome: Outcome, error: BaseException | None) -> None:
        mt = self._tracer
        times = self.stamps.times
        metrics = mt.metrics
        ctx = self._ctx
        if mt.keep is not None:
            ctx = self._decide(mt.keep, outcome, error)  # None: not kept (yet); no exemplar, no spans
        if metrics is not None:
            exemplar = {"trace_id": f"{ctx.trace_id:032x}"} if ctx is not None and ctx.trace_flags.sampled else None
        consistent = causal(times)  # the parts fit the whole (tracer.path.stamps); skew is read raw below
        if metrics is not None:
            metrics.observe(self.info.topic, mt.consumer_group, consistent, outcome, exemplar)
        mt.meters.finished(self.info.topic, mt.consumer_group, consistent, outcome, error)
        for gap in CROSS_CLOCK_GAPS:
            a, b = times[gap.start], times[gap.end]
            if a == MISSING or b == MISSING:
                continue
            raw = b - a
            if mt.skew.observe(gap.peer, raw) and metrics is not None:
                metrics.skew_bound.labels(gap.peer).set(raw / 1e9)
            if -raw > gap.tolerance_ns and metrics is not None:
                metrics.clamped(gap.name)
        if ctx is not None and self._process is not None:
            self._write_spans(ctx, self._process, outcome, error)
        for listener in mt.listeners:
            try:
                listener(self, outcome)
            except Exception as exc:  # noqa: BLE001
                mt.hook_failed("a finish listener", exc)

    def _decide(self, keep: KeepPolicy, outcome: Outcome, error: BaseException | None) -> SpanContext | None:
        ctx, hold = self._ctx, self._tracer.hold
        settle = None
        if self._held and self._carried.job_id:
            def settle(kept: bool) -> None:
                self._settle(kept, outcome, error)
        try:
            reason = keep.decide(self.stamps.times, outcome, self._carried.job_id,
                                 head=ctx is not None and not self._held, settle=settle)
        except Exception as exc:  # noqa: BLE001 - a broken policy must not cost the histograms
            self._tracer.hook_failed("the keep decision", exc)
            reason = "failure"  # err on keeping
        if self._head_held and ctx is not None and hold is not None:
            hold.release(ctx.trace_id, True)
            return ctx
        if not self._held or ctx is None or hold is None:
            return ctx
        if reason is PENDING:
            return None
        hold.release(ctx.trace_id, reason is not None)
        return ctx if reason is not None else None

    def _settle(self, kept: bool, outcome: Outcome, error: BaseException | None) -> None:
        """The policy's later word on a job's latest finisher (called from another message's finish)."""
        ctx, hold = self._ctx, self._tracer.hold
        if ctx is None or hold is None:
            return
        hold.release(ctx.trace_id, kept)
        if kept and self._process is not None:
            try:
                self._write_spans(ctx, self._process, outcome, error)
            except Exception as exc:  # noqa: BLE001
                self._tracer.hook_failed("writing a kept trace", exc)

    def _write_spans(self, ctx: SpanContext, process: DeferredSpan, outcome: Outcome,
                     error: BaseException | None) -> None:
        writer = self._tracer.writer()
        assert writer is not None
        fixed = dict(timeline(self.stamps))
        end_ns = fixed.get(Stage.HANDLER_END) or self._tracer.clock.now_ns()
        error_type = type(error).__qualname__ if error is not None else None
        handler = self._handler
        if handler is not None:
            if error is not None:
                handler.record_exception(error)
                handler.set_status(Status(StatusCode.ERROR, type(error).__name__))
                handler.put_attributes({n.ERROR_TYPE: error_type})
            with self._tracer._end_lock:
                still_running = self._overrun and not self._late_end
                if still_running:
                    self._open_handler = handler  # _end_handler ends it when the handler returns
            if not still_running:
                handler.end(end_time=self._late_end or end_ns)
        for name, a, b, gap_attrs in _GAP_SPANS:
            if a in fixed and b in fixed:
                writer.emit(name, writer.child_context(ctx), ctx, fixed[a], fixed[b], attributes=gap_attrs)
        process.put_attributes(self._process_attributes(outcome))
        if outcome is not Outcome.SUCCESS:
            process.set_status(Status(StatusCode.ERROR, outcome.value))
            # the exception's class; without one (a failure result, a timeout) the outcome
            process.put_attributes({n.ERROR_TYPE: error_type or outcome.value})
        start = fixed.get(Stage.BROKER_STORE) or fixed.get(Stage.CLIENT_PULL)
        if start is not None:
            process.move_start(start)  # the causal timeline's: every child inside, none before it
        process.end(end_time=end_ns)

    def _process_attributes(self, outcome: Outcome) -> dict[str, Any]:
        """The ``process`` attributes not given to the sampler at its start."""
        info = self.info
        mt = self._tracer
        times = self.stamps.times
        attrs: dict[str, Any] = {n.OUTCOME: outcome.value}
        mt._client_attrs(attrs, info.namespace if info.namespace is not None else mt.namespace)
        if info.message_id:
            attrs[n.MESSAGE_ID] = _cap(info.message_id)
        if info.delivery_attempt and info.delivery_attempt < 2**31:  # the broker's is an int32
            attrs[n.DELIVERY_ATTEMPT] = info.delivery_attempt
        _message_attrs(attrs, info.tag, info.keys, info.message_group,
                       info.body_size if mt.record_body_size else None)
        attrs[n.MESSAGE_TYPE] = message_type(info.declared_type, info.message_group, info.delivery_ms)
        if info.delivery_ms:
            attrs[n.DELIVERY_TIMESTAMP] = info.delivery_ms
        carried = self._carried
        if carried.job_id:
            attrs[n.JOB_ID] = carried.job_id
        if carried.cost is not None:
            attrs[n.COST] = carried.cost
        if self.worker is not None and mt.worker_attr:
            attrs[n.WORKER] = self.worker
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
        attrs[n.MESSAGE_TAG] = _cap(tag)
    if keys:
        attrs[n.MESSAGE_KEYS] = [_cap(k) for k in keys[:MAX_KEYS]]
    if group:
        attrs[n.MESSAGE_GROUP] = _cap(group)
    if body_size is not None:
        attrs[n.BODY_SIZE] = body_size

