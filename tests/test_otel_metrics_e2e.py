"""End to end: OTel metrics of a real pipeline (embedded broker) exported over OTLP/HTTP to the
local Jaeger, whose collector pipeline (Jaeger v2 is an OTel collector) re-exposes them through its
``prometheus`` exporter (services/jaeger/jaeger-config.yaml, port 8889); our own Prometheus scrapes
that and the series are queried back with PromQL.

Names as the collector's Prometheus exporter writes them: dots become ``_``, the unit ``s`` a
``_seconds`` suffix, counters get ``_total``; ``{message}`` units are dropped.
"""

from __future__ import annotations

import os
import subprocess
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import REPO, unavailable
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from waiting import wait_until

from services import start_prometheus
from tracer.clients.consume import ConsumeLoop
from tracer.clients.producer import TracedProducer
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.telemetry.otel_metrics import MessagingMeters
from tracer.telemetry.tracer import MessageTracer

pytestmark = pytest.mark.integration

OTLP_PORT = int(os.environ.get("JAEGER_OTLP_HTTP_PORT", "4318"))
EXPORTER_PORT = int(os.environ.get("JAEGER_PROM_EXPORTER_PORT", "8889"))
N = 12


def _exporter_up() -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{EXPORTER_PORT}/metrics", timeout=3) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def jaeger_prometheus_exporter() -> int:
    if not _exporter_up():
        proc = subprocess.run(["bash", str(REPO / "services" / "jaeger" / "jaeger.sh"), "start"],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not _exporter_up():
            unavailable(f"Jaeger's Prometheus exporter not reachable on :{EXPORTER_PORT}: {proc.stderr.strip()[-600:]}")
    return EXPORTER_PORT


def _run_pipeline(topic: str, group: str, meters: MessagingMeters) -> None:
    broker = EmbeddedBroker()
    producer_tracer = MessageTracer(tracer_provider=TracerProvider())
    producer_tracer.meters = meters
    producer = TracedProducer(Producer(broker, [topic]), producer_tracer)
    producer.startup()
    for i in range(N):
        m = Message()
        m.topic, m.body = topic, f"m{i}".encode()
        producer.send(m)
    consumer = SimpleConsumer(broker, group, {topic: None}, await_duration=0.05)
    consumer.startup()
    tracer = MessageTracer(consumer_group=group, tracer_provider=TracerProvider())
    tracer.meters = meters
    loop = ConsumeLoop(consumer, lambda m: None, tracer=tracer, workers=2)
    runner = threading.Thread(target=loop.run, daemon=True)
    runner.start()
    wait_until(lambda: loop.statistics().acked == N, timeout=60, what="all acked")
    loop.stop()
    runner.join(10)


def test_otlp_metrics_reach_prometheus_through_jaeger(jaeger_prometheus_exporter: int, tmp_path: Path):
    run = uuid.uuid4().hex[:10]
    topic, group = f"otel-metrics-{run}", f"otel-group-{run}"
    exporter = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{OTLP_PORT}/v1/metrics")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)  # flushed by hand below
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": f"rmqtrace-e2e-{run}"}))
    prom = start_prometheus([f"127.0.0.1:{jaeger_prometheus_exporter}"], [], state_dir=tmp_path / "prom")
    try:
        _run_pipeline(topic, group, MessagingMeters(provider))
        assert provider.force_flush(10_000)
        where = f'messaging_destination_name="{topic}"'
        queries = {
            f"sum(messaging_client_operation_duration_seconds_count{{{where},messaging_operation_name=\"send\"}})": N,
            f"sum(messaging_client_sent_messages_total{{{where}}})": N,
            f"sum(messaging_process_duration_seconds_count{{{where},messaging_consumer_group_name=\"{group}\"}})": N,
            f"sum(messaging_client_consumed_messages_total{{{where}}})": N,
            f"sum(rmqtrace_stage_duration_seconds_count{{{where},rmqtrace_stage=\"handler\"}})": N,
            f"count(count by (rmqtrace_stage) (rmqtrace_stage_duration_seconds_count{{{where}}}))": 7,
        }
        got: dict[str, float | None] = {}

        def arrived() -> bool:
            for q in queries:
                result = prom.query(q)
                got[q] = float(result[0]["value"][1]) if result else None
            return got == {q: float(v) for q, v in queries.items()}

        wait_until(arrived, timeout=60, interval=0.5, what=f"the pipeline's OTel metrics in Prometheus: {got}")
        # the spec's advised buckets survived OTLP -> collector -> Prometheus
        les = {s["le"] for s in prom.series([f"messaging_process_duration_seconds_bucket{{{where}}}"])}
        assert {"0.005", "0.075", "7.5", "10.0", "+Inf"} <= les, les
    finally:
        provider.shutdown()
        prom.stop()
