"""Bounded resources: a soak through the embedded broker with tracing and metrics on.

Every message is produced through ``TracedProducer`` and consumed through ``ConsumeLoop`` with a
``MessageTracer`` (an SDK provider whose batch processor feeds an exporter that discards, so the
whole span path runs) plus stage and dispatcher metrics. Resident memory (``VmRSS``) and the
number of objects the garbage collector tracks are read after a warm-up and at the end: a leak of
anything per message shows as growth proportional to the message count. Afterwards no
per-message state may be left anywhere.

The short soak (2×10⁴ messages) always runs; ``RMQTRACE_LONG=1`` adds the 10⁵ one.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import threading
import time
from typing import Any, Sequence

import pytest
from fault_programs.harness import record_figures
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry, generate_latest
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.clients.official import TracedSimpleConsumer
from tracer.clients.producer import TracedProducer
from tracer.config import CountingSpanProcessor, DropCounter
from tracer.dispatch import DispatchMetrics
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.message import MessageInfo
from tracer.path.stages import Outcome
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer

LONG = os.environ.get("RMQTRACE_LONG") == "1"


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def tracked_objects() -> int:
    gc.collect()
    return len(gc.get_objects())


class Discard(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0  # message spans
        self.operations = 0  # the loop's receive operation spans (one per receive call)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ops = sum((s.attributes or {}).get("messaging.operation.type") == "receive" for s in spans)
        self.operations += ops
        self.spans += len(spans) - ops
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class ReceiveSpansEnded(SpanProcessor):
    """Counts the receive spans handed to ``on_end``, exported or not."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        if (span.attributes or {}).get("messaging.operation.type") == "receive":
            with self._lock:
                self.count += 1


def soak(n: int, warmup: int) -> dict[str, Any]:
    broker = EmbeddedBroker(keep_consumed=False, min_receive_invisible=1)  # 2 s leases, as the local proxy allows
    broker.create_topic("soak")
    provider, sink, drops, ended = TracerProvider(), Discard(), DropCounter(), ReceiveSpansEnded()
    provider.add_span_processor(ended)  # a dropped span may be a receive span: the sum below needs them all
    provider.add_span_processor(CountingSpanProcessor(sink, drops))
    registry = CollectorRegistry()
    metrics = TracerMetrics(registry)
    drops.bind(metrics.spans_dropped)
    tracer = MessageTracer(consumer_group="soak", tracer_provider=provider, metrics=metrics)
    producer = TracedProducer(Producer(broker, ["soak"]), MessageTracer(tracer_provider=provider))
    producer.startup()
    consumer = SimpleConsumer(broker, "soak", {"soak": None}, await_duration=0.05)
    consumer.startup()
    seen = bytearray(n)  # one byte per message: handled how many times
    lock = threading.Lock()

    def handler(msg: Any) -> None:
        i = int(msg.body)
        with lock:
            seen[i] += 1

    # A short lease: the embedded broker forgets an acked lease's timer only once it is due, so
    # its timers are as many as the messages acked within one lease.
    loop = ConsumeLoop(consumer, handler, tracer=tracer, dispatch_metrics=DispatchMetrics(registry), workers=8,
                       invisible_duration=2)
    stop_producing = threading.Event()

    def produce() -> None:
        for i in range(n):
            while broker.backlog("soak", "soak") > 2000 and not stop_producing.is_set():
                stop_producing.wait(0.005)  # the consumer is behind: keep the backlog bounded
            if stop_producing.is_set():
                return
            m = Message()
            m.topic, m.body, m.tag = "soak", str(i).encode(), "t"
            m.keys = f"k{i}"
            producer.send(m, job_id=f"job-{i % 50}", cost=float(i % 7))

    runner = threading.Thread(target=loop.run, daemon=True)
    sender = threading.Thread(target=produce, daemon=True)
    t0 = time.monotonic()
    runner.start()
    sender.start()
    try:
        wait_until(lambda: loop.statistics().acked >= warmup, timeout=300, interval=0.05, what="warm-up")
        gc.collect()
        rss_warm, objects_warm, at_warm = rss_bytes(), tracked_objects(), loop.statistics().acked
        wait_until(lambda: loop.statistics().acked >= n, timeout=900, interval=0.05, what=f"{n} messages acked")
        elapsed = time.monotonic() - t0
    finally:
        stop_producing.set()
        loop.stop()
        runner.join(60)
        sender.join(60)
    provider.force_flush()
    gc.collect()
    rss_end, objects_end = rss_bytes(), tracked_objects()
    return {
        "messages": n, "elapsed_s": round(elapsed, 1), "rate_msgs_per_s": round(n / elapsed),
        "rss_warm_mb": round(rss_warm / 2**20, 1), "rss_end_mb": round(rss_end / 2**20, 1),
        "rss_growth_mb": round((rss_end - rss_warm) / 2**20, 2),
        "rss_growth_bytes_per_message": round((rss_end - rss_warm) / max(1, n - at_warm), 1),
        "gc_objects_growth": objects_end - objects_warm, "measured_over_messages": n - at_warm,
        "spans_exported": sink.spans, "operation_spans": sink.operations, "spans_dropped": drops.dropped,
        "operation_spans_ended": ended.count,
        "handled_once": seen.count(1), "handled_twice_or_more": n - seen.count(1) - seen.count(0),
        "never_handled": seen.count(0), "stats": dataclasses.asdict(loop.statistics()),
        "_loop": loop, "_tracer": tracer, "_metrics": metrics, "_broker": broker,
    }


def check_soak(r: dict[str, Any]) -> None:
    loop, tracer, metrics, broker = r.pop("_loop"), r.pop("_tracer"), r.pop("_metrics"), r.pop("_broker")
    n = r["messages"]
    assert r["never_handled"] == 0 and r["handled_twice_or_more"] == 0, r
    assert loop.statistics().acked == n and loop.statistics().failed == 0 and loop.statistics().ack_errors == 0
    assert broker.backlog("soak", "soak") == 0
    # tracer state is per in-flight message only: nothing is left once everything is acked
    assert loop.state().held == 0 and not loop.dispatcher.running()
    assert not tracer.statistics().hook_failures
    assert len(tracer.skew.bounds()) <= 3 and metrics.statistics().label_pairs == 1
    assert broker.stored("soak") < 3000  # the broker keeps what is unconsumed, not history
    # six spans a message (send, process, handler, three gaps); every one delivered, none dropped
    # (the drop counter cannot tell a dropped receive span from a message's: those ended minus
    # those exported are the dropped receive spans)
    dropped_operations = r["operation_spans_ended"] - r["operation_spans"]
    assert 0 <= dropped_operations <= r["spans_dropped"]
    assert r["spans_exported"] + r["spans_dropped"] - dropped_operations == 6 * n
    # memory: a leak of one small object per message would add ≥ 20 MB and ≥ n tracked objects.
    # Bounded on purpose, so allowed for: live blame keeps each worker's last runs (up to 64, their
    # message and trace: ~15 objects each) for the messages that may still wait behind them, and
    # trims them every 32 — between two snapshots that log may hold up to 8 × 64 runs more.
    blame_log = 8 * 64 * 15
    assert r["gc_objects_growth"] < r["measured_over_messages"] // 10 + blame_log, r
    assert r["rss_growth_mb"] < 16, r


def test_short_soak_memory_bounded_and_no_state_left():
    if os.environ.get("RMQTRACE_SOAK_CHILD") != "1":
        # the RSS bound is the soak's own: measured in a fresh process, not at the end of a long suite
        # whose earlier tests' threads and allocator state move the process's RSS meanwhile (the full
        # run measured 51 MB where the soak alone measures under 16, on 3.11 and 3.13 alike)
        import subprocess
        import sys
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"{__file__}::test_short_soak_memory_bounded_and_no_state_left"],
                              env={**os.environ, "RMQTRACE_SOAK_CHILD": "1"}, capture_output=True, text=True,
                              timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        return
    r = soak(20_000, warmup=5_000)
    printable = {k: v for k, v in r.items() if not k.startswith("_")}
    record_figures("soak_short", printable)
    check_soak(r)


@pytest.mark.slow
@pytest.mark.skipif(not LONG, reason="the 10^5-message soak runs with RMQTRACE_LONG=1")
def test_long_soak_memory_bounded_and_no_state_left():
    r = soak(100_000, warmup=10_000)
    printable = {k: v for k, v in r.items() if not k.startswith("_")}
    record_figures("soak_long", printable)
    check_soak(r)


def test_traced_simple_consumer_keeps_nothing_after_acks_or_dropped_messages():
    broker = EmbeddedBroker()
    producer = Producer(broker, ["T"])
    producer.startup()
    for i in range(500):
        m = Message()
        m.topic, m.body = "T", str(i).encode()
        producer.send(m)
    consumer = TracedSimpleConsumer(SimpleConsumer(broker, "G", {"T": None}, await_duration=0),
                                    MessageTracer(consumer_group="G", tracer_provider=TracerProvider()))
    consumer.startup()
    received = 0
    while received < 500:
        batch = consumer.receive(32, 30)
        received += len(batch)
        for j, msg in enumerate(batch):
            if j % 2 == 0:
                with consumer.processing(msg):
                    pass
                consumer.ack(msg)
            # odd ones: the user drops the message without acking (the broker will redeliver)
        del batch, msg
    gc.collect()
    assert consumer.traces.statistics().tracked == 0


def test_metric_label_sets_stay_bounded_whatever_the_topic_names():
    registry = CollectorRegistry()
    metrics = TracerMetrics(registry, label_limit=64)
    tracers = [MessageTracer(consumer_group=g, tracer_provider=TracerProvider(), metrics=metrics)
               for g in ("g1", "\x00evil\ngroup", "x" * 10_000)]
    rnd = random.Random(7)
    hostile = ["", "\x00", "a\nb", "{}", 'q"uote', "é" * 300, "x" * 100_000, "\\", "\u202e"]
    for i in range(5_000):
        topic = rnd.choice(hostile) + f"-{i}" if i % 3 else f"topic-{i}"
        t = tracers[i % len(tracers)].start_message(MessageInfo(topic=topic, properties={"traceparent": topic}))
        with t.handler_scope():
            pass
        t.finish(rnd.choice(list(Outcome)))
    assert metrics.statistics().label_pairs <= (64 + 1) * 3
    pairs, kinds = set(), set()
    for family in registry.collect():
        for sample in family.samples:
            if "topic" in sample.labels:
                pairs.add((sample.labels["topic"], sample.labels["consumer_group"]))
            if "kind" in sample.labels:
                kinds.add(sample.labels["kind"])
    assert len(pairs) <= 65 * 3 and ("other", "g1") in pairs
    assert kinds <= {"traceparent_malformed", "not_text"}
    generate_latest(registry)  # and the lot can still be scraped


def test_a_topic_that_is_not_valid_utf8_does_not_break_the_scrape():
    # a lone surrogate (only a Python-side broker can produce one) becomes the label "other"
    registry = CollectorRegistry()
    t = MessageTracer(consumer_group="g", tracer_provider=TracerProvider(), metrics=TracerMetrics(registry))
    trace = t.start_message(MessageInfo(topic="bad-\udcff"))
    with trace.handler_scope():
        pass
    trace.finish(Outcome.SUCCESS)
    generate_latest(registry)
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": "other", "consumer_group": "g", "outcome": "success"}) == 1


class Stuck(SpanExporter):
    """An exporter whose backend hangs until released, then fails: a black hole that closes."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.taken = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.taken += len(spans)
        self.release.wait(30)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.release.set()


def test_span_queue_is_bounded_and_every_lost_span_is_counted_without_waiting():
    drops, stuck = DropCounter(), Stuck()
    processor = CountingSpanProcessor(stuck, drops, max_queue_size=100)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    registry = CollectorRegistry()
    metrics = TracerMetrics(registry)
    drops.bind(metrics.spans_dropped)
    tracer = provider.get_tracer("t")
    t0 = time.monotonic()
    for _ in range(5_000):
        tracer.start_span("s").end()
    took = time.monotonic() - t0
    # ending a span never waits for the backend: one that waited would sit out Stuck's 30 s hold
    assert took < 25
    assert processor.statistics().pending <= 100  # the queue never holds more than its size
    assert drops.dropped >= 5_000 - 100 - stuck.taken
    stuck.release.set()
    provider.shutdown()
    assert drops.dropped == 5_000  # queued, taken or refused: every span is counted once
    assert registry.get_sample_value("rmqtrace_spans_dropped_total") == 5_000
