"""The OTel metrics path: semantic-convention messaging metrics and rmqtrace.stage.duration."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.path.stages import GAPS, Outcome
from tracer.telemetry.metrics import DEFAULT_BUCKETS
from tracer.telemetry.otel_metrics import SEMCONV_BUCKETS, MessagingMeters
from tracer.telemetry.tracer import MessageTracer

MS = 1_000_000


def _points(reader: InMemoryMetricReader) -> dict[str, tuple[str, list[Any], Any]]:
    data = reader.get_metrics_data()
    out: dict[str, tuple[str, list[Any], Any]] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = (m.unit, list(m.data.data_points), sm.scope)
    return out


def _pipeline(meters: MessagingMeters, fail: bool = False) -> None:
    clock = ManualClock()
    props: dict[str, str] = {}
    producer = MessageTracer(tracer_provider=TracerProvider(), clock=clock)
    producer.meters = meters
    send = producer.start_send("orders", props.__setitem__)
    clock.advance(3 * MS)
    send.end("id-1")
    store_ms = clock.advance(1 * MS) // MS
    clock.advance(39 * MS)
    consumer = MessageTracer(consumer_group="billing", tracer_provider=TracerProvider(), clock=clock)
    consumer.meters = meters
    t = consumer.start_message(MessageInfo(topic="orders", properties=props, message_id="id-1",
                                         store_ms=store_ms))
    clock.advance(5 * MS)
    with t.handler_scope():
        clock.advance(20 * MS)
    t.finish(Outcome.FAILURE if fail else Outcome.SUCCESS, ValueError("boom") if fail else None)


def test_send_and_process_record_the_semantic_convention_metrics():
    reader = InMemoryMetricReader()
    meters = MessagingMeters(MeterProvider(metric_readers=[reader]))
    _pipeline(meters)
    assert meters.recording
    got = _points(reader)
    assert {name: unit for name, (unit, _, _) in got.items()} == {
        "messaging.client.operation.duration": "s", "messaging.client.sent.messages": "{message}",
        "messaging.process.duration": "s", "messaging.client.consumed.messages": "{message}",
        "rmqtrace.stage.duration": "s"}
    (op,) = got["messaging.client.operation.duration"][1]
    assert dict(op.attributes) == {"messaging.system": "rocketmq", "messaging.operation.name": "send",
                                   "messaging.operation.type": "send", "messaging.destination.name": "orders"}
    assert op.count == 1 and op.sum == pytest.approx(0.003)
    assert tuple(op.explicit_bounds) == SEMCONV_BUCKETS
    (sent,) = got["messaging.client.sent.messages"][1]
    assert sent.value == 1 and dict(sent.attributes) == dict(op.attributes)
    (proc,) = got["messaging.process.duration"][1]
    assert dict(proc.attributes) == {"messaging.system": "rocketmq", "messaging.operation.name": "process",
                                     "messaging.operation.type": "process", "messaging.destination.name": "orders",
                                     "messaging.consumer.group.name": "billing"}
    assert proc.sum == pytest.approx(0.025)  # client pull -> handler end, as the process span
    (consumed,) = got["messaging.client.consumed.messages"][1]
    assert consumed.value == 1 and dict(consumed.attributes) == dict(proc.attributes)
    stages = {p.attributes["rmqtrace.stage"]: p for p in got["rmqtrace.stage.duration"][1]}
    assert set(stages) == {g.name for g in GAPS}
    assert stages["handler"].sum == pytest.approx(0.020) and stages["dispatch_wait"].sum == pytest.approx(0.005)
    assert stages["end_to_end"].sum == pytest.approx(0.068)
    assert tuple(stages["handler"].explicit_bounds) == DEFAULT_BUCKETS
    assert got["rmqtrace.stage.duration"][2].name == "rmqtrace"


def test_a_failed_handler_carries_error_type():
    reader = InMemoryMetricReader()
    _pipeline(MessagingMeters(MeterProvider(metric_readers=[reader])), fail=True)
    (proc,) = _points(reader)["messaging.process.duration"][1]
    assert proc.attributes["error.type"] == "ValueError"
    (consumed,) = _points(reader)["messaging.client.consumed.messages"][1]
    assert "error.type" not in consumed.attributes


def test_topic_and_group_attributes_are_capped_jointly():
    reader = InMemoryMetricReader()
    meters = MessagingMeters(MeterProvider(metric_readers=[reader]), label_limit=4)
    times = [0] * 8
    for g in range(10):
        for t in range(10):
            meters.finished(f"t{t}", f"g{g}", times, Outcome.SUCCESS)
    pairs = {(p.attributes["messaging.destination.name"], p.attributes["messaging.consumer.group.name"])
             for p in _points(reader)["messaging.client.consumed.messages"][1]}
    assert len(pairs) <= 2 * 4 + 1


_GLOBAL = textwrap.dedent("""
    import json
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from tracer.path.message import MessageInfo
    from tracer.path.stages import Outcome
    from tracer.telemetry.otel_metrics import RECHECK_EVERY
    from tracer.telemetry.tracer import MessageTracer

    def handle(tracer):
        t = tracer.start_message(MessageInfo(topic="t"))
        with t.handler_scope():
            pass
        t.finish(Outcome.SUCCESS)

    tracer = MessageTracer(consumer_group="g")  # built before the provider, as under opentelemetry-instrument
    handle(tracer)  # no provider yet: not recorded
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    for _ in range(RECHECK_EVERY):
        handle(tracer)
    found = {m.name: m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    consumed = found["messaging.client.consumed.messages"].data.data_points[0].value
    print(json.dumps({"names": sorted(found), "consumed": consumed, "every": RECHECK_EVERY}))
""")


def test_the_global_meter_provider_is_followed_once_it_is_set():
    proc = subprocess.run([sys.executable, "-c", _GLOBAL], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["names"] == ["messaging.client.consumed.messages", "messaging.process.duration", "rmqtrace.stage.duration"]
    assert 1 <= got["consumed"] <= got["every"]  # picked up within RECHECK_EVERY messages of being set


def test_without_a_meter_provider_nothing_is_built():
    meters = MessagingMeters()
    from opentelemetry import metrics
    if type(metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider":
        pytest.skip("a global MeterProvider is set in this process")
    meters.finished("t", "g", [1] * 8, Outcome.SUCCESS)
    meters.sent("t", 5)
    assert not meters.recording
