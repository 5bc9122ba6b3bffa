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

This module is the message path; what is not lives beside it: the constructor, the environment
and the bookkeeping in :mod:`~tracer.telemetry.tracercore` (``MessageTracer``'s base), a trace's
state, links and keep decision in :mod:`~tracer.telemetry.tracestate` (``MessageTrace``'s), the
send's span in :mod:`~tracer.telemetry.sendtrace`.
"""

from __future__ import annotations

from typing import Any, Callable, Final, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode

from ..callables import unrun
from ..compiled import mypyc_attr
from ..path import names as n
from ..path.clock import Anchor, MonoNs
from ..path.message import MessageInfo
from ..path.propagation import extract, inject, traceparent_sampled
from ..path.stages import CROSS_CLOCK_GAPS, GAPS, Outcome, Stage
from ..path.stamps import MISSING, causal, drawn
from .attributes import BODY_ATTR, MAX_ATTR_CHARS, MAX_KEYS, body_preview, cap, send_attributes
from .sendtrace import SendTrace
from .spans import DeferredSpan, SpanWriter, record_error
from .tracephase import KeepFate, TracePhase
from .tracercore import TracerCore, TracerStats
from .tracestate import PARSE_IF_KEPT as _PARSE_IF_KEPT
from .tracestate import TraceState

__all__ = ["BODY_ATTR", "MAX_ATTR_CHARS", "MAX_KEYS", "MessageTrace", "MessageTracer", "SendTrace", "TracerStats",
           "body_preview"]

# The gap spans under `process`: (name, first stage, last stage, attributes), from names.GAP_SPANS.
_GAP_SPANS: Final[tuple[tuple[str, int, int, dict[str, Any]], ...]] = tuple(
    (g.name, int(g.start), int(g.end), {n.STAGE: g.name}) for g in n.GAP_SPANS)
# The compact trace's gap attributes: (attribute, first stage, last stage).
_GAP_ATTRS: Final[tuple[tuple[str, int, int], ...]] = tuple((n.GAP_ATTRS[g.name], int(g.start), int(g.end)) for g in GAPS)
# Cross-clock gaps, their fields read once: (first stage, last stage, tolerance, name).
_CROSS: Final[tuple[tuple[int, int, int, str], ...]] = tuple(
    (int(g.start), int(g.end), g.tolerance_ns, g.name) for g in CROSS_CLOCK_GAPS)
# Stages, outcomes and kinds as module constants: an Enum member read off its class costs a
# descriptor call (~0.2 µs on CPython 3.11), and the message path reads about twenty of them.
_PRODUCE: Final = int(Stage.PRODUCE)
_STORE: Final = int(Stage.BROKER_STORE)
_PULL: Final = int(Stage.CLIENT_PULL)
_ENQUEUE: Final = int(Stage.DISPATCH_ENQUEUE)
_START: Final = int(Stage.HANDLER_START)
_END: Final = int(Stage.HANDLER_END)
_SUCCESS: Final = Outcome.SUCCESS
_NOT_STARTED: Final = Outcome.NOT_STARTED
_CONSUMER: Final = SpanKind.CONSUMER
_INTERNAL: Final = SpanKind.INTERNAL
_PRODUCER: Final = SpanKind.PRODUCER
_DROP: Final = Decision.DROP
_ERROR: Final = StatusCode.ERROR
_OPEN: Final = TracePhase.OPEN
_FINISHED: Final = TracePhase.FINISHED
_OVERRUN: Final = TracePhase.OVERRUN
_LATE_ENDED: Final = TracePhase.LATE_ENDED
_HEAD: Final = KeepFate.HEAD
_HEAD_HELD: Final = KeepFate.HEAD_HELD
# The context functions as C statics when compiled (tracer.compiled): no module-dict and attribute
# lookups a message.
_attach: Final = otel_context.attach
_detach: Final = otel_context.detach
_get_current: Final = otel_context.get_current


# Compiled (tracer.compiled), still a Python class: the provider's shutdown hook holds a weak reference
@mypyc_attr(native_class=False)
class MessageTracer(TracerCore):
    """Turns stamps into spans and histograms for one consumer group (or one producer).

    ``tracer_provider=None`` uses the global provider (so ``opentelemetry-instrument`` and any
    SDK setup the application did apply); ``metrics=None`` records no histograms.

    Message bodies are never recorded unless ``capture_body`` > 0: then the first ``capture_body``
    bytes of a body passed to :meth:`start_message` go on the ``process`` span as
    ``rmqtrace.message.body`` (UTF-8, undecodable bytes replaced). ``messaging.message.body.size``
    is opt-in in the conventions: recorded only with ``record_body_size=True``.

    ``client`` (a :class:`~tracer.path.message.ClientFacts`: ``messaging.client.id``,
    ``messaging.rocketmq.namespace``, ``server.address``/``server.port``) describes the client this
    tracer serves; a received message's own namespace and endpoint win over it. The loose
    ``client_id=``, ``namespace=``, ``server_address=``, ``server_port=`` keywords it replaced are
    deprecated (a :class:`DeprecationWarning`); they still override the matching field.
    :meth:`statistics` is a frozen snapshot of what happened.

    ``config`` (a :class:`~tracer.telemetry.tracerconfig.TracerConfig`; default: read from the
    environment once, here) carries ``RMQTRACE_TRACE_SHAPE`` and ``RMQTRACE_KEEP_*``;
    ``trace_shape=`` wins over its shape. No ``keep=``/``hold=``: ``RMQTRACE_KEEP_*`` applies to the
    provider written into, at construction or, when the global one is not set yet, on first use.

    ``clock`` gives both timelines (:class:`~tracer.path.clock.Clock`): each message's stamps are
    its wall time at the pull advanced by its monotonic time (one anchor per message).

    Raises:
        TypeError: ``clock`` lacks ``wall_ns()`` or ``monotonic_ns()``.
        ValueError: ``keep``/``hold`` were given another clock than ``clock`` (their timers run
            on the tracer's; one built without a clock takes it); ``keep`` without ``hold``;
            a ``server_port`` that is not a TCP port; an unknown ``trace_shape``.
    """

    # -- producer side -------------------------------------------------------------------
    def start_send(self, topic: str, set_property: Callable[[str, str], object], *,
                   tag: str | None = None, keys: Sequence[str] = (), message_group: str | None = None,
                   job_id: str | None = None, cost: float | None = None,
                   body_size: int | None = None, delivery_ms: int | None = None) -> SendTrace:
        """Open the ``send {topic}`` span and write trace context + produce stamp into the message.

        Every attribute is known before the send, so all go to ``start_span``: the sampler sees
        them, as the conventions ask for the sampling-relevant ones."""
        topic = cap(topic)
        attrs = send_attributes(topic, self.client, self._server, tag=tag, keys=keys, message_group=message_group,
                                job_id=job_id, body_size=body_size if self.record_body_size else None,
                                delivery_ms=delivery_ms)
        # One clock for the send span and the produce stamp: the consumer's spans are drawn from
        # the stamps, and broker_wait (a child of send) must not start before it. The send's
        # duration runs on the monotonic clock from there (tracer.path.clock: one anchor per message).
        anchor = Anchor(self.clock)
        produce_ns = anchor.wall_ns
        span = self.start_span_at(n.send_span_name(topic), _PRODUCER, otel_context.get_current(), produce_ns, attrs)
        try:
            inject(set_property, produce_ns, trace.set_span_in_context(span), job_id=job_id, cost=cost)
        except Exception as exc:  # noqa: BLE001 - a read-only message must not fail the send
            self.errors.count("inject_failed", repr(exc))
        return SendTrace(span, produce_ns, self, topic, anchor)

    # -- consumer side -------------------------------------------------------------------
    def start_message(self, info: MessageInfo, pulled_ns: Anchor | int | None = None,
                      body: object = None) -> MessageTrace:
        """A trace for one received message, stamped with produce, broker store and client pull.

        ``pulled_ns``: when the message was pulled. An :class:`~tracer.path.clock.Anchor` read on
        this tracer's clock (a batch's pull: ``Anchor(tracer.clock)`` once, then passed for each
        message) is the pull on both clocks, so a wall-clock step between the batch's reading and
        this call moves the message as a whole and none of its gaps. An ``int`` is a wall time
        read elsewhere (a client's decode time): it is placed that far back on the monotonic
        clock, so a step in between does enter the gaps; ``None`` is now.

        ``body`` is read only when ``capture_body`` is on, and only a ``bytes``, ``bytearray`` or
        ``str``; it is whatever the client's message carries, so it is typed ``object``: compiled
        (``tracer.compiled``), a narrower annotation would raise where the path never does.
        Timestamps that cannot be real (before 2000, over a day ahead) are ignored and counted as
        ``timestamp_out_of_range``.
        """
        # The message's timeline (tracer.path.clock): anchored once, at the pull, to the wall clock;
        # every later consumer stamp is the anchor plus monotonic time, so a wall-clock step moves
        # the message as a whole and none of its own gaps.
        clock = self.clock
        mono = clock.monotonic_ns()
        now = clock.wall_ns()
        # The traceparent is parsed only if a span is written or the context made current
        # (MessageTrace.carried): a message only measured costs no parse (BENCHMARKS.md).
        carried = extract(info.properties, self.errors, now, info.system_trace_context, defer_parent=True)
        anchor = self._pull_anchor(pulled_ns, now, mono)
        t = MessageTrace(self, info, carried, anchor)
        if self._lost_runs and info.message_id:
            # peeked, not taken: a copy refused unstarted must leave it to the copy that runs
            # (MessageTrace.finish takes it then)
            with self._lost_lock:
                t._lost_from = self._lost_runs.get(info.message_id)
        self._stamp_received(t.stamps.times, carried.produce_ns, anchor.wall_ns, info.store_ms, now)
        if self.occupancy is not None:
            self.occupancy.received(anchor.mono_ns)  # the pull, on the occupancy's monotonic clock
        if self.capture_body and isinstance(body, (bytes, bytearray, str)):
            t.body = body
        return t


class MessageTrace(TraceState):
    """Stamps of one received message and, while its handler runs, its live handler span."""

    __slots__ = ()

    def handler_scope(self, start_ns: int | None = None) -> MessageTrace:
        """``with trace.handler_scope():`` stamps handler start/end; the handler span is current inside.

        ``start_ns`` dates the handler start back, for seams that learn of the handler only at
        its end (an ack with no scope around the handler)."""
        self._scope_start = start_ns
        return self

    def __enter__(self) -> Span | None:
        """The handler starts: stamp it, open (or hold) the spans, make the context current."""
        times = self.stamps.times
        times[_START] = self._scope_start or self.anchor.now()
        with self._tracer._end_lock:
            self._tracer._abandonable.add(self)  # until __exit__: the shutdown ends it should it never come
        if times[_ENQUEUE] == MISSING:
            # No dispatcher stamped it: the client's own pool dispatched from its cache.
            times[_ENQUEUE] = times[_PULL]
        if self._tracer.occupancy is not None:
            self._tracer.occupancy.started(self.anchor.mono_ns)
        writer = self._tracer.writer()
        if writer is None:
            if self._tracer.foreign_provider:
                # the user's spans, recorded by another SDK, join the producer's trace
                found = self._producer_context()
                if self._carried.context is not None:
                    self._token = _attach(self._carried.context)
                elif found is not None:
                    self._token = _attach(trace.set_span_in_context(NonRecordingSpan(found)))
            return None
        try:
            # process starts at the broker's store (else the pull): broker_wait is its first child
            pulled = times[_PULL]
            start = pulled if self._tracer.compact else min(times[_STORE] or pulled, pulled)
            self._token = _attach(self._open_spans(writer, start, times[_START]))
        except Exception as exc:  # noqa: BLE001
            self._tracer.hook_failed("starting the handler span", exc)
        return self._handler

    def _open_spans(self, writer: SpanWriter, pulled_ns: int, start_ns: int) -> otel_context.Context:
        """Decide sampling, open ``process`` and ``handler``; the context to make current."""
        keep = self._tracer.keep
        carried = self._carried
        base = carried.context  # the extracted context (baggage), when there is more than `parent`
        name, attrs = self._tracer.process_start(self.info)
        tp = carried.traceparent
        if keep is not None and tp is not None and base is None and not self._parsed:
            # A message the head drops is held, and needs the producer's context only for the
            # link it gets if kept: when the sampler reads nothing but the parent's flags, a
            # canonical traceparent's flag decides it and the parse waits for the keep decision.
            flag = traceparent_sampled(tp)
            if flag is not None and writer.parent_decision(True, flag) is _DROP:
                return self._open_held(writer, name, attrs, _PARSE_IF_KEPT, pulled_ns, start_ns, None)
        parent = self._producer_context()
        if parent is not None and not parent[5]:  # is_valid, by index: a SpanContext is a tuple
            parent = None
        # the creation context, as the spec asks; built now only for a sampler that reads it
        links = (Link(parent),) if parent is not None and writer.sampler_called else ()
        ctx, start_attrs = writer.decide(parent, base, name, _CONSUMER, attrs, links, keep is None)
        if start_attrs is None and keep is not None:
            # Dropped by the head, judged at finish: a new trace linked to the producer's (a
            # child of the unrecorded send span would be an orphan; see tracer.telemetry.keep).
            return self._open_held(writer, name, attrs, parent, pulled_ns, start_ns, base)
        if start_attrs is not None and self._tracer.hold is not None and keep is not None:
            self._tracer.hold.hold(ctx.trace_id, running=True)  # not aged out while the handler runs
            self._fate = _HEAD_HELD
        current = base if base is not None else _get_current()  # read once, used twice
        if start_attrs is None:
            # Dropped: the message's context stays current so the handler's spans share the
            # decision instead of starting root traces of their own (as contrib does).
            return trace.set_span_in_context(NonRecordingSpan(ctx), current)
        self._ctx = ctx
        if parent is not None and not links:
            links = (Link(parent),)
        process = DeferredSpan(writer, name, ctx, parent, pulled_ns, _CONSUMER, start_attrs, links)
        writer.started(process, base)
        self._process = process
        if self._tracer.compact:
            return trace.set_span_in_context(process, current)  # the user's spans nest under process
        handler = DeferredSpan(writer, n.HANDLER_SPAN, writer.child_context(ctx), ctx, start_ns)
        if writer.start_seen():  # the context it starts in, built only for a processor that sees it
            writer.started(handler, trace.set_span_in_context(process, current))
        self._handler = handler
        return trace.set_span_in_context(handler, current)

    def __exit__(self, *exc_info: object) -> None:
        """The handler returned: stamp its end (or end a late handler span), restore the context."""
        now = self.anchor.now()
        handler: DeferredSpan | None = None
        with self._tracer._end_lock:
            late = self._phase >= _OVERRUN  # finished already: the stamps are the finish's, the span waits for us
            if late:
                self._late_end = now
                self._phase = _LATE_ENDED
                handler, self._open_handler = self._open_handler, None
            else:
                self.stamps.times[_END] = now
            self._tracer._abandonable.discard(self)  # returned: nothing left for a shutdown to end
        if late and handler is not None:
            try:
                handler.end(end_time=now)  # joins its trace, kept at the finish
            except Exception as exc:  # noqa: BLE001
                self._tracer.hook_failed("ending a late handler span", exc)
        hold, ctx = self._tracer.hold, self._ctx
        if hold is not None and ctx is not None and self._fate is not _HEAD:  # held, either way
            try:
                # ctx[0]: the trace id (a SpanContext is a tuple, no property call)
                hold.ran(ctx[0])  # undecided from now on (an unacked message): aged from here
            except Exception as exc:  # noqa: BLE001
                self._tracer.hook_failed("marking a held trace's handler ended", exc)
        if self._tracer.occupancy is not None:
            self._tracer.occupancy.ended()
        if self._token is not None:
            try:
                _detach(self._token)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001
                self._tracer.hook_failed("detaching the handler context", exc)
            self._token = None

    def finish(self, outcome: Outcome, error: BaseException | None = None) -> None:
        """Write spans, observe every gap, count the outcome. Idempotent; never raises."""
        if self._phase is not _OPEN:
            return
        with self._tracer._end_lock:  # the provider's shutdown may finish it while its handler's report does
            if self._phase is not _OPEN:
                return
            self._phase = _FINISHED
        times = self.stamps.times
        occupancy = self._tracer.occupancy
        if occupancy is not None and times[_START] == MISSING:
            occupancy.discarded(self.anchor.mono_ns)
        lost_from = self._lost_from
        if lost_from is not None:
            if outcome is _NOT_STARTED or outcome is Outcome.SKIPPED:
                self._lost_from = None  # never ran: no second run; the copy that runs links to it
            elif self.info.message_id:
                self._tracer._take_lost_run(self.info.message_id, lost_from)
        if outcome is _NOT_STARTED:
            # The dispatcher's handler refused to start this copy (tracer.dispatch.NotStarted)
            # inside the handler scope: its start and end stamps measure no handler run, and the
            # refusal is no error. Unstamped, it is measured as a message given back unrun: no
            # handler or end-to-end observation, its own outcome, no error on the span.
            error = None
            with self._tracer._end_lock:
                times[_START] = times[_END] = MISSING
        if times[_START] != MISSING and times[_END] == MISSING:
            # A watchdog reports a timeout while the handler still runs: it ran at least until
            # now, so the message is measured (handler, end_to_end, process duration) and judged.
            now = self.anchor.now()
            with self._tracer._end_lock:
                if times[_END] == MISSING:
                    times[_END] = now
                    self._phase = _OVERRUN
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
        consistent = causal(times)  # the parts fit the whole (tracer.path.stamps); skew is read raw below
        if metrics is not None:
            metrics.observe(self.info.topic, mt.consumer_group, consistent, outcome, None,
                            ctx[0] if ctx is not None and ctx[3] & 1 else 0)  # trace id if sampled, by index
        mt.meters.finished(self.info.topic, mt.consumer_group, consistent, outcome, error)
        verdict = self._verdict
        if verdict is not None:
            # The verdict (it names the blocker's entry and trace) is let go now, the blocker's id
            # and handler context kept: held on, every live trace would keep the chain of every
            # trace that blocked one before it alive.
            self._verdict = None
            wait, policy = verdict
            self._blame = self._blame_of(wait, kept=ctx is not None)
            avoidable = float(wait.avoidable_s)
            if metrics is not None:
                metrics.avoidable(self.info.topic, mt.consumer_group, policy, avoidable)
            mt.meters.avoidable(self.info.topic, mt.consumer_group, policy, avoidable)
        # the skew windows' age (ages are monotonic): the latest stamp's, no clock read (Anchor.mono_of
        # inline, without its MonoNs call: a NewType call is a Python call, ~0.1 µs, on every message)
        anchor = self.anchor
        latest: MonoNs = anchor.mono_ns + ((times[_END] if times[_END] != MISSING else times[_PULL])  # type: ignore[assignment]
                                           - anchor.wall_ns)
        changed = mt.skew.observe_times(times, latest)
        if metrics is not None:
            if changed is not None:
                for peer, bound in changed:
                    metrics.skew_bound.labels(peer).set(bound / 1e9)
            for start, end, tolerance, gap_name in _CROSS:
                a, b = times[start], times[end]
                if a != MISSING and b != MISSING and a - b > tolerance:
                    metrics.clamped(gap_name)
        if ctx is not None and (self._process is not None or self._deferred is not None):
            self._write_spans(ctx, outcome, error, consistent)
        for listener in mt.listeners:
            try:
                unrun(listener(self, outcome))  # its answer is ignored; a returned coroutine is closed, unwarned
            except Exception as exc:  # noqa: BLE001
                mt.hook_failed("a finish listener", exc)

    def _write_spans(self, ctx: SpanContext, outcome: Outcome, error: BaseException | None,
                     c: Sequence[int] | None = None) -> None:
        """Write the spans from the causal stamps ``c`` (computed here when not given): ordered in
        stage order with 0 for a missing stamp, so every child lies inside its parent; drawn
        (:func:`~tracer.path.stamps.drawn`) never before the produce stamp, the ``send`` parent's
        start, whatever the producer's clock. Gap values (compact attributes) stay causal."""
        if c is None:
            c = causal(self.stamps.times)
        d = drawn(self.stamps.times, c)
        self._written = True
        process = self._process if self._process is not None else self._materialize()
        if self._lost_from is not None:
            process.add_link(self._lost_from, {n.LINK_REASON: n.LINK_LEASE_LOST})
        # No handler end (a copy refused unstarted is unstamped): the finish, yet never before the
        # latest stamp drawn, which the producer's clock may have moved past it.
        end_ns = d[_END] or max(self.anchor.now(), *d)
        error_type = type(error).__qualname__ if error is not None else None
        if outcome is _NOT_STARTED:
            # refused at the start gate inside the scope: no handler ran, so no handler span
            # (opened at the scope's entry, it is never written)
            self._handler = None
        elif self._handler is not None:
            self._end_handler(self._handler, d, error, error_type, end_ns)
        compact = self._tracer.compact
        blame_attrs, blame_links = self._blame if self._blame is not None else (None, ())
        if not compact:
            self._emit_gaps(ctx, d, blame_attrs, blame_links)
        attrs = self._process_attributes(outcome, process)
        if self._lease_lost is not None:
            attrs[n.LEASE_LOST] = self._lease_lost
        if compact:
            if blame_attrs is not None:
                attrs.update(blame_attrs)
                for link in blame_links:
                    process.add_link(link.context)
            if error is not None:
                record_error(process, error)
            for key, a, b in _GAP_ATTRS:
                if c[a] and c[b]:
                    attrs[key] = (c[b] - c[a]) / 1e9
        if outcome is not _SUCCESS and outcome is not _NOT_STARTED:
            process.set_status(Status(_ERROR, outcome.value))
            # the exception's class; without one (a failure result, a timeout) the outcome
            attrs[n.ERROR_TYPE] = error_type or outcome.value
        # the causal timeline's: every child inside, none before it (compact: no broker_wait child,
        # so process is the consumer's processing alone, as messaging.process.duration)
        start = (0 if compact else d[_STORE]) or d[_PULL]
        if start:
            process.move_start(start)
        process.end(end_ns)

    def _end_handler(self, handler: DeferredSpan, d: Sequence[int], error: BaseException | None,
                     error_type: str | None, end_ns: int) -> None:
        """End the handler span at ``end_ns`` (drawn stamps ``d``), or leave it open for a handler
        that still runs (a watchdog's finish): ``__exit__`` or :meth:`abandon` ends it then."""
        floor = d[_START] or d[_PULL]  # unstamped (not started): still inside its process span
        if floor > handler.start_time:
            handler.move_start(floor)  # the producer's clock is ahead of the handler's start
        if error is not None:
            record_error(handler, error)
            handler.set_status(Status(_ERROR, type(error).__name__))
            handler.put_attributes({n.ERROR_TYPE: error_type})
        with self._tracer._end_lock:
            still_running = self._phase is _OVERRUN  # not returned yet (LATE_ENDED: it has)
            if still_running:
                self._open_handler = handler  # __exit__ ends it when the handler returns
                self._tracer._abandonable.add(self)  # ... or abandon(), should it never
        if not still_running:
            handler.end(end_time=self._late_end or end_ns)

    def _emit_gaps(self, ctx: SpanContext, d: Sequence[int], blame_attrs: dict[str, Any] | None,
                   blame_links: tuple[Link, ...]) -> None:
        """The gap spans under ``process`` (the full shape), from the drawn stamps ``d``."""
        writer = self._tracer.writer()
        assert writer is not None
        for name, a, b, gap_attrs in _GAP_SPANS:
            if d[a] and d[b]:
                if blame_attrs is not None and name == n.BLAME_SPAN:  # drawn even when empty: it carries the verdict
                    writer.emit(name, writer.child_context(ctx), ctx, d[a], d[b],
                                attributes={**gap_attrs, **blame_attrs}, links=blame_links)
                elif d[b] > d[a]:
                    # An empty gap (a push listener's client_buffer, a gap clamped by skew or
                    # a stamp equal on the monotonic clock) gets no span: Jaeger flags every span that
                    # does not end after it starts as "Negative duration". Its 0 is observed.
                    writer.emit(name, writer.child_context(ctx), ctx, d[a], d[b], _INTERNAL, gap_attrs)
