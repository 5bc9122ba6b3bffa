"""The 5.x ``PushConsumer`` fix in one line: same constructor and lifecycle, demand-driven underneath.

The stock ``PushConsumer`` receives ahead into a cache of up to 1024 messages per queue and hands
them to a thread pool; a message cached behind a long one waits there while other consumers of the
group (and, with a key-bound pool, other threads) sit idle. :class:`DemandPushConsumer` takes the
same arguments — ``(client_configuration, consumer_group, message_listener, subscription, …)`` —
and the same ``startup()`` / ``shutdown()``, but runs a
:class:`~tracer.clients.consume.ConsumeLoop` over a ``SimpleConsumer`` with the ``aggressive``
dispatcher: it receives only as many messages as it has free workers, every worker holds at most
one message, and the rest stays in the broker where any member of the group can take it.

The listener's answer is honoured as the stock client honours it: ``ConsumeResult.SUCCESS`` acks;
``FAILURE``, an exception, or anything else gives the message back (it returns after the loop's
retry backoff, ``delivery_attempt + 1``). ``shutdown()`` stops receiving, lets the messages already
held run and be acked (at most ``shutdown_timeout`` seconds; messages still held then return to the
broker when their lease runs out), and then shuts the client down. Should the loop end by itself
(a lease the proxy refuses; a Ctrl-C or SystemExit raised in ``retry_backoff=``) it says so:
``running`` turns False, ``error`` holds the cause, one error line is logged, and ``shutdown()``
then only closes the client. A ``retry_backoff=`` that raises an ``Exception`` or answers junk
is contained (the default backoff), as in the loop.

``client_configuration`` is a ``rocketmq.ClientConfiguration`` (the real proxy) or an
:class:`~tracer.embedded.EmbeddedBroker` (the same code on the embedded broker). Messages are
traced by a :class:`~tracer.telemetry.tracer.MessageTracer` for the group (``tracer=`` to pass
your own): under ``opentelemetry-instrument`` (the instrumentor active) one from
:meth:`~tracer.clients.instrumentor.RocketMQInstrumentor.consumer_tracer` — its provider and
metrics, as for every consumer it traces, and its ``settle_spans`` — else one on the global
tracer provider. Same spans, stamps and metrics as every other rmqtrace seam, plus the loop's
``receive`` and settle operations (``settle_spans=`` for settle spans); the loop suppresses the
instrumentor's ``SimpleConsumer`` patches, so nothing is traced twice.

What differs from the stock class, on purpose: ``max_cache_message_count`` and
``max_cache_message_size`` are accepted and ignored (there is no cache: that is the fix);
``consumption_thread_count`` is the number of workers; a failed message comes back after
``retry_backoff(delivery_attempt)`` seconds (1, 2, 4 … 60) where the stock client uses the
broker's retry policy. Messages of one message group (FIFO
topics) run one at a time in order within this consumer (the dispatcher's key); a failed FIFO
message is not retried in place as the stock FIFO consumer does: it goes back to the broker with
the later messages of its group this consumer holds, unrun, and the broker hands them out again
in order (:class:`~tracer.clients.consume.ConsumeLoop`).
``receive_ahead=True`` receives a worker's next message one round trip before its handler is
expected to end, by the cost ``send_job`` wrote on the message (:mod:`tracer.clients.ahead`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping

from ..bounds import MAX_THREADS, count, timeout_s
from ..callables import never_ran, require_plain
from ..telemetry.tracer import MessageTracer
from .consume import ConsumeLoop, ConsumeStats, exponential_backoff
from .consume_options import resolve_options
from .startup import wait_for_settings

__all__ = ["ConsumeFailed", "DemandPushConsumer"]

log = logging.getLogger(__name__)

# Seconds a long-poll receive waits: short, so shutdown is prompt. An int: the 5.x client puts it
# into a protobuf Duration's seconds, and a float fails every route query.
AWAIT_DURATION_S = 1

class ConsumeFailed(Exception):
    """The listener answered something other than ``ConsumeResult.SUCCESS``: the message goes back."""

def _succeeded(result: object) -> bool:
    # ConsumeResult.SUCCESS of the 5.x client (an Enum), without importing the client here: the
    # embedded broker needs none. Anything else — FAILURE, None, True — is a failure, as in the client.
    return getattr(result, "name", None) == "SUCCESS" and type(result).__name__ == "ConsumeResult"

class DemandPushConsumer:
    """Drop-in for ``rocketmq.PushConsumer``: ``startup()``, ``shutdown()``, a ``MessageListener``.

    Raises:
        TypeError: ``message_listener`` has no callable ``consume``.
        ValueError: an empty ``subscription``, ``consumption_thread_count`` not an int >= 1, a NaN or
            negative timeout, or a bad loop option (``invisible_duration``, ``handler_timeout``).
    """

    def __init__(self, client_configuration: Any, consumer_group: str, message_listener: Any,
                 subscription: Mapping[str, Any], max_cache_message_count: int = 1024,
                 max_cache_message_size: int = 64 * 1024 * 1024, consumption_thread_count: int = 20,
                 tls_enable: bool = False, *, tracer: MessageTracer | None = None,
                 invisible_duration: float = 60.0, handler_timeout: float | None = None,
                 retry_backoff: Callable[[int], float] = exponential_backoff,
                 startup_timeout: float | None = 15.0, shutdown_timeout: float | None = 30.0,
                 settle_spans: bool | None = None, receive_ahead: bool = False) -> None:
        if not callable(getattr(message_listener, "consume", None)):
            raise TypeError(f"message_listener must have a consume(message) method, got {message_listener!r}")
        require_plain(message_listener.consume, "message_listener.consume")  # an async def never runs
        require_plain(retry_backoff, "retry_backoff=")  # here, not at startup(): the loop is built there
        if not subscription:
            raise ValueError("subscription must name at least one topic: {topic: FilterExpression}")
        if not consumer_group:
            raise ValueError("consumer_group must not be empty")
        count(consumption_thread_count, "consumption_thread_count", maximum=MAX_THREADS)
        count(max_cache_message_count, "max_cache_message_count")  # ignored, but a NaN is still a mistake
        count(max_cache_message_size, "max_cache_message_size")
        # None, math.inf or a huge one: no bound (the waits take them as they are stored here)
        self.startup_timeout = timeout_s(startup_timeout, "startup_timeout", positive=True)
        shutdown_timeout = timeout_s(shutdown_timeout, "shutdown_timeout")
        self.consumer_group = consumer_group
        self.message_listener = message_listener
        self.subscription = dict(subscription)
        self.workers = consumption_thread_count
        self.shutdown_timeout = shutdown_timeout
        self._configuration = client_configuration
        self._tls = tls_enable
        if tracer is None:
            tracer, default_settle = _default_tracer(consumer_group)
        else:
            default_settle = False
        self.tracer = tracer
        self.settle_spans = default_settle if settle_spans is None else bool(settle_spans)
        self._loop_options: dict[str, Any] = {"invisible_duration": invisible_duration,
                                              "handler_timeout": handler_timeout, "retry_backoff": retry_backoff,
                                              "receive_ahead": receive_ahead}
        resolve_options(None, None, None, self._loop_options)  # a bad loop option fails here, not at startup()
        self.consumer: Any = None
        self.loop: ConsumeLoop | None = None
        self._runner: threading.Thread | None = None
        # created → running → stopped; running → ended when the loop's run() ended without shutdown()
        self._state = "created"
        self.error: BaseException | None = None  # what ended the loop without shutdown(), if anything
        self._lock = threading.Lock()
        self._warned = False
        self._close_after_run = False  # shutdown() came from the loop's own thread: _run closes the client

    # -- lifecycle ------------------------------------------------------------------------------
    def startup(self) -> None:
        """Connect and start consuming.

        Raises:
            RuntimeError: started before, or shut down.
            ConnectionError: the proxy sent no settings within ``startup_timeout`` (unreachable, or
                not a RocketMQ proxy); the client is shut down and ``startup()`` may be called again.
        """
        with self._lock:
            if self._state != "created":
                raise RuntimeError(f"DemandPushConsumer of {self.consumer_group!r} is {self._state}: start it once")
            consumer = self._simple_consumer()
            consumer.startup()
            try:
                # 5.1.2: startup() returns before the proxy's settings, and without them every receive
                # fails ("settings is null"); against a dead endpoint it returns at once and never gets them
                if wait_for_settings(consumer, self.startup_timeout) is False:
                    raise ConnectionError(f"no settings from the RocketMQ proxy within {self.startup_timeout:g} s "
                                          f"(consumer group {self.consumer_group!r}): is it reachable?")
                loop = ConsumeLoop(consumer, self._handle, tracer=self.tracer, settle_spans=self.settle_spans,
                                   policy="aggressive",
                                   workers=self.workers, key=_message_group, prefetch=0, **self._loop_options)
            except BaseException:
                try:
                    consumer.shutdown()
                except Exception as exc:  # noqa: BLE001 - the startup error is the one to raise
                    log.debug("rmqtrace: shutting down a client that failed to start", exc_info=exc)
                raise
            self.consumer, self.loop = consumer, loop
            self._runner = threading.Thread(target=self._run, name=f"demand-push-{self.consumer_group}", daemon=True)
            self._state = "running"
            self._runner.start()

    def shutdown(self) -> None:
        """Stop receiving, drain what is held (at most ``shutdown_timeout`` s), close the client.
        Called from the listener itself it only asks and returns at once (the drain waits for the
        listener): the client is closed once the drain is done.

        After the loop ended by itself (``running`` False, ``error`` set) it only closes the client.

        Raises:
            RuntimeError: never started, or shut down already (as the stock client).
        """
        with self._lock:
            if self._state not in ("running", "ended"):
                raise RuntimeError(f"DemandPushConsumer of {self.consumer_group!r} is {self._state}, not running")
            ended = self._state == "ended"
            self._state = "stopped"
            loop, runner, consumer = self.loop, self._runner, self.consumer
        if ended:  # the runner is done (or ends now): nothing is held, only the client is left
            consumer.shutdown()
            return
        assert loop is not None and runner is not None
        if loop._on_own_thread():
            # called by the listener (a handler) or on another of the loop's threads: the drain waits
            # for this very call, so it cannot be waited for here; the runner shuts the client down
            # once run() returned
            self._close_after_run = True
            loop.stop(timeout=self.shutdown_timeout)
            return
        try:
            loop.stop(timeout=self.shutdown_timeout)
            runner.join(None if self.shutdown_timeout is None else self.shutdown_timeout + 5)
        finally:
            consumer.shutdown()

    @property
    def running(self) -> bool:
        """True while it consumes: from ``startup()`` until ``shutdown()``, or until its loop ended
        by itself (a refused lease; a Ctrl-C or SystemExit raised in ``retry_backoff=``), which
        ``error`` then holds."""
        return self._state == "running"

    def statistics(self) -> ConsumeStats:
        """The loop's counters (received, acked, failed, retry_scheduled …); zeros before startup."""
        loop = self.loop
        return ConsumeStats() if loop is None else loop.statistics()

    # -- inside ---------------------------------------------------------------------------------
    def _simple_consumer(self) -> Any:
        from ..embedded import EmbeddedBroker, FilterExpression
        from ..embedded import SimpleConsumer as EmbeddedSimpleConsumer

        if isinstance(self._configuration, EmbeddedBroker):
            # the same subscription dict works on both: the client's tag expressions become the broker's
            filters = {t: f if isinstance(f, FilterExpression) or f is None else _embedded_filter(f)
                       for t, f in self.subscription.items()}
            return EmbeddedSimpleConsumer(self._configuration, self.consumer_group, filters,
                                          await_duration=AWAIT_DURATION_S)
        from rocketmq import SimpleConsumer

        return SimpleConsumer(self._configuration, self.consumer_group, self.subscription,
                              await_duration=AWAIT_DURATION_S, tls_enable=self._tls)

    def _run(self) -> None:
        assert self.loop is not None
        try:
            self.loop.run()
        except BaseException as exc:  # noqa: BLE001 - on our own thread: the log line and `error` are all that tell
            # a refused lease (nothing can be received), or a Ctrl-C / SystemExit raised in user
            # code on one of the loop's threads (the loop gave back what it held, then stopped)
            self.error = exc
            log.error("rmqtrace: DemandPushConsumer of %r stopped consuming: %s: %s (call shutdown())",
                      self.consumer_group, type(exc).__name__, exc, exc_info=exc)
        finally:
            with self._lock:
                if self._state == "running":  # no shutdown() asked for it: it consumes no more, say so
                    self._state = "ended"
            if self._close_after_run:
                self.consumer.shutdown()

    def _handle(self, message: Any) -> None:
        result = self.message_listener.consume(message)
        unrun = never_ran(result, "message_listener.consume")  # a coroutine is closed, not left to warn
        if unrun is not None:
            raise unrun
        if _succeeded(result):
            return
        if not self._warned and getattr(result, "name", None) != "FAILURE":
            self._warned = True
            log.warning("rmqtrace: the listener of %r returned %r, not a ConsumeResult: taken as FAILURE",
                        self.consumer_group, result)
        raise ConsumeFailed(f"listener returned {getattr(result, 'name', result)!r}")

def _default_tracer(group: str) -> tuple[MessageTracer, bool]:
    """A tracer from the instrumentor when ``opentelemetry-instrument`` (or
    ``RocketMQInstrumentor().instrument()``) is active — its provider and metrics, as for every
    other consumer it traces — else one on the global provider; and the instrumentor's
    ``settle_spans`` (False without it)."""
    try:
        from .instrumentor import RocketMQInstrumentor

        inst = RocketMQInstrumentor()  # a singleton (BaseInstrumentor)
        if inst.is_instrumented_by_opentelemetry:
            return inst.consumer_tracer(group), inst.settle_spans
    except ImportError:  # the instrumentor needs opentelemetry-instrumentation's extras
        pass
    return MessageTracer(consumer_group=group), False


def _embedded_filter(expression: Any) -> Any:
    """A 5.x ``FilterExpression`` as the embedded broker's (tags only; SQL92 is refused loudly)."""
    from ..embedded import FilterExpression

    kind = getattr(getattr(expression, "filter_type", None), "name", "TAG")
    if kind != "TAG":
        raise ValueError(f"the embedded broker filters by tag only, got a {kind} expression")
    return FilterExpression(str(getattr(expression, "expression", "*") or "*"))


def _message_group(message: Any) -> str | None:
    group = getattr(message, "message_group", None)
    return str(group) if group else None
