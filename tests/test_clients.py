"""Wrappers against the embedded broker (same surface as the 5.x client) and the instrumentor's
patch/unpatch on the real client classes (no broker needed to patch)."""

import time

import pytest

from tracer.clients.official import TracedListener, TracedSimpleConsumer
from tracer.clients.producer import TracedProducer
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.stages import Stage
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer


def make(provider, registry):
    broker = EmbeddedBroker()
    producer = TracedProducer(Producer(broker, ["T"]), MessageTracer(tracer_provider=provider))
    producer.startup()
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    consumer.startup()
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry))
    return producer, TracedSimpleConsumer(consumer, tracer)


def send(producer, body="x"):
    m = Message()
    m.topic, m.body = "T", body.encode()
    return producer.send(m, job_id="J", cost=3)


def test_simple_consumer_processing_scope_gives_handler_span(spans, registry):
    provider, exporter = spans
    producer, consumer = make(provider, registry)
    send(producer)
    (msg,) = consumer.receive(1, 30)
    with consumer.processing(msg):
        pass
    consumer.ack(msg)
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["broker_wait", "client_buffer", "dispatch_wait", "handler", "process T", "receive T", "send T"]
    process = next(s for s in exporter.get_finished_spans() if s.name == "process T")
    assert process.attributes["rmqtrace.job.id"] == "J" and process.attributes["rmqtrace.cost"] == 3.0


def test_simple_consumer_ack_without_scope_takes_receive_to_ack_as_handler(spans, registry):
    provider, exporter = spans
    producer, consumer = make(provider, registry)
    send(producer)
    (msg,) = consumer.receive(1, 30)
    consumer.ack(msg)
    assert registry.get_sample_value("rmqtrace_stage_duration_seconds_count",
                                     {"stage": "handler", "topic": "T", "consumer_group": "G"}) == 1


def test_processing_failure_finishes_as_failure_and_reraises(spans, registry):
    provider, exporter = spans
    producer, consumer = make(provider, registry)
    send(producer)
    (msg,) = consumer.receive(1, 30)
    with pytest.raises(KeyError):
        with consumer.processing(msg):
            raise KeyError("x")
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": "T", "consumer_group": "G", "outcome": "failure"}) == 1


class FakeResult:
    def __init__(self, name):
        self.name = name


class FakeMessage:
    topic = "T"
    message_id = "M"
    properties: dict = {}
    body = b"abc"

    def __init__(self):
        self.decode_message_timestamp = time.time_ns() // 1_000_000


def test_traced_listener_measures_the_pool_queue_as_dispatch_wait(spans, registry):
    provider, exporter = spans
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry))
    stamps = []
    tracer.listeners.append(lambda t, o: stamps.append(t.stamps))

    class Listener:
        def consume(self, message):
            return FakeResult("SUCCESS")

    result = TracedListener(Listener(), tracer).consume(FakeMessage())
    assert result.name == "SUCCESS"
    s = stamps[0]
    assert s.get(Stage.CLIENT_PULL) == s.get(Stage.DISPATCH_ENQUEUE) <= s.get(Stage.HANDLER_START)
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": "T", "consumer_group": "G", "outcome": "success"}) == 1
    # the client buffer is empty by construction here: observed as 0, but no span of no length
    # (Jaeger flags each one "Negative duration detected", on every push-consumer trace)
    labels = {"stage": "client_buffer", "topic": "T", "consumer_group": "G"}
    assert registry.get_sample_value("rmqtrace_stage_duration_seconds_count", labels) == 1
    assert registry.get_sample_value("rmqtrace_stage_duration_seconds_sum", labels) == 0
    written = exporter.get_finished_spans()
    assert {sp.name for sp in written} == {"process T", "dispatch_wait", "handler"}
    assert all(sp.end_time > sp.start_time for sp in written)


def test_traced_listener_lets_user_exceptions_through(spans, registry):
    provider, _ = spans
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry))

    class Listener:
        def consume(self, message):
            raise ValueError("user bug")

    with pytest.raises(ValueError):
        TracedListener(Listener(), tracer).consume(FakeMessage())
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": "T", "consumer_group": "G", "outcome": "failure"}) == 1


def test_instrumentor_patch_and_unpatch_leave_the_client_as_it_was(registry):
    rocketmq = pytest.importorskip("rocketmq")
    from rocketmq import Producer as RProducer
    from rocketmq import PushConsumer
    from rocketmq import SimpleConsumer as RSimple

    from tracer.clients.instrumentor import RocketMQInstrumentor

    names = [(RProducer, "send"), (RProducer, "send_async"), (RSimple, "receive"), (RSimple, "ack"),
             (PushConsumer, "__init__")]
    before = [cls.__dict__[n] for cls, n in names]
    inst = RocketMQInstrumentor()
    inst.instrument(registry=registry)
    try:
        assert all(cls.__dict__[n] is not b for (cls, n), b in zip(names, before))
        assert all(hasattr(cls.__dict__[n], "__wrapped__") for cls, n in names)
    finally:
        inst.uninstrument()
    assert [cls.__dict__[n] for cls, n in names] == before
    assert rocketmq is not None


def test_wrapping_a_5x_client_names_it_in_the_spans(spans):
    pytest.importorskip("rocketmq")
    from tracer.clients.quiet import import_quietly
    rocketmq = import_quietly()
    provider, exporter = spans
    config = rocketmq.ClientConfiguration("127.0.0.1:8081", rocketmq.Credentials(), namespace="ns")
    client = rocketmq.Producer(config, ("T",))  # never started: only its configuration is read
    tracer = MessageTracer(tracer_provider=provider)
    TracedProducer(client, tracer)
    tracer.start_send("T", {}.__setitem__).end()
    (send,) = exporter.get_finished_spans()
    a = send.attributes
    assert a["messaging.client.id"] == client.client_id
    assert (a["server.address"], a["server.port"], a["messaging.rocketmq.namespace"]) == ("127.0.0.1", 8081, "ns")
    assert a["messaging.rocketmq.message.type"] == "normal"


def test_a_received_5x_message_gives_namespace_type_and_endpoint(spans, registry):
    from types import SimpleNamespace
    provider, exporter = spans
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider)
    msg = FakeMessage()
    msg.namespace, msg.message_type = "ns", 3  # the protocol's DELAY
    msg.endpoints = SimpleNamespace(endpoints=SimpleNamespace(addresses=[SimpleNamespace(host="10.0.0.7", port=8081)]))

    class Listener:
        def consume(self, message):
            return FakeResult("FAILURE")

    TracedListener(Listener(), tracer).consume(msg)
    process = next(s for s in exporter.get_finished_spans() if s.name == "process T")
    a = process.attributes
    assert (a["messaging.rocketmq.namespace"], a["messaging.rocketmq.message.type"]) == ("ns", "delay")
    assert (a["server.address"], a["server.port"]) == ("10.0.0.7", 8081)
    assert a["error.type"] == "failure"


def test_a_delay_message_is_sent_as_type_delay(spans):
    provider, exporter = spans
    broker = EmbeddedBroker()
    producer = TracedProducer(Producer(broker, ["T"]), MessageTracer(tracer_provider=provider))
    producer.startup()
    m = Message()
    m.topic, m.body = "T", b"x"
    m.delivery_timestamp = due = int(time.time() * 1000) + 60_000  # what the 5.x Message's setter stores
    producer.send(m)
    (send,) = exporter.get_finished_spans()
    assert send.attributes["messaging.rocketmq.message.type"] == "delay"
    assert send.attributes["messaging.rocketmq.message.delivery_timestamp"] == due


# -- ReceivedTraces is bounded (issue 19 item 4, the wrapper's own table) ------------------------
def _unacked_setup(provider, **bounds):
    from tracer.path.clock import ManualClock

    broker = EmbeddedBroker()
    producer = TracedProducer(Producer(broker, ["T"]), MessageTracer(tracer_provider=provider))
    producer.startup()
    raw = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    raw.startup()
    clock = ManualClock()
    hold = bounds.pop("hold", None)
    consumer = TracedSimpleConsumer(raw, MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock,
                                                       hold=hold))
    if bounds:
        from tracer.clients.official import ReceivedTraces

        consumer.traces = ReceivedTraces(consumer.traces.tracer, **bounds)
    return producer, consumer, clock


def test_messages_never_acked_are_let_go_after_the_holds_age_limit_and_counted(spans):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tracer.telemetry.hold import HoldingSpanProcessor

    provider, exporter = spans
    hold = HoldingSpanProcessor([SimpleSpanProcessor(InMemorySpanExporter())], max_age_s=5, ticker=False)
    producer, consumer, clock = _unacked_setup(provider, hold=hold)  # the bound: the hold's age
    for body in ("handled", "dropped"):
        send(producer, body)
    handled, dropped = consumer.receive(2, 30)
    with consumer.processing(handled):
        pass  # handled, never acked: the broker will redeliver it
    clock.advance(6 * 10**9)
    send(producer, "later")
    (later,) = consumer.receive(1, 30)  # any receive (or ack) checks the ages
    # the never-handled one finished as skipped (no handler: no spans); the handled one forgotten
    assert [x for x in exporter.get_finished_spans() if x.name == "process T"] == []
    assert consumer.traces.get(handled) is None and consumer.traces.get(dropped) is None
    s = consumer.traces.statistics()
    # invariant: tracked + evicted = received - acked; nothing older than the limit is tracked
    assert s.tracked == 1 and s.evicted == {"max_age": 2, "max_traces": 0}
    consumer.ack(later)
    assert consumer.traces.statistics().tracked == 0


def test_at_most_max_traces_unacked_messages_are_tracked_the_oldest_let_go(spans):
    provider, _ = spans
    producer, consumer, _clock = _unacked_setup(provider, max_traces=5)
    kept = []  # the user still holds them (an entry of a message dropped by the user goes by itself)
    for i in range(8):
        send(producer, f"m{i}")
        kept.extend(consumer.receive(1, 30))
    s = consumer.traces.statistics()
    assert s.tracked == 5 and s.evicted == {"max_age": 0, "max_traces": 3}


def test_the_bounds_default_to_the_tracers_hold(spans):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tracer.clients.official import ReceivedTraces
    from tracer.telemetry.hold import HoldingSpanProcessor

    hold = HoldingSpanProcessor([SimpleSpanProcessor(InMemorySpanExporter())], max_age_s=7, max_traces=9,
                                ticker=False)
    tracer = MessageTracer(consumer_group="G", tracer_provider=spans[0], hold=hold)
    assert ReceivedTraces(tracer).limits() == (7 * 10**9, 9)
    assert ReceivedTraces(tracer, max_age_s=2).limits() == (2 * 10**9, 9)
    with pytest.raises(ValueError, match="max_traces"):
        ReceivedTraces(tracer, max_traces=0)
