"""A finished span as a plain tuple and back: what the export child's pipe carries.

:func:`span_record` turns an SDK ``ReadableSpan`` into nested tuples of ints, strings and
attribute values (what ``marshal`` writes), resources and scopes as indexes into the batch's own
lists; :func:`span_from_record` rebuilds a ``ReadableSpan`` an exporter reads the same, dropped
counts included (:mod:`tracer.telemetry.exportchild` writes and reads the frames).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

__all__ = ["attributes_record", "span_from_record", "span_record"]


def attributes_record(values: Any) -> dict[str, Any]:
    if not values:
        return {}
    return values if type(values) is dict else dict(values)


def _dropped(values: Any) -> int:
    return int(getattr(values, "dropped", 0) or 0)


def _event(e: Event) -> tuple[Any, ...]:
    return (e.name, e.timestamp, attributes_record(e.attributes), _dropped(e.attributes))


def _link(lk: Link) -> tuple[Any, ...]:
    c = lk.context
    return (c[0], c[1], int(c[3]), c[2], c[4].to_header() if c[4] else "", attributes_record(lk.attributes),
            _dropped(lk.attributes))


def span_record(span: ReadableSpan, resource_ix: int, scope_ix: int) -> tuple[Any, ...]:
    """``span`` as a tuple of marshal-able values (``resource_ix``/``scope_ix``: its resource's and
    scope's places in the batch's tables). Read from the SDK span's fields, not its properties
    (which copy events, links and attributes): this runs once per exported span, under the GIL."""
    ctx = span._context  # a SpanContext is a tuple: trace_id, span_id, is_remote, flags, state, valid
    parent = span._parent
    status = span._status
    attrs = span._attributes
    events = span._events
    links = span._links
    return (
        span._name, ctx[0], ctx[1], int(ctx[3]), ctx[4].to_header() if ctx[4] else "",  # type: ignore[index]
        parent[1] if parent is not None else 0, bool(parent is not None and parent[2]),
        span._kind.value, span._start_time, span._end_time, attributes_record(attrs),
        tuple(map(_event, events)) if events else (), tuple(map(_link, links)) if links else (),
        status.status_code.value, status.description, resource_ix, scope_ix,
        attrs.dropped if isinstance(attrs, BoundedAttributes) else 0,
        events.dropped if isinstance(events, BoundedList) else 0,
        links.dropped if isinstance(links, BoundedList) else 0,
    )


class _Dropped(NamedTuple):
    attributes: int
    events: int
    links: int


class _Replayed(ReadableSpan):
    """A span rebuilt in the child, with the dropped counts the parent's span had."""

    def __init__(self, dropped: _Dropped, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._dropped_counts = dropped

    @property
    def dropped_attributes(self) -> int:
        return self._dropped_counts.attributes

    @property
    def dropped_events(self) -> int:
        return self._dropped_counts.events

    @property
    def dropped_links(self) -> int:
        return self._dropped_counts.links


def _state(header: str) -> TraceState | None:
    return TraceState.from_header([header]) if header else None


def span_from_record(record: Sequence[Any], resources: Sequence[Resource],
                     scopes: Sequence[InstrumentationScope]) -> ReadableSpan:
    """The ``ReadableSpan`` :func:`span_record` was made from (same fields an exporter reads)."""
    (name, trace_id, span_id, flags, state, parent_id, parent_remote, kind, start, end, attributes, events,
     links, code, description, resource_ix, scope_ix, d_attrs, d_events, d_links) = record
    context = SpanContext(trace_id, span_id, False, TraceFlags(flags), _state(state))
    parent = SpanContext(trace_id, parent_id, parent_remote, TraceFlags(flags)) if parent_id else None
    return _Replayed(
        _Dropped(d_attrs, d_events, d_links), name=name, context=context, parent=parent, resource=resources[resource_ix],
        attributes=attributes, events=[Event(n, a, timestamp=t) for n, t, a, _d in events],
        links=[Link(SpanContext(t, s, r, TraceFlags(f), _state(ts)), a) for t, s, f, r, ts, a, _d in links],
        kind=SpanKind(kind), status=Status(StatusCode(code), description), start_time=start, end_time=end,
        instrumentation_scope=scopes[scope_ix])
