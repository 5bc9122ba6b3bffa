"""rmqtrace with the official ``rocketmq-python-client`` 5.1.2 against the real local RocketMQ 5.5
(``services/rocketmq``: proxy gRPC 127.0.0.1:8081). Every test has its own topic and group.

Broker facts these tests lean on (verified in services/rocketmq/README.md): invisibility is counted
in whole seconds, minimum 1 s here; an un-acked message comes back ~2–3.5 s after its invisible time
ends, with ``delivery_attempt`` 2; ``change_invisible_duration`` replaces the message's receipt handle
in place; FIFO delivery needs a FIFO topic and a group with ``consumeMessageOrderly``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from importlib.metadata import entry_points

import pytest
from conftest import unavailable
from gap_shape import expected_children
from rmq_real import (
    REPO,
    client,
    configuration,
    ensure_broker,
    fresh_group,
    fresh_topic,
    message,
    quietly,
    start_producer,
    start_simple,
    unique,
)
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.clients.producer import TracedProducer
from tracer.path.stages import Stage
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module")
def rmq():
    ensure_broker()
    return client()


def run_loop(loop: ConsumeLoop) -> threading.Thread:
    t = threading.Thread(target=loop.run, name="test-consume-loop", daemon=True)
    t.start()
    return t


def stop_loop(loop: ConsumeLoop, t: threading.Thread) -> None:
    loop.stop()
    t.join(30)
    assert not t.is_alive(), "consume loop did not stop"


def store_ms(msg) -> int:
    return msg._Message__store_timestamp  # 5.1.2 parses it but keeps it private


def check_trace(finished, topic: str, process) -> None:
    """``process`` is a CONSUMER child of one ``send`` span and has the four gap/handler children."""
    sends = {s.context.span_id: s for s in finished if s.name == f"send {topic}"}
    send = sends[process.parent.span_id]
    assert send.context.trace_id == process.context.trace_id
    assert process.kind.name == "CONSUMER" and send.kind.name == "PRODUCER"
    children = sorted(s.name for s in finished if s.parent is not None and s.parent.span_id == process.context.span_id)
    assert children == expected_children(process.attributes)  # every gap with a length


# -- N sent → N handled ---------------------------------------------------------------------------------
def test_n_sent_n_handled_with_six_stamps_and_linked_traces(rmq, spans, registry):
    provider, exporter = spans
    topic, group = fresh_topic("rt-n"), fresh_group("rt-n")
    n = 40
    consumer = start_simple(group, topic)
    producer = TracedProducer(start_producer(topic), MessageTracer(tracer_provider=provider))
    try:
        receipts = [producer.send(message(topic, f"m{i}", tag="n", keys=f"k{i}")) for i in range(n // 2)]
        futures = [producer.send_async(message(topic, f"m{i}", tag="n")) for i in range(n // 2, n)]
        receipts += [f.result(timeout=10) for f in futures]

        handled: dict[str, tuple[bytes, int]] = {}
        lock = threading.Lock()

        def handler(msg):
            with lock:
                handled[msg.message_id] = (msg.body, store_ms(msg))

        stamps: dict[str, list[int]] = {}
        tracer = MessageTracer(consumer_group=group, tracer_provider=provider, metrics=TracerMetrics(registry),
                               listeners=[lambda t, o: stamps.__setitem__(t.info.message_id, list(t.stamps.times))])
        loop = ConsumeLoop(consumer, handler, tracer=tracer, workers=8, invisible_duration=10)
        t = run_loop(loop)
        wait_until(lambda: loop.statistics().acked >= n, timeout=60, what=f"{n} acks")
        stop_loop(loop, t)
    finally:
        quietly(consumer.shutdown)
        quietly(producer.shutdown)

    assert sorted(body for body, _ in handled.values()) == sorted(f"m{i}".encode() for i in range(n))
    assert set(handled) == {r.message_id for r in receipts}
    assert loop.statistics().acked == n and loop.statistics().ack_errors == 0 and loop.statistics().redelivered == 0
    assert set(stamps) == set(handled)
    for mid, times in stamps.items():
        assert all(times[st] for st in Stage), (mid, times)
        # broker_store is the broker's store time as the client received it, placed within its
        # millisecond (no earlier than the produce stamp, no later than the pull: tracer.path.stamps)
        assert handled[mid][1] * 1_000_000 <= times[Stage.BROKER_STORE] < (handled[mid][1] + 1) * 1_000_000
        assert times[Stage.BROKER_STORE] <= times[Stage.CLIENT_PULL]
    assert any(ms % 1000 for _, ms in handled.values())  # not the whole-second born_timestamp

    finished = exporter.get_finished_spans()
    process = [s for s in finished if s.name == f"process {topic}"]
    assert len(process) == n
    for p in process:
        check_trace(finished, topic, p)
        assert p.attributes["messaging.consumer.group.name"] == group
    assert {p.attributes["messaging.message.id"] for p in process} == set(handled)
    for stage in ("send", "broker_wait", "client_buffer", "dispatch_wait", "handler", "end_to_end"):
        assert registry.get_sample_value("rmqtrace_stage_duration_seconds_count",
                                         {"stage": stage, "topic": topic, "consumer_group": group}) == n, stage


# -- PushConsumer + TracedListener ----------------------------------------------------------------------
def test_push_consumer_listener_gets_six_stamps_and_the_pool_wait_as_dispatch_wait(rmq, spans, registry):
    from tracer.clients.official import TracedListener

    provider, exporter = spans
    topic, group = fresh_topic("rt-push"), fresh_group("rt-push")
    n, handler_s, threads = 16, 0.02, 2
    producer = TracedProducer(start_producer(topic), MessageTracer(tracer_provider=provider))
    # Everything is in the topic before the consumer starts: its first receive takes a batch and
    # submits it to its 2-thread pool at once, so later messages wait there for a thread.
    for i in range(n):
        producer.send(message(topic, f"p{i}", tag="push"))
    quietly(producer.shutdown)

    got: list[tuple[str, int, int]] = []
    lock = threading.Lock()

    class Listener(rmq.MessageListener):
        def consume(self, msg):
            start = time.time_ns()
            time.sleep(handler_s)  # real-time: the handler's work, so the pool queue builds up
            with lock:
                got.append((msg.message_id, msg.decode_message_timestamp, start))
            return rmq.ConsumeResult.SUCCESS

    stamps: dict[str, list[int]] = {}
    tracer = MessageTracer(consumer_group=group, tracer_provider=provider, metrics=TracerMetrics(registry),
                           listeners=[lambda t, o: stamps.__setitem__(t.info.message_id, list(t.stamps.times))])
    consumer = rmq.PushConsumer(configuration(), group, TracedListener(Listener(), tracer),
                                {topic: rmq.FilterExpression()}, consumption_thread_count=threads)
    consumer.startup()
    try:
        wait_until(lambda: len(stamps) >= n, timeout=60, what=f"{n} messages through the push consumer")
    finally:
        quietly(consumer.shutdown)

    assert len(got) == n
    waits = []
    for mid, decode_ms, listener_start in got:
        times = stamps[mid]
        assert all(times[st] for st in Stage), times
        # the client's decode time is both client_pull and dispatch_enqueue ...
        assert times[Stage.CLIENT_PULL] == times[Stage.DISPATCH_ENQUEUE] == decode_ms * 1_000_000
        # ... and dispatch_wait is the wait in the client's consumption pool, up to the listener
        assert times[Stage.DISPATCH_ENQUEUE] <= times[Stage.HANDLER_START] <= listener_start
        waits.append(times[Stage.HANDLER_START] - times[Stage.DISPATCH_ENQUEUE])
    # 16 messages, 2 threads, 20 ms each: the later ones of a batch wait several handler times
    assert max(waits) >= 2 * handler_s * 1e9, sorted(waits)
    finished = exporter.get_finished_spans()
    process = [s for s in finished if s.name == f"process {topic}"]
    assert len(process) == n
    for p in process:
        check_trace(finished, topic, p)
    longest = max((s for s in finished if s.name == "dispatch_wait"), key=lambda s: s.end_time - s.start_time)
    assert longest.end_time - longest.start_time == max(waits)
    assert registry.get_sample_value("rmqtrace_stage_duration_seconds_sum",
                                     {"stage": "dispatch_wait", "topic": topic, "consumer_group": group}) > 0


# -- FIFO -------------------------------------------------------------------------------------------------
def test_fifo_topic_keeps_order_per_message_group(rmq, spans, registry):
    provider, exporter = spans
    topic, group = fresh_topic("rt-fifo", fifo=True), fresh_group("rt-fifo", fifo=True)
    groups, per = ("ga", "gb", "gc"), 8
    producer = TracedProducer(start_producer(topic), MessageTracer(tracer_provider=provider))
    try:
        for i in range(per):
            for g in groups:
                producer.send(message(topic, f"{g}-{i}", group=g, tag="fifo", seq=str(i)))
    finally:
        quietly(producer.shutdown)

    order: dict[str, list[int]] = defaultdict(list)
    active: dict[str, int] = defaultdict(int)
    overlaps = []
    lock = threading.Lock()

    def handler(msg):
        g, seq = msg.message_group, int(msg.properties["seq"])
        with lock:
            active[g] += 1
            if active[g] > 1:
                overlaps.append((g, seq))
            order[g].append(seq)
        time.sleep((seq * 7 % 5) / 1000)  # real-time: uneven handler times would reorder an unkeyed pool
        with lock:
            active[g] -= 1

    consumer = start_simple(group, topic)
    tracer = MessageTracer(consumer_group=group, tracer_provider=provider, metrics=TracerMetrics(registry))
    loop = ConsumeLoop(consumer, handler, tracer=tracer, workers=4, key=lambda m: m.message_group,
                       invisible_duration=10)
    t = run_loop(loop)
    try:
        wait_until(lambda: loop.statistics().acked >= per * len(groups), timeout=60, what="every FIFO message acked")
    finally:
        stop_loop(loop, t)
        quietly(consumer.shutdown)
    assert dict(order) == {g: list(range(per)) for g in groups}
    assert overlaps == []
    assert loop.statistics().redelivered == 0
    process = [s for s in exporter.get_finished_spans() if s.name == f"process {topic}"]
    assert len(process) == per * len(groups)
    assert {p.attributes["messaging.rocketmq.message.group"] for p in process} == set(groups)


# -- failure → redelivery ---------------------------------------------------------------------------------
def test_failing_handler_message_comes_back_with_delivery_attempt_two(rmq, spans, registry):
    provider, exporter = spans
    topic, group = fresh_topic("rt-fail"), fresh_group("rt-fail")
    producer = TracedProducer(start_producer(topic), MessageTracer(tracer_provider=provider))
    try:
        receipt = producer.send(message(topic, "fails once"))
    finally:
        quietly(producer.shutdown)
    seen: list[tuple[str, int, float]] = []

    def handler(msg):
        seen.append((msg.message_id, msg.delivery_attempt, time.monotonic()))
        if msg.delivery_attempt == 1:
            raise RuntimeError("first delivery fails")

    consumer = start_simple(group, topic)
    tracer = MessageTracer(consumer_group=group, tracer_provider=provider, metrics=TracerMetrics(registry))
    # back in 1 s (the broker's minimum here) + the broker's ~2-3.5 s redelivery lag
    loop = ConsumeLoop(consumer, handler, tracer=tracer, workers=2, invisible_duration=10,
                       retry_backoff=lambda attempt: 1.0)
    t = run_loop(loop)
    try:
        wait_until(lambda: loop.statistics().acked >= 1, timeout=30, what="the retried message acked")
    finally:
        stop_loop(loop, t)
        quietly(consumer.shutdown)
    assert [(mid, attempt) for mid, attempt, _ in seen] == [(receipt.message_id, 1), (receipt.message_id, 2)]
    assert seen[1][2] - seen[0][2] >= 1.0
    s = loop.statistics()
    assert (s.failed, s.retry_scheduled, s.redelivered, s.acked, s.ack_errors) == (1, 1, 1, 1, 0)
    process = sorted((p for p in exporter.get_finished_spans() if p.name == f"process {topic}"),
                     key=lambda p: p.start_time)
    assert [p.attributes["rmqtrace.delivery_attempt"] for p in process] == [1, 2]
    assert [p.attributes["rmqtrace.outcome"] for p in process] == ["failure", "success"]
    assert not process[0].status.is_ok and process[0].attributes["error.type"] == "RuntimeError"
    assert process[0].parent.span_id == process[1].parent.span_id  # both under the one send span
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": topic, "consumer_group": group, "outcome": "failure"}) == 1


# -- lease renewal ----------------------------------------------------------------------------------------
def test_handler_longer_than_its_invisible_duration_is_not_delivered_twice(rmq):
    topic, group = fresh_topic("rt-lease"), fresh_group("rt-lease")
    producer = start_producer(topic)
    try:
        producer.send(message(topic, "long tail"))
    finally:
        quietly(producer.shutdown)

    release = threading.Event()
    deliveries: list[tuple[str, int]] = []
    handles: list[str] = []

    def handler(msg):
        deliveries.append((msg.message_id, msg.delivery_attempt))
        handles.append(msg.receipt_handle)
        release.wait(60)
        handles.append(msg.receipt_handle)

    consumer = start_simple(group, topic)
    # a second consumer of the same group, polling once the loop holds the message: it must not
    # get the message either
    other = start_simple(group, topic)
    other_got: list[str] = []
    polling = threading.Event()
    polling.set()

    def poll_other():
        while polling.is_set():
            try:
                for m in other.receive(16, 10):
                    other_got.append(m.message_id)
            except Exception:  # noqa: BLE001 - a receive error is not a delivery
                pass

    poller = threading.Thread(target=poll_other, daemon=True)
    # lease 2 s: without renewal the broker hands the message out again after ~4.1-4.9 s
    loop = ConsumeLoop(consumer, handler, workers=2, invisible_duration=2)
    t = run_loop(loop)
    try:
        wait_until(lambda: deliveries, timeout=15, what="the first delivery")
        t0 = time.monotonic()
        poller.start()
        wait_until(lambda: loop.statistics().leases_extended >= 5 and time.monotonic() - t0 > 6.5, timeout=30,
                   interval=0.05, what="the handler running past several leases")
        release.set()
        wait_until(lambda: loop.statistics().acked >= 1, timeout=15, what="ack after the long handler")
    finally:
        release.set()
        stop_loop(loop, t)
        polling.clear()
        if poller.is_alive():
            poller.join(15)
        quietly(consumer.shutdown)
        quietly(other.shutdown)
    assert len(deliveries) == 1 and deliveries[0][1] == 1
    assert other_got == []
    assert loop.statistics().redelivered == 0 and loop.statistics().lease_errors == 0 and loop.statistics().ack_errors == 0
    # the client replaced the receipt handle in place at each renewal; the ack used the newest one
    assert handles[0] != handles[1]


# -- RocketMQInstrumentor ----------------------------------------------------------------------------------
def test_instrumentor_is_registered_and_passes_the_dependency_check():
    from opentelemetry.instrumentation.dependencies import get_dist_dependency_conflicts

    from tracer.clients.instrumentor import RocketMQInstrumentor

    (ep,) = [e for e in entry_points(group="opentelemetry_instrumentor") if e.name == "rocketmq"]
    assert ep.load() is RocketMQInstrumentor
    assert get_dist_dependency_conflicts(ep.dist) is None  # what opentelemetry-instrument checks
    assert RocketMQInstrumentor()._check_dependency_conflicts() is None  # what instrument() checks


def test_instrumentor_on_the_real_client_traces_then_leaves_it_as_it_was(rmq, spans, registry):
    from tracer.clients.instrumentor import RocketMQInstrumentor
    from tracer.path.propagation import PRODUCE_NS, TRACEPARENT

    provider, exporter = spans
    patched = [(rmq.Producer, "send"), (rmq.Producer, "send_async"), (rmq.SimpleConsumer, "receive"),
               (rmq.SimpleConsumer, "ack"), (rmq.PushConsumer, "__init__")]
    before = [cls.__dict__[name] for cls, name in patched]
    topic, group = fresh_topic("rt-inst"), fresh_group("rt-inst")
    producer = start_producer(topic)
    consumer = start_simple(group, topic)
    inst = RocketMQInstrumentor()
    inst.instrument(tracer_provider=provider, registry=registry)
    try:
        assert all(cls.__dict__[name] is not b for (cls, name), b in zip(patched, before))
        traced = message(topic, "traced")
        producer.send(traced)
        assert TRACEPARENT in traced.properties and PRODUCE_NS in traced.properties
        got = []
        wait_until(lambda: got.extend(consumer.receive(16, 10)) or got, timeout=20, what="the traced message")
        for m in got:
            consumer.ack(m)
    finally:
        inst.uninstrument()
    assert [cls.__dict__[name] for cls, name in patched] == before
    finished = exporter.get_finished_spans()
    (process,) = [s for s in finished if s.name == f"process {topic}"]
    check_trace(finished, topic, process)

    # unpatched: a send writes nothing and makes no span; a receive/ack traces nothing
    count = len(exporter.get_finished_spans())
    plain = message(topic, "plain")
    producer.send(plain)
    assert TRACEPARENT not in plain.properties and PRODUCE_NS not in plain.properties
    again = []
    try:
        wait_until(lambda: again.extend(consumer.receive(16, 10)) or again, timeout=20, what="the plain message")
        for m in again:
            consumer.ack(m)
    finally:
        quietly(consumer.shutdown)
        quietly(producer.shutdown)
    assert [m.body for m in again] == [b"plain"] and TRACEPARENT not in again[0].properties
    assert len(exporter.get_finished_spans()) == count


def _console_spans(stdout: str) -> list[dict]:
    """Span objects from ConsoleSpanExporter output (indented JSON objects, other lines between)."""
    decoder = json.JSONDecoder()
    found, i = [], 0
    while (i := stdout.find("{", i)) >= 0:
        try:
            obj, end = decoder.raw_decode(stdout, i)
        except json.JSONDecodeError:
            i += 1
            continue
        if isinstance(obj, dict) and "context" in obj and "name" in obj:
            found.append(obj)
        i = end
    return found


def test_opentelemetry_instrument_runs_the_push_consumer_example_unchanged(rmq, spans, tmp_path):
    if not list(entry_points(group="opentelemetry_configurator")):
        unavailable("no OpenTelemetry SDK configurator: `pip install opentelemetry-distro` (opentelemetry-instrument "
                    "sets up the SDK only through a distro/configurator)")
    provider, exporter = spans
    topic, group = fresh_topic("rt-auto"), fresh_group("rt-auto")
    n = 6
    producer = TracedProducer(start_producer(topic), MessageTracer(tracer_provider=provider))
    try:
        for i in range(n):
            producer.send(message(topic, json.dumps({"group": f"g{i}", "cases": 1})))
    finally:
        quietly(producer.shutdown)
    service = unique("rt-auto-svc")
    env = dict(os.environ, RMQ_TOPIC=topic, RMQ_GROUP=group, EXPECT=str(n), CASE_MS="1", WORKERS="2",
               OTEL_SERVICE_NAME=service, OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none",
               OTEL_LOGS_EXPORTER="none", HOME=str(tmp_path))
    env.pop("RMQTRACE_METRICS_PORT", None)
    instrument = os.path.join(os.path.dirname(sys.executable), "opentelemetry-instrument")
    proc = subprocess.run([instrument, sys.executable, "examples/push_consumer.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"handled {n}" in proc.stdout
    got = _console_spans(proc.stdout)
    sends = {f"0x{s.context.span_id:016x}": s for s in exporter.get_finished_spans() if s.name == f"send {topic}"}
    process = [s for s in got if s["name"] == f"process {topic}"]
    assert len(process) == n
    for p in process:
        assert p["kind"] == "SpanKind.CONSUMER" and p["resource"]["attributes"]["service.name"] == service
        send = sends[p["parent_id"]]  # the producer's span, in this process
        assert p["context"]["trace_id"] == f"0x{send.context.trace_id:032x}"
        children = sorted(s["name"] for s in got if s["parent_id"] == p["context"]["span_id"])
        assert children == expected_children(p["attributes"])
        assert p["attributes"]["messaging.consumer.group.name"] == group
        assert all(p["attributes"].get(f"rmqtrace.stamp.{st.name.lower()}_ns") for st in Stage)


# -- the broker bench (rmqtrace bench broker), smoke-sized ---------------------------------------------------
def test_broker_bench_runs_every_mode_and_reports_ratios(rmq):
    from tracer.tools.bench.broker import format_broker_bench, run_broker_bench

    result = run_broker_bench(messages=60, rounds=1, handler_ms=1.0)
    for mode in ("untraced", "traced", "traced_otlp", "traced_compact", "traced_child", "traced_keep", "contrib"):
        assert all(v > 0 for v in result["msgs_per_s"][mode].values()), result["msgs_per_s"]
        # the client's I/O thread does the RPCs in every mode: a breakdown that misses it names no thread
        assert result["cpu_breakdown_us"][mode]["client_io"] > 0, result["cpu_breakdown_us"]
    assert result["contrib_over_untraced"] > 0 and result["traced_over_contrib"] > 0
    assert result["compact_over_contrib"] > 0 and len(result["compact_consume_ratios"]) == 1
    assert result["traced_over_untraced"] > 0 and len(result["consume_ratios"]) == 1
    assert result["child_over_untraced"] > 0 and result["produce_child_over_untraced"] > 0
    # the export child's CPU is read every round (in 10 ms ticks: 60 messages may take less than one)
    assert len(result["per_round"]["traced_child"]["helper_cpu_us"]) == 1 and result["child_process_cpu_us"] >= 0
    assert result["spans_encoded"] >= 60 * 6  # warm-up included: every message's send + 5 consumer spans
    text = format_broker_bench(result)
    assert "traced/untraced" in text and "OTLP" in text and "compact/contrib" in text and "child process" in text
