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
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TracerProvider

from ..bounds import count
from ..callables import require_plain, unrun
from ..compiled import mypyc_attr
from ..path import names as n
from ..path.clock import Anchor, Clock, MonoNs, WallNs, default_clock, require_clock
from ..path.message import ClientFacts, MessageInfo
from ..path.propagation import (
    PLAUSIBLE_AHEAD_NS,
    PLAUSIBLE_MIN_NS,
    Carried,
    PropagationErrors,
    extract,
    inject,
    plausible_ns,
    resolve_parent,
    traceparent_sampled,
)
from ..path.stages import CROSS_CLOCK_GAPS, GAPS, Outcome, Stage
from ..path.stamps import MISSING, SkewTracker, Stamps, causal, drawn, store_stamp
from ..version import __version__
from .abandon import HandlerAbandoned, watch_shutdown
from .adopt import keep_for
from .attributes import (  # noqa: F401 - re-exported
    BODY_ATTR,
    MAX_ATTR_CHARS,
    MAX_KEYS,
    body_preview,
    cap,
    process_attributes,
    process_sampling_attributes,
    send_attributes,
    server_attributes,
)
from .hold import HoldingSpanProcessor, HoldStats
from .keep import PENDING, KeepPolicy, KeepStats
from .metrics import TracerMetrics
from .occupancy import Occupancy
from .otel_metrics import GLOBAL_METERS, MessagingMeters
from .spans import DeferredSpan, SpanWriter, add_own_attributes, record_error, span_writer

__all__ = ["BODY_ATTR", "MAX_ATTR_CHARS", "MAX_KEYS", "MessageTrace", "MessageTracer", "SendTrace", "TracerStats",
           "body_preview"]

log = logging.getLogger(__name__)

# The gap spans under `process`: (name, first stage, last stage, attributes), from names.GAP_SPANS.
_GAP_SPANS: tuple[tuple[str, int, int, dict[str, Any]], ...] = tuple(
    (g.name, int(g.start), int(g.end), {n.STAGE: g.name}) for g in n.GAP_SPANS)
# The compact trace's gap attributes: (attribute, first stage, last stage).
_GAP_ATTRS: tuple[tuple[str, int, int], ...] = tuple((n.GAP_ATTRS[g.name], int(g.start), int(g.end)) for g in GAPS)
# Cross-clock gaps, their fields read once: (first stage, last stage, tolerance, name).
_CROSS: tuple[tuple[int, int, int, str], ...] = tuple(
    (int(g.start), int(g.end), g.tolerance_ns, g.name) for g in CROSS_CLOCK_GAPS)
# Stages, outcomes and kinds as module constants: an Enum member read off its class costs a
# descriptor call (~0.2 µs on CPython 3.11), and the message path reads about twenty of them.
_PRODUCE, _STORE, _PULL = int(Stage.PRODUCE), int(Stage.BROKER_STORE), int(Stage.CLIENT_PULL)
_ENQUEUE, _START, _END = int(Stage.DISPATCH_ENQUEUE), int(Stage.HANDLER_START), int(Stage.HANDLER_END)
_SUCCESS = Outcome.SUCCESS
_NOT_STARTED = Outcome.NOT_STARTED
_CONSUMER, _INTERNAL, _PRODUCER = SpanKind.CONSUMER, SpanKind.INTERNAL, SpanKind.PRODUCER
_DROP = Decision.DROP
# A held trace's creation link whose traceparent is parsed only if the trace is kept.
_PARSE_IF_KEPT = object()
_ERROR = StatusCode.ERROR
# A held trace's keep decision, as its victims see it (blame-aware keep, MessageTrace._fate).
_UNDECIDED, _DECIDING, _KEPT, _DROPPED, _PENDING, _GONE = range(6)
# Topics (with their endpoint) whose process span name and sampling attributes are kept built.
_MAX_STARTS = 256
# Runs whose lease was lost, remembered (by message id) for the redelivery's link: the broker
# redelivers within a lease or two, so a few hundred cover any burst; the oldest go first.
_MAX_LOST_RUNS = 512


# Compiled (tracer.compiled), still a Python class: the provider's shutdown hook holds it by a weak
# reference. (A Python subclass of it is refused by its compiled methods all the same: the history's
# "The same path compiled".)
@mypyc_attr(native_class=False)
class MessageTracer:
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
    ``client_id=``, ``namespace=``, ``server_address=``, ``server_port=`` keywords still work and
    override the matching field. :meth:`statistics` is a frozen snapshot of what happened.

    ``clock`` gives both timelines (:class:`~tracer.path.clock.Clock`): each message's stamps are
    its wall time at the pull advanced by its monotonic time (one anchor per message).

    Raises:
        TypeError: ``clock`` lacks ``wall_ns()`` or ``monotonic_ns()``.
        ValueError: ``keep``/``hold`` were given another clock than ``clock`` (their timers run
            on the tracer's; one built without a clock takes it); ``keep`` without ``hold``;
            a ``server_port`` that is not a TCP port; an unknown ``trace_shape``.
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
        client: ClientFacts | None = None,
        client_id: str | None = None,
        namespace: str | None = None,
        server_address: str | None = None,
        server_port: int | None = None,
        record_body_size: bool = False,
        trace_shape: str | None = None,
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
        facts = client or ClientFacts()
        facts = ClientFacts(client_id if client_id is not None else facts.client_id,
                            namespace if namespace is not None else facts.namespace,
                            server_address if server_address is not None else facts.server_address,
                            server_port if server_port is not None else facts.server_port)
        if facts.server_port is not None and not (
                isinstance(facts.server_port, int) and 0 < facts.server_port < 65536):
            raise ValueError(f"server_port must be a TCP port (1..65535), not {facts.server_port!r}")
        self.consumer_group = consumer_group
        self.record_body_size = bool(record_body_size)
        # "full": process + handler + gap spans (the waterfall); "compact": process alone, current
        # while the handler runs, every gap and stamp as its attributes (RMQTRACE_TRACE_SHAPE).
        shape = trace_shape if trace_shape is not None else (os.environ.get("RMQTRACE_TRACE_SHAPE") or "full")
        shape = shape.strip().lower()
        if shape not in n.TRACE_SHAPES:
            raise ValueError(f"trace_shape (RMQTRACE_TRACE_SHAPE) must be one of {', '.join(n.TRACE_SHAPES)}, "
                             f"got {shape!r}")
        self.compact = shape == "compact"
        self._set_client(facts)
        # Fed from the stamps: client_pull = received, handler start/end = a worker busy.
        self.occupancy = occupancy
        self.capture_body = max(0, count(capture_body, "capture_body", minimum=-(2**63)))  # below 0: off
        if clock is not None:
            require_clock(clock, "MessageTracer(clock=)", wall=True, monotonic=True)
        self.clock: Clock = clock or default_clock()
        self._share_clock()
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
        for fn in listeners:
            require_plain(fn, "listeners[]")  # an async one would never run
        self.listeners: list[Callable[[MessageTrace, Outcome], None]] = list(listeners)
        self._hook_failures: dict[str, int] = {}
        self._hook_lock = threading.Lock()
        # Orders a handler's end (worker thread) against a watchdog's finish (another thread).
        self._end_lock = threading.Lock()
        # message id -> the process span context of a run whose lease was lost (see MessageTrace.lease_lost)
        self._lost_runs: OrderedDict[str, SpanContext] = OrderedDict()
        self._lost_lock = threading.Lock()
        # traces whose handler runs (entered, not exited), finished or not: what the provider's
        # shutdown abandons (under _end_lock)
        self._abandonable: set[MessageTrace] = set()
        self._fate_lock = threading.Lock()  # MessageTrace._fate / _must_keep (blame-aware keep)

    def _set_client(self, facts: ClientFacts) -> None:
        self.client: ClientFacts = facts  # read by the attributes, and by telemetry.operations
        self._server = server_attributes(facts)
        # the topic (with the endpoint, when the message names one) -> the process span's name and what the sampler
        # sees; built once per topic (the sampler gets the same read-only dict every time)
        self._starts: dict[Any, tuple[str, dict[str, Any]]] = {}

    @property
    def client_id(self) -> str | None:
        return self.client.client_id

    @property
    def namespace(self) -> str | None:
        return self.client.namespace

    def describe_client(self, facts: ClientFacts) -> None:
        """Fill what was not given at construction from a client's own facts (the wrappers call
        this with :func:`tracer.path.message.client_facts` of the client they wrap)."""
        c = self.client
        has_server = bool(c.server_address)
        self._set_client(ClientFacts(
            c.client_id if c.client_id is not None or not facts.client_id else facts.client_id,
            c.namespace if c.namespace is not None else facts.namespace,
            c.server_address if has_server else facts.server_address,
            c.server_port if has_server else facts.server_port))

    def statistics(self) -> TracerStats:
        """A frozen snapshot: our own failures by place, propagation errors, skew, keep and hold."""
        with self._hook_lock:
            hooks = dict(self._hook_failures)
        return TracerStats(hooks, dict(self.errors.counts), self.skew.bounds(),
                           self.keep.statistics() if self.keep is not None else None,
                           self.hold.statistics() if self.hold is not None else None)

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

    def start_span_at(self, name: str, kind: SpanKind, parent_ctx: Context, start_ns: int,
                      attributes: dict[str, Any], links: Sequence[Link] = ()) -> Span:
        """The span ``Tracer.start_span`` would start under ``parent_ctx`` at ``start_ns``, not made
        current. On the SDK it is written once when it ends
        (:meth:`~tracer.telemetry.spans.SpanWriter.start`: no SDK span lock or per-link attribute
        copy, BENCHMARKS.md); any other provider starts its own. The send, receive and settle spans
        are begun here."""
        writer = self.writer()
        if writer is None:
            return self.tracer.start_span(name, context=parent_ctx, kind=kind, attributes=attributes,
                                          links=links, start_time=start_ns)
        return writer.start(name, kind, parent_ctx, start_ns, attributes, links)

    # -- consumer side -------------------------------------------------------------------
    def start_message(self, info: MessageInfo, pulled_ns: Anchor | int | None = None,
                      body: bytes | bytearray | str | None = None) -> MessageTrace:
        """A trace for one received message, stamped with produce, broker store and client pull.

        ``pulled_ns``: when the message was pulled. An :class:`~tracer.path.clock.Anchor` read on
        this tracer's clock (a batch's pull: ``Anchor(tracer.clock)`` once, then passed for each
        message) is the pull on both clocks, so a wall-clock step between the batch's reading and
        this call moves the message as a whole and none of its gaps. An ``int`` is a wall time
        read elsewhere (a client's decode time): it is placed that far back on the monotonic
        clock, so a step in between does enter the gaps; ``None`` is now.

        ``body`` is read only when ``capture_body`` is on. Timestamps that cannot be real (before
        2000, over a day ahead) are ignored and counted as ``timestamp_out_of_range``.
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

    def _pull_anchor(self, pulled_ns: Anchor | int | None, now: WallNs, mono: MonoNs) -> Anchor:
        """The message's timeline, anchored at its pull (see :meth:`start_message`'s ``pulled_ns``)."""
        clock = self.clock
        if isinstance(pulled_ns, Anchor):
            if pulled_ns.read_on(clock):  # the batch's pull, read on both clocks at once
                return Anchor(clock, pulled_ns.wall_ns, pulled_ns.mono_ns)
            pulled_ns = pulled_ns.wall_ns  # read on another clock: only its wall time means anything here
        if pulled_ns and not plausible_ns(pulled_ns, now):
            self.errors.count("timestamp_out_of_range", f"pulled_ns={pulled_ns}")
            pulled_ns = None
        if pulled_ns:
            # a wall time read elsewhere (a client's decode): that far back on the monotonic clock,
            # never ahead of now (the wall clock stepped back in between)
            since = now - pulled_ns
            return Anchor(clock, WallNs(pulled_ns), MonoNs(mono - since if since > 0 else mono))
        return Anchor(clock, now, mono)

    def _stamp_received(self, times: list[int], produce_ns: int, pulled: int, store_ms: int | None, now: int) -> None:
        """The three stamps a message has when it is received: produce, broker store, client pull."""
        times[_PRODUCE] = produce_ns
        times[_PULL] = pulled
        if store_ms:
            if PLAUSIBLE_MIN_NS <= store_ms * 1_000_000 <= now + PLAUSIBLE_AHEAD_NS:  # plausible_ns, inline
                # millisecond resolution: placed within its millisecond (tracer.path.stamps)
                times[_STORE] = store_stamp(store_ms, produce_ns, pulled)
            else:
                self.errors.count("timestamp_out_of_range", f"store_ms={store_ms}")

    def process_sampling_attributes(self, info: MessageInfo) -> dict[str, Any]:
        """What the sampler sees when it decides a ``process`` span (the spec's sampling-relevant set)."""
        return process_sampling_attributes(info, self.consumer_group, self._server)

    def process_start(self, info: MessageInfo) -> tuple[str, dict[str, Any]]:
        """The ``process`` span's name and sampling attributes (not to be changed: they are shared)."""
        # keyed by the topic alone when the message names no endpoint (the common case, no tuple)
        key: Any = info.topic if info.server_address is None else (info.topic, info.server_address, info.server_port)
        starts = self._starts
        found = starts.get(key)
        if found is None:
            found = (n.process_span_name(cap(info.topic)), self.process_sampling_attributes(info))
            if len(starts) < _MAX_STARTS:  # topics on the fly are built per message past this
                starts[key] = found
        return found

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
                try:
                    self._share_clock()
                except ValueError as exc:  # another tracer's clock took the hold first: say it, trace on
                    self.hook_failed("sharing the clock with RMQTRACE_KEEP_*", exc)
        if self._writer is not None and self._writer_resolved:
            # after keep_for: in front of an adopted hold, so the spans it ends still reach it
            watch_shutdown(provider, self)
        self.foreign_provider = self._writer is None and not isinstance(
            provider, (trace.NoOpTracerProvider, trace.ProxyTracerProvider))
        return self._writer

    def _share_clock(self) -> None:
        """The keep policy's and the hold's timers on this tracer's monotonic clock: the times a
        finish hands them are read on it (one source for stamps, blame, hold and keep)."""
        if self.keep is not None:
            self.keep.share_clock(self.clock)
        if self.hold is not None:
            self.hold.share_clock(self.clock)
        if self.occupancy is not None:
            self.occupancy.share_clock(self.clock)

    def abandon_handlers(self) -> int:
        """End the handler span of every handler still running (status ERROR,
        ``rmqtrace.abandoned``), so the user's spans under it are not orphans; how many. Run at the
        provider's shutdown (:mod:`tracer.telemetry.abandon`); a dispatcher's ``close`` does it for
        its own overrun handlers (:meth:`MessageTrace.abandon`). A running handler whose message
        was not finished yet (no ``handler_timeout``, or none reported) is finished first, as a
        ``timeout`` with :class:`~tracer.telemetry.abandon.HandlerAbandoned`: it ran past the
        time it was given (the process ends under it), so it is measured once and its
        ``process`` span written with the handler's — after the keep policy has settled every
        pending trace (kept), so such a finish supersedes none."""
        with self._end_lock:
            traces = list(self._abandonable)
        if self.keep is not None and any(not t._done for t in traces):
            # The shutdown keeps every pending trace (the hold's promise): settled before these
            # finishes, which would make a running handler its job's latest finisher and drop
            # the finisher pending now as superseded.
            self.keep.flush()
        n_ended = 0
        for t in traces:
            if not t._done:
                t.finish(Outcome.TIMEOUT, HandlerAbandoned("the handler still ran when the tracer provider shut down"))
            n_ended += t.abandon()
        return n_ended

    def _take_lost_run(self, message_id: str, ctx: SpanContext) -> None:
        """A copy of ``message_id`` ran: the lost run it links to is linked (forget it, if still ``ctx``)."""
        with self._lost_lock:
            if self._lost_runs.get(message_id) == ctx:
                del self._lost_runs[message_id]

    def _remember_lost_run(self, message_id: str, ctx: SpanContext) -> None:
        with self._lost_lock:
            runs = self._lost_runs
            runs[message_id] = ctx
            runs.move_to_end(message_id)
            while len(runs) > _MAX_LOST_RUNS:
                runs.popitem(last=False)

    def hook_failed(self, where: str, exc: BaseException) -> None:
        """Log a failure of our own code once per place; the user's message flow goes on."""
        with self._hook_lock:
            first = where not in self._hook_failures
            self._hook_failures[where] = self._hook_failures.get(where, 0) + 1
        if first:
            log.error("rmqtrace: %s failed; tracing for it is skipped (logged once)", where, exc_info=exc)


class SendTrace:
    """The live ``send {topic}`` span; end it with the receipt or the exception."""

    __slots__ = ("span", "produce_ns", "_tracer", "_topic", "_anchor")

    def __init__(self, span: Span, produce_ns: int, tracer: MessageTracer | None = None, topic: str = "",
                 anchor: Anchor | None = None) -> None:
        self.span = span
        self.produce_ns = produce_ns
        self._tracer = tracer
        self._topic = topic
        self._anchor = anchor

    def end(self, message_id: str | None = None, error: BaseException | None = None) -> None:
        span = self.span
        if span.is_recording():
            if message_id:
                add_own_attributes(span, {n.MESSAGE_ID: str(message_id)})
            if error is not None:
                record_error(span, error)
                span.set_status(Status(_ERROR, type(error).__name__))
                span.set_attribute(n.ERROR_TYPE, type(error).__qualname__)
        mt = self._tracer
        if mt is None:
            span.end()
            return
        now = self._anchor.now() if self._anchor is not None else mt.clock.wall_ns()
        span.end(end_time=now)
        mt.meters.sent(self._topic, now - self.produce_ns, error)


class MessageTrace:
    """Stamps of one received message and, while its handler runs, its live handler span."""

    __slots__ = ("_tracer", "info", "_carried", "_parent", "_parsed", "stamps", "worker", "body", "_ctx", "_process",
                 "_handler", "_token", "_done", "_scope_start", "_held", "_head_held", "_overrun", "_late_end",
                 "_open_handler", "_deferred", "_verdict", "_blame", "anchor", "_lease_lost", "_lost_from",
                 "_written", "_fate", "_must_keep", "_dropped_outcome")

    def __init__(self, tracer: MessageTracer, info: MessageInfo, carried: Carried, anchor: Anchor) -> None:
        self._tracer = tracer
        self.anchor = anchor  # the message's timeline: every consumer stamp is read on it
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
        # a held trace's process/handler, not yet spans: ids allocated, written only if kept;
        # (writer, name, creation, pulled_ns, attrs, inner, start_ns), read by unpacking into those
        # names (a plain tuple: a NamedTuple instance per held message costs its allocation)
        self._deferred: tuple[Any, ...] | None = None
        self._verdict: tuple[Any, str] | None = None  # (Verdict, policy) from the dispatcher, until the finish
        # what the spans carry of it (attributes, link to the blocker), made at the finish
        self._blame: tuple[dict[str, Any], tuple[Link, ...]] | None = None
        self._lease_lost: str | None = None  # the consume loop lost this delivery's lease (why)
        self._lost_from: SpanContext | None = None  # an earlier run of this message whose lease was lost
        self._written = False  # our spans of this trace were written (so a link to it resolves)
        # the keep decision of a held trace, for the victims that link to it (under _fate_lock)
        self._fate = _UNDECIDED
        # keep it whatever its own decision, and why: a kept victim links to it (blocker), its
        # lease was lost after its finish (lease_lost: its redelivery links to it)
        self._must_keep: str | None = None
        self._dropped_outcome: Outcome | None = None  # to write its spans should it be revived

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
        self.stamps.times[stage] = ns if ns else self.anchor.now()

    def now(self) -> WallNs:
        """This instant on the message's timeline (its anchor plus monotonic time since)."""
        return self.anchor.now()

    @property
    def trace_id(self) -> int:
        return self._ctx.trace_id if self._ctx is not None else 0

    def blame(self, verdict: Any, policy: str) -> None:
        """The dispatcher's verdict on this message's wait (a :class:`tracer.path.blocking.Verdict`,
        whose ``blocker_ref`` is the blocker's trace), given when its handler starts."""
        self._verdict = (verdict, policy)

    def handler_context(self) -> SpanContext | None:
        """The context of the span current in this message's handler (``handler``; ``process`` in
        the compact shape); None when unsampled or not started. A copy refused unstarted has no
        handler span: its ``process`` stands in (what a blame link to it then resolves to)."""
        if self._done and self.stamps.times[_START] == MISSING:
            return self._ctx
        if self._handler is not None:
            return self._handler.context
        if self._process is not None:
            return self._process.context
        deferred = self._deferred
        if deferred is not None:
            _writer, _name, _creation, _pulled_ns, _attrs, inner, _start_ns = deferred
            return inner  # type: ignore[no-any-return]
        return None

    def abandon(self) -> bool:
        """The timed-out handler is let go while it still runs (its dispatcher closed, the
        provider shuts down): end its handler span now — status ERROR, ``error.type`` (kept, else
        ``timeout``), ``rmqtrace.abandoned=true`` — so the user's spans under it have an exported
        parent. True when there was one to end; its late return then ends nothing more."""
        mt = self._tracer
        with mt._end_lock:
            handler, self._open_handler = self._open_handler, None
            if self._done:  # a running, unfinished one stays for the shutdown to finish (abandon_handlers)
                mt._abandonable.discard(self)
        if handler is None:
            return False
        try:
            if handler.status.status_code is not _ERROR:
                handler.set_status(Status(_ERROR, "abandoned"))
            attrs = handler.own_attributes()
            attrs.setdefault(n.ERROR_TYPE, Outcome.TIMEOUT.value)
            attrs[n.ABANDONED] = True
            handler.end(end_time=self.anchor.now())
        except Exception as exc:  # noqa: BLE001
            mt.hook_failed("ending an abandoned handler span", exc)
        return True

    def lease_lost(self, reason: str) -> None:
        """The consume loop lost this delivery's lease while holding it (``reason``: ``expired``,
        ran out before a renewal; ``abandoned``, given up on a hung handler): the broker may hand
        the message out again, so it may run twice. Counted (``rmqtrace_consumer_leases_lost_total``),
        marked on the ``process`` span (``rmqtrace.lease.lost``, when the trace is not finished yet),
        the trace kept (keep reason ``lease_lost``), and remembered by message id: the redelivery
        this tracer receives links its ``process`` span to this run (and is kept too). Once per
        delivery.

        Raises:
            ValueError: ``reason`` is not one of ``names.LEASE_LOST_REASONS``.
        """
        if reason not in n.LEASE_LOST_REASONS:
            raise ValueError(f"a lost lease's reason is one of {', '.join(n.LEASE_LOST_REASONS)}, got {reason!r}")
        if self._lease_lost is not None:
            return
        self._lease_lost = reason
        mt = self._tracer
        try:
            if mt.metrics is not None:
                mt.metrics.lease_lost(self.info.topic, mt.consumer_group, reason)
            ctx = self._ctx
            # A run the keep policy dropped at its finish (lost between the handler's end and the
            # ack) is kept after all, revived from the hold while it still has it, so the
            # redelivery's link resolves; one not revivable (or unsampled) has nothing to link to.
            # A held one still deciding is promised kept the same way (the flag may come too late).
            if self.info.message_id and ctx is not None and ctx.is_valid and (
                    self._written or (self._exported_for("lease_lost", True) if self._held else not self._done)):
                mt._remember_lost_run(self.info.message_id, ctx)
        except Exception as exc:  # noqa: BLE001 - the loop's settle must go on
            mt.hook_failed("recording a lost lease", exc)

    def _blame_of(self, verdict: Any, kept: bool) -> tuple[dict[str, Any], tuple[Link, ...]]:
        """The blame attributes and the link to the blocker's handler span — only to a span that
        is exported: a victim written now (``kept``) keeps its blocker (blame-aware keep); one
        written later, if at all, links only to a blocker already kept."""
        attrs: dict[str, Any] = {n.BLAME_REASON: verdict.reason, n.BLAME_AVOIDABLE_WAIT: float(verdict.avoidable_s)}
        links: tuple[Link, ...] = ()
        blocker = verdict.blocker_ref
        if isinstance(blocker, MessageTrace):
            if blocker.info.message_id:
                attrs[n.BLAME_BLOCKER_MESSAGE_ID] = cap(blocker.info.message_id)
            ctx = blocker.handler_context()
            if ctx is not None and ctx.is_valid:
                if blocker._exported_for("blocker", kept):
                    links = (Link(ctx),)
                elif kept and self._tracer.keep is not None:
                    self._tracer.keep.blocker_unkept()
        return attrs, links

    def _exported_for(self, why: str, keep_it: bool) -> bool:
        """Whether this trace's spans are or will be exported, so a link to it resolves (a kept
        victim's, ``why="blocker"``; a redelivery's after a lost lease, ``why="lease_lost"``).
        ``keep_it``: keep it for that link — when undecided, whatever its decision; when dropped
        a moment ago, revived if the hold still has it (:meth:`HoldingSpanProcessor.revive`);
        counted as kept after all for ``why``."""
        if not self._held:
            return True  # the head decision: sampled (a context to link to) means exported
        mt = self._tracer
        with mt._fate_lock:
            fate = self._fate
            if fate == _UNDECIDED or fate == _DECIDING:
                if keep_it and self._must_keep is None:
                    self._must_keep = why  # its _decide keeps it (reason why)
                return keep_it
            if fate == _KEPT:
                return True
            if fate == _PENDING and keep_it:
                self._must_keep = self._must_keep or why  # its settle keeps it (a job's latest finisher, superseded or not)
                return True
            if fate != _DROPPED or not keep_it:
                return False
            self._fate = _GONE  # one reviver; a victim racing with it leaves its link out
        ctx, hold, keep, outcome = self._ctx, mt.hold, mt.keep, self._dropped_outcome
        revived = ctx is not None and hold is not None and outcome is not None and hold.revive(ctx.trace_id)
        if revived:
            assert ctx is not None and outcome is not None
            if keep is not None:
                keep.kept_after_all(why)
            try:
                self._write_spans(ctx, outcome, None)
            except Exception as exc:  # noqa: BLE001
                mt.hook_failed("writing a blocker's kept trace", exc)
            with mt._fate_lock:
                self._fate = _KEPT
        return revived

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
                    self._token = otel_context.attach(self._carried.context)
                elif found is not None:
                    self._token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(found)))
            return None
        try:
            # process starts at the broker's store (else the pull): broker_wait is its first child
            pulled = times[_PULL]
            start = pulled if self._tracer.compact else min(times[_STORE] or pulled, pulled)
            self._token = otel_context.attach(self._open_spans(writer, start, times[_START]))
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
            self._head_held = True
        current = base if base is not None else otel_context.get_current()  # read once, used twice
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

    def _open_held(self, writer: SpanWriter, name: str, attrs: dict[str, Any], creation: Any, pulled_ns: int,
                   start_ns: int, base: otel_context.Context | None) -> otel_context.Context:
        """A new held trace, pending the keep decision (a root linked to ``creation``, the
        producer's context; a child of its unrecorded send span would be an orphan, see
        tracer.telemetry.keep): no live spans, no processor on_start. A sampled non-recording
        context with pre-allocated ids is current, so the user's spans are recorded (and held)
        under the handler id; ours are written with those ids at finish, if kept — the sampling
        attributes copied and the creation link made then."""
        hold = self._tracer.hold
        assert hold is not None
        ctx = self._ctx = hold.open_trace(writer.tracer.id_generator, running=True)  # not aged while it runs
        self._held = True
        inner = ctx if self._tracer.compact else writer.child_context(ctx)
        self._deferred = (writer, name, creation, pulled_ns, attrs, inner, start_ns)
        return trace.set_span_in_context(NonRecordingSpan(inner), base if base is not None else otel_context.get_current())

    def __exit__(self, *exc_info: object) -> None:
        """The handler returned: stamp its end (or end a late handler span), restore the context."""
        now = self.anchor.now()
        handler: DeferredSpan | None = None
        with self._tracer._end_lock:
            late = self._overrun  # finished already: the stamps are the finish's, the span waits for us
            if late:
                self._late_end = now
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
        if hold is not None and ctx is not None and (self._held or self._head_held):
            try:
                # ctx[0]: the trace id (a SpanContext is a tuple, no property call)
                hold.ran(ctx[0])  # undecided from now on (an unacked message): aged from here
            except Exception as exc:  # noqa: BLE001
                self._tracer.hook_failed("marking a held trace's handler ended", exc)
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
        with self._tracer._end_lock:  # the provider's shutdown may finish it while its handler's report does
            if self._done:
                return
            self._done = True
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
            self._blame = self._blame_of(verdict[0], kept=ctx is not None)
            avoidable = float(verdict[0].avoidable_s)
            if metrics is not None:
                metrics.avoidable(self.info.topic, mt.consumer_group, verdict[1], avoidable)
            mt.meters.avoidable(self.info.topic, mt.consumer_group, verdict[1], avoidable)
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

    def _decide(self, keep: KeepPolicy, outcome: Outcome, error: BaseException | None) -> SpanContext | None:
        ctx, hold = self._ctx, self._tracer.hold
        settle = None
        if self._held and self._carried.job_id:
            def settle(kept: bool) -> None:
                self._settle(kept, outcome, error)
        mt = self._tracer
        flag: str | None = None
        if self._lease_lost is not None or self._lost_from is not None:
            flag = "lease_lost"  # both runs of a message that may have run twice
        if self._held:
            with mt._fate_lock:
                self._fate = _DECIDING
                if flag is None and self._must_keep:
                    flag = self._must_keep
        try:
            times = self.stamps.times
            # the policy's timers (job idle, intervals) run on the monotonic clock, as its tick
            # (Anchor.mono_of inline: two NewType calls and a method call less, every held message)
            end = times[_END]
            anchor = self.anchor
            end_mono: MonoNs | None = anchor.mono_ns + (end - anchor.wall_ns) if end else None  # type: ignore[assignment]
            reason = keep.decide(times, outcome, self._carried.job_id, head=ctx is not None and not self._held,
                                 settle=settle, end_mono=end_mono, flag=flag)
        except Exception as exc:  # noqa: BLE001 - a broken policy must not cost the histograms
            self._tracer.hook_failed("the keep decision", exc)
            reason = "failure"  # err on keeping
        if self._held:
            flipped: str | None = None
            with mt._fate_lock:
                if reason is None and self._must_keep:  # a kept victim linked to it meanwhile (or a lost lease)
                    reason = flipped = self._must_keep
                self._fate = _PENDING if reason is PENDING else _KEPT if reason is not None else _DROPPED
                if reason is None:
                    self._dropped_outcome = outcome
            if flipped is not None:
                keep.kept_after_all(flipped)
        if self._head_held and ctx is not None and hold is not None:
            hold.release(ctx.trace_id, True)
            return ctx
        if not self._held or ctx is None or hold is None:
            return ctx
        if reason is PENDING:
            return None
        hold.release(ctx[0], reason is not None)  # its trace id, by index
        return ctx if reason is not None else None

    def _settle(self, kept: bool, outcome: Outcome, error: BaseException | None) -> None:
        """The policy's later word on a job's latest finisher (called from another message's finish)."""
        ctx, hold, mt = self._ctx, self._tracer.hold, self._tracer
        if ctx is None or hold is None:
            return
        with mt._fate_lock:
            if not kept and self._must_keep:  # a kept victim was promised it while it was pending
                kept = True
                if mt.keep is not None:
                    mt.keep.kept_after_all(self._must_keep, was="superseded")
            self._fate = _KEPT if kept else _DROPPED
            if not kept:
                self._dropped_outcome = outcome
        hold.release(ctx.trace_id, kept)
        if kept and (self._process is not None or self._deferred is not None):
            try:
                self._write_spans(ctx, outcome, error)
            except Exception as exc:  # noqa: BLE001
                self._tracer.hook_failed("writing a kept trace", exc)

    def _materialize(self) -> DeferredSpan:
        """The process (and handler) span of a held trace, made now that it is kept."""
        writer, name, creation, pulled_ns, attrs, inner, start_ns = self._deferred  # type: ignore[misc]
        self._deferred = None
        assert self._ctx is not None
        if creation is _PARSE_IF_KEPT:
            creation = self._producer_context()  # a canonical traceparent: valid, its tracestate checked now
            if creation is not None and not creation.is_valid:
                creation = None
        # a root linked to the producer's context (its parent, the unrecorded send span, is not)
        links = (Link(creation),) if creation is not None else ()
        process = self._process = DeferredSpan(writer, name, self._ctx, None, pulled_ns, kind=_CONSUMER,
                                               attributes=dict(attrs), links=links)
        if not self._tracer.compact:
            self._handler = DeferredSpan(writer, n.HANDLER_SPAN, inner, self._ctx, start_ns)
        return process

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
            still_running = self._overrun and not self._late_end
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

    def _process_attributes(self, outcome: Outcome, span: DeferredSpan | None = None) -> dict[str, Any]:
        """The ``process`` attributes not given to the sampler at its start; with ``span``, put
        straight into its attributes (what ``put_attributes`` of them would do) and returned."""
        mt, carried = self._tracer, self._carried
        # by position: seven keywords cost a measurable part of a message (BENCHMARKS.md)
        return process_attributes(self.info, mt.client, outcome, self.stamps.times, carried.job_id, carried.cost,
                                  self.worker if mt.worker_attr else None, mt.record_body_size, self.body,
                                  mt.capture_body, span.own_attributes() if span is not None else None)


@dataclass(frozen=True, slots=True)
class TracerStats:
    """What one :class:`MessageTracer` has seen (:meth:`MessageTracer.statistics`)."""

    hook_failures: Mapping[str, int]  # our own code's failures, by place (the first of each is logged)
    propagation_errors: Mapping[str, int]  # bad trace context or stamps in received messages, by kind
    skew_bounds_ns: Mapping[str, int]  # per clock pair, the smallest cross-clock gap of the recent messages
    keep: KeepStats | None
    hold: HoldStats | None
