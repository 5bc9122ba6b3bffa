"""Settings follow the OTel SDK's environment specification (service.name, exporters, endpoints)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from tracer.config import Settings, configure_tracing, make_exporters
from tracer.telemetry.spanfile import JsonLinesSpanExporter

_OTEL_VARS = ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
              "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
              "RMQTRACE_SPANS_FILE", "OTEL_SDK_DISABLED")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    # configure_tracing keeps an SDK provider another test may have made global; these tests build their own
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    return monkeypatch


def _service_name(env: pytest.MonkeyPatch, **variables: str) -> object:
    for k, v in variables.items():
        env.setenv(k, v)
    provider = configure_tracing(Settings.from_env(), set_global=False)
    assert provider is not None
    try:
        return provider.resource.attributes.get("service.name")
    finally:
        provider.shutdown()


def test_service_name_from_otel_service_name(env):
    assert _service_name(env, OTEL_SERVICE_NAME="billing", OTEL_RESOURCE_ATTRIBUTES="service.name=other") == "billing"


def test_service_name_from_resource_attributes_is_not_overridden(env):
    assert _service_name(env, OTEL_RESOURCE_ATTRIBUTES="deployment.environment=prod,service.name=orders%20api") \
        == "orders api"


def test_service_name_defaults_like_the_sdk(env):
    name = _service_name(env)
    assert isinstance(name, str) and name.startswith("unknown_service"), name
    assert Settings.from_env({}, default_service_name="rmqtrace").service_name == "rmqtrace"
    assert Settings.from_env({"OTEL_SERVICE_NAME": "x"}, default_service_name="rmqtrace").service_name == "x"


def test_otlp_without_endpoint_uses_the_sdk_default(env):
    (exporter,) = make_exporters(Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp"}))
    assert isinstance(exporter, HttpExporter)
    assert exporter._endpoint == "http://localhost:4318/v1/traces"  # SDK internal, read only to check the default
    (exporter,) = make_exporters(Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}))
    assert isinstance(exporter, GrpcExporter)
    assert exporter._endpoint == "localhost:4317"
    (exporter,) = make_exporters(Settings.from_env({}))  # unset is otlp too, as in the SDK
    assert isinstance(exporter, HttpExporter)


def test_exporter_list_none_and_span_file(tmp_path):
    spans = str(tmp_path / "spans.jsonl")
    assert make_exporters(Settings.from_env({"OTEL_TRACES_EXPORTER": "none"})) == []
    kinds = [type(e) for e in make_exporters(Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp, Console"}))]
    assert kinds == [HttpExporter, ConsoleSpanExporter]
    kinds = [type(e) for e in make_exporters(Settings.from_env({"RMQTRACE_SPANS_FILE": spans}))]
    assert kinds == [JsonLinesSpanExporter]
    kinds = [type(e) for e in make_exporters(Settings.from_env({"RMQTRACE_SPANS_FILE": spans, "OTEL_TRACES_EXPORTER": "otlp"}))]
    assert kinds == [HttpExporter]  # asked for by name: OTLP, not the file


@pytest.mark.parametrize("variables, word", [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "zipkin"),
    ({"OTEL_TRACES_EXPORTER": "otlp,jaeger"}, "jaeger"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json"),
    ({"RMQTRACE_METRICS_PORT": "ninety"}, "ninety"),
])
def test_a_value_that_cannot_work_is_one_clear_error(variables, word):
    with pytest.raises(ValueError) as info:
        Settings.from_env(variables)
    message = str(info.value)
    assert word in message and "\n" not in message


def test_with_no_endpoint_set_spans_go_to_the_sdk_default_and_start_up_says_so(env, caplog):
    """Issue 23: the standard OTel behaviour (OTLP to localhost:4318), said once at start-up."""
    import logging

    with caplog.at_level(logging.INFO, logger="tracer.config"):
        provider = configure_tracing(Settings.from_env(), set_global=False)
    assert provider is not None
    provider.shutdown()
    lines = [r.getMessage() for r in caplog.records if r.name == "tracer.config"]
    assert any("http://localhost:4318/v1/traces" in m and "OTEL_EXPORTER_OTLP_ENDPOINT is unset" in m for m in lines)


def test_an_export_that_fails_names_the_endpoint_once(env, caplog):
    import logging

    from opentelemetry.sdk.trace.export import SpanExportResult

    from tracer.config import CountingExporter, DropCounter

    class Down(HttpExporter):
        def export(self, spans):  # noqa: ANN001, ANN202 - what a collector that is not there gives
            return SpanExportResult.FAILURE

    drops = DropCounter()
    exporter = CountingExporter(Down(endpoint="http://127.0.0.1:9/v1/traces"), drops)
    with caplog.at_level(logging.WARNING, logger="tracer.config"):
        for _ in range(3):
            exporter.export([object(), object()])  # type: ignore[list-item]
    warnings = [r.getMessage() for r in caplog.records if r.name == "tracer.config"]
    assert len(warnings) == 1 and "http://127.0.0.1:9/v1/traces" in warnings[0]
    assert drops.dropped == 6


def test_the_readme_names_the_extra_that_brings_opentelemetry_instrument() -> None:
    import pathlib

    from conftest import pyproject

    root = pathlib.Path(__file__).resolve().parents[1]
    extras = pyproject()["project"]["optional-dependencies"]
    assert any(d.startswith("opentelemetry-distro") for d in extras["instrument"])
    readme = (root / "README.md").read_text()
    block = readme[readme.index("pip install -e '.[rocketmq,instrument]'"):]
    assert block.index("opentelemetry-instrument python") < 400


def test_spans_the_hold_loses_count_in_the_same_drop_counter(env):
    from tracer.config import DropCounter
    from tracer.telemetry.hold import HoldingSpanProcessor

    env.setenv("RMQTRACE_KEEP_CONSUMER_WAIT", "0.1")
    env.setenv("OTEL_TRACES_EXPORTER", "none")
    none = configure_tracing(Settings.from_env(), set_global=False)  # nothing exported: no hold, no error
    assert none is not None
    none.shutdown()
    env.setenv("OTEL_TRACES_EXPORTER", "console")
    drops = DropCounter()
    provider = configure_tracing(Settings.from_env(), set_global=False, drops=drops)
    assert provider is not None
    (hold,) = [p for p in provider._active_span_processor._span_processors  # noqa: SLF001
               if isinstance(p, HoldingSpanProcessor)]
    tracer = provider.get_tracer("t")
    root = tracer.start_span("undecided")
    hold.hold(root.get_span_context().trace_id)
    root.end()
    provider.shutdown()  # never decided: lost at shutdown, and counted
    assert drops.dropped == 1 and hold.statistics().dropped_by_reason["shutdown"] == 1
