"""Held spans: forwarded to every wrapped processor when kept, forgotten when dropped, bounded."""

from __future__ import annotations

import gc
import os
import random
import tracemalloc

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracer.telemetry.hold import HoldingSpanProcessor

LONG = os.environ.get("RMQTRACE_LONG") == "1"


def _setup(**kwargs: int) -> tuple[TracerProvider, HoldingSpanProcessor, InMemorySpanExporter, InMemorySpanExporter]:
    simple, batch = InMemorySpanExporter(), InMemorySpanExporter()
    hold = HoldingSpanProcessor([SimpleSpanProcessor(simple), BatchSpanProcessor(batch)], **kwargs)
    provider = TracerProvider()
    provider.add_span_processor(hold)
    return provider, hold, simple, batch


def _trace_of(provider: TracerProvider, name: str, children: int = 2) -> int:
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span(name) as root:
        for i in range(children):
            tracer.start_span(f"{name}.{i}").end()
    return root.get_span_context().trace_id


def test_a_kept_trace_reaches_every_processor_and_a_dropped_one_none() -> None:
    provider, hold, simple, batch = _setup()
    tracer = provider.get_tracer("t")
    # hold before the trace's first span ends: mark the trace id the root span will get
    root = tracer.start_span("kept")
    hold.hold(root.get_span_context().trace_id)
    with tracer.start_as_current_span("child", context=None):
        pass
    from opentelemetry import trace

    with trace.use_span(root, end_on_exit=True):
        tracer.start_span("user").end()
    other = _trace_of(provider, "unrelated")
    assert {s.name for s in simple.get_finished_spans()} == {"child", "unrelated", "unrelated.0", "unrelated.1"}
    hold.release(root.get_span_context().trace_id, keep=True)
    assert {s.name for s in simple.get_finished_spans()} >= {"kept", "user"}

    dropped = tracer.start_span("dropped")
    hold.hold(dropped.get_span_context().trace_id)
    with trace.use_span(dropped, end_on_exit=True):
        tracer.start_span("dropped-user").end()
    hold.release(dropped.get_span_context().trace_id, keep=False)
    provider.force_flush()
    for exporter in (simple, batch):
        names = [s.name for s in exporter.get_finished_spans()]
        assert "kept" in names and "user" in names and "dropped" not in names and "dropped-user" not in names
    assert other
    assert hold.stats().held_spans == 0 and hold.stats().forwarded == 2 and hold.stats().dropped == 0


def test_bounds_drop_and_count() -> None:
    counted: list[int] = []
    simple = InMemorySpanExporter()
    hold = HoldingSpanProcessor([SimpleSpanProcessor(simple)], max_spans=3, max_traces=2, on_dropped=counted.append)
    provider = TracerProvider()
    provider.add_span_processor(hold)
    tracer = provider.get_tracer("t")
    from opentelemetry import trace

    roots = [tracer.start_span(f"r{i}") for i in range(3)]
    hold.hold(roots[0].get_span_context().trace_id)
    with trace.use_span(roots[0], end_on_exit=True):
        for i in range(5):
            tracer.start_span(f"u{i}").end()
    assert hold.stats().held_spans == 3 and sum(counted) == 3  # u3, u4, then the root itself
    hold.hold(roots[1].get_span_context().trace_id)
    hold.hold(roots[2].get_span_context().trace_id)  # the oldest undecided trace goes
    assert hold.stats().held_traces == 2 and hold.stats().held_spans == 0 and sum(counted) == 6
    assert simple.get_finished_spans() == ()


def test_arguments_that_cannot_work() -> None:
    with pytest.raises(ValueError):
        HoldingSpanProcessor([])
    with pytest.raises(ValueError):
        HoldingSpanProcessor([SimpleSpanProcessor(InMemorySpanExporter())], max_spans=0)
    with pytest.raises(ValueError, match="RMQTRACE_KEEP_HELD_SPANS"):
        HoldingSpanProcessor.from_env([SimpleSpanProcessor(InMemorySpanExporter())], {"RMQTRACE_KEEP_HELD_SPANS": "x"})
    assert HoldingSpanProcessor.from_env([SimpleSpanProcessor(InMemorySpanExporter())],
                                         {"RMQTRACE_KEEP_HELD_SPANS": "7"}).max_spans == 7


def test_held_span_memory_stays_bounded_under_a_soak() -> None:
    """Traces held, some kept, most dropped, some never decided: the held set and the memory it
    takes stop growing at the bound."""
    from opentelemetry import trace

    bound = 500
    provider, hold, simple, _batch = _setup(max_spans=bound, max_traces=bound)
    tracer = provider.get_tracer("t")
    rng = random.Random(3)
    rounds = 60_000 if LONG else 6_000

    def soak(n: int) -> None:
        for _ in range(n):
            root = tracer.start_span("m")
            tid = root.get_span_context().trace_id
            hold.hold(tid)
            with trace.use_span(root, end_on_exit=True):
                for _ in range(rng.randrange(4)):
                    tracer.start_span("u").end()
            r = rng.random()
            if r < 0.05:
                hold.release(tid, keep=True)
            elif r < 0.95:
                hold.release(tid, keep=False)
            # else: never decided (a lost finish) — only the bound frees it
            assert hold.stats().held_spans <= bound and hold.stats().held_traces <= bound
        simple.clear()

    tracemalloc.start()
    try:
        soak(rounds // 3)
        gc.collect()
        first, _ = tracemalloc.get_traced_memory()
        soak(rounds)
        gc.collect()
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert hold.stats().dropped > 0  # the undecided ones were evicted and counted
    assert second - first < 2_000_000, (first, second)  # a full bound of spans is ~1 MB; no growth beyond
