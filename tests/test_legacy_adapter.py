"""The legacy 2.x adapter (tracer.clients.legacy) against fakes with the 2.x API — no broker, no
native library. The real client against the real broker: tests/test_legacy_real.py."""

from __future__ import annotations

import sys
import types
from collections import namedtuple
from enum import IntEnum

import pytest
from gap_shape import expected_children

from tracer.clients import legacy
from tracer.clients.legacy import (
    KNOWN_PROPERTIES,
    TracedLegacyProducer,
    describe_legacy,
    produced_fields,
    traced_callback,
)
from tracer.path.propagation import PRODUCE_NS, TRACEPARENT
from tracer.path.stages import Stage
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer

SendResult = namedtuple("SendResult", ["status", "msg_id", "offset"])


class ConsumeStatus(IntEnum):  # rocketmq.client.ConsumeStatus
    CONSUME_SUCCESS = 0
    RECONSUME_LATER = 1


class FakeMessage:
    """rocketmq.client.Message: setters only; the values live in the native message."""

    def __init__(self, topic: str) -> None:
        self._native = {"topic": topic.encode(), "tags": b"", "keys": b"", "body": b"", "props": {}}

    def set_keys(self, keys: str) -> None:
        self._native["keys"] = keys.encode()

    def set_tags(self, tags: str) -> None:
        self._native["tags"] = tags.encode()

    def set_body(self, body: str | bytes) -> None:
        self._native["body"] = body.encode() if isinstance(body, str) else body

    def set_property(self, key: str, value: str) -> None:
        self._native["props"][key.encode()] = value.encode()


class ReadableMessage(FakeMessage):
    """A 2.x-style message that also carries its fields as attributes (a subclass a user might write)."""

    @property
    def topic(self) -> str:
        return self._native["topic"].decode()

    @property
    def tags(self) -> bytes:
        return self._native["tags"]

    @property
    def keys(self) -> bytes:
        return self._native["keys"]


class FakeReceived:
    """rocketmq.client.ReceivedMessage: bytes for tags/keys/body/properties, str id/topic."""

    def __init__(self, sent: FakeMessage, msg_id: str, store_ms: int, reconsume_times: int = 0) -> None:
        n = sent._native
        self.id = msg_id
        self.topic = n["topic"].decode()
        self.tags = n["tags"]
        self.keys = n["keys"]
        self.body = n["body"]
        self.reconsume_times = reconsume_times
        self.born_timestamp = store_ms - 1
        self.store_timestamp = store_ms
        self.queue_id = 0
        self._props = dict(n["props"])
        self._props[b"UNIQ_KEY"] = msg_id.encode()
        self.asked: list[str] = []

    def get_property(self, prop: str) -> bytes:
        self.asked.append(prop)
        return self._props.get(prop.encode(), b"")


class FakeProducer:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.sent: list[FakeMessage] = []
        self.fail = fail
        self.started = False

    def start(self) -> None:
        self.started = True

    def set_name_server_address(self, addr: str) -> None:
        self.name_server = addr

    def send_sync(self, msg: FakeMessage) -> SendResult:
        if self.fail is not None:
            raise self.fail
        self.sent.append(msg)
        return SendResult(0, f"MSG{len(self.sent):04d}", len(self.sent))

    def send_orderly_with_sharding_key(self, msg: FakeMessage, key: str) -> SendResult:
        return self.send_sync(msg)

    def send_oneway(self, msg: FakeMessage) -> None:
        self.sent.append(msg)


def now_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


def setup(provider, registry):
    producer = TracedLegacyProducer(FakeProducer(), MessageTracer(tracer_provider=provider))
    consumer_tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry))
    return producer, consumer_tracer


def test_send_then_callback_gives_a_linked_trace_with_six_stamps(spans, registry):
    provider, exporter = spans
    producer, tracer = setup(provider, registry)
    stamps = []
    tracer.listeners.append(lambda t, o: stamps.append(t.stamps))
    m = ReadableMessage("T")
    m.set_tags("tg")
    m.set_keys("k1 k2")
    m.set_body("hello")
    receipt = producer.send_sync(m, job_id="J", cost=4)
    assert receipt.msg_id == "MSG0001"
    props = {k.decode(): v.decode() for k, v in m._native["props"].items()}
    assert TRACEPARENT in props and PRODUCE_NS in props and props["rmqtrace_job"] == "J"

    calls = []

    def callback(msg):
        calls.append(msg.id)
        return ConsumeStatus.CONSUME_SUCCESS

    result = traced_callback(callback, tracer)(FakeReceived(m, receipt.msg_id, now_ms()))
    assert result is ConsumeStatus.CONSUME_SUCCESS and calls == ["MSG0001"]
    (s,) = stamps
    assert all(s.has(st) for st in Stage)
    assert s.get(Stage.CLIENT_PULL) == s.get(Stage.DISPATCH_ENQUEUE) <= s.get(Stage.HANDLER_START)

    by_name = {sp.name: sp for sp in exporter.get_finished_spans()}
    # the callback's client buffer is empty (pull = enqueue): no span for it
    assert sorted(by_name) == sorted(["process T", "send T", *expected_children(by_name["process T"].attributes)])
    assert "client_buffer" not in by_name
    send, process = by_name["send T"], by_name["process T"]
    assert process.parent.span_id == send.context.span_id and process.context.trace_id == send.context.trace_id
    assert send.attributes["messaging.message.id"] == "MSG0001"
    assert send.attributes["messaging.rocketmq.message.tag"] == "tg"
    assert list(send.attributes["messaging.rocketmq.message.keys"]) == ["k1", "k2"]
    assert process.attributes["rmqtrace.delivery_attempt"] == 1
    assert process.attributes["rmqtrace.job.id"] == "J" and process.attributes["rmqtrace.cost"] == 4.0
    assert list(process.attributes["messaging.rocketmq.message.keys"]) == ["k1", "k2"]
    for child in ("broker_wait", "dispatch_wait", "handler"):
        assert by_name[child].parent.span_id == process.context.span_id
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": "T", "consumer_group": "G", "outcome": "success"}) == 1


def test_only_our_properties_are_read_from_a_received_message(spans, registry):
    provider, _ = spans
    producer, tracer = setup(provider, registry)
    m = ReadableMessage("T")
    m.set_body("x")
    m.set_property("secret", "do not read")
    r = producer.send_sync(m)
    received = FakeReceived(m, r.msg_id, now_ms(), reconsume_times=2)
    info = describe_legacy(received)
    assert set(received.asked) == set(KNOWN_PROPERTIES)
    assert set(info.properties) == {TRACEPARENT, PRODUCE_NS}  # absent ones (b'') are left out
    assert info.delivery_attempt == 3 and info.message_id == r.msg_id and info.topic == "T"
    assert info.store_ms == received.store_timestamp and info.body_size == 1


def test_reconsume_later_and_exceptions_are_failures_that_pass_through(spans, registry):
    provider, exporter = spans
    producer, tracer = setup(provider, registry)
    m = ReadableMessage("T")
    m.set_body("x")
    r = producer.send_sync(m)
    wrapped = traced_callback(lambda msg: ConsumeStatus.RECONSUME_LATER, tracer)
    assert wrapped(FakeReceived(m, r.msg_id, now_ms())) is ConsumeStatus.RECONSUME_LATER

    def boom(msg):
        raise KeyError("user bug")

    with pytest.raises(KeyError):
        traced_callback(boom, tracer)(FakeReceived(m, r.msg_id, now_ms(), reconsume_times=1))
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": "T", "consumer_group": "G", "outcome": "failure"}) == 2
    handlers = [s for s in exporter.get_finished_spans() if s.name == "handler"]
    assert any(e.name == "exception" for s in handlers for e in s.events)


def test_a_broken_traceparent_is_counted_and_the_callback_still_runs(spans, registry):
    provider, _ = spans
    _, tracer = setup(provider, registry)
    m = FakeMessage("T")
    m.set_property(TRACEPARENT, "garbage")
    got = []
    traced_callback(lambda msg: got.append(msg) or ConsumeStatus.CONSUME_SUCCESS, tracer)(
        FakeReceived(m, "M1", now_ms()))
    assert len(got) == 1
    assert tracer.errors.counts["traceparent_malformed"] == 1


def test_a_failing_send_raises_the_users_exception_and_marks_the_span(spans, registry):
    provider, exporter = spans
    producer = TracedLegacyProducer(FakeProducer(fail=ConnectionError("broker down")),
                                    MessageTracer(tracer_provider=provider))
    with pytest.raises(ConnectionError):
        producer.send_sync(ReadableMessage("T"))
    (span,) = exporter.get_finished_spans()
    assert span.name == "send T" and not span.status.is_ok


def test_other_send_methods_and_passthrough(spans, registry):
    provider, exporter = spans
    producer, _ = setup(provider, registry)
    producer.start()
    assert producer.wrapped.started
    producer.send_orderly_with_sharding_key(ReadableMessage("T"), "shard")
    producer.send_oneway(ReadableMessage("T"))
    assert [s.name for s in exporter.get_finished_spans()] == ["send T", "send T"]


def test_traced_callback_does_not_wrap_twice(spans, registry):
    provider, _ = spans
    _, tracer = setup(provider, registry)
    cb = traced_callback(lambda m: ConsumeStatus.CONSUME_SUCCESS, tracer)
    assert traced_callback(cb, tracer) is cb


def test_fields_of_a_plain_2x_message_are_read_back_from_the_native_library(monkeypatch):
    """The 2.x Message has no getters: topic/tag/keys come from librocketmq's GetOriginMessage*."""
    natives = {}

    class Func:
        def __init__(self, field):
            self.field = field

        def __call__(self, handle):
            return natives[handle][self.field]

    class Dll:
        def __getitem__(self, name):
            return Func({"GetOriginMessageTopic": "topic", "GetOriginMessageTags": "tags",
                         "GetOriginMessageKeys": "keys"}[name])

    monkeypatch.setitem(sys.modules, "rocketmq.ffi", types.SimpleNamespace(dll=Dll()))
    monkeypatch.setattr(legacy, "_native", legacy._NativeReader())
    m = FakeMessage("T")
    m.set_tags("tg")
    m.set_keys("a b")
    m._handle = 1234
    natives[1234] = m._native
    assert produced_fields(m) == legacy.Produced("T", "tg", ("a", "b"))
    assert produced_fields(object()) == legacy.Produced("", None, ())


def test_instrumentor_patches_and_unpatches_the_legacy_client(monkeypatch, spans, registry):
    """RocketMQInstrumentor on a fake ``rocketmq.client`` module with the 2.x API (the real one
    runs in the legacy venv: tests/test_legacy_real.py)."""
    import tracer.clients.instrumentor as inst_mod

    # the 2.x classes define these methods themselves (no base class)
    body = {k: v for k, v in FakeProducer.__dict__.items() if k.startswith(("send", "start", "set_name"))}
    body["__init__"] = lambda self, group_id: FakeProducer.__init__(self)
    Producer = type("Producer", (), body)

    class PushConsumer:
        def __init__(self, group_id, orderly=False):
            self.callbacks = {}

        def subscribe(self, topic, callback, expression="*"):
            self.callbacks[topic] = callback

    fake = types.ModuleType("rocketmq.client")
    fake.Producer, fake.PushConsumer = Producer, PushConsumer
    try:
        import rocketmq  # noqa: F401 - the 5.x package, when installed, stays the parent
    except ImportError:
        monkeypatch.setitem(sys.modules, "rocketmq", types.ModuleType("rocketmq"))
    monkeypatch.setitem(sys.modules, "rocketmq.client", fake)
    monkeypatch.setattr(inst_mod, "_legacy_only", lambda: True)
    names = [(Producer, "send_sync"), (Producer, "send_orderly_with_sharding_key"), (Producer, "send_oneway"),
             (Producer, "set_name_server_address"), (PushConsumer, "__init__"), (PushConsumer, "subscribe")]
    before = [cls.__dict__[n] for cls, n in names]
    provider, exporter = spans
    inst = inst_mod.RocketMQInstrumentor()
    inst.instrument(tracer_provider=provider, registry=registry, skip_dep_check=True)
    try:
        assert all(cls.__dict__[n] is not b for (cls, n), b in zip(names, before))
        p = Producer("pg")
        m = ReadableMessage("T")
        r = p.send_sync(m)
        c = PushConsumer("cg")
        c.subscribe("T", lambda msg: ConsumeStatus.CONSUME_SUCCESS)
        assert c.callbacks["T"](FakeReceived(m, r.msg_id, now_ms())) is ConsumeStatus.CONSUME_SUCCESS
    finally:
        inst.uninstrument()
    assert [cls.__dict__[n] for cls, n in names] == before
    process = next(s for s in exporter.get_finished_spans() if s.name == "process T")
    send = next(s for s in exporter.get_finished_spans() if s.name == "send T")
    assert process.parent.span_id == send.context.span_id
    assert process.attributes["messaging.consumer.group.name"] == "cg"


def test_baggage_and_another_propagators_keys_are_read_from_a_2x_message(spans, registry):
    from opentelemetry import baggage, propagate
    from opentelemetry import context as otel_context
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    class Extra(TraceContextTextMapPropagator):  # W3C under one more field name, like a vendor's
        @property
        def fields(self):
            return {*super().fields, "x-vendor"}

    provider, _ = spans
    producer, tracer = setup(provider, registry)
    m = ReadableMessage("T")
    m.set_body("x")
    token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        r = producer.send_sync(m)
    finally:
        otel_context.detach(token)
    received = FakeReceived(m, r.msg_id, now_ms())
    assert describe_legacy(received).properties["baggage"] == b"tenant=acme"
    seen = []
    traced_callback(lambda msg: seen.append(baggage.get_baggage("tenant")) or ConsumeStatus.CONSUME_SUCCESS,
                    tracer)(received)
    assert seen == ["acme"]  # the 2.x client hands bytes; the getter decodes them
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([Extra()]))
    try:
        describe_legacy(received)
    finally:
        propagate.set_global_textmap(before)
    assert "x-vendor" in received.asked
