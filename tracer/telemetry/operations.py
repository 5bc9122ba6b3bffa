"""A pull consumer's client operations besides processing: ``receive`` and ``settle``.

The messaging conventions ask a pull-based consumer for a ``receive`` span per receive call
(kind ``CLIENT``, ``messaging.operation.type=receive``, ``messaging.batch.message_count``, a link
to each returned message's creation context) and a ``settle`` span per settlement (kind
``CLIENT``, ``messaging.operation.type=settle``, operation name ``ack`` or
``change_invisible_duration``), and ``messaging.client.operation.duration`` for each. One
:class:`ConsumerOperations` per consumer does both; :class:`~tracer.clients.official.TracedSimpleConsumer`
and the instrumentor's patched ``SimpleConsumer`` use it, and a consume loop can (see its
:meth:`ConsumerOperations.receive` / :meth:`ConsumerOperations.settle`).

Receive spans are on by default (``receive_async`` too: its span ends when the future does), for
every receive that returned messages or failed; an empty receive (an idle long poll) is measured but
writes no span, as the OpenTelemetry Java agent's Kafka ``poll`` instrumentation does — an idle
consumer would otherwise write one trace per long poll.
Settle spans are opt-in (``settle_spans=True``): one more span per message, for an operation whose
duration the histogram already has. The histogram records every operation either way (a counter
increment without a meter provider). Span and histogram read one pair of clock readings, so they
agree: the wall clock at the start, the monotonic clock for the duration (``tracer.path.clock``).

The topic of a receive is known only afterwards (the 5.x client picks one of its subscriptions
inside ``receive``), so the span is written once the call returned, with the call's start time:
``receive {topic}`` with ``messaging.destination.name`` when every returned message has that topic,
and its links, all given to the sampler at start. It is not current while the client's call runs.
On the SDK the receive and settle spans are written once at their end
(:meth:`~tracer.telemetry.tracer.MessageTracer.start_span_at`), as the send span is.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from opentelemetry import context as otel_context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from ..path import names as n
from ..path.clock import Anchor
from ..path.message import client_facts
from .attributes import cap, client_attributes, server_attributes
from .futures import future_error
from .spans import add_own_attributes, record_error

if TYPE_CHECKING:
    from .tracer import MessageTrace, MessageTracer

__all__ = ["ConsumerOperations"]

T = TypeVar("T")


class ConsumerOperations:
    """``receive`` and ``settle`` of one pull consumer (``consumer``: the client object, read once
    for its id, namespace and endpoint; the tracer's own values win when it has them)."""

    def __init__(self, tracer: MessageTracer, consumer: Any = None, *, settle_spans: bool = False) -> None:
        self.tracer = tracer
        self.settle_spans = bool(settle_spans)
        if consumer is not None:
            # fills what the tracer was not given: messaging.client.id etc. on its process spans too
            tracer.describe_client(client_facts(consumer))
        client = tracer.client
        attrs: dict[str, Any] = {n.SYSTEM: n.SYSTEM_VALUE}
        if tracer.consumer_group:
            attrs[n.CONSUMER_GROUP] = tracer.consumer_group
        attrs.update(server_attributes(client))
        self._start = attrs  # what every operation span gives the sampler
        self._after: dict[str, Any] = {}
        client_attributes(self._after, client, client.namespace)

    def receive(self, call: Callable[[], T], traces: Callable[[Any], list[MessageTrace]] | None = None) -> T:
        """``call()`` (the client's receive) as one ``receive`` operation; its result and its
        exceptions pass through. ``traces(result)``, if given, is called with the result and
        returns the traces it started for the messages: the span links to their creation contexts."""
        t0 = Anchor(self.tracer.clock)
        parent = otel_context.get_current()
        try:
            result = call()
        except BaseException as exc:
            self._receive_ended(parent, t0, None, None, exc)
            raise
        self._receive_ended(parent, t0, result, traces, None)
        return result

    def receive_async(self, call: Callable[[], Future[Any]],
                      traces: Callable[[Any], list[MessageTrace]] | None = None,
                      then: Callable[[Any], Any] | None = None) -> Future[Any]:
        """``call()`` (the client's ``receive_async``) as one ``receive`` operation that ends when
        its future does. Returns a future of the result, passed through ``then`` (e.g. to take
        probes out) when given; the client's exception passes through it."""
        mt = self.tracer
        t0 = Anchor(mt.clock)
        parent = otel_context.get_current()  # the future resolves on another thread
        try:
            inner = call()
        except BaseException as exc:
            self._receive_ended(parent, t0, None, None, exc)
            raise
        outer: Future[Any] = Future()

        def done(f: Future[Any]) -> None:
            error = future_error(f)
            if error is not None:
                self._receive_ended(parent, t0, None, None, error)
                if f.cancelled():
                    outer.cancel()  # the caller sees the client's cancellation as it is
                else:
                    outer.set_exception(error)
                return
            result = f.result()
            self._receive_ended(parent, t0, result, traces, None)
            if then is not None:
                try:
                    result = then(result)
                except Exception as exc:  # noqa: BLE001 - the messages still reach the caller
                    mt.hook_failed("settling probes of an async receive", exc)
            outer.set_result(result)

        inner.add_done_callback(done)
        return outer

    def _receive_ended(self, parent: Any, t0: Anchor, result: Any,
                       traces: Callable[[Any], list[MessageTrace]] | None, error: BaseException | None) -> None:
        """Traces for the received messages, then the span — written after the fact, so an empty
        receive (an idle long poll) writes none, as the OpenTelemetry Java agent's Kafka ``poll``
        does — and the duration, recorded for every receive."""
        topic: str | None = None
        span: Any = None
        messages: list[Any] = []
        links: list[Link] = []
        try:
            if error is None and not isinstance(result, (str, bytes)):
                messages = list(result or ())
            topics = {str(getattr(m, "topic", "") or "") for m in messages}
            topic = cap(topics.pop()) if len(topics) == 1 else None
            started = traces(result) if traces is not None and error is None else []
            links = [Link(p) for t in started if (p := t.carried.parent) is not None and p.is_valid]
        except Exception as exc:  # noqa: BLE001 - tracing never fails the receive
            self.tracer.hook_failed("describing a receive", exc)
        if messages or error is not None:
            attrs = {**self._start, n.OPERATION_NAME: n.RECEIVE, n.OPERATION_TYPE: n.RECEIVE}
            if topic:
                attrs[n.DESTINATION] = topic
            if error is None:
                attrs[n.BATCH_MESSAGE_COUNT] = len(messages)
            try:
                span = self.tracer.start_span_at(n.operation_span_name(n.RECEIVE, topic), SpanKind.CLIENT, parent,
                                                 t0.wall_ns, attrs, links)
            except Exception as exc:  # noqa: BLE001 - a broken provider must not stop the receive
                self.tracer.hook_failed("starting the receive span", exc)
        self._end(span, n.RECEIVE, n.RECEIVE, topic or None, t0, error)

    def settle(self, operation: str, message: Any, call: Callable[[], T]) -> T:
        """``call()`` (the client's ``ack`` or ``change_invisible_duration`` of ``message``) as one
        ``settle`` operation named ``operation``; result and exceptions pass through."""
        mt = self.tracer
        topic = cap(str(getattr(message, "topic", "") or "")) or None
        t0 = Anchor(mt.clock)
        span: Any = None
        if self.settle_spans:
            attrs = {**self._start, n.OPERATION_NAME: operation, n.OPERATION_TYPE: n.SETTLE}
            if topic:
                attrs[n.DESTINATION] = topic
            try:
                span = mt.start_span_at(n.operation_span_name(operation, topic), SpanKind.CLIENT,
                                        otel_context.get_current(), t0.wall_ns, attrs)
            except Exception as exc:  # noqa: BLE001 - a broken provider must not stop the settle
                mt.hook_failed("starting a settle span", exc)
        try:
            result = call()
        except BaseException as exc:
            self._end(span, operation, n.SETTLE, topic, t0, exc)
            raise
        if span is not None and span.is_recording():
            message_id = getattr(message, "message_id", None)
            if message_id:
                add_own_attributes(span, {n.MESSAGE_ID: str(message_id)})
        self._end(span, operation, n.SETTLE, topic, t0, None)
        return result

    def _end(self, span: Any, name: str, kind: str, topic: str | None, t0: Anchor, error: BaseException | None) -> None:
        mt = self.tracer
        # the operation's span and duration on one timeline: wall at its start, monotonic since
        t1 = t0.now()
        try:
            if span is not None:
                if span.is_recording():
                    add_own_attributes(span, self._after)
                    if error is not None:
                        record_error(span, error)
                        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
                        span.set_attribute(n.ERROR_TYPE, type(error).__qualname__)
                span.end(end_time=t1)
            mt.meters.operation(name, kind, topic, mt.consumer_group, t1 - t0.wall_ns, error)
        except Exception as exc:  # noqa: BLE001
            mt.hook_failed(f"ending a {kind} operation", exc)
