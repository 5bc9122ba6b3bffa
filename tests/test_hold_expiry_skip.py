"""The hold scans for aged traces only when one can be due (HoldingSpanProcessor._expire_at, a
lower bound): against the same hold made to scan at every hold (the reference, the bound reset
before each step), the same statistics after every step of any mix of holds, runs, releases, late
and early spans and clock moves."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import SpanContext, TraceFlags

from tracer.path.clock import ManualClock
from tracer.telemetry.hold import HoldingSpanProcessor

S = 1_000_000_000


class _Count(SpanProcessor):
    def __init__(self) -> None:
        self.n = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.n += 1


def _span(trace_id: int, span_id: int) -> ReadableSpan:
    return ReadableSpan("s", SpanContext(trace_id, span_id, False, TraceFlags(1)), None)


_STEP = st.one_of(
    st.tuples(st.just("hold"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("ran"), st.integers(1, 6)),
    st.tuples(st.just("release"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("span"), st.integers(1, 6)),
    st.tuples(st.just("advance"), st.integers(0, 8)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, max_size=40))
def test_skipping_the_scan_changes_nothing(steps: list[tuple[Any, ...]]) -> None:
    clocks = [ManualClock(), ManualClock()]
    outs = [_Count(), _Count()]
    holds = [HoldingSpanProcessor([out], max_age_s=5.0, max_traces=4, clock=clock, ticker=False)
             for out, clock in zip(outs, clocks)]
    span_id = 0
    for step in steps:
        holds[1]._expire_at = 0  # the reference: scans at every hold, as before the bound
        for hold, clock in zip(holds, clocks):
            what = step[0]
            if what == "hold":
                hold.hold(step[1] << 64, running=step[2])
            elif what == "ran":
                hold.ran(step[1] << 64)
            elif what == "release":
                hold.release(step[1] << 64, step[2])
            elif what == "span":
                hold.on_end(_span(step[1] << 64, span_id + 1))
            else:
                clock.advance(step[1] * S)
        span_id += 1
        assert holds[0].statistics() == holds[1].statistics()
        assert outs[0].n == outs[1].n
