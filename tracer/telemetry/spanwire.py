"""A finished span as a plain tuple and back: what the export child's pipe carries.

:func:`span_record` turns an SDK ``ReadableSpan`` into nested tuples of ints, strings and
attribute values (what ``marshal`` writes), resources and scopes as indexes into the batch's own
lists; :func:`span_from_record` rebuilds a ``ReadableSpan`` an exporter reads the same, dropped
counts included — the span's and its events' and links' (:mod:`tracer.telemetry.exportchild`
writes and reads the frames). :func:`plain` turns what ``marshal`` refuses although the OTLP encoder
takes it (instances of subclasses of str, int, float, bytes, tuple, dict: an ``IntEnum``) into the
plain values the encoder would have sent.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

__all__ = ["attributes_record", "plain", "span_from_record", "span_record"]

_EXACT = frozenset((str, int, float, bool, bytes, type(None)))


def attributes_record(values: Any) -> dict[str, Any]:
    if not values:
        return {}
    return values if type(values) is dict else dict(values)


def plain(value: Any) -> Any:
    """``value`` (a record, or any part of one) with every instance of a subclass of a wire type
    made that type, holding what the OTLP encoder reads from it (``str.__str__`` of a ``str`` enum
    member is its value, ``int.__index__`` of an ``IntEnum`` member its number)."""
    kind = type(value)
    if kind in _EXACT:
        return value
    if isinstance(value, (tuple, list)):
        return tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, bytes):
        return bytes(value)
    return value  # not a wire type at all: marshal says so, and the span fails alone


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


class _ReplayedEvent(Event):
    """An event rebuilt in the child, with the dropped attribute count the parent's event had."""

    def __init__(self, name: str, attributes: Any, timestamp: int, dropped: int) -> None:
        super().__init__(name, attributes, timestamp=timestamp)
        self._dropped_attributes = dropped

    @property
    def dropped_attributes(self) -> int:
        return self._dropped_attributes


class _ReplayedLink(Link):
    """A link rebuilt in the child, with the dropped attribute count the parent's link had."""

    def __init__(self, context: SpanContext, attributes: Any, dropped: int) -> None:
        super().__init__(context, attributes)
        self._dropped_attributes = dropped

    @property
    def dropped_attributes(self) -> int:
        return self._dropped_attributes


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
        attributes=attributes, events=[_ReplayedEvent(n, a, t, d) for n, t, a, d in events],
        links=[_ReplayedLink(SpanContext(t, s, r, TraceFlags(f), _state(ts)), a, d) for t, s, f, r, ts, a, d in links],
        kind=SpanKind(kind), status=Status(StatusCode(code), description), start_time=start, end_time=end,
        instrumentation_scope=scopes[scope_ix])
