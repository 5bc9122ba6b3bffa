"""The report read back from a real Jaeger: spans of a small embedded-broker run go out over OTLP
and, at the same time, into a JSON-lines file; both sources must give the same numbers.

Jaeger is the one ``services/jaeger/jaeger.sh start`` runs (``make test`` starts it); its ports
follow the script's env vars ``JAEGER_QUERY_PORT`` (16686) and ``JAEGER_OTLP_HTTP_PORT`` (4318).
Skips when Jaeger is not reachable, fails instead under ``RMQTRACE_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import unavailable
from waiting import wait_until

from tracer.report.model import build_report, is_process_span, messages_from_spans
from tracer.report.sources import read_jaeger, read_jsonl

pytestmark = pytest.mark.integration

QUERY = f"http://127.0.0.1:{os.environ.get('JAEGER_QUERY_PORT', '16686')}"
OTLP = f"http://127.0.0.1:{os.environ.get('JAEGER_OTLP_HTTP_PORT', '4318')}"
POLICIES = ("round_robin", "aggressive")
GROUPS = 30  # messages per policy


@pytest.fixture(scope="module")
def jaeger() -> str:
    try:
        with urllib.request.urlopen(f"{QUERY}/api/services", timeout=3) as resp:
            json.load(resp)
    except (OSError, ValueError) as exc:
        unavailable(f"Jaeger not reachable at {QUERY} ({exc}); start it with `services/jaeger/jaeger.sh start`")
    return QUERY


@pytest.fixture(scope="module")
def run(jaeger: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Two policies on the embedded broker; spans to Jaeger (OTLP HTTP) and to a file."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from prometheus_client import CollectorRegistry

    from tracer.dispatch import DispatchMetrics
    from tracer.telemetry.metrics import TracerMetrics
    from tracer.telemetry.spanfile import JsonLinesSpanExporter
    from tracer.tools.demo import DemoOptions, run_policy
    from tracer.tools.workload import make_job

    service = f"rmqtrace-report-it-{uuid.uuid4().hex[:8]}"  # this run's traces only
    spans_file = tmp_path_factory.mktemp("jaeger") / "spans.jsonl"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{OTLP}/v1/traces", timeout=10)))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(spans_file)))
    opts = DemoOptions(groups=GROUPS, workers=3, case_ms=1.0, policies=POLICIES)
    job = make_job(opts.groups, seed=opts.seed)
    registry = CollectorRegistry()
    metrics, dispatch_metrics = TracerMetrics(registry), DispatchMetrics(registry)
    for policy in POLICIES:
        run_policy(policy, job, opts, tracer_provider=provider, registry=registry, metrics=metrics,
                   dispatch_metrics=dispatch_metrics)
    assert provider.force_flush(30_000)
    provider.shutdown()
    expected = len(POLICIES) * GROUPS

    def arrived() -> bool:
        try:
            spans = read_jaeger(jaeger, service, limit=1000, lookback_s=3600, timeout=10)
        except Exception:  # noqa: BLE001 - not stored yet: "no traces for service"
            return False
        return sum(1 for s in spans if is_process_span(s)) >= expected

    wait_until(arrived, timeout=30, interval=0.2, what=f"{expected} process spans of {service} in Jaeger")
    return service, spans_file


def test_nanosecond_stamps_survive_jaegers_json(jaeger: str, run: tuple[str, Path]) -> None:
    service, spans_file = run
    from_jaeger = {s.span_id: s for s in read_jaeger(jaeger, service, limit=1000, timeout=10) if is_process_span(s)}
    from_file = {s.span_id: s for s in read_jsonl(spans_file) if is_process_span(s)}
    assert set(from_jaeger) == set(from_file) and len(from_file) == len(POLICIES) * GROUPS
    for span_id, f in from_file.items():
        j = from_jaeger[span_id]
        stamps = {k: v for k, v in f.attributes.items() if k.startswith("rmqtrace.stamp.")}
        assert len(stamps) >= 5 and max(stamps.values()) > 2 ** 53
        for key, value in stamps.items():
            assert j.attributes[key] == value and type(j.attributes[key]) is int, key  # exact, not a double
        assert j.attributes["messaging.consumer.group.name"] == f.attributes["messaging.consumer.group.name"]
        assert j.attributes["rmqtrace.job.id"] == "job-1"
        assert j.start_ns == f.start_ns // 1000 * 1000  # span times: Jaeger keeps µs
    assert {r.timing for r in messages_from_spans(from_jaeger.values())} == {"stamps"}


def test_report_from_jaeger_equals_report_from_file(jaeger: str, run: tuple[str, Path]) -> None:
    service, spans_file = run
    a = build_report(read_jaeger(jaeger, service, limit=1000, timeout=10))
    b = build_report(read_jsonl(spans_file))
    assert [g.group for g in a.groups] == [g.group for g in b.groups] == [f"demo-{p}" for p in POLICIES]
    for ga, gb in zip(a.groups, b.groups, strict=True):
        assert len(ga.records) == len(gb.records) == GROUPS
        assert ga.workers == gb.workers
        [ja], [jb] = ga.jobs, gb.jobs
        assert (ja.completion_s, ja.lower_bound_s, ja.total_handler_s) == (jb.completion_s, jb.lower_bound_s,
                                                                            jb.total_handler_s)
        assert ja.critical.message.message_id == jb.critical.message.message_id
        assert ja.critical.split_s == jb.critical.split_s
        for gap, st in ga.stages.items():
            assert (st.p50, st.p95, st.p99, st.max) == (gb.stages[gap].p50, gb.stages[gap].p95,
                                                        gb.stages[gap].p99, gb.stages[gap].max), gap
        assert [r.message_id for r in ga.slowest] == [r.message_id for r in gb.slowest]


def test_cli_reads_jaeger(jaeger: str, run: tuple[str, Path], capsys: pytest.CaptureFixture[str],
                          tmp_path: Path) -> None:
    from tracer.tools.cli import main
    service, spans_file = run
    html = tmp_path / "jaeger.html"
    code = main(["report", "--jaeger", jaeger, "--service", service, "--lookback", "1h", "--json", "--html", str(html)])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    assert report["messages"] == len(POLICIES) * GROUPS
    file_report = build_report(read_jsonl(spans_file))
    for g, fg in zip(report["groups"], file_report.groups, strict=True):
        assert g["jobs"][0]["completion_s"] == fg.jobs[0].completion_s
        assert g["jobs"][0]["lower_bound_s"] == fg.jobs[0].lower_bound_s
    assert 'id="waterfall"' in html.read_text()
