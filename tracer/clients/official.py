"""Wrappers for the official ``rocketmq-python-client`` 5.x (and anything with its surface,
such as :mod:`tracer.embedded`).

- Producers: :class:`tracer.clients.producer.TracedProducer` (``send``/``send_async``).
- Simple consumers: :class:`TracedSimpleConsumer` stamps ``client_pull`` when ``receive`` returns;
  run the handler inside ``with consumer.processing(msg):`` to stamp the handler, or just ``ack``
  (then the time from receive to ack is taken as the handler). :class:`tracer.clients.consume.ConsumeLoop`
  is the full consume loop with our dispatcher.
- Push consumers: :class:`TracedListener` wraps the user's ``MessageListener``. The client decodes
  a batch and submits every message to its ``ThreadPoolExecutor`` at once, so the decode time is
  both ``client_pull`` and ``dispatch_enqueue``, and the wait in that pool's queue — which the
  client never measures — becomes ``dispatch_wait``. The wrapping is
  :func:`tracer.clients.listener.traced_consume`, shared with the 2.x callback.

The simple consumer and producer wrappers read the wrapped client's id, namespace and endpoint
(:func:`tracer.path.message.client_facts`) into the tracer, for ``messaging.client.id``,
``messaging.rocketmq.namespace`` and ``server.address``. The simple consumer's ``receive`` and
settle calls are operations of their own (:mod:`tracer.telemetry.operations`).
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import Future
from typing import Any

from ..path import names as n
from ..path.message import MessageInfo, body_of, describe
from ..path.stages import Outcome, Stage
from ..telemetry.operations import ConsumerOperations
from ..telemetry.tracer import MessageTrace, MessageTracer
from .listener import Seam, traced_consume
from .probe import settle_received

__all__ = ["PUSH_SEAM", "Processing", "ReceivedTraces", "TracedListener", "TracedSimpleConsumer"]

try:  # the listener must be a real MessageListener subclass for the client's type checks
    from rocketmq import ConsumeResult, MessageListener
except ImportError:  # pragma: no cover - the client is an optional dependency
    MessageListener = object  # type: ignore[assignment,misc]
    ConsumeResult = None  # type: ignore[assignment,misc]


def _is_success(result: Any) -> bool:
    if ConsumeResult is not None and result is ConsumeResult.SUCCESS:
        return True
    return getattr(result, "name", None) == "SUCCESS"


def _decoded_ns(info: MessageInfo) -> int | None:
    return info.decode_ms * 1_000_000 if info.decode_ms else None


# The client decoded the message just before handing it to its pool: that is the pull time.
PUSH_SEAM = Seam(describe, _decoded_ns, _is_success, "starting a push-consumer trace",
                 ConsumeResult.SUCCESS if ConsumeResult is not None else None)


class TracedListener(MessageListener):  # type: ignore[misc,valid-type]
    """A ``MessageListener`` that traces the wrapped one; exceptions and results pass through."""

    def __init__(self, listener: Any, tracer: MessageTracer) -> None:
        self.listener = listener
        self.tracer = tracer

    def consume(self, message: Any) -> Any:
        return traced_consume(self.tracer, PUSH_SEAM, self.listener.consume, message)


class ReceivedTraces:
    """Traces of received, not yet acked messages of one consumer group.

    Weakly keyed by the message object, so a message the user drops without acking leaks
    nothing. Shared by :class:`TracedSimpleConsumer` and the instrumentor's patched methods.
    """

    def __init__(self, tracer: MessageTracer) -> None:
        self.tracer = tracer
        self._traces: weakref.WeakKeyDictionary[Any, MessageTrace] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def received(self, messages: Any) -> list[MessageTrace]:
        """Start a trace for each received message; returns them (the receive span links to them)."""
        try:
            pulled = self.tracer.clock.now_ns()
            started = [(m, self.tracer.start_message(describe(m), pulled, body_of(self.tracer, m)))
                       for m in messages or ()]
            with self._lock:
                for m, t in started:
                    self._traces[m] = t
            return [t for _, t in started]
        except Exception as exc:  # noqa: BLE001
            self.tracer.hook_failed("stamping received messages", exc)
            return []

    def get(self, message: Any) -> MessageTrace | None:
        with self._lock:
            return self._traces.get(message)

    def pop(self, message: Any) -> MessageTrace | None:
        with self._lock:
            return self._traces.pop(message, None)

    def acked(self, message: Any) -> None:
        trace = self.pop(message)
        if trace is None:
            return
        if not trace.stamps.has(Stage.HANDLER_START):
            # no processing() scope: the time between receive and ack was the handler's
            pulled = trace.stamps.get(Stage.CLIENT_PULL)
            trace.mark(Stage.DISPATCH_ENQUEUE, pulled)
            with trace.handler_scope(start_ns=pulled):
                pass
        trace.finish(Outcome.SUCCESS)


class TracedSimpleConsumer:
    """A proxy around one simple consumer; unknown attributes pass through to it.

    ``receive``, ``ack`` and ``change_invisible_duration`` are client operations with a span
    (``receive`` always, the two settle calls with ``settle_spans=True``) and
    ``messaging.client.operation.duration`` (:mod:`tracer.telemetry.operations`), and so is
    ``receive_async``. ``ack_async`` and ``change_invisible_duration_async`` pass through
    untraced (the 5.1 client returns no future from them: there is no end to time).
    """

    def __init__(self, consumer: Any, tracer: MessageTracer, *, settle_spans: bool = False) -> None:
        self._consumer = consumer
        self.operations = ConsumerOperations(tracer, consumer, settle_spans=settle_spans)
        self.traces = ReceivedTraces(tracer)

    @property
    def wrapped(self) -> Any:
        return self._consumer

    def receive(self, max_message_num: int, invisible_duration: Any) -> Any:
        messages = self.operations.receive(lambda: self._consumer.receive(max_message_num, invisible_duration),
                                           self.traces.received)
        return settle_received(self.traces, self._consumer, messages)  # probes acked here, not returned

    def receive_async(self, max_message_num: int, invisible_duration: Any) -> Future[Any]:
        """``receive`` with the client's future: traces start, and the span ends, when it resolves."""
        return self.operations.receive_async(
            lambda: self._consumer.receive_async(max_message_num, invisible_duration), self.traces.received,
            lambda messages: settle_received(self.traces, self._consumer, messages))

    def processing(self, message: Any) -> Processing:
        """``with consumer.processing(msg): handle(msg)`` — stamps and spans around the handler.
        An exception ends the trace as a failure and passes through."""
        return Processing(self.traces, message)

    def ack(self, message: Any) -> Any:
        result = self.operations.settle(n.ACK, message, lambda: self._consumer.ack(message))
        self.traces.acked(message)
        return result

    def change_invisible_duration(self, message: Any, invisible_duration: Any) -> Any:
        """A lease change or a retry with backoff: a settle operation; the message's trace stays open."""
        return self.operations.settle(n.CHANGE_INVISIBLE_DURATION, message,
                                      lambda: self._consumer.change_invisible_duration(message, invisible_duration))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


class Processing:
    __slots__ = ("_traces", "_message", "_trace")

    def __init__(self, traces: ReceivedTraces, message: Any) -> None:
        self._traces = traces
        self._message = message
        self._trace = traces.get(message)

    def __enter__(self) -> Any:
        t = self._trace
        if t is not None:
            if not t.stamps.has(Stage.DISPATCH_ENQUEUE):
                t.mark(Stage.DISPATCH_ENQUEUE)
            t.__enter__()
        return self._message

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        t = self._trace
        if t is None:
            return
        t.__exit__(exc_type, exc, tb)
        if exc is not None:
            self._traces.pop(self._message)
            t.finish(Outcome.FAILURE, exc)
