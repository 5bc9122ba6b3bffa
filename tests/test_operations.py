"""receive and settle of the pull consumer: spans and messaging.client.operation.duration, as the
messaging conventions define them for pull-based consumers; on the embedded broker and the proxy."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tracer.clients.official import TracedSimpleConsumer
from tracer.clients.producer import TracedProducer
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.message import ClientFacts
from tracer.telemetry.otel_metrics import SEMCONV_BUCKETS, MessagingMeters
from tracer.telemetry.tracer import MessageTracer


def _setup(settle_spans: bool = False, client_id: str | None = "client-7") -> tuple[Any, ...]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    broker = EmbeddedBroker()
    broker.create_topic("T")
    producer = TracedProducer(Producer(broker), MessageTracer(tracer_provider=provider))
    producer.startup()
    raw = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    raw.startup()
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, client=ClientFacts(client_id=client_id))
    tracer.meters = MessagingMeters(MeterProvider(metric_readers=[reader]))
    return producer, TracedSimpleConsumer(raw, tracer, settle_spans=settle_spans), exporter, reader


def _send(producer: Any, body: str = "x") -> None:
    m = Message()
    m.topic, m.body = "T", body.encode()
    producer.send(m)


def _operations(reader: InMemoryMetricReader) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "messaging.client.operation.duration" for p in m.data.data_points]


def _by_op(reader: InMemoryMetricReader, name: str) -> Any:
    (point,) = [p for p in _operations(reader) if p.attributes["messaging.operation.name"] == name]
    return point


def test_receive_is_a_client_span_linked_to_every_message_and_a_histogram_point() -> None:
    producer, consumer, exporter, reader = _setup()
    _send(producer, "a")
    _send(producer, "b")
    got = consumer.receive(8, 30)
    assert len(got) == 2
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("receive")]
    assert span.name == "receive T" and span.kind is SpanKind.CLIENT
    a = span.attributes
    assert a["messaging.system"] == "rocketmq"
    assert a["messaging.operation.name"] == "receive" and a["messaging.operation.type"] == "receive"
    assert a["messaging.destination.name"] == "T" and a["messaging.consumer.group.name"] == "G"
    assert a["messaging.batch.message_count"] == 2 and a["messaging.client.id"] == "client-7"
    sends = {s.context.span_id for s in exporter.get_finished_spans() if s.name == "send T"}
    assert {link.context.span_id for link in span.links} == sends  # each message's creation context
    point = _by_op(reader, "receive")
    assert point.count == 1 and list(point.explicit_bounds) == list(SEMCONV_BUCKETS)
    assert point.attributes == {"messaging.system": "rocketmq", "messaging.operation.name": "receive",
                                "messaging.operation.type": "receive", "messaging.destination.name": "T",
                                "messaging.consumer.group.name": "G"}
    assert point.sum == pytest.approx((span.end_time - span.start_time) / 1e9)  # the span's own duration


def test_an_empty_receive_is_measured_but_writes_no_span() -> None:
    """An idle long poll: no trace per poll (the Java agent's Kafka poll writes none either)."""
    _, consumer, exporter, reader = _setup()
    assert consumer.receive(8, 30) == []
    assert consumer.receive(8, 30) == []
    assert exporter.get_finished_spans() == ()
    point = _by_op(reader, "receive")
    assert point.count == 2 and "messaging.destination.name" not in point.attributes


def test_a_failed_receive_is_a_span_with_its_error_and_a_point() -> None:
    _, consumer, exporter, reader = _setup()

    def broken(*a: Any) -> Any:
        raise ConnectionError("proxy gone")

    consumer.wrapped.receive = broken
    with pytest.raises(ConnectionError):
        consumer.receive(8, 30)
    (span,) = exporter.get_finished_spans()
    assert span.name == "receive" and span.attributes["error.type"] == "ConnectionError"
    assert "messaging.batch.message_count" not in span.attributes
    assert _by_op(reader, "receive").attributes["error.type"] == "ConnectionError"


def test_the_receive_span_is_a_child_of_what_was_current_at_the_call() -> None:
    producer, consumer, exporter, reader = _setup()
    _send(producer)
    with consumer.operations.tracer.tracer.start_as_current_span("user loop") as outer:
        (msg,) = consumer.receive(8, 30)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "receive T"]
    assert span.parent is not None and span.parent.span_id == outer.get_span_context().span_id
    assert span.attributes["messaging.destination.name"] == "T"  # known at start: the sampler saw it


def test_settle_is_measured_always_and_a_span_only_when_opted_in() -> None:
    for opted in (False, True):
        producer, consumer, exporter, reader = _setup(settle_spans=opted)
        _send(producer)
        _send(producer)
        first, second = consumer.receive(8, 30)
        consumer.ack(first)
        consumer.change_invisible_duration(second, 10)
        settles = [s for s in exporter.get_finished_spans() if s.attributes.get("messaging.operation.type") == "settle"]
        assert _by_op(reader, "ack").attributes["messaging.operation.type"] == "settle"
        assert _by_op(reader, "change_invisible_duration").attributes["messaging.operation.type"] == "settle"
        if not opted:
            assert settles == []
            continue
        assert sorted(s.name for s in settles) == ["ack T", "change_invisible_duration T"]
        ack = next(s for s in settles if s.name == "ack T")
        assert ack.kind is SpanKind.CLIENT and ack.attributes["messaging.message.id"] == first.message_id
        assert ack.attributes["messaging.client.id"] == "client-7"
        assert ack.attributes["messaging.consumer.group.name"] == "G"


def test_a_failed_receive_passes_through_with_error_type_on_span_and_metric() -> None:
    _, consumer, exporter, reader = _setup()

    def refuse(*_a: Any) -> Any:
        raise TimeoutError("proxy says no")

    consumer.wrapped.receive = refuse
    with pytest.raises(TimeoutError):
        consumer.receive(8, 30)
    (span,) = exporter.get_finished_spans()
    assert span.attributes["error.type"] == "TimeoutError" and not span.status.is_ok
    assert _by_op(reader, "receive").attributes["error.type"] == "TimeoutError"


def test_the_process_span_carries_the_consumers_client_id() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    broker = EmbeddedBroker()
    broker.create_topic("T")
    producer = TracedProducer(Producer(broker), MessageTracer(tracer_provider=provider))
    producer.startup()
    raw = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    raw.startup()
    raw.client_id = "from-the-client"  # what a 5.x SimpleConsumer says about itself
    consumer = TracedSimpleConsumer(raw, MessageTracer(consumer_group="G", tracer_provider=provider))
    _send(producer)
    (msg,) = consumer.receive(1, 30)
    with consumer.processing(msg):
        pass
    consumer.ack(msg)
    for name in ("process T", "receive T"):
        span = next(s for s in exporter.get_finished_spans() if s.name == name)
        assert span.attributes["messaging.client.id"] == "from-the-client"




def test_receive_async_ends_its_span_when_the_future_resolves_and_traces_the_messages() -> None:
    from concurrent.futures import Future, ThreadPoolExecutor

    producer, consumer, exporter, reader = _setup()
    raw = consumer.wrapped
    gate = ThreadPoolExecutor(1)
    release: Future[None] = Future()

    def receive_async(n: int, invisible: int) -> Future[Any]:  # the 5.x client's shape, on the embedded broker
        def later() -> Any:
            release.result(10)
            return raw.receive(n, invisible)
        return gate.submit(later)

    raw.receive_async = receive_async
    _send(producer)
    fut = consumer.receive_async(8, 30)
    assert not [s for s in exporter.get_finished_spans() if s.name.startswith("receive")]  # still open
    release.set_result(None)
    (msg,) = fut.result(10)
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("receive")]
    assert span.name == "receive T" and span.attributes["messaging.batch.message_count"] == 1
    assert len(span.links) == 1
    consumer.ack(msg)  # the message was traced: its process span ends at the ack
    assert [s.name for s in exporter.get_finished_spans()].count("process T") == 1
    assert _by_op(reader, "receive").count == 1
    gate.shutdown()


def test_a_broken_tracer_provider_never_stops_receive_or_ack(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(TracerProvider):
        def get_tracer(self, *a: Any, **k: Any) -> Any:
            class T:
                def start_span(self, *a: Any, **k: Any) -> Any:
                    raise RuntimeError("vendor SDK bug")
            return T()

    broker = EmbeddedBroker()
    broker.create_topic("T")
    producer = Producer(broker)
    producer.startup()
    raw = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    raw.startup()
    consumer = TracedSimpleConsumer(raw, MessageTracer(consumer_group="G", tracer_provider=Broken()), settle_spans=True)
    _send(producer)
    (msg,) = consumer.receive(1, 30)
    consumer.ack(msg)
    assert "starting the receive span failed" in caplog.text and "starting a settle span failed" in caplog.text


# -- the real proxy ----------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("seam", ["wrapper", "instrumentor"])
def test_receive_and_settle_on_the_real_proxy(seam: str) -> None:
    from rmq_real import client, ensure_broker, fresh_group, fresh_topic, message, quietly, start_producer, start_simple
    from waiting import wait_until

    from tracer.clients.instrumentor import RocketMQInstrumentor

    ensure_broker()
    rmq = client()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    topic, group = fresh_topic(f"rt-ops-{seam[:4]}"), fresh_group(f"rt-ops-{seam[:4]}")
    producer = start_producer(topic)
    raw = start_simple(group, topic)
    inst = None
    names = ("receive", "receive_async", "ack", "change_invisible_duration", "ack_async")
    before = [rmq.SimpleConsumer.__dict__[name] for name in names]
    if seam == "wrapper":
        consumer: Any = TracedSimpleConsumer(raw, MessageTracer(consumer_group=group, tracer_provider=provider),
                                             settle_spans=True)
    else:
        inst = RocketMQInstrumentor()
        from prometheus_client import CollectorRegistry
        inst.instrument(tracer_provider=provider, registry=CollectorRegistry(), settle_spans=True)
        consumer = raw
    try:
        for body in ("a", "b", "c", "d"):
            producer.send(message(topic, body))
        got: list[Any] = []
        wait_until(lambda: got.extend(consumer.receive_async(1, 15).result(30)) or len(got) >= 1, timeout=30,
                   what="a message through receive_async")
        wait_until(lambda: got.extend(consumer.receive(16, 15)) or len(got) >= 4, timeout=30, what="four messages")
        consumer.ack(got[0])
        consumer.change_invisible_duration(got[1], 10)
        # the 5.1.2 client returns None from both, and builds an asyncio.Future in the calling
        # thread: without an event loop set there (any thread but a fresh main one) it raises
        _with_an_event_loop(lambda: consumer.ack_async(got[2]))
        _with_an_event_loop(lambda: consumer.change_invisible_duration_async(got[3], 10))
    finally:
        if inst is not None:
            inst.uninstrument()
        quietly(raw.shutdown)
        quietly(producer.shutdown)
    assert [rmq.SimpleConsumer.__dict__[name] for name in names] == before  # unpatched again
    finished = exporter.get_finished_spans()
    receives = [s for s in finished if s.attributes.get("messaging.operation.type") == "receive"]
    assert receives and all(s.kind is SpanKind.CLIENT for s in receives)
    client_id = raw.client_id
    assert client_id and all(s.attributes["messaging.client.id"] == client_id for s in receives)
    assert all(s.attributes["server.address"] and s.attributes["messaging.consumer.group.name"] == group
               for s in receives)
    with_messages = [s for s in receives if s.attributes["messaging.batch.message_count"] > 0]
    assert with_messages and all(s.name == f"receive {topic}" for s in with_messages)
    settles = sorted(s.name for s in finished if s.attributes.get("messaging.operation.type") == "settle")
    assert settles == [f"ack {topic}", f"change_invisible_duration {topic}"]  # the async ones are not timed
    processes = [s for s in finished if s.name == f"process {topic}"]
    assert len(processes) == 4  # acked and nacked, sync and async: each ended its message's trace (issue 31)


def _with_an_event_loop(call: Any) -> None:
    """``call()`` in a thread of its own with an event loop set (what the 5.1.2 client's async
    settles need), re-raising what it raised."""
    import asyncio
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            errors.append(exc)
        finally:
            loop.close()

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    if errors:
        raise errors[0]


@pytest.mark.integration
def test_instrumented_clients_each_carry_their_own_client_id() -> None:
    from prometheus_client import CollectorRegistry
    from rmq_real import (
        client,
        configuration,
        ensure_broker,
        fresh_group,
        fresh_topic,
        message,
        quietly,
        start_producer,
        start_simple,
    )
    from waiting import wait_until

    from tracer.clients.instrumentor import RocketMQInstrumentor

    ensure_broker()
    rmq = client()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    topic, group, push_group = fresh_topic("rt-cid"), fresh_group("rt-cid"), fresh_group("rt-cid-push")
    producer = start_producer(topic)
    inst = RocketMQInstrumentor()
    inst.instrument(tracer_provider=provider, registry=CollectorRegistry())
    simple = [start_simple(group, topic), start_simple(group, topic)]

    class Listener(rmq.MessageListener):
        def consume(self, msg: Any) -> Any:
            return rmq.ConsumeResult.SUCCESS

    push = rmq.PushConsumer(configuration(), push_group, Listener(), {topic: rmq.FilterExpression()})
    try:
        push.startup()
        for i in range(6):
            producer.send(message(topic, f"m{i}"))
        got: dict[int, list[Any]] = {0: [], 1: []}

        def receive_some() -> bool:
            for i, c in enumerate(simple):
                if len(got[i]) < 1:
                    for m in c.receive(1, 15):  # one each: a batch could take them all
                        got[i].append(m)
                        c.ack(m)
            return all(got.values())

        wait_until(receive_some, timeout=60, what="a message on each of two consumers of one group")
        wait_until(lambda: any(s.attributes.get("messaging.consumer.group.name") == push_group
                               for s in exporter.get_finished_spans() if s.name == f"process {topic}"),
                   timeout=60, what="a message through the push consumer")
    finally:
        inst.uninstrument()
        for c in [*simple, push]:
            quietly(c.shutdown)
        quietly(producer.shutdown)
    ids = {c.client_id for c in simple}
    assert len(ids) == 2  # two clients, two ids
    finished = exporter.get_finished_spans()
    by_message = {m.message_id: c.client_id for i, c in enumerate(simple) for m in got[i]}
    for span in finished:
        mid = span.attributes.get("messaging.message.id")
        if span.name == f"process {topic}" and mid in by_message \
                and span.attributes["messaging.consumer.group.name"] == group:  # the push group has them too
            assert span.attributes["messaging.client.id"] == by_message[mid]  # its own consumer's, not the first's
    receive_ids = {s.attributes["messaging.client.id"] for s in finished
                   if s.attributes.get("messaging.operation.type") == "receive"}
    assert receive_ids == ids
    push_process = [s for s in finished if s.name == f"process {topic}"
                    and s.attributes.get("messaging.consumer.group.name") == push_group]
    assert push_process and all(s.attributes["messaging.client.id"] == push.client_id for s in push_process)
    sends = [s for s in finished if s.name == f"send {topic}"]
    assert sends and all(s.attributes["messaging.client.id"] == producer.client_id for s in sends)
