"""The broker bench's clients and modes: what runs in each of ``rmqtrace bench broker``'s modes.

:mod:`tracer.tools.bench.broker` describes the modes and runs them in rotating rounds; here each is
built: a producer to send with, the consumer's tracer (None: untraced or contrib-style), the provider
to flush after a round, a handler wrapper (contrib's ``process`` span) and a helper process's CPU.
"""

from __future__ import annotations

import uuid
from concurrent.futures import Future
from typing import Any, Callable, NamedTuple, Sequence

from opentelemetry import trace as otel_trace
from opentelemetry.propagators.textmap import DefaultGetter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry

from ...clients.producer import TracedProducer
from ...telemetry.exportchild import ChildExportProcessor
from ...telemetry.hold import HoldingSpanProcessor
from ...telemetry.keep import KeepPolicy
from ...telemetry.metrics import TracerMetrics
from ...telemetry.tracer import MessageTracer
from . import DropExporter, contrib_process, rmq_admin
from .threadcpu import process_cpu_s

__all__ = ["Clients", "EncodeOnlyExporter", "Mode", "child_mode", "contrib_mode", "keep_mode", "open_clients",
           "traced_mode"]


class EncodeOnlyExporter(SpanExporter):
    """Encodes every batch to OTLP protobuf bytes, as the OTLP exporter does, and drops them."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        self._encode = encode_spans
        self.spans = 0
        self.bytes = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.bytes += len(self._encode(spans).SerializeToString())
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class Clients(NamedTuple):
    """One run's topic and group, a started plain producer and simple consumer."""

    rmq: Any
    topic: str
    group: str
    producer: Any
    consumer: Any


class Mode(NamedTuple):
    producer: Any
    tracer: MessageTracer | None
    provider: TracerProvider | None
    wrap: Callable[[Callable[[Any], None]], Callable[[Any], None]] | None = None
    helper_cpu_s: Callable[[], float] | None = None  # CPU seconds so far of a helper process (the export child)


class ContribProducer:
    """A ``send`` span per message and ``traceparent`` injected, as a contrib instrumentation does."""

    def __init__(self, producer: Any, tracer: Any) -> None:
        self._producer = producer
        self._tracer = tracer
        self._propagator = TraceContextTextMapPropagator()

    def send_async(self, message: Any) -> Future[Any]:
        topic = message.topic
        span = self._tracer.start_span(f"send {topic}", kind=SpanKind.PRODUCER, attributes={
            "messaging.system": "rocketmq", "messaging.operation.type": "send",
            "messaging.operation.name": "send", "messaging.destination.name": topic})
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, otel_trace.set_span_in_context(span))
        for k, v in carrier.items():
            message.add_property(k, v)
        future: Future[Any] = self._producer.send_async(message)
        future.add_done_callback(lambda _f: span.end())
        return future


class PropertiesGetter(DefaultGetter):
    """Reads the W3C fields from a 5.x message's ``properties`` dict."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = (getattr(carrier, "properties", None) or {}).get(key)
        return [value] if value is not None else None


def contrib_mode(clients: Clients) -> Mode:
    """No rmqtrace: a contrib-style ``send`` span and ``process`` span per message (module doc)."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=1 << 16))
    tracer = provider.get_tracer("contrib-style")
    propagator = TraceContextTextMapPropagator()
    getter = PropertiesGetter()
    group = clients.group

    def wrap(handler: Callable[[Any], None]) -> Callable[[Any], None]:
        def traced(msg: Any) -> None:
            topic = getattr(msg, "topic", "")
            with contrib_process(tracer, propagator.extract(msg, getter=getter), topic, group,
                                 str(getattr(msg, "message_id", ""))):
                handler(msg)
        return traced

    return Mode(ContribProducer(clients.producer, tracer), None, provider, wrap)


def open_clients(rmq: Any, endpoint: str) -> Clients:
    """Create a fresh topic (4 queues) and group, start a producer and a consumer on them."""
    admin = rmq_admin("broker")
    run = uuid.uuid4().hex[:8]
    topic = group = f"rmqtrace-bench-{run}"
    admin.create_topic(topic, queues=4)
    admin.create_group(group)
    config = rmq.ClientConfiguration(endpoint, rmq.Credentials())
    producer = rmq.Producer(config, (topic,))
    producer.startup()
    consumer = rmq.SimpleConsumer(config, group, {topic: rmq.FilterExpression()}, await_duration=1)
    consumer.startup()
    settled = getattr(consumer, "_init_settings_event", None)  # 5.1.2: startup() does not wait for it
    if settled is not None:
        settled.wait(15)
    return Clients(rmq, topic, group, producer, consumer)


def traced_mode(clients: Clients, exporter: SpanExporter, shape: str = "full") -> Mode:
    """A traced producer and consumer tracer (histograms on, every span sampled, the trace
    ``shape``) on their own provider, whose batch processor hands spans to ``exporter``."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 16))
    return Mode(TracedProducer(clients.producer, MessageTracer(tracer_provider=provider)),
                 MessageTracer(consumer_group=clients.group, tracer_provider=provider,
                               metrics=TracerMetrics(CollectorRegistry()), trace_shape=shape),
                 provider)


def child_mode(clients: Clients) -> Mode:
    """``traced`` (full shape) with the spans exported by a child process that OTLP-encodes them."""
    provider = TracerProvider()
    processor = ChildExportProcessor(f"{__name__}:EncodeOnlyExporter", max_queue_size=1 << 16)
    provider.add_span_processor(processor)
    return Mode(TracedProducer(clients.producer, MessageTracer(tracer_provider=provider)),
                 MessageTracer(consumer_group=clients.group, tracer_provider=provider,
                               metrics=TracerMetrics(CollectorRegistry()), trace_shape="full"),
                 provider, helper_cpu_s=lambda: process_cpu_s(processor.child_pid))


def keep_mode(clients: Clients) -> Mode:
    """Head sampling at 1 %, the keep policy deciding the rest on the consumer (see the module doc)."""
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
    hold = HoldingSpanProcessor([BatchSpanProcessor(DropExporter(), max_queue_size=1 << 16)])
    provider.add_span_processor(hold)
    policy = KeepPolicy({"dispatch_wait": 10.0, "end_to_end": 600.0}, background=0.0)
    return Mode(TracedProducer(clients.producer, MessageTracer(tracer_provider=provider)),
                 MessageTracer(consumer_group=clients.group, tracer_provider=provider,
                               metrics=TracerMetrics(CollectorRegistry()), keep=policy, hold=hold),
                 provider)
