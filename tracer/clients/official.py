"""Wrappers for the official ``rocketmq-python-client`` 5.x (and anything with its surface,
such as :mod:`tracer.embedded`).

- Producers: :class:`tracer.clients.producer.TracedProducer` (``send``/``send_async``).
- Simple consumers: :class:`TracedSimpleConsumer` stamps ``client_pull`` when ``receive`` returns;
  run the handler inside ``with consumer.processing(msg):`` to stamp the handler, or just ``ack``
  (then the time from receive to ack is taken as the handler). Inside the block
  ``change_invisible_duration`` is the nack (the delivery ends as a failure when the block ends,
  unless it is acked first); ``renew_lease`` is a renewal (the trace waits for the settle).
  :class:`tracer.clients.consume.ConsumeLoop` is the full consume loop with our dispatcher.
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

import logging
import threading
import weakref
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import SpanProcessor

from ..callables import require_plain
from ..logonce import OnceLogger
from ..path import names as n
from ..path.clock import Anchor, MonoNs
from ..path.message import MessageInfo, body_of, describe
from ..path.stages import Outcome, Stage
from ..telemetry.hold import DEFAULT_MAX_AGE_S, DEFAULT_MAX_TRACES, HoldingSpanProcessor
from ..telemetry.operations import ConsumerOperations
from ..telemetry.tracer import MessageTrace, MessageTracer
from .listener import Seam, traced_consume
from .probe import settle_probe
from .refusal import lease_gone
from .startup import SETTINGS_WAIT_S, wait_for_settings

__all__ = ["PUSH_SEAM", "NotAcked", "Processing", "ReceivedStats", "ReceivedTraces", "TracedListener",
           "TracedSimpleConsumer", "settle_received"]

log = logging.getLogger(__name__)

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
                 ConsumeResult.SUCCESS if ConsumeResult is not None else None, "message_listener.consume")


class TracedListener(MessageListener):  # type: ignore[misc,valid-type]
    """A ``MessageListener`` that traces the wrapped one; exceptions and results pass through.

    Raises:
        TypeError: ``listener.consume`` is missing, or is an ``async def`` or a generator: the
            client would only build a coroutine (or a generator) per message, never run it.
    """

    def __init__(self, listener: Any, tracer: MessageTracer) -> None:
        require_plain(getattr(listener, "consume", None), "message_listener.consume")
        self.listener = listener
        self.tracer = tracer

    def consume(self, message: Any) -> Any:
        return traced_consume(self.tracer, PUSH_SEAM, self.listener.consume, message)


@dataclass(frozen=True, slots=True)
class ReceivedStats:
    """A snapshot of :class:`ReceivedTraces`: traces waiting for their ack, and those let go."""

    tracked: int  # received, not yet acked or failed
    evicted: Mapping[str, int]  # never acked, let go: "max_age" (older than the limit), "max_traces" (room)


class _Entry:
    __slots__ = ("ref", "since", "given_back")

    def __init__(self, ref: weakref.ref[Any], since: MonoNs) -> None:
        self.ref = ref
        self.since = since
        # change_invisible_duration inside processing(): the nack, settled at the block's end
        # unless an ack or an explicit renewal comes first (TracedSimpleConsumer.renew_lease)
        self.given_back = False


class _Held(NamedTuple):
    """A received message's trace and its place in the arrival order (its :class:`_Entry`)."""

    trace: MessageTrace
    entry: _Entry


class ReceivedTraces:
    """Traces of received, not yet acked messages of one consumer group.

    Weakly keyed by the message object, so a message the user drops without acking leaks
    nothing. Shared by :class:`TracedSimpleConsumer` and the instrumentor's patched methods.

    **Bounded** like the hold that keeps such a trace's spans
    (:class:`~tracer.telemetry.hold.HoldingSpanProcessor`): a message received but not acked
    within ``max_age_s`` (the hold's ``max_age_s``, ``RMQTRACE_KEEP_HELD_AGE``, default 600 s) is let
    go, and so is the oldest when more than ``max_traces`` wait (the hold's ``max_traces``,
    ``RMQTRACE_KEEP_HELD_SPANS``, default 20000); both are counted in :meth:`statistics` by reason.
    An unacked message is redelivered by the broker (its redelivery gets a trace of its own): a
    let-go trace of a message handled in :meth:`TracedSimpleConsumer.processing` is forgotten
    unfinished (not measured; the hold drops its held spans at the same age, counted there as
    ``max_age``), one never handled is finished as skipped with a :class:`NotAcked` error. Ages
    are checked whenever a message is received or acked (no timer: a consumer that stopped
    receiving grows nothing).
    """

    def __init__(self, tracer: MessageTracer, *, max_age_s: float | None = None,
                 max_traces: int | None = None) -> None:
        if max_age_s is not None and not (isinstance(max_age_s, (int, float)) and max_age_s > 0):
            raise ValueError(f"max_age_s must be seconds > 0, got {max_age_s!r}")
        if max_traces is not None and not (isinstance(max_traces, int) and max_traces >= 1):
            raise ValueError(f"max_traces must be an integer >= 1, got {max_traces!r}")
        self.tracer = tracer
        self._max_age_s = max_age_s
        self._max_traces = max_traces
        self._traces: weakref.WeakKeyDictionary[Any, _Held] = weakref.WeakKeyDictionary()
        self._order: deque[_Entry] = deque()  # arrival order; entries of acked messages are skipped
        self._evicted = {"max_age": 0, "max_traces": 0}
        self._lock = threading.Lock()
        self._log = OnceLogger("rmqtrace received traces", log, logging.WARNING)
        self._configured: HoldingSpanProcessor | None = None  # the bounds the tracer's config sets, once read

    def limits(self) -> tuple[int, int]:
        """(max age in ns, max traces): given ones, else the tracer's hold's, else the bounds
        ``RMQTRACE_KEEP_HELD_AGE`` / ``RMQTRACE_KEEP_HELD_SPANS`` give in the tracer's configuration
        (:attr:`MessageTracer.config`, read once, at the tracer's construction)."""
        hold = self.tracer.hold
        if hold is None and (self._max_age_s is None or self._max_traces is None):
            if self._configured is None:  # never installed: only its bounds are read (one parser: the hold's)
                self._configured = HoldingSpanProcessor.from_env([SpanProcessor()], self.tracer.config.keep_env)
            hold = self._configured
        age_ns = int(self._max_age_s * 1e9) if self._max_age_s is not None else hold.max_age_ns  # type: ignore[union-attr]
        count = self._max_traces if self._max_traces is not None else hold.max_traces  # type: ignore[union-attr]
        return age_ns, count

    def statistics(self) -> ReceivedStats:
        with self._lock:
            return ReceivedStats(len(self._traces), dict(self._evicted))

    def received(self, messages: Any) -> list[MessageTrace]:
        """Start a trace for each received message; returns them (the receive span links to them)."""
        try:
            pulled = Anchor(self.tracer.clock)  # on both clocks: a wall step after it is no gap
            since = self.tracer.clock.monotonic_ns()  # the held traces' ages run on the monotonic clock
            started = [(m, self.tracer.start_message(describe(m), pulled, body_of(self.tracer, m)))
                       for m in messages or ()]
            with self._lock:
                for m, t in started:
                    entry = _Entry(weakref.ref(m), since)
                    self._traces[m] = _Held(t, entry)
                    self._order.append(entry)
            self._evict(since)
            return [t for _, t in started]
        except Exception as exc:  # noqa: BLE001
            self.tracer.hook_failed("stamping received messages", exc)
            return []

    def get(self, message: Any) -> MessageTrace | None:
        with self._lock:
            found = self._traces.get(message)
        return found.trace if found is not None else None

    def pop(self, message: Any) -> MessageTrace | None:
        with self._lock:
            found = self._traces.pop(message, None)
        return found.trace if found is not None else None

    def _entry(self, message: Any) -> _Entry | None:
        with self._lock:
            found = self._traces.get(message)
        return found.entry if found is not None else None

    def acked(self, message: Any, refused: BaseException | None = None) -> None:
        """The user acked ``message``: its trace ends as a success, once — also when the broker
        refused the ack (``refused``, the call's exception): the handler's outcome was decided,
        and a refusal saying the lease was gone (:func:`lease_gone`: the message runs again) is
        a lost lease besides (counted, kept, linked from the redelivery), as in ``ConsumeLoop``."""
        self._settled(message, Outcome.SUCCESS, refused)

    def nacked(self, message: Any, refused: BaseException | None = None) -> None:
        """``change_invisible_duration`` of a received message: the 5.x nack (redelivered after the
        new invisible time), so its trace ends as a failure, once (a refusal as in :meth:`acked`).

        Inside ``processing()`` (its handler runs) the call may also be a lease renewal: the trace
        stays open, and the block's end decides — it ends as a failure there unless an ack (or
        an explicit :meth:`renewed`) came first. After ``processing()`` ended with an exception
        the trace has already finished."""
        trace = self.get(message)
        if trace is None:
            self._evict(self.tracer.clock.monotonic_ns())
            return
        stamps = trace.stamps
        if stamps.has(Stage.HANDLER_START) and not stamps.has(Stage.HANDLER_END):
            entry = self._entry(message)
            if entry is not None:
                entry.given_back = True  # settled by Processing.__exit__ unless acked or renewed first
            if lease_gone(refused):
                trace.lease_lost("expired")
            return
        self._settled(message, Outcome.FAILURE, refused)

    def renewed(self, message: Any, refused: BaseException | None = None) -> None:
        """An explicit lease renewal (:meth:`TracedSimpleConsumer.renew_lease`): the trace stays
        open for the ack or nack, and an earlier ``change_invisible_duration`` inside
        ``processing()`` was a renewal too. Refused because the lease was already gone: a lost
        lease (the handler runs on; the message runs again)."""
        trace = self.get(message)
        entry = self._entry(message)
        if entry is not None:
            entry.given_back = False
        if trace is not None and lease_gone(refused):
            trace.lease_lost("expired")

    def given_back(self, message: Any) -> bool:
        """Whether ``change_invisible_duration`` gave ``message`` back inside ``processing()``,
        with no ack or renewal since (its block's end settles it as the nack)."""
        entry = self._entry(message)
        return entry is not None and entry.given_back

    def _settled(self, message: Any, outcome: Outcome, refused: BaseException | None) -> None:
        trace = self.pop(message)
        self._evict(self.tracer.clock.monotonic_ns())
        if trace is None:  # settled or let go already (another thread, a second call)
            return
        if not trace.stamps.has(Stage.HANDLER_START):
            # no processing() scope: the time between receive and the settle was the handler's
            pulled = trace.stamps.get(Stage.CLIENT_PULL)
            trace.mark(Stage.DISPATCH_ENQUEUE, pulled)
            with trace.handler_scope(start_ns=pulled):
                pass
        if lease_gone(refused):
            trace.lease_lost("expired")  # before the finish: marked, kept, remembered for the link
        trace.finish(outcome)

    def _evict(self, now_ns: MonoNs) -> None:
        """Let go of what is too old, then of the oldest beyond the count; finish each as not acked."""
        try:
            age_ns, count = self.limits()
        except ValueError as exc:  # a bad RMQTRACE_KEEP_HELD_*: the hold says so too; keep the defaults
            self.tracer.hook_failed("reading RMQTRACE_KEEP_HELD_*", exc)
            age_ns, count = int(DEFAULT_MAX_AGE_S * 1e9), DEFAULT_MAX_TRACES
        gone: list[tuple[str, MessageTrace]] = []
        with self._lock:
            while self._order:
                entry = self._order[0]
                message = entry.ref()
                found = self._traces.get(message) if message is not None else None
                if found is None or found.entry is not entry:  # acked, failed, or dropped by the user
                    self._order.popleft()
                    continue
                reason = ("max_age" if now_ns - entry.since >= age_ns else
                          "max_traces" if len(self._traces) > count else None)
                if reason is None:
                    break
                self._order.popleft()
                del self._traces[message]
                self._evicted[reason] += 1
                gone.append((reason, found.trace))
            if len(self._order) > 2 * max(len(self._traces), 64):  # acked ones behind a long-lived head
                self._order = deque(e for e in self._order if (m := e.ref()) is not None
                                    and (f := self._traces.get(m)) is not None and f.entry is e)
        for reason, trace in gone:
            self._log(f"an unacked message's trace ({reason})", None,
                      "a message received but never acked was let go (the broker redelivers it); "
                      "further ones are counted in statistics().evicted")
            if not trace.stamps.has(Stage.HANDLER_START):
                # never handled: finished as skipped (the keep policy drops it as not_handled)
                trace.finish(Outcome.SKIPPED, NotAcked(f"not acked ({reason})"))
            # handled but never acked: forgotten unfinished; the hold drops its held spans at
            # its own age limit (counted there), so nothing is exported without its parent


class NotAcked(Exception):
    """Finishes the trace of a message received but never acked (see :class:`ReceivedTraces`)."""


class TracedSimpleConsumer:
    """A proxy around one simple consumer; unknown attributes pass through to it.

    ``receive``, ``ack`` and ``change_invisible_duration`` are client operations with a span
    (``receive`` always, the two settle calls with ``settle_spans=True``) and
    ``messaging.client.operation.duration`` (:mod:`tracer.telemetry.operations`), and so is
    ``receive_async``. ``ack_async`` ends the message's trace as ``ack`` does but is no timed
    operation, and ``change_invisible_duration_async`` passes through: the 5.1 client's public
    methods return None, and the future behind them is an ``asyncio.Future`` of no running loop,
    whose callbacks never run — there is no end to time.
    """

    def __init__(self, consumer: Any, tracer: MessageTracer, *, settle_spans: bool = False) -> None:
        self._consumer = consumer
        self.operations = ConsumerOperations(tracer, consumer, settle_spans=settle_spans)
        self.traces = ReceivedTraces(tracer)
        self._settled = False  # the client's settings were waited for (startup.py: the 5.1.2 race)

    def _await_settings(self) -> None:
        if not self._settled:
            self._settled = True
            if wait_for_settings(self._consumer) is False:
                log.debug("rmqtrace: no settings from the proxy within %g s; receiving anyway", SETTINGS_WAIT_S)

    @property
    def wrapped(self) -> Any:
        return self._consumer

    def receive(self, max_message_num: int, invisible_duration: Any) -> Any:
        self._await_settings()
        messages = self.operations.receive(lambda: self._consumer.receive(max_message_num, invisible_duration),
                                           self.traces.received)
        return settle_received(self.traces, self._consumer, messages)  # probes acked here, not returned

    def receive_async(self, max_message_num: int, invisible_duration: Any) -> Future[Any]:
        """``receive`` with the client's future: traces start, and the span ends, when it resolves."""
        self._await_settings()
        return self.operations.receive_async(
            lambda: self._consumer.receive_async(max_message_num, invisible_duration), self.traces.received,
            lambda messages: settle_received(self.traces, self._consumer, messages))

    def processing(self, message: Any) -> Processing:
        """``with consumer.processing(msg): handle(msg)`` — stamps and spans around the handler.
        An exception ends the trace as a failure and passes through."""
        return Processing(self.traces, message)

    def ack(self, message: Any) -> Any:
        """A settle operation; the message's trace ends as a success (also when the broker refuses
        the ack: :meth:`ReceivedTraces.acked`), and the refusal passes through."""
        try:
            result = self.operations.settle(n.ACK, message, lambda: self._consumer.ack(message))
        except BaseException as exc:
            self.traces.acked(message, exc)
            raise
        self.traces.acked(message)
        return result

    def change_invisible_duration(self, message: Any, invisible_duration: Any) -> Any:
        """A settle operation: the 5.x nack (a retry with backoff); the message's trace finishes as
        a failure — inside ``processing()`` when its block ends, unless the message is acked (or
        :meth:`renew_lease` is called) before then (:meth:`ReceivedTraces.nacked`). To renew a lease and
        ack after the block, use :meth:`renew_lease`."""
        try:
            result = self.operations.settle(
                n.CHANGE_INVISIBLE_DURATION, message,
                lambda: self._consumer.change_invisible_duration(message, invisible_duration))
        except BaseException as exc:
            self.traces.nacked(message, exc)
            raise
        self.traces.nacked(message)
        return result

    def renew_lease(self, message: Any, invisible_duration: Any) -> Any:
        """Renew the lease of a message still being handled: the client's
        ``change_invisible_duration``, said to be a renewal — the trace stays open for the ack or
        nack, wherever it comes. No settle operation (as the consume loop's renewals). A refusal
        saying the lease was already gone is a lost lease (counted, marked, kept); it passes through."""
        try:
            result = self._consumer.change_invisible_duration(message, invisible_duration)
        except BaseException as exc:
            self.traces.renewed(message, exc)
            raise
        self.traces.renewed(message)
        return result

    def ack_async(self, message: Any) -> Any:
        """The client's ``ack_async``; the message's trace ends here (the outcome was decided).
        Not a timed operation: the 5.1 client's future cannot be waited for from a thread."""
        try:
            result = self._consumer.ack_async(message)
        except BaseException as exc:  # refused on the spot: measured all the same (ReceivedTraces.acked)
            self.traces.acked(message, exc)
            raise
        self.traces.acked(message)
        return result

    def change_invisible_duration_async(self, message: Any, invisible_duration: Any) -> Any:
        """The client's ``change_invisible_duration_async``: the nack of :meth:`change_invisible_duration`
        (the trace finishes as a failure outside ``processing()``), no timed operation (see :meth:`ack_async`)."""
        try:
            result = self._consumer.change_invisible_duration_async(message, invisible_duration)
        except BaseException as exc:  # refused on the spot: measured all the same (ReceivedTraces.nacked)
            self.traces.nacked(message, exc)
            raise
        self.traces.nacked(message)
        return result

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
        elif self._traces.given_back(self._message) and self._traces.pop(self._message) is not None:
            # change_invisible_duration inside the block, no ack or renewal since: that was the
            # nack, and the handler is done with the message now
            t.finish(Outcome.FAILURE)


def settle_received(traces: ReceivedTraces, consumer: Any, messages: Any) -> Any:
    """What a traced ``SimpleConsumer.receive`` returns: ``messages`` without its probes, each of
    them settled (:func:`settle_probe`) and acked through ``consumer`` on the spot — the caller's
    own loop never sees one, so for these consumers a probe shows the broker's wait only.
    ``messages`` itself when it holds no probe. Never raises."""
    if not messages:
        return messages
    try:
        items = list(messages)
    except Exception:  # noqa: BLE001 - not a batch we can read: leave it to the caller
        return messages
    kept = []
    for m in items:
        trace = traces.get(m)
        if not settle_probe(traces.tracer, trace):
            kept.append(m)
            continue
        traces.pop(m)
        try:
            with suppress_instrumentation():  # an instrumented ack must not look for the trace
                consumer.ack(m)
        except Exception as exc:  # noqa: BLE001 - unacked, it comes back after its lease and is settled again
            traces.tracer.hook_failed("acking a probe", exc)
    return kept if len(kept) != len(items) else messages
