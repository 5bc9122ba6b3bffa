"""DemandPushConsumer: the PushConsumer's constructor and lifecycle over the demand-driven loop.

The same rules on the embedded broker and on the real proxy: SUCCESS acks; FAILURE, an exception
or a wrong-kind answer gives the message back (it returns with delivery_attempt 2); shutdown
drains what is held and stops the listener; the lifecycle is start once, stop once.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
from waiting import wait_until

from tracer.clients.demandpush import DemandPushConsumer
from tracer.clients.quiet import import_quietly
from tracer.embedded import EmbeddedBroker
from tracer.embedded import Message as EmbeddedMessage
from tracer.embedded import Producer as EmbeddedProducer
from tracer.telemetry.tracer import MessageTracer

rmq = import_quietly()


@dataclass
class Backend:
    name: str
    configuration: Any
    topic: str
    group: str
    send: Callable[[str], str]  # body -> message id
    close: Callable[[], None] = lambda: None


def _embedded() -> Backend:
    broker = EmbeddedBroker()
    broker.create_topic("dp")
    producer = EmbeddedProducer(broker, ["dp"])
    producer.startup()

    def send(body: str) -> str:
        m = EmbeddedMessage()
        m.topic, m.body = "dp", body.encode()
        return str(producer.send(m).message_id)

    return Backend("embedded", broker, "dp", "dp-group", send, producer.shutdown)


def _proxy() -> Backend:
    from rmq_real import configuration, ensure_broker, fresh_group, fresh_topic, message, quietly, start_producer

    ensure_broker()
    topic, group = fresh_topic("dp"), fresh_group("dp")
    producer = start_producer(topic)

    def send(body: str) -> str:
        return str(producer.send(message(topic, body)).message_id)

    return Backend("proxy", configuration(), topic, group, send, lambda: quietly(producer.shutdown))


@pytest.fixture(params=["embedded", pytest.param("proxy", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    b = _embedded() if request.param == "embedded" else _proxy()
    yield b
    b.close()


@dataclass
class Listener(rmq.MessageListener):  # type: ignore[misc,name-defined]
    """Answers per (body, attempt) from ``answers``; records every call."""

    answers: dict[tuple[str, int], Callable[[], Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, int]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    hold: set[str] = field(default_factory=set)

    def consume(self, message: Any) -> Any:
        body = bytes(message.body).decode()
        self.calls.append((body, str(message.message_id), int(message.delivery_attempt)))
        if body in self.hold:
            self.release.wait(30)
        answer = self.answers.get((body, int(message.delivery_attempt)))
        return answer() if answer else rmq.ConsumeResult.SUCCESS


def _consumer(b: Backend, listener: Listener, spans: Any = None, **kw: Any) -> DemandPushConsumer:
    tracer = MessageTracer(consumer_group=b.group, tracer_provider=spans[0]) if spans else None
    return DemandPushConsumer(b.configuration, b.group, listener, {b.topic: rmq.FilterExpression()},
                              consumption_thread_count=2, tracer=tracer, retry_backoff=lambda attempt: 1.0, **kw)


def _boom() -> Any:
    raise RuntimeError("handler failed")


def test_success_acks_failure_exception_and_wrong_answers_come_back(backend: Backend, spans: Any) -> None:
    listener = Listener({("fail", 1): lambda: rmq.ConsumeResult.FAILURE, ("raise", 1): _boom,
                         ("none", 1): lambda: None})
    c = _consumer(backend, listener, spans)
    c.startup()
    try:
        ids = {body: backend.send(body) for body in ("ok", "fail", "raise", "none")}
        wait_until(lambda: c.statistics().acked >= 4, timeout=60, what="all four acked")
    finally:
        c.shutdown()
    attempts = sorted((body, attempt) for body, _mid, attempt in listener.calls)
    # invariant: SUCCESS is acked once; every other answer gives the message back exactly once
    assert attempts == [("fail", 1), ("fail", 2), ("none", 1), ("none", 2), ("ok", 1), ("raise", 1), ("raise", 2)]
    assert {body: mid for body, mid, _a in listener.calls} == ids  # the same message came back
    s = c.statistics()
    assert (s.acked, s.failed, s.retry_scheduled, s.ack_errors) == (4, 3, 3, 0)
    process = [x for x in spans[1].get_finished_spans() if x.name == f"process {backend.topic}"]
    outcomes = sorted((x.attributes["rmqtrace.delivery_attempt"], x.attributes["rmqtrace.outcome"]) for x in process)
    assert outcomes == [(1, "failure")] * 3 + [(1, "success")] + [(2, "success")] * 3
    assert all(x.attributes["messaging.consumer.group.name"] == backend.group for x in process)


def test_shutdown_drains_the_running_message_then_the_listener_is_not_called(backend: Backend) -> None:
    listener = Listener(hold={"slow"})
    c = _consumer(backend, listener, shutdown_timeout=30)
    c.startup()
    backend.send("slow")
    wait_until(lambda: bool(listener.calls), timeout=30, what="the slow message started")
    stopping = threading.Thread(target=c.shutdown)
    stopping.start()
    time.sleep(0.3)  # real-time: shutdown must wait for the running handler, not return now
    assert stopping.is_alive()
    backend.send("during")  # a receive already in flight may still bring it: then it is run and acked
    listener.release.set()
    stopping.join(40)
    assert not stopping.is_alive() and not c.running
    first = list(listener.calls)
    assert first[0][0] == "slow" and {b for b, _m, _a in first} <= {"slow", "during"}
    assert c.statistics().acked == len(first) and c.statistics().failed == 0
    backend.send("after")
    after = Listener()
    c2 = _consumer(backend, after)
    c2.startup()
    try:
        want = {"slow", "during", "after"} - {b for b, _m, _a in first}
        wait_until(lambda: {b for b, _m, _a in after.calls} >= want, timeout=30, what="the rest delivered")
        time.sleep(0.5)  # real-time: room for a wrong second delivery to show up
    finally:
        c2.shutdown()
    # invariant: once shutdown returned the old listener is never called again
    assert listener.calls == first
    # invariant: every message handled exactly once across the two consumers (drained ones were acked)
    assert sorted(b for b, _m, _a in first + after.calls) == ["after", "during", "slow"]


def test_lifecycle_is_start_once_stop_once() -> None:
    b = _embedded()
    c = _consumer(b, Listener())
    with pytest.raises(RuntimeError, match="created, not running"):
        c.shutdown()
    c.startup()
    with pytest.raises(RuntimeError, match="start it once"):
        c.startup()
    c.shutdown()
    with pytest.raises(RuntimeError, match="stopped"):
        c.shutdown()
    with pytest.raises(RuntimeError, match="stopped"):
        c.startup()


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"message_listener": object()}, TypeError),
    ({"subscription": {}}, ValueError),
    ({"consumer_group": ""}, ValueError),
    ({"consumption_thread_count": 0}, ValueError),
    ({"shutdown_timeout": -1}, ValueError),
    ({"startup_timeout": 0}, ValueError),
])
def test_bad_arguments_are_loud(kwargs: dict[str, Any], error: type[Exception]) -> None:
    args: dict[str, Any] = {"client_configuration": EmbeddedBroker(), "consumer_group": "g",
                            "message_listener": Listener(), "subscription": {"t": None}}
    args.update(kwargs)
    with pytest.raises(error):
        DemandPushConsumer(**args)


def test_same_positional_signature_as_the_stock_push_consumer() -> None:
    import inspect

    stock = list(inspect.signature(rmq.PushConsumer.__init__).parameters)[1:]
    ours = list(inspect.signature(DemandPushConsumer.__init__).parameters)[1:]
    # every stock parameter but the client type, in the same order, so PushConsumer( → DemandPushConsumer( works
    assert ours[:len(stock) - 1] == [p for p in stock if p != "client_type"]


def test_traced_by_the_instrumentor_once_per_message(backend: Backend, spans: Any, registry: Any) -> None:
    from tracer.clients.instrumentor import RocketMQInstrumentor

    provider, exporter = spans
    inst = RocketMQInstrumentor()
    inst.instrument(tracer_provider=provider, registry=registry)
    try:
        listener = Listener()
        c = DemandPushConsumer(backend.configuration, backend.group, listener, {backend.topic: rmq.FilterExpression()},
                               consumption_thread_count=2)  # no tracer=: the instrumentor's
        c.startup()
        try:
            ids = sorted(backend.send(f"m{i}") for i in range(3))
            wait_until(lambda: c.statistics().acked >= 3, timeout=30, what="three acked")
        finally:
            c.shutdown()
    finally:
        inst.uninstrument()
    process = [x for x in exporter.get_finished_spans() if x.name == f"process {backend.topic}"]
    # invariant: one process span per delivery, from the instrumentor's provider, never two
    assert sorted(x.attributes["messaging.message.id"] for x in process) == ids
    assert registry.get_sample_value("rmqtrace_messages_total", {
        "topic": backend.topic, "consumer_group": backend.group, "outcome": "success"}) == 3


def test_a_proxy_that_never_answers_fails_startup_loudly_and_it_can_be_retried() -> None:
    # the 5.1.2 client's startup() returns at once against a dead port; without the proxy's
    # settings every receive would fail for ever, so startup says so instead
    cfg = rmq.ClientConfiguration("127.0.0.1:1", rmq.Credentials())
    c = DemandPushConsumer(cfg, "g", Listener(), {"t": rmq.FilterExpression()}, startup_timeout=0.5)
    with pytest.raises(ConnectionError, match="no settings from the RocketMQ proxy within 0.5 s"):
        c.startup()
    assert not c.running
    with pytest.raises(ConnectionError):
        c.startup()  # still "created": a second try is allowed, and fails the same way


def test_a_hung_listener_gives_its_message_back_and_its_copies_bounce_once_per_lease() -> None:
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("dp")
    producer = EmbeddedProducer(broker, ["dp"])
    producer.startup()
    b = Backend("embedded", broker, "dp", "dp-group", lambda body: "", producer.shutdown)
    gate = threading.Event()
    hang_s, lease_s = 6.0, 4.0
    listener = Listener(answers={("hangs", 1): lambda: gate.wait(30) and rmq.ConsumeResult.SUCCESS})
    c = _consumer(b, listener, handler_timeout=0.3, invisible_duration=lease_s)
    c.startup()
    release = threading.Timer(hang_s, gate.set)
    try:
        m = EmbeddedMessage()
        m.topic, m.body = "dp", b"hangs"
        producer.send(m)
        release.start()
        wait_until(lambda: c.statistics().acked >= 1, timeout=40, what="a later copy acked once the hung call returned")
    finally:
        release.cancel()
        gate.set()
        c.shutdown()
        producer.shutdown()
    s = c.statistics()
    calls = [(body, attempt) for body, _m, attempt in listener.calls]
    # invariant: no second copy runs while the first hangs; the copies received meanwhile are given
    # back for at least a lease each (not the 1 s retry backoff: a hot loop against the broker)
    assert calls[0] == ("hangs", 1) and len(calls) == 2 and calls[1][1] == s.given_back + 2
    assert 1 <= s.given_back <= math.ceil(hang_s / lease_s), s
    assert s.failed == 1 and s.acked == 1


def test_a_failed_fifo_message_takes_its_group_s_later_ones_back_unrun() -> None:
    # built on ConsumeLoop, so it inherits successors_follow: fails before (branch fifofail) with
    # a0 a1 a0 a1 a2 a3 — a1 ran past the failed a0, then again
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("dpf", fifo=True, queues=1)
    producer = EmbeddedProducer(broker, ["dpf"])
    producer.startup()
    for body in ("a0", "a1", "a2", "a3"):  # before the start: its first receive takes a0 and a1 (2 workers)
        m = EmbeddedMessage()
        m.topic, m.body, m.message_group = "dpf", body.encode(), "a"
        producer.send(m)
    listener = Listener(answers={("a0", 1): _boom})
    b = Backend("embedded", broker, "dpf", "dpf-group", lambda body: "", producer.shutdown)
    c = _consumer(b, listener, invisible_duration=10)
    c.startup()
    try:
        wait_until(lambda: c.statistics().acked >= 4, timeout=40, what="the group acked after its rerun")
    finally:
        c.shutdown()
        producer.shutdown()
    assert [body for body, _m, _a in listener.calls] == ["a0", "a0", "a1", "a2", "a3"], listener.calls
    s = c.statistics()
    assert (s.acked, s.failed) == (4, 1) and s.not_started >= 1, s  # a1 at least went back with a0
