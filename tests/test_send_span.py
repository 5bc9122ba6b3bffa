"""The ``send`` span written once at its end (issue 20 item 4): on the SDK it is a DeferredSpan —
it must be the span ``Tracer.start_span`` would have produced (name, kind, attributes in order,
parent, status, events, scope, flags), seen by a called sampler and by ``on_start``, and a
dropped one must inject the unsampled context the SDK would."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from recording_sampler import Recording

from tracer.clients.producer import TracedProducer
from tracer.embedded import EmbeddedBroker, Message, Producer
from tracer.telemetry.tracer import MessageTracer


def _rig(sampler: Any = None, sdk_span: bool = False, fail: bool = False) -> tuple[Any, Any, Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    if isinstance(sampler, Recording):
        provider.add_span_processor(sampler)  # type: ignore[arg-type]
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    broker = EmbeddedBroker()
    broker.create_topic("T")
    raw = Producer(broker, ["T"])
    raw.startup()
    if fail:
        def broken(*a: Any, **k: Any) -> Any:
            raise ConnectionError("proxy gone")

        raw.send = broken  # type: ignore[method-assign]
    tracer = MessageTracer(tracer_provider=provider, client_id="p-1")
    if sdk_span:
        tracer.writer = lambda: None  # type: ignore[method-assign]  # as under a non-SDK provider
    return TracedProducer(raw, tracer), exporter, provider


def _message() -> Message:
    m = Message()
    m.topic, m.body, m.tag, m.keys = "T", b"hello", "tagA", ["k1", "k2"]
    return m


def _injected(m: Message) -> Any:
    """The span context the message carries, read as any W3C consumer would."""
    ctx = TraceContextTextMapPropagator().extract({"traceparent": m.properties["traceparent"]})
    return trace.get_current_span(ctx).get_span_context()


def _shape(span: Any) -> tuple[Any, ...]:
    events = [(e.name, {k: v for k, v in e.attributes.items() if k != "exception.stacktrace"}) for e in span.events]
    return (span.name, span.kind, list(span.attributes.items()), list(span.links), span.parent is not None,
            span.parent.is_remote if span.parent else None, span.status.status_code, span.status.description,
            events, span.instrumentation_scope, span.resource.attributes, span.context.trace_flags)


@pytest.mark.parametrize("fail", [False, True], ids=["sent", "failed"])
def test_the_send_span_written_at_its_end_is_the_span_the_sdk_would_have_started(fail: bool) -> None:
    shapes = []
    for sdk_span in (False, True):
        producer, exporter, provider = _rig(sdk_span=sdk_span, fail=fail)
        m = _message()
        with provider.get_tracer("user").start_as_current_span("user job") as outer:
            if fail:
                with pytest.raises(ConnectionError):
                    producer.send(m)
            else:
                producer.send(m)
        (span,) = [s for s in exporter.get_finished_spans() if s.name == "send T"]
        assert span.kind is SpanKind.PRODUCER and span.start_time <= span.end_time
        assert span.parent is not None and span.parent.span_id == outer.get_span_context().span_id
        if not fail:  # the traceparent injected is this span's own context
            ctx = _injected(m)
            assert (ctx.trace_id, ctx.span_id) == (span.context.trace_id, span.context.span_id)
            assert span.attributes["messaging.message.id"]
        shapes.append(_shape(span))
    assert shapes[0] == shapes[1]


def test_a_called_sampler_sees_the_send_spans_name_kind_and_attributes_and_on_start_sees_it() -> None:
    rec = Recording(Decision.RECORD_AND_SAMPLE)
    producer, exporter, _provider = _rig(sampler=rec)
    producer.send(_message())
    (asked,) = [a for a in rec.asked if a[0] == "send T"]
    assert asked[1] is SpanKind.PRODUCER and asked[2]["messaging.destination.name"] == "T"
    assert asked[2]["messaging.operation.type"] == "send"
    (span,) = exporter.get_finished_spans()
    assert [s.context for s in rec.started] == [span.context]


def test_a_send_span_the_sampler_drops_is_not_written_and_injects_an_unsampled_context() -> None:
    rec = Recording(Decision.DROP)
    producer, exporter, _provider = _rig(sampler=rec)
    m = _message()
    producer.send(m)
    assert exporter.get_finished_spans() == () and rec.started == []
    ctx = _injected(m)
    assert ctx.is_valid and not ctx.trace_flags.sampled  # the consumer follows the decision
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left current
