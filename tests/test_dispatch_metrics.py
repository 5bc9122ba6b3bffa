"""Dispatcher series read back from a fresh registry: counts, labels, gauges at scrape time."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from tracer.dispatch import DEFAULT_BUCKETS, CostAware, Dispatcher, DispatchMetrics
from tracer.path.clock import ManualClock
from tracer.path.stages import Outcome, Stage

WAIT = 10.0


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    v = reg.get_sample_value(name, labels)
    return 0.0 if v is None else v


def test_slot_wait_count_equals_messages_handled_and_outcomes_counted() -> None:
    reg = CollectorRegistry()
    m = DispatchMetrics(reg)

    def handler(i: int) -> None:
        if i % 4 == 0:
            raise ValueError(i)

    with Dispatcher(handler, workers=3, metrics=m, on_done=lambda *a: None) as d:
        for i in range(100):
            d.submit(i)
    s = d.statistics()
    assert value(reg, "rmqtrace_dispatch_slot_wait_seconds_count", policy="aggressive") == 100
    assert value(reg, "rmqtrace_dispatch_submit_blocked_seconds_count", policy="aggressive") == 100
    assert value(reg, "rmqtrace_dispatch_messages_total", policy="aggressive", outcome="success") == s.handled == 75
    assert value(reg, "rmqtrace_dispatch_messages_total", policy="aggressive", outcome="failure") == s.failed == 25
    for o in Outcome:  # every outcome child exists from the start (pre-bound)
        labels = {"policy": "aggressive", "outcome": o.value}
        assert reg.get_sample_value("rmqtrace_dispatch_messages_total", labels) is not None


def test_slot_wait_measured_on_the_injected_clock() -> None:
    reg = CollectorRegistry()
    clock = ManualClock()
    started = threading.Event()
    release = threading.Event()

    def handler(i: int) -> None:
        if i == 0:
            started.set()
            assert release.wait(WAIT)

    d = Dispatcher(handler, workers=1, policy=CostAware(window=4), metrics=DispatchMetrics(reg), clock=clock)
    d.submit(0)
    assert started.wait(WAIT)
    d.submit(1)  # waits in the window...
    clock.advance_s(0.3)  # ...for 0.3 s of the injected clock
    release.set()
    d.close()
    assert value(reg, "rmqtrace_dispatch_slot_wait_seconds_sum", policy="cost_aware") == pytest.approx(0.3)
    assert value(reg, "rmqtrace_dispatch_slot_wait_seconds_bucket", policy="cost_aware", le="0.25") == 1
    assert value(reg, "rmqtrace_dispatch_slot_wait_seconds_bucket", policy="cost_aware", le="0.5") == 2


def test_gauges_follow_live_dispatchers_and_are_summed_per_policy() -> None:
    reg = CollectorRegistry()
    m = DispatchMetrics(reg)
    started = threading.Event()
    release = threading.Event()

    def handler(i: int) -> None:
        started.set()
        assert release.wait(WAIT)

    a = Dispatcher(handler, workers=2, policy=CostAware(window=5), metrics=m)
    b = Dispatcher(handler, workers=3, policy=CostAware(window=5), metrics=m)
    a.submit(1)
    assert started.wait(WAIT)
    a.submit(2)
    a.submit(3)
    assert value(reg, "rmqtrace_dispatch_workers", policy="cost_aware") == 5
    assert value(reg, "rmqtrace_dispatch_busy_workers", policy="cost_aware") == 2
    assert value(reg, "rmqtrace_dispatch_queued_messages", policy="cost_aware") == 1
    release.set()
    a.close()
    b.close()
    assert value(reg, "rmqtrace_dispatch_workers", policy="cost_aware") == 0
    assert value(reg, "rmqtrace_dispatch_busy_workers", policy="cost_aware") == 0


def test_buckets_and_shared_instance() -> None:
    assert DEFAULT_BUCKETS[0] == 0.001 and DEFAULT_BUCKETS[-1] == 600.0
    reg = CollectorRegistry()
    assert DispatchMetrics.shared(reg) is DispatchMetrics.shared(reg)
    with pytest.raises(ValueError):  # prometheus-client refuses duplicate series
        DispatchMetrics(reg)
    text = generate_latest(reg).decode()
    assert 'rmqtrace_dispatch_slot_wait_seconds_bucket{le="600.0",policy=' not in text  # no children yet
    assert "rmqtrace_dispatch_messages_total" in text


class ExemplarTrace:
    def mark(self, stage: Stage) -> None:
        pass

    @contextmanager
    def handler_scope(self) -> Iterator[object]:
        yield None

    def finish(self, outcome: Outcome, error: BaseException | None) -> None:
        pass

    def exemplar(self) -> dict[str, str]:
        return {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}


def test_slot_wait_carries_the_trace_exemplar() -> None:
    reg = CollectorRegistry()
    with Dispatcher(lambda i: None, workers=1, metrics=DispatchMetrics(reg)) as d:
        d.submit(1, ExemplarTrace())
    text = generate_openmetrics(reg).decode()
    assert '# {trace_id="4bf92f3577b34da6a3ce929d0e0e4736"}' in text


def test_no_unbounded_labels() -> None:
    reg = CollectorRegistry()
    with Dispatcher(lambda i: None, workers=2, metrics=DispatchMetrics(reg), key=str) as d:
        for i in range(50):
            d.submit(i)
    labelsets: set[tuple[Any, ...]] = set()
    for fam in reg.collect():
        for sample in fam.samples:
            labelsets.add(tuple(sorted(k for k in sample.labels if k != "le")))
    assert labelsets <= {("policy",), ("outcome", "policy")}


def test_gauge_sources_are_public_and_unbind_is_idempotent() -> None:
    reg = CollectorRegistry()
    m = DispatchMetrics(reg)
    d = Dispatcher(lambda i: None, workers=2, metrics=m)
    assert value(reg, "rmqtrace_dispatch_workers", policy="aggressive") == 2
    assert m.sources_for("aggressive").workers() == 2.0
    d.close()
    d.close()
    assert m.sources_for("aggressive").workers() == 0.0
