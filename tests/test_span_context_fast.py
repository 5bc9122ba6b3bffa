"""span_context (tracer.path.propagation) builds the very tuple SpanContext(...) builds: every
field, validity included, for any ids (valid, zero, too large, negative) and either state."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from tracer.path.propagation import span_context

_ids = st.one_of(st.integers(0, (1 << 128) + 5), st.integers(-3, 3), st.sampled_from([(1 << 64) - 1, 1 << 64]))


@given(trace_id=_ids, span_id=_ids, remote=st.booleans(), flags=st.sampled_from([0, 1, 2, 3]),
       state=st.sampled_from([None, TraceState(), TraceState([("k", "v")])]))
def test_span_context_is_the_constructors_tuple(trace_id: int, span_id: int, remote: bool, flags: int,
                                                state: TraceState | None) -> None:
    want = SpanContext(trace_id, span_id, remote, TraceFlags(flags), state)
    got = span_context(trace_id, span_id, remote, TraceFlags(flags), state)
    assert type(got) is SpanContext
    assert tuple(got) == tuple(want)
    assert got.is_valid == want.is_valid and got.trace_state == want.trace_state
    assert (got.trace_state is want.trace_state) == (state is None or got.trace_state is state)
