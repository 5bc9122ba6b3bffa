"""Our spans and OTel metrics against the semantic-conventions registry (issue 31's "Done when": no
violation outside the ``rmqtrace.*`` names).

OpenTelemetry's own check is weaver's ``registry live-check`` (tests/test_weaver_live_check.py runs
it when a weaver binary is here); no package registry reachable here ships weaver (crates.io's
``weaver`` is another project, PyPI and npm have none), so this test, run everywhere, makes the
checks it reports as violations itself, against the registry in
tests/semconv/registry.json (generated from the semantic-conventions model by
tests/semconv/make_registry.py): for attributes, ``missing_attribute``, ``deprecated`` and
``type_mismatch``; for metrics (weaver's ``sample_metric.rs`` and ``type_advisor.rs``),
``missing_metric``, ``deprecated``, ``unexpected_instrument`` and ``unit_mismatch``, and every data
point's attributes as above. It reads every span, span event and link, and every metric the
tracer records into an OTel ``MeterProvider``, of a demo run (both dispatch policies, the blame
links) and of the traced 5.x wrapper path on the embedded broker (send, receive, process with a
failure and an exception, the settle spans of an ack and a nack). Item 13 was the first such
violation: ``exception.escaped`` (deprecated, and written as a string), 8 per run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from semconv_runs import consume_loop, demo, wrappers

_REGISTRY = json.loads((Path(__file__).parent / "semconv" / "registry.json").read_text())
REGISTRY, METRICS = _REGISTRY["attributes"], _REGISTRY["metrics"]
OURS = "rmqtrace."


def _matches(kind: str, value: Any) -> bool:
    if kind.startswith("template["):
        kind = kind[len("template["):-1]
    scalar = {"string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "double": lambda v: isinstance(v, float)}
    if kind == "any":
        return True
    if kind.endswith("[]"):
        return isinstance(value, Sequence) and not isinstance(value, str) and all(scalar[kind[:-2]](v) for v in value)
    return scalar[kind](value)


def _definition(key: str) -> dict[str, Any] | None:
    if key in REGISTRY:
        return REGISTRY[key]
    for name, d in REGISTRY.items():  # a template attribute: http.request.header.<key>
        if str(d["type"]).startswith("template[") and key.startswith(name + "."):
            return d
    return None


def _check(found: set[str], where: str, attrs: Mapping[str, Any] | None) -> None:
    for key, value in (attrs or {}).items():
        if key.startswith(OURS):
            continue
        d = _definition(key)
        if d is None:
            found.add(f"{where}: {key} is not in the registry")
        else:  # both, as weaver reports both (its control run: tests/test_weaver_live_check.py)
            if d["deprecated"]:
                found.add(f"{where}: {key} is deprecated")
            if not _matches(str(d["type"]), value):
                found.add(f"{where}: {key}={value!r} is not of type {d['type']}")


def violations(spans: Sequence[ReadableSpan]) -> list[str]:
    """What weaver's live check reports as violations, for every attribute outside ``rmqtrace.*``."""
    found: set[str] = set()

    def check(where: str, attrs: Mapping[str, Any] | None) -> None:
        _check(found, where, attrs)

    for s in spans:
        check(f"span {s.name}", s.attributes)
        for e in s.events:
            check(f"event {e.name} of {s.name}", e.attributes)
        for link in s.links:
            check(f"link of {s.name}", link.attributes)
    return sorted(found)


def _instrument(data: Any) -> str:
    """The instrument of an SDK metric's data, as weaver names it (from the OTLP data kind)."""
    from opentelemetry.sdk.metrics.export import ExponentialHistogram, Gauge, Histogram, Sum

    if isinstance(data, (Histogram, ExponentialHistogram)):
        return "histogram"
    if isinstance(data, Sum):
        return "counter" if data.is_monotonic else "updowncounter"
    if isinstance(data, Gauge):
        return "gauge"
    return type(data).__name__


def metric_violations(data: Any) -> list[str]:
    """What weaver's live check reports as violations for metrics (``MetricsData``), outside ``rmqtrace.*``."""
    found: set[str] = set()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                where = f"metric {m.name}"
                if not m.name.startswith(OURS):
                    d = METRICS.get(m.name)
                    if d is None:
                        found.add(f"{where} is not in the registry")
                    else:
                        if d["deprecated"]:
                            found.add(f"{where} is deprecated")
                        if d["instrument"] != _instrument(m.data):
                            found.add(f"{where} is a {_instrument(m.data)}, not a {d['instrument']}")
                        if d["unit"] is not None and d["unit"] != m.unit:
                            found.add(f"{where} has unit {m.unit!r}, not {d['unit']!r}")
                for point in m.data.data_points:
                    _check(found, where, point.attributes)
    return sorted(found)


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory
    provider.shutdown()


def test_our_spans_break_no_semantic_convention_outside_our_names(spans) -> None:
    provider, memory = spans
    demo(provider)
    wrappers(provider)
    consume_loop(provider)
    written = memory.get_finished_spans()
    seen = {k for s in written for k in (s.attributes or {})} | {k for s in written for e in s.events
                                                                 for k in (e.attributes or {})}
    # not vacuous: the paths that write each kind of attribute ran
    assert {"messaging.system", "messaging.operation.type", "messaging.operation.name", "messaging.destination.name",
            "messaging.consumer.group.name", "messaging.message.id", "error.type", "exception.type",
            "exception.stacktrace", "messaging.rocketmq.message.keys", "messaging.client.id", "server.address",
            "server.port", "messaging.rocketmq.namespace", "messaging.rocketmq.message.tag",
            "messaging.rocketmq.message.group", "messaging.rocketmq.message.delivery_timestamp",
            "messaging.message.body.size", "messaging.batch.message_count"} <= seen, seen
    assert any(s.links for s in written)
    assert violations(written) == []


def test_our_otel_metrics_break_no_semantic_convention_outside_our_names(spans, monkeypatch) -> None:
    """Every metric the tracers record into an OTel meter provider (the demo's and the wrappers'),
    as weaver's live check reads an OTLP metrics export."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from tracer.telemetry import tracercore
    from tracer.telemetry.otel_metrics import MessagingMeters

    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    # every MessageTracer built from here on records into it (the global provider is process-wide)
    monkeypatch.setattr(tracercore, "GLOBAL_METERS", MessagingMeters(meter_provider))
    provider, _memory = spans
    demo(provider)
    wrappers(provider)
    consume_loop(provider)
    data = reader.get_metrics_data()
    meter_provider.shutdown()
    assert data is not None
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    # not vacuous: send, receive/settle, process and consumed all recorded
    assert {"messaging.client.operation.duration", "messaging.client.sent.messages", "messaging.process.duration",
            "messaging.client.consumed.messages"} <= names, names
    assert metric_violations(data) == []


def test_the_metric_check_finds_what_weaver_would() -> None:
    """missing_metric, deprecated, unexpected_instrument, unit_mismatch and a data point's attributes;
    our own names pass."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("t")
    meter.create_counter("messaging.process.duration", unit="ms").add(1, {"messaging.system": "rocketmq"})
    meter.create_histogram("messaging.publish.duration", unit="s").record(0.1)
    meter.create_counter("messaging.no_such_metric").add(1)
    meter.create_histogram("rmqtrace.stage.duration", unit="s").record(0.1, {"messaging.batch.message_count": "3"})
    data = reader.get_metrics_data()
    provider.shutdown()
    assert metric_violations(data) == [
        "metric messaging.no_such_metric is not in the registry",
        "metric messaging.process.duration has unit 'ms', not 's'",
        "metric messaging.process.duration is a counter, not a histogram",
        "metric messaging.publish.duration is deprecated",
        "metric rmqtrace.stage.duration: messaging.batch.message_count='3' is not of type int",
    ]


def test_the_check_finds_what_weaver_would() -> None:
    """The checker itself: the issue's item 13 (exception.escaped as the SDK's record_exception
    wrote it), an unknown name, a wrong type; our own names and templates pass."""
    from opentelemetry.sdk.trace import Event

    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("s", attributes={"messaging.batch.message_count": "3", "rmqtrace.own": 1,
                                                       "messaging.no_such_thing": "x",
                                                       "http.request.header.x-id": ("a",)}) as span:
        span.record_exception(ValueError("x"))  # the SDK writes exception.escaped
        span._events.append(Event("e", {"server.port": 80}))  # type: ignore[attr-defined]
    provider.shutdown()
    assert violations(memory.get_finished_spans()) == [
        "event exception of s: exception.escaped is deprecated",
        "event exception of s: exception.escaped='False' is not of type boolean",
        "span s: messaging.batch.message_count='3' is not of type int",
        "span s: messaging.no_such_thing is not in the registry",
    ]
