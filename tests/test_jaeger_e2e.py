"""End to end: a pipeline on the real RocketMQ broker exporting OTLP/HTTP to the real Jaeger, read
back through Jaeger's HTTP query API (``/api/traces``; times in µs, parents as ``CHILD_OF``).

One trace per message: the producer's ``send {topic}`` (service ``…-producer``) and the consumer's
``process {topic}`` (service ``…-consumer``, child of send and linked to it: Jaeger folds the link
into the parent reference, which it then shows as FOLLOWS_FROM send)
with ``broker_wait``, ``client_buffer``, ``dispatch_wait`` and ``handler`` (each CHILD_OF process,
inside it: process starts at the broker's store) tiling the path in stage order.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
from conftest import unavailable
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rmq_real import REPO, ensure_broker, fresh_group, fresh_topic, message, quietly, start_producer, start_simple, unique
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.clients.producer import TracedProducer
from tracer.telemetry.tracer import MessageTracer

pytestmark = pytest.mark.integration

QUERY = f"http://127.0.0.1:{os.environ.get('JAEGER_QUERY_PORT', '16686')}"
OTLP = f"http://127.0.0.1:{os.environ.get('JAEGER_OTLP_HTTP_PORT', '4318')}/v1/traces"
N = 20
CONSUMER_CHILDREN = ("broker_wait", "client_buffer", "dispatch_wait", "handler")  # in stage order
ROUNDING_US = 1  # Jaeger truncates start and duration to µs: a derived end may be 1 µs off


def _jaeger_up() -> bool:
    try:
        with urllib.request.urlopen(f"{QUERY}/api/services", timeout=3) as resp:
            json.load(resp)
        return True
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="module")
def jaeger() -> str:
    if not _jaeger_up():
        proc = subprocess.run(["bash", str(REPO / "services" / "jaeger" / "jaeger.sh"), "start"],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not _jaeger_up():
            unavailable(f"Jaeger not reachable at {QUERY} and `jaeger.sh start` failed: {proc.stderr.strip()[-600:]}")
    return QUERY


def _provider(service: str, memory: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=OTLP), schedule_delay_millis=200))
    provider.add_span_processor(SimpleSpanProcessor(memory))  # the ids we expect to read back
    return provider


def _traces(service: str) -> list[dict]:
    params = urllib.parse.urlencode({"service": service, "limit": 10 * N})
    with urllib.request.urlopen(f"{QUERY}/api/traces?{params}", timeout=10) as resp:
        return list(json.load(resp)["data"] or [])


def _parent(span: dict) -> str | None:
    refs = [r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"]
    assert len(refs) <= 1, span["references"]
    return refs[0] if refs else None


def _tag(span: dict, key: str):
    return next((t["value"] for t in span["tags"] if t["key"] == key), None)


@pytest.fixture(scope="module")
def pipeline(jaeger: str) -> tuple[str, str, str, list[dict], dict[str, list[str]]]:
    """N messages through the real broker; returns (topic, producer svc, consumer svc, traces, the
    span names we wrote per trace id)."""
    ensure_broker()
    topic, group = fresh_topic("e2e"), fresh_group("e2e")
    base = unique("rmqtrace-e2e")
    svc_p, svc_c = f"{base}-producer", f"{base}-consumer"
    memory = InMemorySpanExporter()
    prov_p, prov_c = _provider(svc_p, memory), _provider(svc_c, memory)
    consumer = start_simple(group, topic)
    producer = TracedProducer(start_producer(topic), MessageTracer(tracer_provider=prov_p))
    loop = ConsumeLoop(consumer, lambda m: time.sleep(0.005),  # real-time: a 5 ms handler
                       tracer=MessageTracer(consumer_group=group, tracer_provider=prov_c),
                       workers=4, invisible_duration=10)
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    try:
        for i in range(N):
            producer.send(message(topic, f"e2e-{i}", tag="e2e"))
        wait_until(lambda: loop.statistics().acked >= N, timeout=60, what=f"{N} acks")
    finally:
        loop.stop()
        t.join(30)
        quietly(consumer.shutdown)
        quietly(producer.shutdown)
    assert prov_p.force_flush(10_000) and prov_c.force_flush(10_000)
    # one trace per message; the loop's receive operations are traces of their own (root CLIENT spans)
    written: dict[str, list[str]] = {}
    for s in memory.get_finished_spans():
        if (s.attributes or {}).get("messaging.operation.type") != "receive":
            written.setdefault(f"{s.context.trace_id:032x}", []).append(s.name)
    assert len(written) == N

    found: list[dict] = []

    def arrived() -> bool:
        found[:] = [tr for tr in _traces(svc_c) if tr["traceID"] in written]
        return len(found) == N and all(len(tr["spans"]) == len(written[tr["traceID"]]) for tr in found)

    wait_until(arrived, timeout=30, interval=0.25, what=f"{N} complete traces in Jaeger")
    prov_p.shutdown()
    prov_c.shutdown()
    return topic, svc_p, svc_c, found, written


def test_one_trace_per_message_with_send_process_and_every_gap(pipeline):
    topic, svc_p, svc_c, traces, written = pipeline
    assert {tr["traceID"] for tr in traces} == set(written)
    message_ids = set()
    children_seen: set[str] = set()
    for tr in traces:
        by_name: dict[str, list[dict]] = {}
        for s in tr["spans"]:
            by_name.setdefault(s["operationName"], []).append(s)
        assert sorted(by_name) == sorted(written[tr["traceID"]])  # Jaeger has what we wrote
        # every gap with a length (an empty one gets no span: Jaeger would flag it) and the handler
        children = [name for name in CONSUMER_CHILDREN if name in by_name]
        assert sorted(by_name) == sorted([f"send {topic}", f"process {topic}", *children]) and "handler" in children
        children_seen.update(children)
        assert all(len(v) == 1 for v in by_name.values()), {k: len(v) for k, v in by_name.items()}
        (send,), (process,) = by_name[f"send {topic}"], by_name[f"process {topic}"]
        services = {pid: p["serviceName"] for pid, p in tr["processes"].items()}
        assert services[send["processID"]] == svc_p and services[process["processID"]] == svc_c
        assert _tag(send, "span.kind") == "producer" and _tag(process, "span.kind") == "consumer"
        assert _parent(send) is None
        # parent and creation link are the same span: one reference, typed by the link
        assert [(r["refType"], r["spanID"]) for r in process["references"]] == [("FOLLOWS_FROM", send["spanID"])]
        for name in children:
            assert _parent(by_name[name][0]) == process["spanID"], name
        # no warning on our consumer spans: no skew note (broker_wait used to start before its
        # parent process), no "Negative duration" (an empty gap's span had one); `process` may get
        # a skew note: an async child of another service's send that outlives it
        assert not [(name, by_name[name][0].get("warnings")) for name in children
                    if by_name[name][0].get("warnings")]
        mid = _tag(process, "messaging.message.id")
        assert mid and _tag(send, "messaging.message.id") == mid
        assert _tag(process, "messaging.rocketmq.message.type") == "normal"
        assert _tag(process, "server.address") and _tag(process, "server.port")
        assert _tag(process, "rmqtrace.delivery_attempt") == 1
        message_ids.add(mid)
    assert len(message_ids) == N
    assert children_seen == set(CONSUMER_CHILDREN)  # a real loop's gaps are not all empty


def test_consumer_spans_tile_the_path_inside_process(pipeline):
    topic, _, _, traces, _ = pipeline
    for tr in traces:
        spans = {s["operationName"]: s for s in tr["spans"]}
        send, process = spans[f"send {topic}"], spans[f"process {topic}"]
        p_start, p_end = process["startTime"], process["startTime"] + process["duration"]
        prev_end = None
        for name in (name for name in CONSUMER_CHILDREN if name in spans):  # an empty gap has no span
            c = spans[name]
            c_start, c_end = c["startTime"], c["startTime"] + c["duration"]
            # inside process: no span of ours starts before its parent
            assert p_start - ROUNDING_US <= c_start and c_end <= p_end + ROUNDING_US, (name, process, c)
            assert c["duration"] >= 0
            if prev_end is not None:  # each gap starts where the one before ended
                assert abs(c_start - prev_end) <= ROUNDING_US, (name, c_start, prev_end)
            prev_end = c_end
        first = min(s["startTime"] for s in spans.values() if s["operationName"] in CONSUMER_CHILDREN)
        assert abs(first - p_start) <= ROUNDING_US  # the first gap starts where process does: the store
        assert abs(prev_end - p_end) <= ROUNDING_US  # and ends with the handler
        # the broker's part starts no earlier than the send began: the store time is placed no
        # earlier than the produce stamp, which now dates the send span too (one clock)
        assert p_start >= send["startTime"]


def test_a_push_listener_trace_has_no_warning_in_jaeger(jaeger):
    """A push listener's client buffer is empty by construction (the client's decode time is both
    the pull and the enqueue); its span of no length got Jaeger's "Negative duration detected" on
    every trace. The real Jaeger is the judge of what it flags."""
    from tracer.clients.official import TracedListener

    service = unique("rmqtrace-e2e-push")
    memory = InMemorySpanExporter()
    provider = _provider(service, memory)
    tracer = MessageTracer(consumer_group="push", tracer_provider=provider)

    class Message:  # what the 5.x client hands a listener
        topic, message_id, properties, body = "push-topic", "M-push", {}, b"x"

        def __init__(self) -> None:
            self.decode_message_timestamp = time.time_ns() // 1_000_000

    class Listener:
        def consume(self, message: object) -> str:
            time.sleep(0.002)  # real-time: a handler that takes a moment
            return "SUCCESS"

    for _ in range(3):
        TracedListener(Listener(), tracer).consume(Message())
    assert provider.force_flush(10_000)
    n = len(memory.get_finished_spans())
    found: list[dict] = []

    def arrived() -> bool:
        found[:] = _traces(service)
        return sum(len(tr["spans"]) for tr in found) == n

    wait_until(arrived, timeout=30, interval=0.25, what=f"{n} push-listener spans in Jaeger")
    provider.shutdown()
    names = {s["operationName"] for tr in found for s in tr["spans"]}
    assert {"process push-topic", "dispatch_wait", "handler"} <= names and "client_buffer" not in names
    assert not [(s["operationName"], s["warnings"]) for tr in found for s in tr["spans"] if s.get("warnings")]
