"""Probes end to end on the real local RocketMQ 5.5 (proxy gRPC 127.0.0.1:8081): ``rmqtrace probe``
sends, the consume loop and a push consumer's traced listener settle them — probe series present,
the user's handler never called for a probe, every probe acked and not delivered again."""

from __future__ import annotations

import threading

import pytest
from rmq_real import (
    ENDPOINT,
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

from tracer.clients.consume import ConsumeLoop
from tracer.clients.probe import ProbeSender, is_probe
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer
from tracer.tools.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rmq():
    ensure_broker()
    return client()


def probe_count(registry, topic: str, group: str) -> float:
    return registry.get_sample_value("rmqtrace_probe_received_total", {"topic": topic, "consumer_group": group}) or 0


def test_cli_probes_through_the_consume_loop_are_settled_acked_and_never_handled(rmq, registry, capsys):
    topic, group = fresh_topic("rt-probe"), fresh_group("rt-probe")
    consumer = start_simple(group, topic)
    handled: list[bytes] = []
    tracer = MessageTracer(consumer_group=group, metrics=TracerMetrics(registry))
    loop = ConsumeLoop(consumer, lambda m: handled.append(m.body), tracer=tracer, workers=2, invisible_duration=2)
    runner = threading.Thread(target=loop.run, name="test-probe-loop", daemon=True)
    runner.start()
    try:
        # real-time: the CLI paces its probes 0.2 s apart, as `rmqtrace probe` does in production
        assert main(["probe", "--endpoint", ENDPOINT, "--topic", topic, "--count", "3", "--interval", "0.2"]) == 0
        assert "3 probes sent, 0 failed" in capsys.readouterr().out
        producer = start_producer(topic)
        producer.send(message(topic, "real-1"))
        quietly(producer.shutdown)
        wait_until(lambda: probe_count(registry, topic, group) >= 3 and handled, timeout=60, what="3 probes and 1 message")
        wait_until(lambda: loop.statistics().acked >= 4, timeout=30, what="4 acks")
    finally:
        loop.stop()
        runner.join(30)
    assert handled == [b"real-1"]
    lab = {"topic": topic, "consumer_group": group}
    for stage in ("send", "broker_wait", "client_buffer", "dispatch_wait", "consumer_wait", "end_to_end"):
        assert registry.get_sample_value("rmqtrace_probe_stage_duration_seconds_count", {"stage": stage, **lab}) == 3
    assert registry.get_sample_value("rmqtrace_probe_last_seen_timestamp_seconds", lab) > 0
    assert registry.get_sample_value("rmqtrace_messages_total", {"outcome": "success", **lab}) == 1  # the real one
    assert loop.statistics().redelivered == 0 and loop.statistics().ack_errors == 0
    # acked, so not delivered again: an un-acked one would be back 2 s (lease) + 2-3.5 s (revive) later
    again = start_simple(group, topic, await_duration=4)
    try:
        assert [m for _ in range(2) for m in again.receive(32, 2)] == []
    finally:
        quietly(again.shutdown)
        quietly(consumer.shutdown)


def test_push_consumer_traced_listener_settles_probes_without_calling_the_listener(rmq, registry):
    from tracer.clients.official import TracedListener

    topic, group = fresh_topic("rt-probe-push"), fresh_group("rt-probe-push")
    calls: list[bytes] = []
    probes_seen: list[bool] = []

    class Listener(rmq.MessageListener):
        def consume(self, msg):
            probes_seen.append(is_probe(msg))
            calls.append(msg.body)
            return rmq.ConsumeResult.SUCCESS

    tracer = MessageTracer(consumer_group=group, metrics=TracerMetrics(registry))
    consumer = rmq.PushConsumer(configuration(), group, TracedListener(Listener(), tracer),
                                {topic: rmq.FilterExpression()}, consumption_thread_count=2)
    consumer.startup()
    producer = start_producer(topic)
    try:
        sender = ProbeSender(producer, topic, rmq.Message)
        assert sender.send_one() and sender.send_one()
        producer.send(message(topic, "real-1"))
        wait_until(lambda: probe_count(registry, topic, group) >= 2 and calls, timeout=60,
                   what="2 probes and 1 message through the push consumer")
    finally:
        quietly(producer.shutdown)
        quietly(consumer.shutdown)
    assert calls == [b"real-1"] and probes_seen == [False]
    lab = {"topic": topic, "consumer_group": group}
    # the push consumer's pool wait is the probe's dispatch_wait, as for a real message
    assert registry.get_sample_value("rmqtrace_probe_stage_duration_seconds_count",
                                     {"stage": "dispatch_wait", **lab}) == 2
    assert registry.get_sample_value("rmqtrace_messages_total", {"outcome": "success", **lab}) == 1


@pytest.mark.parametrize(("endpoint", "made", "says"), [
    ("127.0.0.1:1", True, ["no RocketMQ proxy answers at 127.0.0.1:1", "make stack"]),
    (ENDPOINT, False, ["does not exist on the broker at", "rmq.sh topic "]),
], ids=["broker-down", "topic-missing"])
def test_cli_says_whether_the_broker_is_down_or_the_topic_missing(rmq, capsys, endpoint, made, says):
    """Both failed with the same line ("failed to fetch topic:T route.") and exit 2, the bad-argument
    status; each is a failure of the run (1) with its own line and next step (issue 33)."""
    from rmq_real import unique

    topic = fresh_topic("rt-probe-cli") if made else unique("rt-probe-missing")
    assert main(["probe", "--endpoint", endpoint, "--topic", topic, "--count", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rmqtrace probe: error: "), err
    assert all(word in err for word in says) and "failed to fetch" not in err, err
    if not made:
        assert f"rmq.sh topic {topic}" in err


def test_instrumented_simple_consumer_never_returns_a_probe_and_acks_it(rmq, registry):
    from tracer.clients.instrumentor import RocketMQInstrumentor

    topic, group = fresh_topic("rt-probe-inst"), fresh_group("rt-probe-inst")
    producer = start_producer(topic)
    consumer = start_simple(group, topic)
    sender = ProbeSender(producer, topic, rmq.Message)
    assert sender.send_one() and sender.send_one()
    producer.send(message(topic, "real-1"))
    inst = RocketMQInstrumentor()
    inst.instrument(registry=registry)
    got: list = []
    try:
        wait_until(lambda: got.extend(consumer.receive(16, 2)) or probe_count(registry, topic, group) >= 2 and got,
                   timeout=30, what="2 probes settled and the real message received")
        for m in got:
            consumer.ack(m)
    finally:
        inst.uninstrument()
    assert [m.body for m in got] == [b"real-1"]
    quietly(producer.shutdown)
    quietly(consumer.shutdown)
    # the probes were acked on receive: nothing comes back after their 2 s lease (+ the revive delay)
    again = start_simple(group, topic, await_duration=4)
    try:
        assert [m for _ in range(2) for m in again.receive(16, 2)] == []
    finally:
        quietly(again.shutdown)
