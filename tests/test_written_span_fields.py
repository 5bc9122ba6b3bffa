"""SpanWriter.emit builds the ReadableSpan's instance dict inline instead of calling its
constructor (tracer.telemetry.spans.FAST_READABLE): every span it hands over must be the span the
constructor makes from the same fields, field for field and in the same order, whatever the
fields — and the import-time check must refuse a constructor that makes something else."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tracer.telemetry import spans
from tracer.telemetry.spans import SCOPE, span_writer


class _Keep(SpanProcessor):
    def __init__(self) -> None:
        self.ended: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


_IDS = st.integers(1, 2**64 - 1)
_ATTRS = st.dictionaries(st.sampled_from(["a", "b", "messaging.system", "x.y"]),
                         st.one_of(st.integers(-5, 5), st.text(max_size=5), st.booleans(), st.floats(0, 1)),
                         max_size=4)


@settings(max_examples=150, deadline=None)
@given(st.text(min_size=1, max_size=12), _IDS, _IDS, st.booleans(), st.one_of(st.none(), _IDS), _ATTRS,
       st.sampled_from(list(SpanKind)), st.sampled_from([None, Status(StatusCode.ERROR, "boom"), Status(StatusCode.OK)]),
       st.integers(1, 10**18), st.integers(0, 10**9), st.booleans(), st.booleans(), st.booleans())
def test_a_written_span_is_the_one_the_constructor_makes(
        name: str, trace_id: int, span_id: int, sampled: bool, parent_id: int | None, attrs: dict[str, Any],
        kind: SpanKind, status: Status | None, start: int, length: int, with_event: bool, with_link: bool,
        checked: bool) -> None:
    assert spans.FAST_READABLE  # the installed SDK (1.45): the fast branch is the one under test
    provider = TracerProvider()
    keep = _Keep()
    provider.add_span_processor(keep)
    writer = span_writer(provider.get_tracer("t"))
    assert writer is not None
    ctx = SpanContext(trace_id, span_id, False, TraceFlags(int(sampled)))
    parent = SpanContext(trace_id, parent_id, True, TraceFlags(1)) if parent_id else None
    events = [Event("e", {"k": 1}, 3)] if with_event else []
    links = [Link(SpanContext(trace_id, 77, True, TraceFlags(1)))] if with_link else []
    writer.emit(name, ctx, parent, start, start + length, kind, attrs, status, events, links, checked)
    (got,) = keep.ended
    # the attributes, events and links as emit bounded them (that code is not the fast branch)
    made = ReadableSpan(name, ctx, parent, writer.resource, got._attributes, got._events, got._links, kind, None,
                        got._status, start, start + length, SCOPE)
    assert got._status is (status or got._status) and (status is not None or got._status.status_code is StatusCode.UNSET)
    assert type(got) is ReadableSpan
    assert list(vars(got).items()) == list(vars(made).items())
    assert got.to_json() == made.to_json()


def test_the_import_check_refuses_a_constructor_that_makes_other_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ReadableSpan.__init__

    def more(self: ReadableSpan, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._dropped = 0  # type: ignore[attr-defined]  # a field a later SDK might add

    assert spans._fast_readable_holds()
    monkeypatch.setattr(ReadableSpan, "__init__", more)
    assert not spans._fast_readable_holds()
