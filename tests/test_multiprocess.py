"""Prometheus multiprocess mode with real processes: every rmqtrace series survives the aggregate.

Two worker processes write to one ``PROMETHEUS_MULTIPROC_DIR`` while they are alive; this process
reads the directory with ``MultiProcessCollector``, as a gunicorn-style ``/metrics`` does. Before,
the occupancy series were absent there, ``rmqtrace_dispatch_workers`` read 0 (a ``set_function``
gauge never reaches the files) and the joint (topic, group) cap held per process only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

LIMIT = 4  # the joint label cap of the stage series

_WORKER = textwrap.dedent("""
    import sys, threading, time
    from tracer.path.stages import GAPS
    from tracer.telemetry.probe_metrics import ProbeMetrics
    from prometheus_client import CollectorRegistry
    from tracer.dispatch import Dispatcher, DispatchMetrics
    from tracer.path.clock import ManualClock
    from tracer.path.message import MessageInfo
    from tracer.path.stages import Outcome
    from tracer.telemetry.metrics import TracerMetrics
    from tracer.telemetry.occupancy import OccupancyMetrics
    from tracer.telemetry.tracer import MessageTracer

    name, workers, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    registry = CollectorRegistry()  # this process's: the aggregate is read from the directory
    metrics = TracerMetrics(registry, label_limit=limit)
    occupancy = OccupancyMetrics(registry)
    clock = ManualClock()
    occ = occupancy.track("g", workers, clock=clock)
    tracer = MessageTracer(consumer_group="g", metrics=metrics, occupancy=occ, clock=clock)
    for i in range(2 * limit):  # topics of this process only: 2 * limit of them
        t = tracer.start_message(MessageInfo(topic=f"{name}{i}"))
        with t.handler_scope():
            clock.advance_s(1)
        t.finish(Outcome.SUCCESS)
    tracer.start_message(MessageInfo(topic=f"{name}0"))  # one received, never started
    clock.advance_s(2)
    occupancy.flush()  # the refresher would within a second; the test does not wait for it
    dispatcher = Dispatcher(lambda item: None, workers=workers, metrics=DispatchMetrics(registry))
    # every other series once, so the aggregate can be checked family by family
    dispatcher.submit("x")
    assert dispatcher.wait_idle(30)
    metrics.clamped(next(g.name for g in GAPS if g.crosses_clocks))
    metrics.skew_bound.labels("broker").set(-0.001)
    metrics.count_propagation_error("malformed_traceparent")
    metrics.avoidable(f"{name}0", "g", "round_robin", 0.5)
    metrics.lease_lost(f"{name}0", "g", "expired")
    probes = ProbeMetrics(registry, label_limit=limit)
    now = time.time_ns()
    probes.record(f"{name}p", "g", [now - 3_000_000, now - 2_000_000, now - 1_000_000, now, now, 0], now)
    probes.sent_one(f"{name}p", True, now)
    print("ready", flush=True)
    sys.stdin.readline()  # alive until the test has read the aggregate
    dispatcher.close()
""")


@pytest.fixture(scope="module")
def two_live_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CollectorRegistry]:
    mp = tmp_path_factory.mktemp("multiproc")
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(mp))
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, name, str(n), str(LIMIT)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for name, n in (("a", 2), ("b", 3))]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(mp))
        yield registry
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        assert [p.wait(timeout=120) for p in procs] == [0, 0]


def test_occupancy_series_are_in_the_aggregate(two_live_workers: CollectorRegistry) -> None:
    reg = two_live_workers

    def value(name: str) -> float | None:
        return reg.get_sample_value(name, {"consumer_group": "g"})

    assert value("rmqtrace_consumer_workers") == 2 + 3
    assert value("rmqtrace_consumer_busy_workers") == 0
    assert value("rmqtrace_consumer_unstarted_messages") == 2  # one per process
    assert value("rmqtrace_consumer_oldest_unstarted_age_seconds") == pytest.approx(2)  # the max, not the sum
    # each process: 2 * LIMIT handlers of 1 s, then 2 s with one message waiting and every worker idle
    assert value("rmqtrace_consumer_busy_worker_seconds_total") == pytest.approx(2 * 2 * LIMIT)
    assert value("rmqtrace_consumer_holding_seconds_total") == pytest.approx(2 + 2)
    assert value("rmqtrace_consumer_hol_idle_worker_seconds_total") == pytest.approx(2 + 2)


def test_dispatch_worker_gauge_sums_the_live_processes(two_live_workers: CollectorRegistry) -> None:
    labels = {"policy": "aggressive", "consumer_group": ""}
    assert two_live_workers.get_sample_value("rmqtrace_dispatch_workers", labels) == 2 + 3
    assert two_live_workers.get_sample_value("rmqtrace_dispatch_busy_workers", labels) == 0
    # the worker-seconds counters reach the files too (written by flush, not at scrape time)
    for name in ("rmqtrace_dispatch_busy_worker_seconds_total", "rmqtrace_dispatch_hol_idle_worker_seconds_total"):
        assert two_live_workers.get_sample_value(name, labels) is not None, name


def test_the_joint_label_cap_holds_in_the_aggregate(two_live_workers: CollectorRegistry) -> None:
    topics = {s.labels["topic"] for m in two_live_workers.collect() if m.name == "rmqtrace_stage_duration_seconds"
              for s in m.samples}
    assert len(topics - {"other"}) == LIMIT, topics  # was 2 * LIMIT: one cap per process
    assert "other" in topics
    total = sum(s.value for m in two_live_workers.collect() if m.name == "rmqtrace_messages"
                for s in m.samples if s.name == "rmqtrace_messages_total")
    assert total == 2 * 2 * LIMIT  # nothing lost to the cap: overflow goes to `other`


def _described_families() -> set[str]:
    """Every family rmqtrace's collectors describe (found as test_collectors finds them)."""
    from test_collectors import COLLECTORS

    names: set[str] = set()
    for cls in COLLECTORS:
        names |= {m.name for c in cls(CollectorRegistry()).collectors for m in c.describe()}
    return names


def test_every_series_is_in_the_aggregate(two_live_workers: CollectorRegistry) -> None:
    aggregate = {m.name for m in two_live_workers.collect() if m.samples}
    missing = _described_families() - aggregate
    assert not missing, f"series lost in multiprocess mode: {sorted(missing)}"


def test_a_shared_cap_whose_directory_is_gone_still_caps_per_process(tmp_path, caplog) -> None:
    from tracer.telemetry.registration import SharedAdmission

    admit = SharedAdmission(str(tmp_path / "gone"), "x", 2)
    assert [admit(k) for k in "abca"] == [True, True, False, True]
    assert "holds per process" in caplog.text


_ADMITTER = textwrap.dedent("""
    import json, sys
    from tracer.telemetry.registration import SharedAdmission
    directory, me = sys.argv[1], sys.argv[2]
    admit = SharedAdmission(directory, "race", 10)
    print(json.dumps([k for k in (f"{me}-{i}" for i in range(50)) if admit(k)]))
""")


def test_a_shared_cap_holds_when_processes_race_for_it(tmp_path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _ADMITTER, str(tmp_path), str(p)], stdout=subprocess.PIPE,
                              text=True) for p in range(4)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    admitted = [k for out in outs for k in json.loads(out)]
    lines = (tmp_path / "rmqtrace_race.admitted").read_text().splitlines()
    assert len(lines) == 10 and sorted(admitted) == sorted(lines)  # ten in all, each admitted once
