"""TracerMetrics on shared registries, the joint label cap, and Prometheus multiprocess mode."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from tracer.config import Settings, serve_metrics
from tracer.path.message import MessageInfo
from tracer.path.stages import Outcome
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _handle(tracer: MessageTracer, topic: str, outcome: Outcome = Outcome.SUCCESS) -> None:
    t = tracer.start_message(MessageInfo(topic=topic))
    with t.handler_scope():
        pass
    t.finish(outcome)


def _families(registry: CollectorRegistry) -> list[str]:
    return [m.name for m in registry.collect()]


def test_a_second_tracer_metrics_is_refused_and_the_first_still_scrapes(registry):
    first = TracerMetrics(registry)
    _handle(MessageTracer(consumer_group="g", metrics=first), "t")
    with pytest.raises(ValueError, match="TracerMetrics.shared"):
        TracerMetrics(registry)
    text = generate_latest(registry).decode()  # raised "Clashing name" before
    assert text.count("# TYPE rmqtrace_stage_duration_seconds histogram") == 1
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": "t", "consumer_group": "g", "outcome": "success"}) == 1


def test_registration_is_all_or_nothing(registry):
    squatter = Counter("rmqtrace_propagation_errors", "someone else's", ["kind"], registry=registry)
    with pytest.raises(ValueError):
        TracerMetrics(registry)
    assert _families(registry) == ["rmqtrace_propagation_errors"]  # nothing of ours half-registered
    registry.unregister(squatter)
    m = TracerMetrics(registry)
    assert TracerMetrics.shared(registry) is m


def test_shared_is_one_instance_per_registry(registry):
    a = TracerMetrics.shared(registry)
    assert TracerMetrics.shared(registry) is a
    other = CollectorRegistry()
    assert TracerMetrics.shared(other) is not a
    generate_latest(registry)


def test_80_topics_by_80_groups_stay_bounded(registry):
    metrics = TracerMetrics(registry, label_limit=64)
    for g in range(80):
        tracer = MessageTracer(consumer_group=f"group-{g}", metrics=metrics)
        for t in range(80):
            _handle(tracer, f"topic-{t}")
    pairs = {(s.labels["topic"], s.labels["consumer_group"])
             for m in registry.collect() if m.name == "rmqtrace_messages" for s in m.samples}
    assert len(pairs) <= 2 * 64 + 1  # was 4,225 with topic and group capped separately
    assert ("topic-0", "group-0") in pairs and ("other", "group-79") not in pairs
    total = sum(s.value for m in registry.collect() if m.name == "rmqtrace_messages"
                for s in m.samples if s.name == "rmqtrace_messages_total")
    assert total == 80 * 80  # every message still counted
    samples = sum(len(m.samples) for m in registry.collect())
    assert samples < 20_000  # was 536,583


@pytest.mark.parametrize("field", ["topic", "group"])
def test_values_that_are_not_valid_utf8_become_other(registry, field):
    metrics = TracerMetrics(registry)
    bad = "bad-\udcff"
    tracer = MessageTracer(consumer_group=bad if field == "group" else "g", metrics=metrics)
    _handle(tracer, bad if field == "topic" else "t")
    generate_latest(registry)
    want = {"topic": "other", "consumer_group": "g"} if field == "topic" else {"topic": "t", "consumer_group": "other"}
    assert registry.get_sample_value("rmqtrace_messages_total", {**want, "outcome": "success"}) == 1


_WORKER = textwrap.dedent("""
    import sys
    from prometheus_client import CollectorRegistry
    from tracer.path.message import MessageInfo
    from tracer.path.stages import Outcome
    from tracer.telemetry.metrics import TracerMetrics
    from tracer.telemetry.tracer import MessageTracer

    metrics = TracerMetrics(CollectorRegistry())
    assert metrics.multiprocess
    tracer = MessageTracer(consumer_group="workers", metrics=metrics)
    for i in range(int(sys.argv[1])):
        t = tracer.start_message(MessageInfo(topic="orders"))
        with t.handler_scope():
            pass
        t.finish(Outcome.SUCCESS if i % 2 else Outcome.FAILURE)
""")


def _two_workers(tmp_path: Path) -> Path:
    """Two real processes writing 6 and 10 messages into one multiprocess directory."""
    mp = tmp_path / "multiproc"
    mp.mkdir()
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(mp))
    workers = [subprocess.Popen([sys.executable, "-c", _WORKER, str(n)], env=env) for n in (6, 10)]
    assert [w.wait(timeout=120) for w in workers] == [0, 0]
    return mp


def test_multiprocess_mode_two_workers_one_collector(tmp_path: Path) -> None:
    mp = _two_workers(tmp_path)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(mp))
    labels = {"topic": "orders", "consumer_group": "workers"}
    assert registry.get_sample_value("rmqtrace_stage_duration_seconds_count", {**labels, "stage": "handler"}) == 16
    assert registry.get_sample_value("rmqtrace_stage_duration_seconds_bucket",
                                     {**labels, "stage": "handler", "le": "+Inf"}) == 16
    assert registry.get_sample_value("rmqtrace_messages_total", {**labels, "outcome": "success"}) == 3 + 5
    assert registry.get_sample_value("rmqtrace_messages_total", {**labels, "outcome": "failure"}) == 3 + 5


def test_serve_metrics_serves_every_process_in_multiprocess_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    mp = _two_workers(tmp_path)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(mp))
    port = free_port()
    server: Any = serve_metrics(Settings(metrics_port=port), CollectorRegistry())  # this process's registry: empty
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'rmqtrace_stage_duration_seconds_count{consumer_group="workers",stage="handler",topic="orders"} 16.0' in text
