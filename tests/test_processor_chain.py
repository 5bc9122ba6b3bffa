"""The flattened processor chain (tracer.telemetry.chain) against the SDK's own: the same calls
with an effect, in the same order, for every mix of processors, sampled and unsampled spans and
processors added between spans — and the span writer through it against the SDK's chain."""

from __future__ import annotations

from typing import Any, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, SynchronousMultiSpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from tracer.telemetry.abandon import AbandonOnShutdown
from tracer.telemetry.chain import ProcessorChain, does_nothing
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.spans import span_writer


class _Log(SpanExporter):
    def __init__(self, log: list[Any], tag: str) -> None:
        self.log, self.tag = log, tag

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.log.extend((self.tag, "export", s.name) for s in spans)
        return SpanExportResult.SUCCESS


class _Recording(SpanProcessor):
    def __init__(self, log: list[Any], tag: str) -> None:
        self.log, self.tag = log, tag

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        self.log.append((self.tag, "start", span.name, parent_context is not None))

    def on_end(self, span: ReadableSpan) -> None:
        self.log.append((self.tag, "end", span.name))


class _EndsOnly(SpanProcessor):
    """An on_start left empty, the way BatchSpanProcessor's is (a docstring and nothing else)."""

    def __init__(self, log: list[Any], tag: str) -> None:
        self.log, self.tag = log, tag

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        """Nothing to do at the start."""

    def on_end(self, span: ReadableSpan) -> None:
        self.log.append((self.tag, "end", span.name))


KINDS = ("batch", "simple", "recording", "ends_only", "empty", "abandon", "hold")


def _make(kind: str, log: list[Any], tag: str) -> SpanProcessor:
    if kind == "batch":
        return BatchSpanProcessor(_Log(log, tag), schedule_delay_millis=60_000)
    if kind == "simple":
        return SimpleSpanProcessor(_Log(log, tag))
    if kind == "recording":
        return _Recording(log, tag)
    if kind == "ends_only":
        return _EndsOnly(log, tag)
    if kind == "abandon":
        return AbandonOnShutdown()
    if kind == "hold":
        return HoldingSpanProcessor([_Recording(log, tag)], ticker=False)
    return SpanProcessor()


def _span(name: str, sampled: bool) -> ReadableSpan:
    ctx = SpanContext(0x1234, 0x99, False, TraceFlags(int(sampled)))
    return ReadableSpan(name, ctx, None, kind=SpanKind.INTERNAL, start_time=1, end_time=2)


def _flush(multi: SynchronousMultiSpanProcessor) -> None:
    for p in multi._span_processors:
        p.force_flush()


steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(KINDS)),
    st.tuples(st.just("start"), st.booleans()),
    st.tuples(st.just("end"), st.booleans()),
), max_size=25)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(KINDS), max_size=4), steps)
def test_the_chain_makes_the_calls_the_sdk_chain_makes(first: list[str], plan: list[tuple[str, Any]]) -> None:
    logs: list[list[Any]] = [[], []]
    multis = [SynchronousMultiSpanProcessor(), SynchronousMultiSpanProcessor()]
    for i, kind in enumerate(first):
        for log, multi in zip(logs, multis):
            multi.add_span_processor(_make(kind, log, f"p{i}"))
    chain = ProcessorChain(multis[1])
    assert chain.flat
    n = len(first)
    for k, (what, arg) in enumerate(plan):
        if what == "add":
            for log, multi in zip(logs, multis):
                multi.add_span_processor(_make(arg, log, f"p{n}"))
            n += 1
        elif what == "start":
            span = _span(f"s{k}", True)
            parent = Context() if arg else None
            multis[0].on_start(span, parent_context=parent)  # type: ignore[arg-type]
            chain.on_start(span, parent)
        else:
            span = _span(f"e{k}", arg)
            multis[0].on_end(span)
            chain.on_end(span)
    for multi in multis:
        _flush(multi)
    assert logs[1] == logs[0]


def _provider(kinds: Sequence[str], log: list[Any]) -> TracerProvider:
    provider = TracerProvider()
    for i, kind in enumerate(kinds):
        provider.add_span_processor(_make(kind, log, f"p{i}"))
    return provider


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(KINDS), min_size=1, max_size=4), st.lists(st.booleans(), min_size=1, max_size=8))
def test_the_writer_hands_spans_over_as_the_sdk_chain_would(kinds: list[str], sampled: list[bool]) -> None:
    """SpanWriter.emit (the chain inline) against the provider's own processor, span by span."""
    logs: list[list[Any]] = [[], []]
    providers = [_provider(kinds, logs[0]), _provider(kinds, logs[1])]
    writer = span_writer(providers[1].get_tracer("t"))
    assert writer is not None
    for i, s in enumerate(sampled):
        span = _span(f"w{i}", s)
        providers[0]._active_span_processor.on_end(span)
        writer.emit(span.name, span.context, None, 1, 2)
    for p in providers:
        p.force_flush()
    assert [e[:3] for e in logs[1]] == [e[:3] for e in logs[0]]


def test_an_empty_body_is_told_from_one_that_does_something() -> None:
    def empty(self: object, span: object) -> None:
        pass

    def doc_only(self: object, span: object) -> None:
        """Only a docstring."""

    def returns_none(self: object, span: object) -> None:
        return None

    def works(self: object, span: object) -> None:
        print(span)

    def returns_value(self: object, span: object) -> int:
        return 1

    assert does_nothing(empty) and does_nothing(doc_only) and does_nothing(returns_none)
    assert not does_nothing(works) and not does_nothing(returns_value)
    assert does_nothing(SpanProcessor().on_end) and does_nothing(BatchSpanProcessor(_Log([], "x")).on_start)
    assert not does_nothing(print) and not does_nothing(lambda span: span.end())
    assert not ProcessorChain(HoldingSpanProcessor([SpanProcessor()], ticker=False)).flat
