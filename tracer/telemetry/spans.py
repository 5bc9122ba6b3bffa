"""Spans whose times are known only afterwards, written straight to the SDK's span processors.

A message's ``process`` span and its gap spans (broker_wait, client_buffer, dispatch_wait) are
complete facts by the time the handler ends. Creating them through ``Tracer.start_span`` would
run the sampler, attribute cleaning and locking five times per message; instead this module
decides sampling once (with the provider's own sampler), draws ids from the provider's id
generator, and hands finished ``ReadableSpan`` objects to the tracer's span processor — the same
objects the SDK itself would hand to it. Processors' ``on_start`` is not called for these spans
(they were never live); ``on_end`` is, so batch export, filtering and exporters work unchanged.

Only an SDK ``TracerProvider`` allows this; with any other provider (no-op, or a vendor's own)
:func:`span_writer` returns None and no consumer spans are written.
"""

from __future__ import annotations

import traceback
from typing import Any, Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import Attributes, AttributeValue

from ..version import __version__

SCOPE = InstrumentationScope("rmqtrace", __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(0)


class SpanWriter:
    __slots__ = ("tracer", "_sampler", "_ids", "_processor", "_resource")

    def __init__(self, tracer: SdkTracer) -> None:
        self.tracer = tracer
        self._sampler = tracer.sampler
        self._ids = tracer.id_generator
        self._processor = tracer.span_processor
        self._resource = tracer.resource

    def root_context(self, parent: SpanContext | None, name: str, kind: SpanKind) -> SpanContext | None:
        """The context of a new span under the (remote) ``parent``; None when the sampler drops it."""
        parent_ctx: Context | None = None
        if parent is not None and parent.is_valid:
            trace_id = parent.trace_id
            parent_ctx = trace.set_span_in_context(NonRecordingSpan(parent))
        else:
            trace_id = self._ids.generate_trace_id()
        result = self._sampler.should_sample(parent_ctx, trace_id, name, kind)
        if not result.decision.is_recording():  # type: ignore[no-untyped-call]
            return None
        return SpanContext(trace_id, self._ids.generate_span_id(), is_remote=False,
                           trace_flags=_SAMPLED if result.decision.is_sampled() else _UNSAMPLED,  # type: ignore[no-untyped-call]
                           trace_state=result.trace_state)

    def child_context(self, parent: SpanContext) -> SpanContext:
        return SpanContext(parent.trace_id, self._ids.generate_span_id(), is_remote=False,
                           trace_flags=parent.trace_flags, trace_state=parent.trace_state)

    def emit(self, name: str, context: SpanContext, parent: SpanContext | None, start_ns: int,
             end_ns: int, *, kind: SpanKind = SpanKind.INTERNAL,
             attributes: Mapping[str, Any] | None = None, status: Status | None = None,
             events: Sequence[Event] = ()) -> None:
        span = ReadableSpan(name, context, parent, self._resource, attributes or {}, events, (), kind,
                            None, status or Status(), start_ns, end_ns, SCOPE)
        self._processor.on_end(span)


def span_writer(tracer: Any) -> SpanWriter | None:
    """A writer for an SDK tracer (resolving the API's proxy tracer), else None."""
    real = getattr(tracer, "_real_tracer", None) or tracer  # ProxyTracer once the SDK is set
    if isinstance(real, SdkTracer) and getattr(real, "_is_enabled", lambda: True)():
        return SpanWriter(real)
    return None


class DeferredSpan(Span):
    """A recording span whose ids are fixed now and which is written when :meth:`end` is called.

    It stands as the current span while the user's handler runs: spans the handler starts nest
    under it, and attributes, events and status set on it are kept. It costs a few attribute
    assignments instead of a full SDK span (no lock, no sampler, no ``on_start``).
    """

    __slots__ = ("_writer", "_name", "_ctx", "_parent", "_start", "_attrs", "_events", "_status", "_ended")

    def __init__(self, writer: SpanWriter, name: str, context: SpanContext, parent: SpanContext,
                 start_ns: int) -> None:
        self._writer = writer
        self._name = name
        self._ctx = context
        self._parent = parent
        self._start = start_ns
        self._attrs: dict[str, Any] = {}
        self._events: list[Event] = []
        self._status = Status()
        self._ended = False

    def get_span_context(self) -> SpanContext:
        return self._ctx

    def is_recording(self) -> bool:
        return not self._ended

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if not self._ended:
            self._attrs.update(attributes)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if not self._ended:
            self._attrs[key] = value

    def add_event(self, name: str, attributes: Attributes = None, timestamp: int | None = None) -> None:
        if not self._ended:
            self._events.append(Event(name, attributes, timestamp))

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        pass  # a handler span links to nothing; links belong on the process span

    def update_name(self, name: str) -> None:
        self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if isinstance(status, Status):
            self._status = status
        else:
            self._status = Status(status, description)

    def record_exception(self, exception: BaseException, attributes: Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        attrs: dict[str, Any] = {
            "exception.type": type(exception).__qualname__,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            attrs.update(attributes)
        self.add_event("exception", attrs, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self._writer.emit(self._name, self._ctx, self._parent, self._start, end_time or self._start,
                          attributes=self._attrs, status=self._status, events=self._events)



