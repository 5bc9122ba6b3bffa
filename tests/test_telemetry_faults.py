"""Telemetry faults: what the counters, events and traces say when things go wrong (or on purpose)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace as api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan
from prometheus_client import CollectorRegistry

from tracer.config import DropCounter
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.metrics import TracerMetrics

_PROVIDERS: list[TracerProvider] = []


@pytest.fixture(autouse=True)
def _shut_down_providers() -> Iterator[None]:
    yield
    while _PROVIDERS:
        _PROVIDERS.pop().shutdown()


# -- 1. a policy drop is not an export loss ---------------------------------------------------------
@pytest.mark.parametrize("ours", [True, False], ids=["opened-here", "marked-foreign"])
def test_late_spans_of_a_trace_the_policy_dropped_are_no_export_loss(ours: bool) -> None:
    """A handler's thread ending its span after the keep policy dropped the trace: dropped with
    it, counted as the policy's (rmqtrace_spans_policy_dropped), never in rmqtrace_spans_dropped
    (which RmqtraceSpansDropped reads: a healthy exporter must not page)."""
    reg = CollectorRegistry()
    metrics = TracerMetrics(reg)
    lost, policy = DropCounter(), DropCounter()
    lost.bind(metrics.spans_dropped)
    policy.bind(metrics.spans_policy_dropped)
    memory = InMemorySpanExporter()
    hold = HoldingSpanProcessor([SimpleSpanProcessor(memory)], on_dropped=lost, on_policy_dropped=policy,
                                ticker=False)
    provider = TracerProvider()
    _PROVIDERS.append(provider)
    provider.add_span_processor(hold)
    tracer = provider.get_tracer("t")
    if ours:
        ctx = hold.open_trace(RandomIdGenerator())
        parent = api.set_span_in_context(NonRecordingSpan(ctx))
        root = tracer.start_span("process", context=parent)
    else:
        root = tracer.start_span("process")
        hold.hold(root.get_span_context().trace_id)
    with api.use_span(root, end_on_exit=False):
        late = [tracer.start_span(f"late-{i}") for i in range(3)]
    root.end()
    assert hold.release(root.get_span_context().trace_id, keep=False)
    for span in late:
        span.end()
    assert memory.get_finished_spans() == ()
    s = hold.statistics()
    assert s.dropped == 0 and s.policy_dropped == 3
    assert lost.dropped == 0 and policy.dropped == 3
    assert reg.get_sample_value("rmqtrace_spans_dropped_total") == 0
    assert reg.get_sample_value("rmqtrace_spans_policy_dropped_total") == 3
