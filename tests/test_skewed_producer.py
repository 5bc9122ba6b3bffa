"""A producer whose clock is ahead (issue 31 item 10).

The ``send`` span starts at the produce stamp as the producer read it; the consumer's spans were
drawn on the causal stamps, where a produce stamp later than the broker's store is moved back to
it — so every consumer span started before its ``send`` parent. Now both use one time: the spans
are drawn never before the produce stamp the message carries, which is the send span's start.
The histograms keep the causal gaps (the parts still add up to end_to_end).

Invariant: no exported span's parent starts after it.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.path.stages import Outcome, Stage
from tracer.path.stamps import causal, compute_gaps, drawn, in_order
from tracer.telemetry.tracer import MessageTracer

MS = 1_000_000
SEND, BROKER_WAIT, CLIENT_BUFFER, DISPATCH_WAIT, HANDLER = 2 * MS, 20 * MS, 3 * MS, 5 * MS, 30 * MS
UP_TO_HANDLER = SEND + BROKER_WAIT + CLIENT_BUFFER + DISPATCH_WAIT


def no_parent_starts_after_its_child(spans: list[ReadableSpan]) -> list[tuple[str, str]]:
    """The (parent, child) names of every exported pair where the parent starts later."""
    by_id = {s.context.span_id: s for s in spans}
    bad = []
    for s in spans:
        p = by_id.get(s.parent.span_id) if s.parent is not None else None
        if p is not None and p.start_time > s.start_time:  # type: ignore[operator]
            bad.append((p.name, s.name))
    return bad


def _one_message(ahead_ns: int, shape: str, user_span: bool) -> tuple[list[ReadableSpan], MessageTracer, object]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    consumer_clock = ManualClock()  # the broker's clock too
    producer_clock = ManualClock(consumer_clock.wall_ns() + ahead_ns)
    producer = MessageTracer(tracer_provider=provider, clock=producer_clock)
    consumer = MessageTracer(consumer_group="g", tracer_provider=provider, clock=consumer_clock, trace_shape=shape)
    props: dict[str, str] = {}
    send = producer.start_send("T", props.__setitem__)
    producer_clock.advance(SEND)
    consumer_clock.advance(SEND)
    send.end("m")
    store_ms = consumer_clock.wall_ns() // MS
    consumer_clock.advance(BROKER_WAIT)
    t = consumer.start_message(MessageInfo(topic="T", message_id="m", properties=props, store_ms=store_ms))
    consumer_clock.advance(CLIENT_BUFFER)
    t.mark(Stage.DISPATCH_ENQUEUE)
    consumer_clock.advance(DISPATCH_WAIT)
    with t.handler_scope():
        if user_span:
            # the user's span at the consumer's time (the SDK would read time.time_ns)
            provider.get_tracer("user").start_span("user work", start_time=t.now()).end(end_time=t.now() + MS)
        consumer_clock.advance(HANDLER)
    t.finish(Outcome.SUCCESS)
    return list(exporter.get_finished_spans()), consumer, t


@pytest.mark.parametrize("shape", ["full", "compact"])
@pytest.mark.parametrize("ahead_ns", [0, 1 * MS, 15 * MS, BROKER_WAIT + 2 * MS, UP_TO_HANDLER - MS],
                         ids=["none", "1ms", "15ms", "past-the-pull", "past-the-enqueue"])
def test_no_consumer_span_starts_before_its_send_parent(ahead_ns: int, shape: str) -> None:
    spans, _, _ = _one_message(ahead_ns, shape, user_span=True)
    send = next(s for s in spans if s.name == "send T")
    process = next(s for s in spans if s.name == "process T")
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert no_parent_starts_after_its_child(spans) == []


@pytest.mark.parametrize("shape", ["full", "compact"])
def test_a_producer_ahead_of_the_whole_path_still_parents_our_spans_in_order(shape: str) -> None:
    """Ahead by more than the message's whole path: our own spans start at the send (empty gaps
    get no span); only spans the user's handler dates itself could start earlier (docs/semconv.md)."""
    spans, _, _ = _one_message(10 * 1_000_000_000, shape, user_span=False)
    assert no_parent_starts_after_its_child(spans) == []
    ours = [s for s in spans if s.name != "send T"]
    assert all(s.end_time >= s.start_time for s in ours)  # type: ignore[operator]


def test_the_histogram_gaps_stay_causal_under_a_skewed_producer() -> None:
    # the spans are drawn from the send's start; the gaps observed keep adding up (tracer.path.stamps)
    _, _, t = _one_message(BROKER_WAIT + 2 * MS, "full", user_span=False)
    gaps = {g.gap.name: g.seconds for g in compute_gaps(t.stamps)}  # type: ignore[attr-defined]
    assert gaps["handler"] == pytest.approx(HANDLER / 1e9)
    assert gaps["broker_wait"] == pytest.approx(BROKER_WAIT / 1e9, abs=1e-3)
    path = sum(gaps[g] for g in ("send", "broker_wait", "client_buffer", "dispatch_wait", "handler"))
    assert path == pytest.approx(gaps["end_to_end"])



@given(st.lists(st.integers(0, 10**12), min_size=6, max_size=6), st.integers(-10**9, 10**9))
def test_drawn_stamps_start_at_the_produce_stamp_and_never_go_back(offsets: list[int], skew: int) -> None:
    base = 1_800_000_000 * 1_000_000_000
    times = sorted(base + o for o in offsets)
    times[Stage.PRODUCE] += skew  # the producer's clock, off either way
    c = causal(times)
    d = drawn(times, c)
    assert d[Stage.PRODUCE] == times[Stage.PRODUCE]  # the send span's start, as the producer stamped it
    assert all(d[i] <= d[i + 1] for i in range(len(d) - 1))  # children inside their parents
    assert all(d[i] == max(c[i], times[Stage.PRODUCE]) for i in range(int(Stage.BROKER_STORE), len(d)))
    if in_order(times):
        assert d is times
