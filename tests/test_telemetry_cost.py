"""Issue 20 (per-message cost): what the cheaper paths must keep exactly as before.

The stock samplers are evaluated inline (``tracer.telemetry.spans.stock_decider``): they must give
the decision, attributes and trace state their own ``should_sample`` gives. The compact trace
must carry everything the full trace's ``process`` carries, plus the gaps. A held message (the
keep policy decides at finish) must write nothing of ours unless kept, and a kept compact one
is still one ``process`` span with the user's spans under it.
"""

from __future__ import annotations

import re

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    ParentBased,
    ParentBasedTraceIdRatio,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState
from prometheus_client import CollectorRegistry

from tracer.path.clock import ManualClock
from tracer.path.message import ClientFacts, MessageInfo
from tracer.path.propagation import PRODUCE_NS, TRACEPARENT
from tracer.path.stages import GAPS, Outcome, Stage
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.spans import span_writer, stock_decider
from tracer.telemetry.tracer import MessageTracer

MS = 1_000_000
STATE = TraceState([("vendor", "v1")])
SAMPLERS = {
    "always_on": ALWAYS_ON, "always_off": ALWAYS_OFF, "parentbased_always_on": DEFAULT_ON,
    "parentbased_always_off": DEFAULT_OFF, "traceidratio": TraceIdRatioBased(0.5),
    "parentbased_traceidratio": ParentBasedTraceIdRatio(0.25),
    "parentbased_inverted": ParentBased(TraceIdRatioBased(0.5), remote_parent_sampled=ALWAYS_OFF,
                                        remote_parent_not_sampled=ALWAYS_ON, local_parent_sampled=TraceIdRatioBased(0.5),
                                        local_parent_not_sampled=ALWAYS_ON),
}


def _parents() -> list[SpanContext | None]:
    out: list[SpanContext | None] = [None, SpanContext(0, 0, True)]  # none, and an invalid one
    for i in range(1, 40):
        remote, sampled = bool(i & 1), bool(i & 2)
        out.append(SpanContext(i * 0x9E3779B97F4A7C15F39CC0605CEDC835 % 2**128, i, remote,
                               TraceFlags(int(sampled) | (2 if i & 4 else 0)), STATE if i & 8 else None))
    return out


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_a_stock_sampler_evaluated_inline_decides_what_it_would_itself(name: str) -> None:
    sampler = SAMPLERS[name]
    fast = span_writer(TracerProvider(sampler=sampler).get_tracer("t"))
    called = span_writer(TracerProvider(sampler=sampler).get_tracer("t"))
    assert fast is not None and called is not None
    assert not fast.sampler_called
    called._stock = None  # the same writer, calling the sampler as for any other
    assert called.sampler_called
    attrs = {"messaging.system": "rocketmq", "messaging.destination.name": "T"}
    for parent in _parents():
        links = (Link(parent),) if parent is not None and parent.is_valid else ()
        base = trace.set_span_in_context(NonRecordingSpan(parent), Context()) if parent is not None else None
        for _ in range(3):  # root spans: a fresh trace id each time, the ratio samplers see it
            a_ctx, a_attrs = fast.decide(parent, base, "process T", SpanKind.CONSUMER, attrs, links)
            # same trace id for the called one: draw it from the fast one's decision
            b_parent = parent if parent is not None and parent.is_valid else None
            if b_parent is None:
                called._ids.generate_trace_id = lambda tid=a_ctx.trace_id: tid  # type: ignore[method-assign]
            b_ctx, b_attrs = called.decide(parent, base, "process T", SpanKind.CONSUMER, attrs, links)
            assert a_ctx.trace_id == b_ctx.trace_id
            assert a_ctx.trace_flags == b_ctx.trace_flags, (name, parent)
            assert a_ctx.trace_state == b_ctx.trace_state, (name, parent)
            assert a_attrs == b_attrs, (name, parent)
            assert a_attrs is None or a_attrs is not attrs  # the span gets its own copy


def test_a_sampler_that_is_not_a_stock_class_is_called_with_the_attributes_and_the_link() -> None:
    class Counting(ParentBased):
        calls = 0

        def should_sample(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
            Counting.calls += 1
            return super().should_sample(*args, **kwargs)

    assert stock_decider(Counting(ALWAYS_ON)) is None
    assert stock_decider(ParentBased(Counting(ALWAYS_ON))) is None  # a delegate that is not stock either
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=Counting(ALWAYS_ON))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    clock = ManualClock()
    mt = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    t = mt.start_message(_info(clock, sampled=True))
    with t.handler_scope():
        pass
    t.finish(Outcome.SUCCESS)
    assert Counting.calls == 1


def _info(clock: ManualClock, *, sampled: bool, i: int = 1) -> MessageInfo:
    return MessageInfo(topic="T", message_id=f"M{i}", tag="tg", keys=("k1", "k2"), delivery_attempt=2,
                       properties={TRACEPARENT: f"00-{i:032x}-{i:016x}-0{int(sampled)}",
                                   PRODUCE_NS: str(clock.now_ns() - 3 * MS)},
                       store_ms=clock.now_ns() // MS - 1)


def _run(mt: MessageTracer, clock: ManualClock, info: MessageInfo, *, fail: bool = False,
         inside: object = None) -> None:
    t = mt.start_message(info)
    clock.advance(2 * MS)
    t.mark(Stage.DISPATCH_ENQUEUE)
    clock.advance(30 * MS)
    with t.handler_scope():
        if callable(inside):
            inside()
        clock.advance(10 * MS)
    t.finish(Outcome.FAILURE if fail else Outcome.SUCCESS, ValueError("bad") if fail else None)


@pytest.mark.parametrize("fail", [False, True])
def test_the_compact_process_span_carries_every_attribute_of_the_full_one_and_the_gaps(fail: bool) -> None:
    shapes = {}
    for shape in ("full", "compact"):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        clock = ManualClock()
        mt = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock, trace_shape=shape,
                           client=ClientFacts("c1", "ns"))
        _run(mt, clock, _info(clock, sampled=True), fail=fail)
        (shapes[shape],) = [s for s in exporter.get_finished_spans() if s.name == "process T"]
    full, compact = dict(shapes["full"].attributes), dict(shapes["compact"].attributes)
    gaps = {f"rmqtrace.gap.{g.name}_s" for g in GAPS}
    assert set(compact) - set(full) == gaps
    assert {k: v for k, v in compact.items() if k not in gaps} == full
    assert list(compact["messaging.rocketmq.message.keys"]) == ["k1", "k2"]
    assert compact["rmqtrace.gap.dispatch_wait_s"] == pytest.approx(0.030)
    assert shapes["compact"].status.status_code == shapes["full"].status.status_code
    assert shapes["compact"].end_time == shapes["full"].end_time
    assert shapes["compact"].start_time == compact["rmqtrace.stamp.client_pull_ns"]
    links = {shape: [(link.context.trace_id, link.context.span_id) for link in s.links] for shape, s in shapes.items()}
    assert links["compact"] == links["full"] == [(1, 1)]  # the creation link


def _held(shape: str) -> tuple[MessageTracer, TracerProvider, InMemorySpanExporter, HoldingSpanProcessor,
                              ManualClock]:
    exporter = InMemorySpanExporter()
    hold = HoldingSpanProcessor([SimpleSpanProcessor(exporter)], ticker=False)
    provider = TracerProvider()
    provider.add_span_processor(hold)
    clock = ManualClock()
    mt = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock, trace_shape=shape,
                       keep=KeepPolicy({"dispatch_wait": 10.0}), hold=hold)
    return mt, provider, exporter, hold, clock


@pytest.mark.parametrize("shape", ["full", "compact"])
def test_a_dropped_held_message_writes_nothing_while_its_handler_runs_under_sampled_preallocated_ids(
        shape: str) -> None:
    mt, provider, exporter, hold, clock = _held(shape)
    seen: list[trace.Span] = []

    def inside() -> None:
        seen.append(trace.get_current_span())
        provider.get_tracer("user").start_span("user-work").end()

    _run(mt, clock, _info(clock, sampled=False), inside=inside)
    (current,) = seen
    ctx = current.get_span_context()
    assert not current.is_recording() and ctx.is_valid and ctx.trace_flags.sampled  # ids exist, nothing live
    assert ctx.trace_id != 1  # a held trace of its own, not the unsampled producer's
    assert exporter.get_finished_spans() == ()  # dropped: neither ours nor the user's span left
    assert hold.statistics().held_traces == 0


@pytest.mark.parametrize("shape", ["full", "compact"])
def test_a_held_message_kept_on_failure_is_written_with_the_ids_its_handler_ran_under(shape: str) -> None:
    mt, provider, exporter, _hold, clock = _held(shape)
    seen: list[SpanContext] = []

    def inside() -> None:
        seen.append(trace.get_current_span().get_span_context())
        provider.get_tracer("user").start_span("user-work").end()

    _run(mt, clock, _info(clock, sampled=False, i=7), fail=True, inside=inside)
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    if shape == "compact":
        assert set(by_name) == {"process T", "user-work"}
        current = by_name["process T"]
        assert "rmqtrace.gap.handler_s" in current.attributes
    else:
        assert set(by_name) == {"process T", "handler", "broker_wait", "client_buffer", "dispatch_wait", "user-work"}
        current = by_name["handler"]
    assert current.context.span_id == seen[0].span_id  # the pre-allocated id the handler ran under
    assert by_name["user-work"].parent.span_id == seen[0].span_id
    process = by_name["process T"]
    assert process.parent is None and [link.context.trace_id for link in process.links] == [7]
    assert process.attributes["messaging.destination.name"] == "T"  # the sampling attributes, kept


def test_the_stage_exemplar_is_the_sampled_traces_id() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    clock = ManualClock()
    mt = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry), clock=clock,
                       trace_shape="compact")
    _run(mt, clock, _info(clock, sampled=True, i=0xABC))
    from prometheus_client.openmetrics.exposition import generate_latest
    text = generate_latest(registry).decode()
    found = set(re.findall(r'# \{trace_id="([0-9a-f]+)"\}', text))
    assert found == {f"{0xABC:032x}"}


def test_a_held_message_parses_the_producers_traceparent_only_if_it_is_kept() -> None:
    """The head decision of the default sampler reads only the sampled flag: a dropped held
    message never parses the producer's context (a bad tracestate on it is never counted), a
    kept one parses it for its creation link (and counts a bad tracestate then, once)."""
    mt, _provider, exporter, _hold, clock = _held("full")
    dropped = _info(clock, sampled=False, i=3)
    dropped.properties["tracestate"] = "not a tracestate!"  # type: ignore[index]
    _run(mt, clock, dropped)
    assert exporter.get_finished_spans() == ()
    assert mt.errors.counts["tracestate_invalid"] == 0
    kept = _info(clock, sampled=False, i=5)
    kept.properties["tracestate"] = "not a tracestate!"  # type: ignore[index]
    t = mt.start_message(kept)
    with t.handler_scope():
        pass
    t.finish(Outcome.FAILURE)
    (process,) = [s for s in exporter.get_finished_spans() if s.name == "process T"]
    assert [(link.context.trace_id, link.context.span_id) for link in process.links] == [(5, 5)]
    assert mt.errors.counts["tracestate_invalid"] == 1
    assert t.carried.parent is not None and t.carried.parent.trace_id == 5  # parsed once, kept for readers
    assert mt.errors.counts["tracestate_invalid"] == 1
