"""The report's fleet view: one job across instances (``service.instance.id``), read from Jaeger in
pages with bounded memory; the stamps sweep behind "where the job waited"."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tracemalloc
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tracer.path import names
from tracer.path.stages import Stage
from tracer.report.fleet import FleetCollector, Handled, sweep_waits
from tracer.report.fleetread import read_jaeger_fleet
from tracer.report.fleetview import cli_fleet, fleet_lines

S = 1_000_000_000
T0 = 1_800_000_000 * S


def test_sweep_attributes_the_fleet_loss_to_the_holder() -> None:
    # instance 0 (1 worker) holds 3 received at 0 and runs them back to back; instance 1 (2 workers) idles
    recs = [Handled(i, 0, T0, T0 + 2 * i * S, T0 + 2 * (i + 1) * S) for i in range(3)]
    w = sweep_waits(recs, [1, 2], T0)
    # 0-2 s: 2 held, 2 idle elsewhere → 2 w-s/s; 2-4 s: 1 held → 1 w-s/s
    assert w["fleet_idle_while_held_s"] == pytest.approx(6)
    assert w["caused_s"] == pytest.approx([6, 0])
    with pytest.raises(ValueError, match="instance 0"):
        sweep_waits(recs, [], T0)


def _span(span_id: int, instance_pid: str, job: str, pull: int, start: int, end: int, worker: int | None) -> dict[str, Any]:
    tags = [{"key": names.STAMP_ATTRS[Stage.CLIENT_PULL], "type": "int64", "value": pull},
            {"key": names.STAMP_ATTRS[Stage.HANDLER_START], "type": "int64", "value": start},
            {"key": names.STAMP_ATTRS[Stage.HANDLER_END], "type": "int64", "value": end},
            {"key": names.JOB_ID, "type": "string", "value": job}]
    if worker is not None:
        tags.append({"key": names.WORKER, "type": "int64", "value": worker})
    return {"traceID": f"{span_id:032x}", "spanID": f"{span_id:016x}", "operationName": "process T",
            "startTime": pull // 1000, "duration": (end - pull) // 1000, "tags": tags, "processID": instance_pid}


def _trace(i: int, instance: int, job: str, pull: int, start: int, end: int, worker: int | None = 0) -> dict[str, Any]:
    pid = f"p{instance}"
    return {"traceID": f"{i:032x}", "spans": [_span(i, pid, job, pull, start, end, worker)],
            "processes": {pid: {"serviceName": "svc", "tags": [
                {"key": "service.instance.id", "type": "string", "value": f"host:{100 + instance}"}]}}}


def test_the_view_names_instances_workers_and_the_critical_path() -> None:
    c = FleetCollector()
    # host:100 got two long messages on one worker; host:101 (2 workers) finished early
    c.add_jaeger_page({"data": [
        _trace(1, 0, "j", T0, T0, T0 + 3 * S),
        _trace(2, 0, "j", T0, T0 + 3 * S, T0 + 6 * S),
        _trace(3, 1, "j", T0, T0, T0 + S, worker=0),
        _trace(4, 1, "j", T0, T0, T0 + S, worker=1),
        _trace(4, 1, "j", T0, T0, T0 + S, worker=1),  # the same trace again, from an overlapping page
    ]})
    (job,) = c.job_views()
    assert job.messages == 4 and job.completion_s == pytest.approx(6)
    by = {i.name: i for i in job.instances}
    assert (by["host:100"].messages, by["host:100"].workers, by["host:101"].workers) == (2, 1, 2)
    assert by["host:100"].max_held == 2 and by["host:100"].busy_share == pytest.approx(0.75)
    # host:101's 2 workers idle 1-3 s while host:100 holds one message: min(2, 1) × 2 s
    assert job.idle_while_held_s == pytest.approx(2) and by["host:100"].held_while_others_idled_s == pytest.approx(2)
    assert job.critical == {"instance": "host:100", "received_s": 0.0, "waited_unstarted_s": 3.0,
                            "handler_s": 3.0, "ended_s": 6.0}
    text = "\n".join(fleet_lines([job]))
    assert "host:100" in text and "critical path" in text and "2.0 idle worker-s" in text


def test_workers_are_inferred_from_overlap_when_spans_carry_none() -> None:
    c = FleetCollector()
    c.add_jaeger_page({"data": [_trace(i, 0, "j", T0, T0, T0 + S, worker=None) for i in range(3)]})
    (job,) = c.job_views()
    assert job.instances[0].workers == 3 and job.instances[0].workers_inferred
    assert "lower bound" in "\n".join(fleet_lines([job]))


class _FakeJaeger:
    """``/api/traces`` over generated traces: the newest ``limit`` traces starting in the window."""

    def __init__(self, n: int, instances: int) -> None:
        self.n, self.instances, self.calls = n, instances, 0

    def __call__(self, url: str, timeout: float) -> dict[str, Any]:
        self.calls += 1
        q = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
        a, b, limit = int(q["start"][0]), int(q["end"][0]), int(q["limit"][0])
        first, last = max(0, -(-(a - self._start_us(0)) // 1000)), min(self.n - 1, (b - self._start_us(0)) // 1000)
        ids = list(range(first, last + 1))[-limit:]  # one trace per ms from _start_us(0)
        return {"data": [self._trace(i) for i in ids]}  # fresh objects per call, as a real answer

    def _start_us(self, i: int) -> int:
        return (T0 + i * 1_000_000) // 1000  # one message per ms

    def _trace(self, i: int) -> dict[str, Any]:
        pull = T0 + i * 1_000_000
        return _trace(i, i % self.instances, "big", pull, pull + 500_000, pull + 3_500_000, worker=i % 4)


def test_paging_reads_every_trace_once_in_bounded_memory() -> None:
    n = 10_000
    fake = _FakeJaeger(n, instances=3)
    tracemalloc.start()
    try:
        c = read_jaeger_fleet("http://jaeger", "svc", start_s=T0 / 1e9 - 1, end_s=T0 / 1e9 + 11, page_limit=500,
                              get=fake)
        (job,) = c.job_views()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert c.traces == n and job.messages == n and len(job.instances) == 3
    assert c.pages >= n // 500 and fake.calls >= c.pages
    # one page of 500 traces as parsed JSON is ~1.3 MB; all 10^4 would be ~25 MB at once
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert {i.workers for i in job.instances} == {4}


def test_read_jaeger_fleet_refuses_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="page_limit"):
        read_jaeger_fleet("http://jaeger", "svc", page_limit=1, get=lambda u, t: {})
    with pytest.raises(ValueError, match="empty time window"):
        read_jaeger_fleet("http://jaeger", "svc", start_s=10, end_s=5, get=lambda u, t: {})


@pytest.mark.integration
def test_a_fleet_demo_in_jaeger_reads_back_per_instance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import unavailable

    query = f"http://127.0.0.1:{os.environ.get('JAEGER_QUERY_PORT', '16686')}"
    otlp = f"http://127.0.0.1:{os.environ.get('JAEGER_OTLP_HTTP_PORT', '4318')}/v1/traces"
    try:
        urllib.request.urlopen(f"{query}/api/services", timeout=3).close()
    except OSError:
        unavailable(f"Jaeger not reachable at {query} (services/jaeger/jaeger.sh start)")
    service = f"rmqtrace-fleet-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, OTEL_SERVICE_NAME=service, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=otlp,
               OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf")
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "tracer", "demo", "--consumers", "3", "--groups", "60",
                           "--workers", "2", "--case-ms", "1", "--out", str(tmp_path / "demo")],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    deadline = time.monotonic() + 60
    while True:
        c = read_jaeger_fleet(query, service, start_s=started - 5, end_s=time.time() + 5, page_limit=50, api="http")
        jobs = {j.job: j for j in c.job_views()}
        if sum(j.messages for j in jobs.values()) >= 120 or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # real-time: Jaeger indexes spans a moment after they arrive
    assert set(jobs) == {"job-1-prefetch", "job-1-demand_driven"}, jobs.keys()
    dd = jobs["job-1-demand_driven"]
    assert len(dd.instances) == 3 and all(i.name.endswith(("/consumer-0", "/consumer-1", "/consumer-2"))
                                          for i in dd.instances)
    assert c.pages > 1  # 120 traces at 50 a page
    assert dd.idle_while_held_s <= jobs["job-1-prefetch"].idle_while_held_s
    # the command's view of the same service: JSON per job, the lanes page
    html = tmp_path / "fleet.html"
    args = argparse.Namespace(jaeger=query, service=service, lookback="10m", timeout=30.0, job=None, json=True,
                              html=str(html))
    assert cli_fleet(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {j["job"] for j in out["jobs"]} == set(jobs) and out["traces"] >= 120
    assert html.read_text().count("/consumer-2</text>") == 2
    cmd = subprocess.run([sys.executable, "-m", "tracer", "report", "--jaeger", query, "--service", service, "--fleet",
                          "--lookback", "10m"], capture_output=True, text=True, timeout=120)
    assert cmd.returncode == 0, cmd.stderr
    assert "Fleet: job job-1-prefetch" in cmd.stdout and "critical path" in cmd.stdout


def test_an_instance_idle_for_a_whole_job_still_counts() -> None:
    c = FleetCollector()
    c.add_jaeger_page({"data": [
        _trace(1, 0, "a", T0, T0, T0 + 2 * S),
        _trace(2, 0, "a", T0, T0 + 2 * S, T0 + 4 * S),  # waits 2 s on host:100 ...
        _trace(3, 1, "b", T0 + 10 * S, T0 + 10 * S, T0 + 11 * S),  # ... while host:101 (seen in job b) idles
    ]})
    a = next(j for j in c.job_views() if j.job == "a")
    by = {i.name: i for i in a.instances}
    assert by["host:101"].messages == 0 and by["host:101"].workers == 1
    assert a.idle_while_held_s == pytest.approx(2)


def test_the_fleet_page_draws_one_lane_group_per_instance() -> None:
    from tracer.report.fleetview import fleet_page

    c = FleetCollector()
    c.add_jaeger_page({"data": [
        _trace(1, 0, "j", T0, T0, T0 + 3 * S, worker=0),
        _trace(2, 0, "j", T0, T0 + 3 * S, T0 + 6 * S, worker=0),
        _trace(3, 1, "j", T0, T0, T0 + S, worker=1),
    ]})
    (job,) = c.job_views()
    assert job.section is not None
    page = fleet_page("fleet", [job.section])
    assert page.count("host:100</text>") == 1 and page.count("host:101</text>") == 1
    assert page.count("<rect ") == 3 and "held ≤ 1" in page and page.startswith("<!doctype html>")


def test_the_report_fleet_flag_needs_jaeger() -> None:
    out = subprocess.run([sys.executable, "-m", "tracer", "report", "--fleet"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--fleet reads Jaeger" in out.stderr
