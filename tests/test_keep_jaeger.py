"""What the real Jaeger shows for traces the keep policy saved although the producer did not sample.

The producer samples nothing (its ``send`` spans are never recorded, ``traceparent`` flags 00).
The consumer keeps the slow and the failed messages: each becomes a new trace whose root is
``process {topic}``, with a span link to the producer's context, which Jaeger shows as a
``FOLLOWS_FROM`` reference into the producer's trace id — and no parent warning. The alternative, a
``process`` span under the producer's trace id with the unrecorded send span as parent, is what
Jaeger flags: ``invalid parent span IDs=…; skipping clock skew adjustment`` (the last test checks
that this is still so, which is why the keep policy does not do it).
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.parse
import urllib.request
import uuid

import pytest
from conftest import unavailable
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from waiting import wait_until

from tracer.embedded import Message
from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.path.stages import Outcome, Stage
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.tracer import MessageTracer

pytestmark = pytest.mark.integration

QUERY = f"http://127.0.0.1:{os.environ.get('JAEGER_QUERY_PORT', '16686')}"
OTLP = f"http://127.0.0.1:{os.environ.get('JAEGER_OTLP_HTTP_PORT', '4318')}/v1/traces"


def _get(path: str) -> dict:
    with urllib.request.urlopen(f"{QUERY}{path}", timeout=10) as resp:
        return json.load(resp)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def jaeger() -> str:
    try:
        _get("/api/services")
    except (OSError, ValueError) as exc:
        unavailable(f"Jaeger not reachable at {QUERY} ({exc}); run `make services-up`")
    return QUERY


def _traces(service: str) -> list[dict]:
    params = urllib.parse.urlencode({"service": service, "limit": 100})
    return list(_get(f"/api/traces?{params}")["data"] or [])


def test_kept_traces_of_unsampled_messages_are_clean_linked_roots_in_jaeger(jaeger: str) -> None:
    run = uuid.uuid4().hex[:8]
    producer_provider = TracerProvider(sampler=ALWAYS_OFF,
                                       resource=Resource.create({"service.name": f"keep-{run}-producer"}))
    consumer_provider = TracerProvider(resource=Resource.create({"service.name": f"keep-{run}-consumer"}))
    hold = HoldingSpanProcessor([BatchSpanProcessor(OTLPSpanExporter(endpoint=OTLP), schedule_delay_millis=200)])
    consumer_provider.add_span_processor(hold)
    clock = ManualClock(time.time_ns())
    producer = MessageTracer(tracer_provider=producer_provider, clock=clock)
    consumer = MessageTracer(consumer_group=f"g-{run}", tracer_provider=consumer_provider, clock=clock,
                             keep=KeepPolicy({"dispatch_wait": 0.2}, rng=random.Random(0)), hold=hold)
    user = consumer_provider.get_tracer("user-code")
    slow, failed, n = {2, 5}, {7}, 10
    producers: dict[str, tuple[str, str]] = {}
    for i in range(n):
        msg = Message()
        msg.topic = f"keep-{run}"
        producer.start_send(msg.topic, msg.add_property).end(message_id=f"m{i}")
        tp = msg.properties["traceparent"]
        assert not int(tp[-2:], 16) & 1  # the head decision: not sampled
        producers[f"m{i}"] = (tp[3:35], tp[36:52])
        store_ms = clock.advance_s(0.002) // 1_000_000  # the broker stores it, the consumer pulls it later
        clock.advance_s(0.003)
        t = consumer.start_message(MessageInfo(topic=msg.topic, message_id=f"m{i}", properties=msg.properties,
                                               store_ms=store_ms))
        clock.advance_s(0.0001)  # the client's buffer (an empty gap would get no span)
        t.mark(Stage.DISPATCH_ENQUEUE)
        clock.advance_s(0.5 if i in slow else 0.001)
        with t.handler_scope():
            # the user's span on the test's clock, so Jaeger's skew check compares like with like
            work = user.start_span(f"user work {i}", start_time=clock.now_ns())
            clock.advance_s(0.002)
            work.end(end_time=clock.now_ns())
        t.finish(Outcome.FAILURE if i in failed else Outcome.SUCCESS,
                 RuntimeError("boom") if i in failed else None)
    consumer_provider.force_flush()
    service = f"keep-{run}-consumer"

    def arrived() -> bool:  # Jaeger stores what it received a little later; wait for whole traces
        got = _traces(service)
        return len(got) >= len(slow | failed) and all(len(tr["spans"]) >= 6 for tr in got)

    wait_until(arrived, timeout=20, interval=0.2, what="the kept traces, whole, in Jaeger")
    traces = _traces(service)
    assert len(traces) == len(slow | failed)  # the fast ones cost no export
    assert not _traces(f"keep-{run}-producer")
    seen = set()
    for tr in traces:
        spans = {s["spanID"]: s for s in tr["spans"]}
        # no span starts before its parent: no clock-skew or parent warning (one host, one trace)
        assert not [w for s in spans.values() for w in s.get("warnings") or [] if "skew" in w or "parent" in w], [
            (s["operationName"], s.get("warnings")) for s in spans.values()]
        assert not [w for s in spans.values() for w in s.get("warnings") or [] if "parent" in w], [
            (s["operationName"], s.get("warnings")) for s in spans.values()]
        (root,) = [s for s in spans.values() if s["operationName"] == f"process keep-{run}"]
        tags = {t["key"]: t["value"] for t in root["tags"]}
        mid = tags["messaging.message.id"]
        seen.add(mid)
        # no parent in the trace: a FOLLOWS_FROM into the producer's (unrecorded) trace instead
        assert [(r["refType"], r["traceID"], r["spanID"]) for r in root["references"]] == [
            ("FOLLOWS_FROM", *producers[mid])]
        assert tr["traceID"] != producers[mid][0]
        names = {s["operationName"] for s in spans.values()}
        assert {"handler", "dispatch_wait", f"user work {int(mid[1:])}"} <= names
        for s in spans.values():
            if s is not root:
                (parent,) = [r["spanID"] for r in s["references"] if r["refType"] == "CHILD_OF"]
                assert parent in spans  # every other span's parent is in the trace
    assert seen == {f"m{i}" for i in slow | failed}
    consumer_provider.shutdown()


def test_jaeger_flags_a_span_whose_parent_was_never_recorded(jaeger: str) -> None:
    """Why kept traces are not put under the producer's trace id (see the module doc)."""
    run = uuid.uuid4().hex[:8]
    provider = TracerProvider(resource=Resource.create({"service.name": f"keep-{run}-orphan"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=OTLP)))
    rng = random.Random(run)
    missing = SpanContext(rng.getrandbits(128), rng.getrandbits(64), is_remote=True,
                          trace_flags=TraceFlags(TraceFlags.SAMPLED))
    provider.get_tracer("t").start_span("orphan", context=trace.set_span_in_context(NonRecordingSpan(missing))).end()
    provider.force_flush()
    wait_until(lambda: bool(_traces(f"keep-{run}-orphan")), timeout=20, interval=0.2,
               what="the orphan trace in Jaeger")
    (tr,) = _traces(f"keep-{run}-orphan")
    (span,) = tr["spans"]
    assert any("invalid parent span IDs" in w for w in span.get("warnings") or []), span.get("warnings")
    provider.shutdown()
