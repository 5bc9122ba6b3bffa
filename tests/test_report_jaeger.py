"""The report read back from a real Jaeger: spans of a small embedded-broker run go out over OTLP
and, at the same time, into a JSON-lines file; both sources must give the same numbers.

Jaeger is the one ``services/jaeger/jaeger.sh start`` runs (``make test`` starts it); its ports
follow the script's env vars ``JAEGER_QUERY_PORT`` (16686) and ``JAEGER_OTLP_HTTP_PORT`` (4318).
Skips when Jaeger is not reachable, fails instead under ``RMQTRACE_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import unavailable
from waiting import wait_until

from tracer.report.fleet import FleetCollector
from tracer.report.fleetread import read_jaeger_fleet
from tracer.report.model import build_report, is_process_span, messages_from_spans
from tracer.report.sources import read_jaeger, read_jsonl
from tracer.tools.bench.report import LoadedJob

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


# -- the fleet read paths, and `bench report`, on the real Jaeger --------------------------------
GRPC = os.environ.get("JAEGER_QUERY_GRPC_PORT", "16685")
FLEET_MESSAGES = 1000


@pytest.fixture(scope="module")
def fleet_job(jaeger: str, tmp_path_factory: pytest.TempPathFactory) -> LoadedJob:
    """The bench's job of 10³ messages over 3 instances, through the real tracer into Jaeger."""
    from tracer.tools.bench.report import load_job, wait_in_jaeger

    job = load_job(FLEET_MESSAGES, otlp=OTLP, directory=tmp_path_factory.mktemp("fleet-read"))
    wait_in_jaeger(job, f"127.0.0.1:{GRPC}", timeout=60)
    return job


def _fleet_views(jaeger: str, job: LoadedJob, **kw: Any) -> tuple[FleetCollector, list[dict[str, Any]]]:
    c = read_jaeger_fleet(jaeger, job.service, start_s=job.start_s, end_s=job.end_s, grpc_target=f"127.0.0.1:{GRPC}",
                          **kw)
    return c, [j.as_dict() for j in c.job_views()]


def test_fleet_api_v3_reads_what_the_http_json_reader_reads(jaeger: str, fleet_job: LoadedJob) -> None:
    """The same traces through api_v3 (one page; and small pages that split the window) and through
    /api/traces (the reader report --fleet used before): the same fleet answer, every message once."""
    v3, views_v3 = _fleet_views(jaeger, fleet_job, api="v3")
    split, views_split = _fleet_views(jaeger, fleet_job, api="v3", depth=64)
    http, views_http = _fleet_views(jaeger, fleet_job, api="http", page_limit=100)
    assert v3.api.startswith("api_v3") and http.api.startswith("HTTP JSON")
    assert v3.pages == 1 and split.pages > FLEET_MESSAGES // 64
    assert v3.traces == split.traces == http.traces == FLEET_MESSAGES
    assert views_v3 == views_split == views_http
    [job] = views_v3
    assert job["messages"] == FLEET_MESSAGES
    assert [i["name"] for i in job["instances"]] == ["bench-0", "bench-1", "bench-2"]
    assert all(i["workers"] == 4 for i in job["instances"])


def test_report_fleet_cli_takes_the_v3_path(jaeger: str, fleet_job: LoadedJob,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from tracer.tools.cli import main

    assert main(["report", "--jaeger", jaeger, "--service", fleet_job.service, "--fleet", "--json",
                 "--jaeger-grpc", f"127.0.0.1:{GRPC}"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["api"].startswith("api_v3 gRPC") and out["traces"] == FLEET_MESSAGES
    assert out["jobs"][0]["messages"] == FLEET_MESSAGES


def test_fleet_auto_falls_back_to_http_when_no_v3_answers(jaeger: str, fleet_job: LoadedJob) -> None:
    import socket

    with socket.socket() as s:  # nobody listens here
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    from tracer.report.sources import SourceError

    c = read_jaeger_fleet(jaeger, fleet_job.service, start_s=fleet_job.start_s,
                          end_s=fleet_job.end_s, grpc_target=dead, timeout=5)
    assert c.api.startswith("HTTP JSON") and c.traces == FLEET_MESSAGES
    with pytest.raises(SourceError, match="cannot reach"):
        read_jaeger_fleet(jaeger, fleet_job.service, start_s=fleet_job.start_s,
                          end_s=fleet_job.end_s, grpc_target=dead, timeout=5, api="v3")


def test_bench_report_small_gives_its_json_shape(jaeger: str, tmp_path: Path) -> None:
    """`rmqtrace bench report` at 10³ messages: shape and correctness, not speed."""
    from tracer.tools.bench.report import run_report_bench

    r = run_report_bench((FLEET_MESSAGES,), jaeger=jaeger, otlp=OTLP, grpc_target=f"127.0.0.1:{GRPC}", runs=1,
                         http_max=FLEET_MESSAGES, directory=tmp_path)
    for key in ("messages_per_s", "seconds", "peak_mib"):
        assert r["jaeger"][key] > 0 and r["file"][key] > 0, key
    assert r["jaeger"]["messages"] == r["file"]["messages"] == FLEET_MESSAGES
    size = r["sizes"][str(FLEET_MESSAGES)]
    assert size["fleet_answers_identical"] is True and size["jaeger_http"]["messages"] == FLEET_MESSAGES
    assert r["largest_messages"] == FLEET_MESSAGES and len(r["loadavg"]["before"]) == 3
    json.dumps(r)  # one JSON document


def test_fleet_blockers_from_jaeger_are_those_of_the_span_file(jaeger: str, fleet_job: LoadedJob) -> None:
    """The blockers the fleet view names from Jaeger's records equal fleet_blame over the same job's
    span file (each message's instance from the bench's round-robin hand-out: message i on bench-(i % 3))."""
    from tracer.path.stages import Stage
    from tracer.report.blame import Run
    from tracer.report.fleetblame import fleet_blame
    from tracer.report.spanread import read_span_file
    from tracer.tools.bench.report import INSTANCES, WORKERS

    _, [view] = _fleet_views(jaeger, fleet_job, api="v3")
    runs: list[list[Run]] = [[] for _ in range(INSTANCES)]
    for r in read_span_file(fleet_job.spans_file).records:
        t = r.stamps.times
        runs[int(r.message_id.rsplit("-", 1)[1]) % INSTANCES].append(Run(
            r.message_id, r.message_id, int(r.worker or 0), t[Stage.CLIENT_PULL], t[Stage.HANDLER_START],
            t[Stage.HANDLER_END], t[Stage.DISPATCH_ENQUEUE]))
    shares, ranked = fleet_blame(runs, [WORKERS] * INSTANCES, [f"bench-{k}" for k in range(INSTANCES)])
    assert view["top_blockers"], "the long-tailed job held messages up while other instances idled"
    assert view["top_blockers"] == [b.as_dict() for b in ranked]
    assert view["avoidable_wait"] == {k: round(v, 6) for k, v in shares.items()}


def test_limit_counts_messages_not_receive_traces(jaeger: str, run: tuple[str, Path]) -> None:
    """Each receive call is a trace of its own: --limit 100 of 200 messages found none (issue 33)."""
    service, _ = run
    expected = len(POLICIES) * GROUPS
    query = urllib.parse.urlencode({"service": service, "limit": 10 * expected, "lookback": "1h"})
    with urllib.request.urlopen(f"{jaeger}/api/traces?{query}", timeout=10) as resp:
        traces = json.load(resp)["data"]
    receive_only = [t for t in traces if not any(s["operationName"].startswith("process ") for s in t["spans"])]
    assert receive_only and len(traces) == expected + len(receive_only)  # the run has receive traces
    spans = read_jaeger(jaeger, service, limit=expected, lookback_s=3600, timeout=10)
    assert sum(1 for s in spans if is_process_span(s)) == expected  # fails before: the receive traces took part
    assert len({s.trace_id for s in spans}) == expected
