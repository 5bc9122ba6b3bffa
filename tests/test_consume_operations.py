"""The consume loop's client operations (issue 19 item 9): its ``receive`` calls and its acks and
nacks are ``receive`` / settle operations (spans and ``messaging.client.operation.duration``), its
``process`` spans carry the consumer's ``messaging.client.id``, lease renewals are no operation,
and a ``TracedSimpleConsumer`` handed to the loop traces each message once, not twice.
On the embedded broker and the real proxy."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.clients.official import TracedSimpleConsumer
from tracer.clients.producer import TracedProducer
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.telemetry.otel_metrics import MessagingMeters
from tracer.telemetry.tracer import MessageTracer


class Rig:
    """A traced producer, a raw consumer whose receive calls are recorded, a tracer with meters."""

    def __init__(self, bodies: list[str], client_id: str = "from-the-client") -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        broker = EmbeddedBroker(min_receive_invisible=1)
        broker.create_topic("T")
        producer = TracedProducer(Producer(broker, ["T"]), MessageTracer(tracer_provider=self.provider))
        producer.startup()
        for body in bodies:
            m = Message()
            m.topic, m.body = "T", body.encode()
            producer.send(m)
        raw = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.02)
        raw.startup()
        raw.client_id = client_id  # what a 5.x SimpleConsumer says about itself
        self.batches: list[int] = []  # messages returned by each receive call, in order
        self.lock = threading.Lock()
        receive = raw.receive

        def recorded(n: int, invisible: Any) -> Any:
            got = receive(n, invisible)
            with self.lock:
                self.batches.append(len(got))
            return got

        raw.receive = recorded  # type: ignore[method-assign]
        self.raw = raw
        # no client_id=: the loop must learn it from the consumer
        self.tracer = MessageTracer(consumer_group="G", tracer_provider=self.provider)
        self.tracer.meters = MessagingMeters(MeterProvider(metric_readers=[self.reader]))

    def run(self, loop: ConsumeLoop, acked: int) -> None:
        t = threading.Thread(target=loop.run, daemon=True)
        t.start()
        try:
            assert loop.wait(lambda s: s.acked >= acked, timeout=30), loop.statistics()
        finally:
            loop.stop()
            t.join(30)

    def spans(self, **attrs: Any) -> list[Any]:
        return [s for s in self.exporter.get_finished_spans()
                if all(s.attributes.get(k) == v for k, v in attrs.items())]

    def points(self, operation: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                if m.name == "messaging.client.operation.duration" for p in m.data.data_points
                if p.attributes["messaging.operation.name"] == operation]


def _count(points: list[Any]) -> int:
    return sum(p.count for p in points)


def test_the_loops_process_spans_carry_the_consumers_client_id() -> None:
    rig = Rig(["a", "b", "c"])
    rig.run(ConsumeLoop(rig.raw, lambda m: None, tracer=rig.tracer, invisible_duration=30, workers=2), acked=3)
    process = [s for s in rig.exporter.get_finished_spans() if s.name == "process T"]
    assert len(process) == 3
    assert all(s.attributes["messaging.client.id"] == "from-the-client" for s in process)


def test_one_receive_span_per_receive_call_with_its_batch_count_and_links() -> None:
    rig = Rig([f"m{i}" for i in range(5)])
    rig.run(ConsumeLoop(rig.raw, lambda m: None, tracer=rig.tracer, invisible_duration=30, workers=4), acked=5)
    receives = sorted(rig.spans(**{"messaging.operation.type": "receive"}), key=lambda s: s.start_time)
    with rig.lock:
        batches = list(rig.batches)
    # invariant: a span per call that returned messages (an idle poll writes none), in order, each
    # with the number of messages that call returned
    assert [s.attributes["messaging.batch.message_count"] for s in receives] == [b for b in batches if b]
    assert sum(batches) == 5 and all(s.kind is SpanKind.CLIENT for s in receives)
    assert all(s.attributes["messaging.client.id"] == "from-the-client" for s in receives)
    full = [s for s in receives if s.attributes["messaging.batch.message_count"]]
    assert full and all(s.name == "receive T" for s in full)
    sends = {s.context.span_id for s in rig.exporter.get_finished_spans() if s.name == "send T"}
    assert {link.context.span_id for s in full for link in s.links} == sends  # each message's creation context
    assert _count(rig.points("receive")) == len(batches)  # the histogram: one record per call


@pytest.mark.parametrize("settle_spans", [False, True])
def test_acks_and_retries_are_settle_operations_and_lease_renewals_are_not(settle_spans: bool) -> None:
    rig = Rig(["ok", "fail", "slow"])
    attempts: dict[str, int] = {}

    def handler(m: Any) -> None:
        body = m.body.decode()
        attempts[body] = attempts.get(body, 0) + 1
        if body == "fail" and attempts[body] == 1:
            raise RuntimeError("first attempt fails")
        if body == "slow":
            threading.Event().wait(2.5)  # past a 2 s lease: renewed at least once

    loop = ConsumeLoop(rig.raw, handler, tracer=rig.tracer, invisible_duration=2,
                       **({"settle_spans": True} if settle_spans else {}),
                       workers=3, retry_backoff=lambda attempt: 1.0)
    rig.run(loop, acked=3)
    s = loop.statistics()
    assert s.leases_extended >= 1 and s.retry_scheduled == 1 and s.acked == 3
    assert _count(rig.points("ack")) == 3
    # invariant: change_invisible_duration operations are the nacks, never the renewals
    assert _count(rig.points("change_invisible_duration")) == s.retry_scheduled + s.given_back
    assert all(p.attributes["messaging.operation.type"] == "settle"
               for p in rig.points("ack") + rig.points("change_invisible_duration"))
    settles = rig.spans(**{"messaging.operation.type": "settle"})
    if not settle_spans:
        assert settles == []
        return
    assert sorted(x.name for x in settles) == ["ack T"] * 3 + ["change_invisible_duration T"]
    assert all(x.kind is SpanKind.CLIENT and x.attributes["messaging.client.id"] == "from-the-client"
               for x in settles)


@pytest.mark.parametrize("loop_tracer", ["none", "same"])
def test_a_traced_simple_consumer_in_the_loop_traces_each_message_once(loop_tracer: str) -> None:
    rig = Rig(["a", "b", "c"])
    wrapper = TracedSimpleConsumer(rig.raw, rig.tracer, settle_spans=True)
    loop = ConsumeLoop(wrapper, lambda m: None, tracer=None if loop_tracer == "none" else rig.tracer,
                       invisible_duration=30, workers=2)
    rig.run(loop, acked=3)
    process = [s for s in rig.exporter.get_finished_spans() if s.name == "process T"]
    # invariant: one process span per message, one receive span per receive call that returned
    # messages (not two of each)
    assert sorted(s.attributes["messaging.message.id"] for s in process) == sorted(
        {s.attributes["messaging.message.id"] for s in process})
    assert len(process) == 3
    with rig.lock:
        calls = len([b for b in rig.batches if b])
    assert len(rig.spans(**{"messaging.operation.type": "receive"})) == calls
    assert [x.name for x in rig.spans(**{"messaging.operation.type": "settle"})] == ["ack T"] * 3  # its opt-in
    assert _count(rig.points("ack")) == 3
    assert loop.consumer is rig.raw and loop.tracer is rig.tracer  # the one path: the wrapped client


# -- the real proxy ----------------------------------------------------------------------------
@pytest.mark.integration
def test_the_loop_on_the_real_proxy_traces_receive_and_ack_with_the_client_id() -> None:
    from rmq_real import ensure_broker, fresh_group, fresh_topic, message, quietly, start_producer, start_simple

    ensure_broker()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    topic, group = fresh_topic("rt-loop-ops"), fresh_group("rt-loop-ops")
    producer = start_producer(topic)
    raw = start_simple(group, topic)
    tracer = MessageTracer(consumer_group=group, tracer_provider=provider)
    tracer.meters = MessagingMeters(MeterProvider(metric_readers=[reader]))
    loop = ConsumeLoop(raw, lambda m: None, tracer=tracer, invisible_duration=15, workers=2)
    t = threading.Thread(target=loop.run, daemon=True)
    try:
        for i in range(3):
            producer.send(message(topic, f"m{i}"))
        t.start()
        wait_until(lambda: loop.statistics().acked >= 3, timeout=60, what="three acked through the loop")
    finally:
        loop.stop()
        t.join(30)
        quietly(raw.shutdown)
        quietly(producer.shutdown)
    client_id = raw.client_id
    finished = exporter.get_finished_spans()
    process = [s for s in finished if s.name == f"process {topic}"]
    assert client_id and len(process) == 3
    assert all(s.attributes["messaging.client.id"] == client_id for s in process)
    receives = [s for s in finished if s.attributes.get("messaging.operation.type") == "receive"]
    assert sum(s.attributes["messaging.batch.message_count"] for s in receives) == 3
    assert all(s.attributes["messaging.client.id"] == client_id and s.attributes["server.address"]
               for s in receives)
    data = reader.get_metrics_data()
    assert data is not None
    ops = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
           if m.name == "messaging.client.operation.duration" for p in m.data.data_points]
    by_name: dict[str, int] = {}
    for p in ops:  # a point per attribute set (a receive's destination is there only when it got messages)
        by_name[p.attributes["messaging.operation.name"]] = by_name.get(p.attributes["messaging.operation.name"], 0) + p.count
    # every receive is measured; only those that returned messages wrote a span
    assert by_name.get("ack") == 3 and by_name.get("receive", 0) >= len(receives) >= 1
