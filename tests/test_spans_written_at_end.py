"""Spans written once at their end (issue 20 items 2 and 4): on the SDK, the ``send``, ``receive``
and ``settle`` spans are :class:`~tracer.telemetry.spans.DeferredSpan` objects begun by
``MessageTracer.start_span_at``. Each must be the span ``Tracer.start_span`` would have produced
(name, kind, attributes in order, links, parent, status, events, scope, resource, flags), be seen by
a called sampler and by ``on_start``, and, when the sampler drops it, be written nowhere while the
operation is still measured. One table of operations; a test checks every caller of
``start_span_at`` in the package is in it."""

from __future__ import annotations

import ast
import pathlib
from typing import Any, Callable, NamedTuple

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from recording_sampler import Recording

import tracer
from tracer.clients.official import TracedSimpleConsumer
from tracer.clients.producer import TracedProducer
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.message import ClientFacts
from tracer.telemetry.otel_metrics import MessagingMeters
from tracer.telemetry.tracer import MessageTracer


class Rig(NamedTuple):
    act: Callable[[], Any]  # the operation; raises ConnectionError when the client is broken
    tracer: MessageTracer
    reader: InMemoryMetricReader
    message: Message | None  # what a send injected into


def _message() -> Message:
    m = Message()
    m.topic, m.body, m.tag, m.keys = "T", b"hello", "tagA", ["k1", "k2"]
    return m


def _broken(*_a: Any, **_k: Any) -> Any:
    raise ConnectionError("proxy gone")


def _measured(t: MessageTracer) -> InMemoryMetricReader:
    reader = InMemoryMetricReader()
    t.meters = MessagingMeters(MeterProvider(metric_readers=[reader]))
    return reader


def _send_rig(provider: TracerProvider, fail: bool) -> Rig:
    broker = EmbeddedBroker()
    broker.create_topic("T")
    raw = Producer(broker, ["T"])
    raw.startup()
    if fail:
        raw.send = _broken  # type: ignore[method-assign]
    t = MessageTracer(tracer_provider=provider, client=ClientFacts(client_id="p-1"))
    producer = TracedProducer(raw, t)
    m = _message()
    return Rig(lambda: producer.send(m), t, _measured(t), m)


def _consumer(provider: TracerProvider, settle_spans: bool = False) -> tuple[TracedSimpleConsumer, MessageTracer]:
    broker = EmbeddedBroker()
    broker.create_topic("T")
    producer = TracedProducer(Producer(broker), MessageTracer(tracer_provider=TracerProvider()))
    producer.startup()
    for body in (b"a", b"b"):
        m = _message()
        m.body = body
        producer.send(m)
    raw = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    raw.startup()
    t = MessageTracer(consumer_group="G", tracer_provider=provider, client=ClientFacts(client_id="client-7"))
    return TracedSimpleConsumer(raw, t, settle_spans=settle_spans), t


def _receive_rig(provider: TracerProvider, fail: bool) -> Rig:
    consumer, t = _consumer(provider)
    if fail:
        consumer.wrapped.receive = _broken
    return Rig(lambda: consumer.receive(8, 30), t, _measured(t), None)


def _settle_rig(provider: TracerProvider, fail: bool) -> Rig:
    consumer, t = _consumer(provider, settle_spans=True)
    first, _second = consumer.receive(8, 30)
    if fail:
        consumer.wrapped.ack = _broken
    return Rig(lambda: consumer.ack(first), t, _measured(t), None)


class Op(NamedTuple):
    rig: Callable[[TracerProvider, bool], Rig]
    span: str  # the span's name
    kind: SpanKind
    operation: str  # messaging.operation.name on the histogram
    failed_span: str  # the name when the call failed (a failed receive has no topic)


OPS = {
    "send": Op(_send_rig, "send T", SpanKind.PRODUCER, "send", "send T"),
    "receive": Op(_receive_rig, "receive T", SpanKind.CLIENT, "receive", "receive"),
    "settle": Op(_settle_rig, "ack T", SpanKind.CLIENT, "ack", "ack T"),
}


def _provider(sampler: Any = None) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    if isinstance(sampler, Recording):
        provider.add_span_processor(sampler)  # type: ignore[arg-type]
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _shape(span: Any) -> tuple[Any, ...]:
    events = [(e.name, {k: v for k, v in e.attributes.items() if k != "exception.stacktrace"}) for e in span.events]
    # message ids differ between the two runs (embedded ids are unique per process): only their presence counts
    attrs = [(k, "<id>" if k == "messaging.message.id" else v) for k, v in span.attributes.items()]
    return (span.name, span.kind, attrs,
            [(lk.context.is_remote, lk.context.trace_flags, dict(lk.attributes or {})) for lk in span.links],
            span.parent is not None, span.parent.is_remote if span.parent else None,
            span.status.status_code, span.status.description, events,
            span.instrumentation_scope, span.resource.attributes, span.context.trace_flags)


def _run(op: Op, provider: TracerProvider, fail: bool, sdk_span: bool = False) -> Rig:
    rig = op.rig(provider, fail)
    if sdk_span:
        rig.tracer.writer = lambda: None  # type: ignore[method-assign]  # as under a non-SDK provider
    if fail:
        with pytest.raises(ConnectionError):
            rig.act()
    else:
        rig.act()
    return rig


def _injected(m: Message) -> Any:
    """The span context a sent message carries, read as any W3C consumer would."""
    ctx = TraceContextTextMapPropagator().extract({"traceparent": m.properties["traceparent"]})
    return trace.get_current_span(ctx).get_span_context()


def _points(reader: InMemoryMetricReader, operation: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "messaging.client.operation.duration" for p in m.data.data_points
            if p.attributes["messaging.operation.name"] == operation]


@pytest.mark.parametrize("fail", [False, True], ids=["done", "failed"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_the_span_written_at_its_end_is_the_span_the_sdk_would_have_started(name: str, fail: bool) -> None:
    op = OPS[name]
    shapes = []
    for sdk_span in (False, True):
        provider, exporter = _provider()
        with provider.get_tracer("user").start_as_current_span("user job") as outer:
            rig = _run(op, provider, fail, sdk_span)
        (span,) = [s for s in exporter.get_finished_spans() if s.name == (op.failed_span if fail else op.span)]
        assert span.kind is op.kind and span.start_time <= span.end_time
        assert span.parent is not None and span.parent.span_id == outer.get_span_context().span_id
        if rig.message is not None and not fail:  # what a send injects is its own span's context
            ctx = _injected(rig.message)
            assert (ctx.trace_id, ctx.span_id) == (span.context.trace_id, span.context.span_id)
        if not fail and name != "receive":
            assert span.attributes["messaging.message.id"]
        if fail:
            assert span.attributes["error.type"] == "ConnectionError" and not span.status.is_ok
        shapes.append(_shape(span))
    assert shapes[0] == shapes[1]


@pytest.mark.parametrize("name", sorted(OPS))
def test_a_called_sampler_sees_the_spans_name_kind_and_attributes_and_on_start_sees_it(name: str) -> None:
    op = OPS[name]
    rec = Recording(Decision.RECORD_AND_SAMPLE)
    provider, exporter = _provider(rec)
    _run(op, provider, fail=False)
    (asked,) = [a for a in rec.asked if a[0] == op.span]
    assert asked[1] is op.kind and asked[2]["messaging.destination.name"] == "T"
    assert asked[2]["messaging.system"] == "rocketmq"
    if name == "receive":
        assert asked[2]["messaging.batch.message_count"] == 2 and len(asked[3]) == 2
    (span,) = [s for s in exporter.get_finished_spans() if s.name == op.span]
    assert [s.context for s in rec.started if s.name == op.span] == [span.context]


@pytest.mark.parametrize("name", sorted(OPS))
def test_a_span_the_sampler_drops_is_not_written_but_the_operation_is_measured(name: str) -> None:
    op = OPS[name]
    rec = Recording(Decision.DROP)
    provider, exporter = _provider(rec)
    rig = _run(op, provider, fail=False)
    assert [s for s in exporter.get_finished_spans() if s.name == op.span] == []
    assert [s for s in rec.started if s.name == op.span] == []
    assert sum(p.count for p in _points(rig.reader, op.operation)) == 1
    if rig.message is not None:  # the consumer follows the decision
        ctx = _injected(rig.message)
        assert ctx.is_valid and not ctx.trace_flags.sampled
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left current


def _calls_of(attr: str) -> list[str]:
    """``module:function`` of every call ``<anything>.<attr>(...)`` in the package's source."""
    root = pathlib.Path(tracer.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and node.func.attr == attr):
                        found.append(f"{path.stem}:{fn.name}")
    return found


def test_every_span_begun_by_start_span_at_is_in_the_table() -> None:
    """A new caller of start_span_at must join OPS, so its span is compared with the SDK's."""
    covered = {"tracer:start_send": "send", "operations:_receive_ended": "receive", "operations:settle": "settle"}
    assert sorted(set(_calls_of("start_span_at"))) == sorted(covered)
    assert sorted(covered.values()) == sorted(OPS)
