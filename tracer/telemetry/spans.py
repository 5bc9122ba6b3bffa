"""Consumer spans at a fraction of the SDK's cost, handed to the SDK's own span processors.

A message's ``process`` and ``handler`` spans are live while the handler runs (spans the handler
starts nest under ``handler``), but their start times are in the past (``process`` starts when the
client received the message) and the gap spans (broker_wait, client_buffer, dispatch_wait) are
complete facts by the time the handler ends. Creating all of them through ``Tracer.start_span``
would run the sampler, attribute cleaning and locking five times per message; instead this module
decides sampling once per message with the provider's own sampler (seeing the sampling-relevant
attributes and the link to the creation context, as the spec asks), draws ids from the provider's
id generator, calls the processors' ``on_start`` for the two live spans (so baggage processors and
other enrichers see them) and ``on_end`` for every span with finished ``ReadableSpan`` objects —
the same objects the SDK itself would hand over. The provider's span limits apply to all of them.

Only an SDK ``TracerProvider`` allows this; with any other provider (no-op, or a vendor's own)
:func:`span_writer` returns None and no consumer spans are written.

**The SDK's own samplers are evaluated, not called.** ``ParentBased``, ``TraceIdRatioBased``,
``ALWAYS_ON``/``ALWAYS_OFF`` and their env-var forms (``OTEL_TRACES_SAMPLER``) are pure functions
of the parent's flags and the trace id; for them (exact classes, tried once per writer) the
decision is computed inline with the same result — decision, attributes, trace state — as their
``should_sample`` would return, without building the parent ``Context`` and the
``SamplingResult`` (BENCHMARKS.md). Any other sampler (a subclass, a wrapper, a vendor's) is
called as before, with the parent context, the sampling-relevant attributes and the link.

SDK internals used here and nowhere else (opentelemetry-sdk 1.45): the proxy tracer's
``_real_tracer``, the SDK tracer's ``_is_enabled`` and ``_span_limits``, and the stock samplers'
fields (``StaticSampler._decision``, ``TraceIdRatioBased.bound``, ``ParentBased._root`` and its
four ``_*_parent_*`` delegates).
"""

from __future__ import annotations

import random
import sys
import traceback
from typing import Any, Callable, Mapping, Sequence

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, sampling
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.util.types import Attributes, AttributeValue

from ..path.names import SCHEMA_URL
from ..path.propagation import span_context
from ..version import __version__
from .chain import ProcessorChain

__all__ = ["SCOPE", "DeferredSpan", "SpanWriter", "add_own_attributes", "exception_attributes", "record_error",
           "span_writer"]

SCOPE = InstrumentationScope("rmqtrace", __version__, SCHEMA_URL)
_NO_LIMITS = SpanLimits()
_EMPTY = Context()  # what the sampler's parent context is built on: only the parent span matters
_UNSET = Status()  # read-only once made: one for every span that never gets a status
# A new span's flags by (sampled, random trace id): TraceFlags(int) costs a call per span otherwise.
_NEW_FLAGS = {(s, r): TraceFlags((TraceFlags.SAMPLED if s else 0) | (TraceFlags.RANDOM_TRACE_ID if r else 0))
              for s in (False, True) for r in (False, True)}

_SAMPLE, _DROP = sampling.Decision.RECORD_AND_SAMPLE, sampling.Decision.DROP
# TraceFlags' bits, tested directly: its .sampled / .random_trace_id are property calls
_SAMPLED_BIT, _RANDOM_BIT = int(TraceFlags.SAMPLED), int(TraceFlags.RANDOM_TRACE_ID)

# A stock sampler as a function: (the valid parent or None, trace id) -> its decision.
Decide = Callable[[SpanContext | None, int], sampling.Decision]
# The SDK classes whose should_sample is known and pure (exact types: a subclass may override it).
_STATIC = tuple(t for t in (sampling.StaticSampler, getattr(sampling, "_AlwaysOn", None),
                            getattr(sampling, "_AlwaysOff", None)) if isinstance(t, type))
_RATIO = (sampling.TraceIdRatioBased,)
_PARENT_BASED = tuple(t for t in (sampling.ParentBased, sampling.ParentBasedTraceIdRatio,
                                  getattr(sampling, "_ParentBasedAlwaysOn", None),
                                  getattr(sampling, "_ParentBasedAlwaysOff", None)) if isinstance(t, type))


def stock_decider(sampler: Any) -> Decide | None:
    """The decision function of one of the SDK's stock samplers, or None for any other sampler.

    Each branch is that class's ``should_sample`` (opentelemetry-sdk 1.45) with the parent given
    as its span context: ``ParentBased`` picks a delegate by the parent's remote and sampled flags
    (the root one without a valid parent), ``TraceIdRatioBased`` compares the trace id's low 64
    bits with its bound, a ``StaticSampler`` returns its decision."""
    t = type(sampler)
    try:
        if t in _STATIC:
            decision = sampler._decision
            if not isinstance(decision, sampling.Decision):
                return None
            return lambda parent, trace_id: decision
        if t in _RATIO:
            bound, limit = int(sampler.bound), sampling.TraceIdRatioBased.TRACE_ID_LIMIT
            yes, no = sampling.Decision.RECORD_AND_SAMPLE, sampling.Decision.DROP
            return lambda parent, trace_id: yes if trace_id & limit < bound else no
        if t in _PARENT_BASED:
            parts: list[Decide] = []
            for delegate in (sampler._root, sampler._remote_parent_sampled, sampler._remote_parent_not_sampled,
                             sampler._local_parent_sampled, sampler._local_parent_not_sampled):
                part = stock_decider(delegate)
                if part is None:
                    return None
                parts.append(part)
            root, remote_yes, remote_no, local_yes, local_no = parts

            def parent_based(parent: SpanContext | None, trace_id: int) -> sampling.Decision:
                if parent is None:
                    return root(parent, trace_id)
                if parent.is_remote:
                    pick = remote_yes if parent.trace_flags & _SAMPLED_BIT else remote_no
                else:
                    pick = local_yes if parent.trace_flags & _SAMPLED_BIT else local_no
                return pick(parent, trace_id)
            return parent_based
    except AttributeError:  # another SDK version's fields: call the sampler instead
        return None
    return None


class SpanWriter:
    """Sampling, ids, limits and the span processor of one SDK tracer."""

    __slots__ = ("tracer", "_sampler", "_stock", "_by_parent", "_ids", "_draw", "_processor", "_chain", "_resource",
                 "_limits", "_random_ids", "_attr_cap", "_links_cap")

    def __init__(self, tracer: SdkTracer) -> None:
        self.tracer = tracer
        self._sampler = tracer.sampler
        self._stock = stock_decider(self._sampler)  # None: the sampler is called (see the module doc)
        # ParentBased with static delegates (the SDK's default): the decision for a parent as a
        # table [remote][sampled], read without calling the decider
        self._by_parent = _parent_table(self._sampler) if self._stock is not None else None
        self._ids = tracer.id_generator
        # the SDK's own generator: its span id drawn here as it draws it (random.getrandbits(64),
        # again while 0), one method call less a span
        self._draw = type(self._ids) is RandomIdGenerator
        self._processor = tracer.span_processor
        self._chain = ProcessorChain(self._processor)  # the same calls, the empty ones left out
        self._resource = tracer.resource
        self._limits: SpanLimits = getattr(tracer, "_span_limits", None) or _NO_LIMITS
        # Our own attributes are bounded only past these (a value length limit bounds always).
        limits = self._limits
        self._attr_cap = -1 if limits.max_span_attribute_length is not None else _cap(limits.max_span_attributes)
        self._links_cap = _cap(limits.max_links)
        self._random_ids = bool(getattr(self._ids, "is_trace_id_random", lambda: False)())

    @property
    def resource(self) -> Resource:
        return self._resource

    @property
    def sampler_called(self) -> bool:
        """Whether :meth:`decide` calls the provider's sampler (else it is a stock one, evaluated
        inline: it reads neither the links nor the attributes, so callers may skip building them)."""
        return self._stock is None

    def decide(self, parent: SpanContext | None, parent_ctx: Context | None, name: str, kind: SpanKind,
               attributes: Attributes, links: Sequence[Link],
               dropped_context: bool = True) -> tuple[SpanContext, dict[str, Any] | None]:
        """A new span's context under the (remote) ``parent``, and the attributes it starts with.

        The attributes are None when the sampler drops the span: its context is then a valid,
        unsampled one for a non-recording span (so what the handler starts shares the decision),
        or ``INVALID_SPAN_CONTEXT`` with ``dropped_context=False`` (the caller makes its own).
        ``parent_ctx`` is the extracted context, if one was built (baggage); else one is made
        from ``parent`` for the sampler.
        """
        # SpanContext is a tuple (trace id, span id, remote, flags, state, valid): read by index
        # below, each a property call less
        if parent is not None and not parent[5]:
            parent = None
        if parent is not None:
            trace_id = parent[0]
            random_id = parent[3] & _RANDOM_BIT
        else:
            trace_id = self._ids.generate_trace_id()
            random_id = self._random_ids
        stock = self._stock
        if stock is not None:
            table = self._by_parent
            if table is not None and parent is not None:
                decision = table[parent[2]][parent[3] & _SAMPLED_BIT]
            else:
                decision = stock(parent, trace_id)
            trace_state = parent[4] if parent is not None else None
            result_attrs: Attributes = attributes
        else:
            if parent is not None and parent_ctx is None:
                parent_ctx = trace.set_span_in_context(NonRecordingSpan(parent), _EMPTY)
            result = self._sampler.should_sample(parent_ctx, trace_id, name, kind, attributes, links)
            decision, trace_state, result_attrs = result.decision, result.trace_state, result.attributes
        if decision is _DROP and not dropped_context:
            return INVALID_SPAN_CONTEXT, None
        span_id = random.getrandbits(64) if self._draw else 0  # as RandomIdGenerator draws it
        ctx = span_context(trace_id, span_id or self._ids.generate_span_id(), False,
                           _NEW_FLAGS[decision is _SAMPLE, bool(random_id)], trace_state)
        if decision is _DROP:
            return ctx, None
        return ctx, dict(result_attrs or {})

    def parent_decision(self, remote: bool, sampled: bool) -> sampling.Decision | None:
        """What the sampler decides for any span under a valid parent with these flags, when that
        is all it reads (a stock ParentBased with static delegates); None otherwise."""
        table = self._by_parent
        return table[remote][sampled] if table is not None else None

    def child_context(self, parent: SpanContext) -> SpanContext:
        # SpanContext is a tuple (trace id, span id, remote, flags, state, valid): its fields by
        # index, not three property calls (four child contexts a full trace)
        span_id = random.getrandbits(64) if self._draw else 0  # as RandomIdGenerator draws it
        return span_context(parent[0], span_id or self._ids.generate_span_id(), False, parent[3], parent[4])

    def start(self, name: str, kind: SpanKind, parent_ctx: Context, start_ns: int, attributes: dict[str, Any],
              links: Sequence[Link] = ()) -> Span:
        """What ``Tracer.start_span`` would return under the span current in ``parent_ctx``, begun at
        ``start_ns``: a :class:`DeferredSpan`, written once at its end (the sampler decided with the
        same name, kind, attributes and links; ``on_start`` has seen it), or, when the sampler drops
        it, the non-recording span with a fresh id the SDK returns (so what is injected agrees)."""
        current = trace.get_current_span(parent_ctx).get_span_context()
        parent = current if current.is_valid else None
        ctx, start_attrs = self.decide(parent, parent_ctx, name, kind, attributes, links)
        if start_attrs is None:
            return NonRecordingSpan(ctx)
        span = DeferredSpan(self, name, ctx, parent, start_ns, kind, start_attrs, links)
        self.started(span, parent_ctx)
        return span

    def started(self, span: DeferredSpan, parent_ctx: Context | None) -> None:
        """Tell the processors a live span began (``parent_ctx``: the context it was started in)."""
        chain = self._chain
        if not chain.flat:
            chain.active.on_start(span, parent_ctx)  # type: ignore[arg-type]
            return
        procs = chain.active._span_processors  # type: ignore[attr-defined]  # ProcessorChain.on_start inline
        if procs is not chain.seen:
            chain.build(procs)
        for start in chain.starts:
            start(span, parent_context=parent_ctx)

    def start_seen(self) -> bool:
        """Whether a processor sees spans start (:meth:`started` calls one): if not, a caller
        need not build the context it would pass."""
        chain = self._chain
        if not chain.flat:
            return True
        procs = chain.active._span_processors  # type: ignore[attr-defined]
        if procs is not chain.seen:
            chain.build(procs)
        return bool(chain.starts)

    def emit(self, name: str, context: SpanContext, parent: SpanContext | None, start_ns: int,
             end_ns: int, kind: SpanKind = SpanKind.INTERNAL,
             attributes: Mapping[str, Any] | None = None, status: Status | None = None,
             events: Sequence[Event] = (), links: Sequence[Link] = (), checked: bool = True) -> None:
        """Hand one finished span to the processors, within the provider's span limits (every
        parameter may be given by position: a keyword call costs more, several times per message).

        ``checked`` says the attributes and links are ours (valid types and values, links without
        attributes): then they are bounded only when a limit could bite, which keeps the common
        case free of per-attribute cleaning.
        """
        limits = self._limits
        attrs: Mapping[str, Any] = attributes or {}
        if not checked or len(attrs) > self._attr_cap:
            attrs = BoundedAttributes(limits.max_span_attributes, attrs, immutable=True,
                                      max_value_len=limits.max_span_attribute_length)
        if events:
            events = BoundedList.from_seq(limits.max_events, events)
        if links and (not checked or len(links) > self._links_cap):
            links = BoundedList.from_seq(limits.max_links, [
                Link(link.context, BoundedAttributes(limits.max_link_attributes, link.attributes, immutable=True,
                                                     max_value_len=limits.max_attribute_length))
                for link in links])
        span = ReadableSpan(name, context, parent, self._resource, attrs, events, links, kind,
                            None, status or _UNSET, start_ns, end_ns, SCOPE)
        chain = self._chain
        # ProcessorChain.on_end inline (five spans a message); context[3]: its trace_flags, not the property call
        if chain.flat and context[3] & _SAMPLED_BIT:
            procs = chain.active._span_processors  # type: ignore[attr-defined]
            if procs is not chain.seen:
                chain.build(procs)
            for end in chain.ends:
                end(span)
        else:
            self._processor.on_end(span)

    def event_attributes(self, attributes: Mapping[str, Any]) -> BoundedAttributes:
        limits = self._limits
        return BoundedAttributes(limits.max_event_attributes, attributes, immutable=True,
                                 max_value_len=limits.max_attribute_length)


def _cap(limit: int | None) -> int:
    return sys.maxsize if limit is None else limit  # None: the limit is off


def _parent_table(sampler: Any) -> tuple[tuple[sampling.Decision, sampling.Decision], ...] | None:
    """((local unsampled, local sampled), (remote unsampled, remote sampled)) decisions of a stock
    ParentBased whose four parent delegates are static; None for any other sampler."""
    if type(sampler) not in _PARENT_BASED:
        return None
    delegates = (sampler._local_parent_not_sampled, sampler._local_parent_sampled,
                 sampler._remote_parent_not_sampled, sampler._remote_parent_sampled)
    if not all(type(d) in _STATIC and isinstance(d._decision, sampling.Decision) for d in delegates):
        return None
    return ((delegates[0]._decision, delegates[1]._decision), (delegates[2]._decision, delegates[3]._decision))


def add_own_attributes(span: Span, attributes: Mapping[str, Any]) -> None:
    """Our own attributes (known-good types) on a recording span: a :class:`DeferredSpan` takes
    them without marking itself for cleaning, any other span through ``set_attributes``."""
    if type(span) is DeferredSpan:
        span.put_attributes(attributes)
    else:
        span.set_attributes(attributes)


def exception_attributes(exception: BaseException) -> dict[str, Any]:
    """The semconv exception event's attributes: type, message, stacktrace. No
    ``exception.escaped`` (deprecated in semconv 1.44), which the SDK's ``record_exception`` writes."""
    return {
        "exception.type": type(exception).__qualname__,
        "exception.message": str(exception),
        "exception.stacktrace": "".join(traceback.format_exception(type(exception), exception,
                                                                   exception.__traceback__)),
    }


def record_error(span: Span, exception: BaseException) -> None:
    """Add the ``exception`` event to ``span`` (any span: the SDK's, ours, a proxy) the way the
    current semconv has it; use this instead of ``span.record_exception``."""
    span.add_event("exception", exception_attributes(exception))


def span_writer(tracer: Any) -> SpanWriter | None:
    """A writer for an SDK tracer (resolving the API's proxy tracer), else None."""
    real = getattr(tracer, "_real_tracer", None) or tracer  # ProxyTracer once the SDK is set
    if isinstance(real, SdkTracer) and getattr(real, "_is_enabled", lambda: True)():
        return SpanWriter(real)
    return None


class DeferredSpan(Span):
    """A recording span whose ids are fixed now and which is written when :meth:`end` is called.

    It stands as a live span while the user's handler runs: spans the handler starts nest under
    it, and attributes, events and status set on it are kept (within the span limits). It also
    reads like a ``ReadableSpan`` (name, context, parent, kind, attributes, times, resource,
    scope) for processors' ``on_start``. It costs a few attribute assignments instead of a full
    SDK span (no lock, no sampler).
    """

    __slots__ = ("_writer", "_name", "_ctx", "_parent", "_start", "_kind", "_attrs", "_events", "_links",
                 "_status", "_ended", "_foreign")

    def __init__(self, writer: SpanWriter, name: str, context: SpanContext, parent: SpanContext | None,
                 start_ns: int, kind: SpanKind = SpanKind.INTERNAL, attributes: dict[str, Any] | None = None,
                 links: Sequence[Link] = ()) -> None:
        self._writer = writer
        self._name = name
        self._ctx = context
        self._parent = parent
        self._start = start_ns
        self._kind = kind
        self._attrs: dict[str, Any] = attributes if attributes is not None else {}
        self._events: list[Event] | None = None  # made on the first event: most spans have none
        self._links = links
        self._status = _UNSET
        self._ended = False
        self._foreign = False  # set when someone else's attributes need cleaning at the end

    # -- the read side processors see ----------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def context(self) -> SpanContext:
        return self._ctx

    @property
    def parent(self) -> SpanContext | None:
        return self._parent

    @property
    def kind(self) -> SpanKind:
        return self._kind

    @property
    def attributes(self) -> Mapping[str, Any]:
        return self._attrs

    @property
    def start_time(self) -> int:
        return self._start

    @property
    def end_time(self) -> int | None:
        return None

    @property
    def resource(self) -> Resource:
        return self._writer.resource

    @property
    def instrumentation_scope(self) -> InstrumentationScope:
        return SCOPE

    @property
    def links(self) -> Sequence[Link]:
        return tuple(self._links)

    @property
    def events(self) -> Sequence[Event]:
        return tuple(self._events or ())

    @property
    def status(self) -> Status:
        return self._status

    # -- the Span API ---------------------------------------------------------------------------
    def get_span_context(self) -> SpanContext:
        return self._ctx

    def is_recording(self) -> bool:
        return not self._ended

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if not self._ended:
            self._foreign = True
            self._attrs.update(attributes)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if not self._ended:
            self._foreign = True
            self._attrs[key] = value

    def move_start(self, start_ns: int) -> None:
        """Correct the start once the clamped timeline is known (before :meth:`end`)."""
        self._start = start_ns

    def put_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Our own attributes (known-good types): no cleaning needed unless a limit bites."""
        self._attrs.update(attributes)

    def own_attributes(self) -> dict[str, Any]:
        """The attribute dict itself, for our own attributes (as :meth:`put_attributes`, one by one)."""
        return self._attrs

    def add_event(self, name: str, attributes: Attributes = None, timestamp: int | None = None) -> None:
        if not self._ended:
            event = Event(name, self._writer.event_attributes(attributes or {}), timestamp)
            if self._events is None:
                self._events = [event]
            else:
                self._events.append(event)

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        if not self._ended and context.is_valid:
            self._foreign = True
            self._links = (*self._links, Link(context, attributes))

    def update_name(self, name: str) -> None:
        self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if isinstance(status, Status):
            self._status = status
        else:
            self._status = Status(status, description)

    def record_exception(self, exception: BaseException, attributes: Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        attrs = exception_attributes(exception)  # no exception.escaped: deprecated (semconv 1.44)
        if attributes:
            attrs.update(attributes)
        self.add_event("exception", attrs, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self._writer.emit(self._name, self._ctx, self._parent, self._start, end_time or self._start, self._kind,
                          self._attrs, self._status, self._events or (), self._links, not self._foreign)
