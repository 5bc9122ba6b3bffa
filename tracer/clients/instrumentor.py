"""``RocketMQInstrumentor``: no-code-change tracing of ``rocketmq-python-client`` 5.x.

Registered under the ``opentelemetry_instrumentor`` entry point, so
``opentelemetry-instrument python app.py`` patches the client before the app runs. It patches
public methods only, each wrap with its unwrap:

- ``Producer.send`` / ``Producer.send_async``: ``send {topic}`` span, trace context and produce stamp;
- ``SimpleConsumer.receive`` (and ``receive_async``) / ``SimpleConsumer.ack`` (and ``ack_async``):
  ``client_pull`` stamp on receive, trace finished on ack (the time between is taken as the
  handler); with ``SimpleConsumer.change_invisible_duration`` these are also client operations
  (``receive`` span, settle spans with ``instrument(settle_spans=True)``,
  ``messaging.client.operation.duration``; ``ack_async`` is not timed: docs/semconv.md);
- ``PushConsumer.__init__``: the user's listener is wrapped in :class:`~tracer.clients.official.TracedListener`.

Each producer and consumer object gets a tracer of its own (the consumers' all recording into one
``TracerMetrics``), so its spans carry its own ``messaging.client.id``.

With the legacy ``rocketmq-client-python`` 2.x installed instead (same import name ``rocketmq``; the two
never share an environment) it patches ``rocketmq.client``: ``Producer.send_sync`` /
``send_orderly_with_sharding_key`` / ``send_oneway`` and ``PushConsumer.subscribe`` (the callback is
wrapped with :func:`~tracer.clients.legacy.traced_callback`; ``PushConsumer.__init__`` only records
the group for the ``consumer_group`` label).

Code that runs its own traced loop (:class:`tracer.consume.ConsumeLoop`) suppresses these patches
around its client calls, so a message is never traced twice.
"""

from __future__ import annotations

import logging
import threading
import weakref
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Collection, NamedTuple

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.instrumentation.utils import is_instrumentation_enabled, unwrap
from wrapt import wrap_function_wrapper

from ..config import Settings, serve_metrics
from ..path.message import client_facts
from ..path.names import ACK, CHANGE_INVISIBLE_DURATION
from ..telemetry.metrics import TracerMetrics
from ..telemetry.operations import ConsumerOperations
from ..telemetry.tracer import MessageTracer
from .legacy import remember_name_server, traced_callback, traced_legacy_send
from .official import ReceivedTraces, TracedListener, settle_received
from .package import _instruments, _instruments_legacy
from .producer import traced_send, traced_send_async
from .startup import SETTINGS_WAIT_S, wait_for_settings

__all__ = ["RocketMQInstrumentor"]


class _Seam(NamedTuple):
    """What the patched methods of one consumer object share."""

    traces: ReceivedTraces
    operations: ConsumerOperations
    settings_waited: threading.Event  # set once its first receive waited for the client's settings (startup.py)

log = logging.getLogger(__name__)


def _await_settings(seam: _Seam, consumer: Any) -> None:
    """The 5.1.2 client's first receive before its settings fails (startup.py): wait once per consumer."""
    if not seam.settings_waited.is_set():
        if wait_for_settings(consumer) is False:
            log.debug("rmqtrace: no settings from the proxy within %g s; receiving anyway", SETTINGS_WAIT_S)
        seam.settings_waited.set()

_PRODUCER = "rocketmq.v5.producer.producer"
_SIMPLE = "rocketmq.v5.consumer.simple.simple_consumer"
_PUSH = "rocketmq.v5.consumer.push.push_consumer"
_LEGACY = "rocketmq.client"
_LEGACY_SENDS = ("send_sync", "send_orderly_with_sharding_key", "send_oneway")
_LEGACY_GROUP_ATTR = "_rmqtrace_group"


def _installed(dist: str) -> bool:
    try:
        version(dist)
    except PackageNotFoundError:
        return False
    return True


def _legacy_only() -> bool:
    """The legacy 2.x client is installed and the 5.x one is not (they cannot coexist)."""
    return _installed("rocketmq-client-python") and not _installed("rocketmq-python-client")


class RocketMQInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Keyword arguments to ``instrument()``: ``tracer_provider``, ``registry`` (a Prometheus
    ``CollectorRegistry``; default the global one) or ready-made ``metrics``
    (:class:`~tracer.telemetry.metrics.TracerMetrics`; else the registry's shared one).

    ``settle_spans=True`` adds a span per ``ack`` / ``change_invisible_duration`` (the histogram
    records them either way).

    ``RMQTRACE_METRICS_PORT`` serves ``/metrics`` of that registry from ``instrument()`` until
    ``uninstrument()``, so the two can alternate on one port.
    """

    metrics: TracerMetrics | None = None  # what instrument() records into
    _legacy = False
    _server: Any = None

    def instrumentation_dependencies(self) -> Collection[str]:
        # Mirrors the `instruments-any` extra the opentelemetry-instrument loader checks.
        return _instruments_legacy if _legacy_only() else _instruments

    def _instrument(self, **kwargs: Any) -> None:
        settings = Settings.from_env()
        provider = kwargs.get("tracer_provider")
        metrics: TracerMetrics | None = kwargs.get("metrics")
        if metrics is None:
            metrics = TracerMetrics.shared(kwargs.get("registry"))
        if settings.metrics_port is not None:
            self._server = serve_metrics(settings, metrics.registry)
        self._producer_tracer = MessageTracer(tracer_provider=provider)  # producers that cannot be weakly referenced
        self._producers: weakref.WeakKeyDictionary[Any, MessageTracer] = weakref.WeakKeyDictionary()
        self._seams: weakref.WeakKeyDictionary[Any, _Seam] = weakref.WeakKeyDictionary()
        self._group_seams: dict[str, _Seam] = {}  # consumers that cannot be weakly referenced
        self._lock = threading.Lock()
        self._provider = provider
        self.metrics = metrics
        self._default_group = settings.consumer_group
        self._settle_spans = bool(kwargs.get("settle_spans", False))

        self._legacy = _legacy_only()
        if self._legacy:
            for name in _LEGACY_SENDS:
                wrap_function_wrapper(_LEGACY, f"Producer.{name}", self._legacy_send)
            wrap_function_wrapper(_LEGACY, "Producer.set_name_server_address", self._legacy_name_server)
            wrap_function_wrapper(_LEGACY, "PushConsumer.__init__", self._legacy_push_init)
            wrap_function_wrapper(_LEGACY, "PushConsumer.subscribe", self._legacy_subscribe)
            return
        wrap_function_wrapper(_PRODUCER, "Producer.send", self._send)
        wrap_function_wrapper(_PRODUCER, "Producer.send_async", self._send_async)
        wrap_function_wrapper(_SIMPLE, "SimpleConsumer.receive", self._receive)
        wrap_function_wrapper(_SIMPLE, "SimpleConsumer.receive_async", self._receive_async)
        wrap_function_wrapper(_SIMPLE, "SimpleConsumer.ack", self._ack)
        wrap_function_wrapper(_SIMPLE, "SimpleConsumer.change_invisible_duration", self._change_invisible)
        wrap_function_wrapper(_SIMPLE, "SimpleConsumer.ack_async", self._ack_async)
        wrap_function_wrapper(_SIMPLE, "SimpleConsumer.change_invisible_duration_async", self._change_invisible_async)
        wrap_function_wrapper(_PUSH, "PushConsumer.__init__", self._push_init)

    def _uninstrument(self, **kwargs: Any) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._legacy:
            import rocketmq.client as legacy

            for name in _LEGACY_SENDS:
                unwrap(legacy.Producer, name)
            unwrap(legacy.Producer, "set_name_server_address")
            unwrap(legacy.PushConsumer, "__init__")
            unwrap(legacy.PushConsumer, "subscribe")
            return
        import rocketmq.v5.consumer.push.push_consumer as push
        import rocketmq.v5.consumer.simple.simple_consumer as simple
        import rocketmq.v5.producer.producer as producer

        unwrap(producer.Producer, "send")
        unwrap(producer.Producer, "send_async")
        unwrap(simple.SimpleConsumer, "receive")
        unwrap(simple.SimpleConsumer, "receive_async")
        unwrap(simple.SimpleConsumer, "ack")
        unwrap(simple.SimpleConsumer, "change_invisible_duration")
        unwrap(simple.SimpleConsumer, "ack_async")
        unwrap(simple.SimpleConsumer, "change_invisible_duration_async")
        unwrap(push.PushConsumer, "__init__")

    # -- per consumer --------------------------------------------------------------------
    @property
    def settle_spans(self) -> bool:
        """Whether ``instrument(settle_spans=True)`` asked for a span per ack / change_invisible_duration."""
        return bool(getattr(self, "_settle_spans", False))

    def consumer_tracer(self, consumer_group: str) -> MessageTracer:
        """A new tracer for one consumer of ``consumer_group`` that traces its messages itself (a
        :class:`~tracer.clients.consume.ConsumeLoop`, the ``DemandPushConsumer``): this
        instrumentor's tracer provider and metrics, as for the consumers it patches, and a tracer
        of its own so that consumer carries its own ``messaging.client.id``.

        Raises:
            RuntimeError: the instrumentor is not active (``instrument()`` not called).
        """
        if not self.is_instrumented_by_opentelemetry:
            raise RuntimeError("RocketMQInstrumentor.consumer_tracer() needs instrument() first")
        return MessageTracer(consumer_group=consumer_group or self._default_group, tracer_provider=self._provider,
                             metrics=self.metrics)

    def _seam_for(self, consumer: Any, group: str | None) -> _Seam:
        """The tracer, received traces and operations of one consumer object: its own
        ``messaging.client.id`` (two consumers of one group have two), its facts read once."""
        with self._lock:
            try:
                found = self._seams.get(consumer)
            except Exception:  # noqa: BLE001 - not weakly referenceable or hashable: one per group instead
                found, consumer_key = self._group_seams.get(group or self._default_group), None
            else:
                consumer_key = consumer
            if found is None:
                tracer = MessageTracer(consumer_group=group or self._default_group, tracer_provider=self._provider,
                                       metrics=self.metrics)
                found = _Seam(ReceivedTraces(tracer),
                              ConsumerOperations(tracer, consumer, settle_spans=self._settle_spans), threading.Event())
                if consumer_key is not None:
                    self._seams[consumer_key] = found
                else:
                    self._group_seams[group or self._default_group] = found
            return found

    def _tracer_for_producer(self, producer: Any) -> MessageTracer:
        """One tracer per producer object, described by its own facts (``messaging.client.id``)."""
        with self._lock:
            try:
                found = self._producers.get(producer)
            except Exception:  # noqa: BLE001 - not weakly referenceable or hashable: the shared one
                return self._producer_tracer
            if found is None:
                found = self._producers[producer] = MessageTracer(tracer_provider=self._provider)
                found.describe_client(client_facts(producer))
            return found

    # -- wrappers (wrapt signature: wrapped, instance, args, kwargs) ------------------------
    def _send(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not is_instrumentation_enabled() or not args:
            return wrapped(*args, **kwargs)
        return traced_send(self._tracer_for_producer(instance), wrapped, *args, **kwargs)

    def _send_async(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not is_instrumentation_enabled() or not args:
            return wrapped(*args, **kwargs)
        return traced_send_async(self._tracer_for_producer(instance), wrapped, *args, **kwargs)

    def _receive(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not is_instrumentation_enabled():
            return wrapped(*args, **kwargs)
        seam = self._seam_for(instance, _group_of(instance))
        _await_settings(seam, instance)
        messages = seam.operations.receive(lambda: wrapped(*args, **kwargs), seam.traces.received)
        return settle_received(seam.traces, instance, messages)  # probes acked here, not returned

    def _receive_async(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not is_instrumentation_enabled():
            return wrapped(*args, **kwargs)
        seam = self._seam_for(instance, _group_of(instance))
        _await_settings(seam, instance)
        return seam.operations.receive_async(lambda: wrapped(*args, **kwargs), seam.traces.received,
                                             lambda messages: settle_received(seam.traces, instance, messages))

    def _ack(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not is_instrumentation_enabled() or not args:
            return wrapped(*args, **kwargs)
        seam = self._seam_for(instance, _group_of(instance))
        try:
            result = seam.operations.settle(ACK, args[0], lambda: wrapped(*args, **kwargs))
        except BaseException as exc:  # a refused ack: measured all the same (ReceivedTraces.acked)
            seam.traces.acked(args[0], exc)
            raise
        seam.traces.acked(args[0])
        return result

    def _change_invisible(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not is_instrumentation_enabled() or not args:
            return wrapped(*args, **kwargs)
        seam = self._seam_for(instance, _group_of(instance))
        try:
            result = seam.operations.settle(CHANGE_INVISIBLE_DURATION, args[0], lambda: wrapped(*args, **kwargs))
        except BaseException as exc:  # a refused nack: measured all the same (ReceivedTraces.nacked)
            seam.traces.nacked(args[0], exc)
            raise
        seam.traces.nacked(args[0])  # the 5.x nack: the trace ends as a failure (see ReceivedTraces.nacked)
        return result

    def _ack_async(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return self._settle_untimed(wrapped, instance, args, kwargs, nack=False)

    def _change_invisible_async(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return self._settle_untimed(wrapped, instance, args, kwargs, nack=True)

    def _settle_untimed(self, wrapped: Any, instance: Any, args: Any, kwargs: Any, *, nack: bool) -> Any:
        # the async ack and nack: no timed operation (no future a thread can wait for); the
        # message's trace ends here, as on the synchronous calls
        if not is_instrumentation_enabled() or not args:
            return wrapped(*args, **kwargs)
        traces = self._seam_for(instance, _group_of(instance)).traces
        end = traces.nacked if nack else traces.acked
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:  # refused on the spot: measured all the same
            end(args[0], exc)
            raise
        end(args[0])
        return result

    def _push_init(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        # PushConsumer(client_configuration, consumer_group, message_listener, subscription, ...)
        tracer: MessageTracer | None = None
        try:
            args = list(args)
            group = kwargs.get("consumer_group", args[1] if len(args) > 1 else None)
            tracer = self._seam_for(instance, group).traces.tracer
            if "message_listener" in kwargs:
                kwargs["message_listener"] = _wrap_listener(kwargs["message_listener"], tracer)
            elif len(args) > 2:
                args[2] = _wrap_listener(args[2], tracer)
        except TypeError as exc:  # a listener that cannot run: say so, but instrumenting changes no behaviour
            log.error("rmqtrace: %s: the client would never run it; this PushConsumer is left untraced", exc)
        except Exception as exc:  # noqa: BLE001 - construct the consumer untraced rather than fail
            log.error("rmqtrace: could not wrap the PushConsumer listener", exc_info=exc)
        result = wrapped(*args, **kwargs)
        if tracer is not None:  # the client id exists only once the consumer is built
            tracer.describe_client(client_facts(instance))
        return result


    # -- legacy 2.x client ----------------------------------------------------------------------
    def _legacy_send(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not is_instrumentation_enabled() or not args:
            return wrapped(*args, **kwargs)
        return traced_legacy_send(self._tracer_for_producer(instance), wrapped, *args, **kwargs)

    def _legacy_name_server(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        # the C++ client keeps the address with no getter: remembered, a route failure says
        # whether the name server is down or the topic missing
        result = wrapped(*args, **kwargs)
        remember_name_server(instance, args[0] if args else kwargs.get("addr"))
        return result

    def _legacy_push_init(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        # PushConsumer(group_id, orderly=False, message_model=...): the group lives only in C++
        result = wrapped(*args, **kwargs)
        try:
            group = kwargs.get("group_id", args[0] if args else None)
            setattr(instance, _LEGACY_GROUP_ATTR, None if group is None else str(group))
        except Exception as exc:  # noqa: BLE001
            log.debug("rmqtrace: could not record the legacy consumer group", exc_info=exc)
        return result

    def _legacy_subscribe(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        # subscribe(topic, callback, expression='*')
        try:
            args = list(args)
            tracer = self._seam_for(instance, getattr(instance, _LEGACY_GROUP_ATTR, None)).traces.tracer
            if "callback" in kwargs:
                kwargs["callback"] = traced_callback(kwargs["callback"], tracer)
            elif len(args) > 1:
                args[1] = traced_callback(args[1], tracer)
        except TypeError as exc:  # a callback that cannot run: say so, but instrumenting changes no behaviour
            log.error("rmqtrace: %s: the client would never run it; this subscription is left untraced", exc)
        except Exception as exc:  # noqa: BLE001 - subscribe untraced rather than fail
            log.error("rmqtrace: could not wrap the legacy PushConsumer callback", exc_info=exc)
        return wrapped(*args, **kwargs)


def _wrap_listener(listener: Any, tracer: MessageTracer) -> Any:
    if listener is None or isinstance(listener, TracedListener):
        return listener
    return TracedListener(listener, tracer)


def _group_of(consumer: Any) -> str | None:
    try:
        return str(consumer.consumer_group)
    except Exception:  # noqa: BLE001
        return None
