"""The producer's side of a trace: the live ``send {topic}`` span, ended with the send's receipt.

:meth:`tracer.telemetry.tracer.MessageTracer.start_send` opens it; :meth:`SendTrace.end` ends it on
the message's own timeline (one anchor, read when the produce stamp was) and counts the send.
"""

from __future__ import annotations

from opentelemetry.trace import Span, Status, StatusCode

from ..path import names as n
from ..path.clock import Anchor
from .spans import add_own_attributes, record_error
from .tracercore import TracerCore

__all__ = ["SendTrace"]

_ERROR = StatusCode.ERROR


class SendTrace:
    """The live ``send {topic}`` span; end it with the receipt or the exception."""

    __slots__ = ("span", "produce_ns", "_tracer", "_topic", "_anchor")

    def __init__(self, span: Span, produce_ns: int, tracer: TracerCore | None = None, topic: str = "",
                 anchor: Anchor | None = None) -> None:
        self.span = span
        self.produce_ns = produce_ns
        self._tracer = tracer
        self._topic = topic
        self._anchor = anchor

    def end(self, message_id: str | None = None, error: BaseException | None = None) -> None:
        span = self.span
        if span.is_recording():
            if message_id:
                add_own_attributes(span, {n.MESSAGE_ID: str(message_id)})
            if error is not None:
                record_error(span, error)
                span.set_status(Status(_ERROR, type(error).__name__))
                span.set_attribute(n.ERROR_TYPE, type(error).__qualname__)
        mt = self._tracer
        if mt is None:
            span.end()
            return
        now = self._anchor.now() if self._anchor is not None else mt.clock.wall_ns()
        span.end(end_time=now)
        mt.meters.sent(self._topic, now - self.produce_ns, error)
