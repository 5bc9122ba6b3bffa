"""Wrappers for the legacy ``rocketmq-client-python`` 2.x (ctypes over rocketmq-client-cpp's
``librocketmq.so``; remoting protocol: name server + broker, no proxy).

- Producers: :class:`TracedLegacyProducer` traces ``send_sync``, ``send_orderly_with_sharding_key``
  and ``send_oneway`` — the ``send {topic}`` span, trace context and produce stamp go into the
  message through ``Message.set_property``.
- Push consumers: ``consumer.subscribe(topic, traced_callback(callback, tracer))``: the callback runs
  inside the ``process``/``handler`` spans. Its ``ConsumeStatus`` and exceptions pass through.

What the 2.x client lets us see: the broker's store time (``ReceivedMessage.store_timestamp``, ms)
and our own properties, read with ``get_property`` for our keys only (a 2.x message cannot list its
properties). The C++ client's pull time and the wait in its consume thread pool are not exposed, so
``client_pull`` and ``dispatch_enqueue`` are both the moment the callback is entered: for this
client ``broker_wait`` also holds the time in the C++ client's local cache and pool queue, and
``client_buffer``/``dispatch_wait`` are zero.

The 2.x ``Message`` has setters only. Its topic, tag and keys (for the span name and attributes)
are read back from the native message with ``GetOriginMessageTopic``/``Tags``/``Keys``, which
``librocketmq.so`` (rocketmq-client-cpp 2.1.0) exports but the Python binding does not wrap;
objects that carry ``topic``/``tags``/``keys`` attributes themselves are read directly.

The 2.x package installs a top-level ``rocketmq`` package, as does the official 5.x client: the two
cannot be installed in one environment. This module never imports either.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple

from opentelemetry import propagate

from ..callables import require_plain
from ..dispatch.cost import check_priority_levels
from ..dispatch.costtable import CostTable
from ..path.message import MessageInfo
from ..path.names import JOB_ORDER_PROPERTY, JOB_ORDERS, PRIORITY_PROPERTY, PROBE_PROPERTY
from ..path.propagation import BAGGAGE, COST, JOB_ID, PRODUCE_NS, TRACEPARENT, TRACESTATE
from ..telemetry.tracer import MessageTracer, SendTrace
from .listener import Seam, traced_consume
from .producer import (
    ProducerProxy,
    check_job_id,
    check_markable,
    ordered_job,
    plan_priorities,
    send_ordered,
    traced_send,
)
from .route import explain_legacy_route_failure

# Our properties and the W3C ones, read from a received 2.x message (it cannot list its
# properties); the global propagator's own fields are read as well when it is another one.
KNOWN_PROPERTIES: tuple[str, ...] = (TRACEPARENT, TRACESTATE, BAGGAGE, PRODUCE_NS, JOB_ID, COST, JOB_ORDER_PROPERTY,
                                     PROBE_PROPERTY)


class Produced(NamedTuple):
    topic: str
    tag: str | None
    keys: tuple[str, ...]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    try:  # a foreign object's __str__ (or a bytes subclass's decode) may raise anything
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        value = str(value)
    except Exception:  # noqa: BLE001
        return None
    return value or None


def _split_keys(value: Any) -> tuple[str, ...]:
    """RocketMQ keeps several keys in one ``KEYS`` property, separated by spaces."""
    text = _text(value)
    return tuple(k for k in text.split(" ") if k) if text else ()


# -- reading a 2.x Message back ---------------------------------------------------------------
class _NativeReader:
    """``GetOriginMessageTopic/Tags/Keys`` of the loaded ``librocketmq.so``, bound once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._funcs: dict[str, Any] | None = None
        self._tried = False

    def _bind(self) -> dict[str, Any] | None:
        with self._lock:
            if not self._tried:
                self._tried = True
                ffi = sys.modules.get("rocketmq.ffi")  # loaded with the client; never import it here
                dll = getattr(ffi, "dll", None)
                if dll is not None:
                    try:
                        funcs = {}
                        for name in ("GetOriginMessageTopic", "GetOriginMessageTags", "GetOriginMessageKeys"):
                            f = dll[name]  # a new function object: the binding's own ones stay untouched
                            f.argtypes = [ctypes.c_void_p]
                            f.restype = ctypes.c_char_p
                            funcs[name] = f
                        self._funcs = funcs
                    except (AttributeError, OSError):
                        self._funcs = None
            return self._funcs

    def read(self, message: Any) -> Produced | None:
        handle = getattr(message, "_handle", None)
        if not handle:
            return None
        funcs = self._funcs if self._tried else self._bind()
        if funcs is None:
            return None
        return Produced(
            _text(funcs["GetOriginMessageTopic"](handle)) or "",
            _text(funcs["GetOriginMessageTags"](handle)),
            _split_keys(funcs["GetOriginMessageKeys"](handle)),
        )


_native = _NativeReader()


def produced_fields(message: Any) -> Produced:
    """Topic, tag and keys of a 2.x ``Message`` about to be sent. Never raises."""
    try:
        topic = getattr(message, "topic", None)
        if topic is not None:
            tags = getattr(message, "tags", None)
            return Produced(_text(topic) or "", _text(tags), _split_keys(getattr(message, "keys", None)))
        found = _native.read(message)
        if found is not None:
            return found
    except Exception:  # noqa: BLE001 - a foreign object; the send goes on with less detail
        pass
    return Produced("", None, ())


# -- producer -------------------------------------------------------------------------------------
def start_legacy_send(tracer: MessageTracer, message: Any, job_id: str | None, cost: float | None) -> SendTrace:
    fields = produced_fields(message)
    return tracer.start_send(fields.topic, message.set_property, tag=fields.tag, keys=fields.keys,
                             job_id=job_id, cost=cost)


# The name server each 2.x producer was given, as far as rmqtrace saw the call (the C++ client
# keeps it and has no getter): it tells a name server that is down from a missing topic.
_NAME_SERVERS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def remember_name_server(producer: Any, addresses: Any) -> None:
    """Keep ``addresses`` (what ``set_name_server_address`` was given) for ``producer``. Never raises."""
    try:
        if isinstance(addresses, str) and addresses:
            _NAME_SERVERS[producer] = addresses
    except TypeError:  # not weakly referenceable: its route failure names both causes
        pass


def explain_legacy_send_failure(exc: BaseException, client: Any, message: Any) -> Exception | None:
    """The 2.x client's "No route info of this topic" as a :class:`.route.TopicRouteError`: the
    name server down or the topic missing (both, when its address was set before rmqtrace saw it)."""
    try:
        name_server = _NAME_SERVERS.get(client)
    except TypeError:
        name_server = None
    return explain_legacy_route_failure(exc, name_server, produced_fields(message).topic)


def traced_legacy_send(tracer: MessageTracer, send: Callable[..., Any], message: Any, *args: Any,
                       job_id: str | None = None, cost: float | None = None, **kwargs: Any) -> Any:
    """``send(message, ...)`` of a 2.x producer inside a ``send {topic}`` span. The receipt's
    ``msg_id`` becomes ``messaging.message.id``; the user's exceptions pass through, but for the
    client's "No route info of this topic", raised as a :class:`.route.TopicRouteError`."""
    return traced_send(tracer, send, message, *args, job_id=job_id, cost=cost, opener=start_legacy_send,
                       explain=explain_legacy_send_failure, id_attr="msg_id", **kwargs)


def legacy_message_key(message: Any) -> str | None:
    """A 2.x message's first key (its keys are one space-separated string), or None."""
    keys = produced_fields(message).keys
    return keys[0] if keys else None


def _property_setter(message: Any) -> Callable[[str, str], object]:
    setter = getattr(message, "set_property", None)
    if not callable(setter):
        raise TypeError(f"{type(message).__name__} has no set_property()")
    return setter  # type: ignore[no-any-return]


def _no_property_setter(message: Any) -> str | None:
    return None if callable(getattr(message, "set_property", None)) else (
        f"({type(message).__name__}) has no set_property(): a 2.x client Message carries the priority")


class TracedLegacyProducer(ProducerProxy):
    """The send methods of one 2.x ``Producer``, traced; :meth:`send_job` sends a job longest first.

    ``job_id`` and ``cost`` keyword arguments are ours and are not passed to the client.
    """

    def send_job(self, messages: Sequence[Any], *, cost: Callable[[Any], float] | CostTable,
                 job_id: str | None = None, order: str = JOB_ORDERS[0],
                 key: Callable[[Any], str | None] = legacy_message_key,
                 priority_levels: int | None = None) -> list[Any]:
        """:meth:`TracedProducer.send_job <tracer.clients.producer.TracedProducer.send_job>` for the
        2.x client: one job with ``send_sync``, longest first, each message with its job id, cost
        and the order (``rmqtrace_order``); every cost checked before the first send.
        ``priority_levels``: each message's priority on a PRIORITY topic of that many queues, in
        the broker's own property (``_SYS_MSG_PRIORITY_``: the 2.x client has no field for it).

        Raises:
            ValueError: an unknown ``order``, a blank ``job_id``; a junk cost or a raising ``cost``
                (naming the message); ``priority_levels`` below 1.
            TypeError: ``cost`` is neither a function nor a table; ``job_id`` not a str;
                ``priority_levels`` not an int.
            JobSendError: a send raised; ``.sent``, ``.failed``, ``.unsent`` say what went.
        """
        job_id = check_job_id(job_id)
        check_priority_levels(priority_levels)
        pairs = ordered_job(messages, cost, order, key)
        check_markable(messages, key, _property_setter)
        levels = iter(plan_priorities(messages, pairs, priority_levels, key, _no_property_setter) or ())

        def mark(m: Any) -> None:
            m.set_property(JOB_ORDER_PROPERTY, order)
            if priority_levels is not None:  # at its own send: a failed job leaves the rest untouched
                m.set_property(PRIORITY_PROPERTY, str(next(levels)))

        return send_ordered(pairs, order, job_id, lambda m, c: self.send_sync(m, job_id=job_id, cost=c), mark)

    def set_name_server_address(self, addr: str) -> None:
        """The client's own, remembered: a route failure then says whether the name server is down."""
        self._producer.set_name_server_address(addr)
        remember_name_server(self._producer, addr)

    def send_sync(self, msg: Any, *, job_id: str | None = None, cost: float | None = None) -> Any:
        return traced_legacy_send(self._tracer, self._producer.send_sync, msg, job_id=job_id, cost=cost)

    def send_orderly_with_sharding_key(self, msg: Any, sharding_key: str, *, job_id: str | None = None,
                                       cost: float | None = None) -> Any:
        return traced_legacy_send(self._tracer, self._producer.send_orderly_with_sharding_key, msg, sharding_key,
                                  job_id=job_id, cost=cost)

    def send_oneway(self, msg: Any, *, job_id: str | None = None, cost: float | None = None) -> Any:
        return traced_legacy_send(self._tracer, self._producer.send_oneway, msg, job_id=job_id, cost=cost)


# -- consumer -------------------------------------------------------------------------------------
def describe_legacy(msg: Any) -> MessageInfo:
    """A :class:`MessageInfo` from a 2.x ``ReceivedMessage``. Never raises: what cannot be read
    stays empty. ``body`` is the client's NUL-terminated copy, so its size may be short."""
    props: dict[str, Any] = {}
    get = _attr(msg, "get_property")
    if get is not None:
        for key in _property_keys():
            try:
                value = get(key)
                if value:  # b'' when absent
                    props[key] = value
            except Exception:  # noqa: BLE001 - a foreign object's answer may raise even on bool()
                continue
    reconsume = _attr(msg, "reconsume_times")
    body = _attr(msg, "body")
    store = _attr(msg, "store_timestamp")
    return MessageInfo(
        topic=_text(_attr(msg, "topic")) or "",
        message_id=_text(_attr(msg, "id")),
        tag=_text(_attr(msg, "tags")),
        keys=_split_keys(_attr(msg, "keys")),
        properties=props,
        store_ms=int(store) if isinstance(store, int) and store > 0 else None,
        delivery_attempt=(reconsume + 1) if isinstance(reconsume, int) and reconsume >= 0 else None,
        body_size=_size(body),
    )


def _property_keys() -> tuple[str, ...]:
    try:
        extra = tuple(f for f in propagate.get_global_textmap().fields if f not in KNOWN_PROPERTIES)
    except Exception:  # noqa: BLE001 - a broken propagator: our keys still work
        extra = ()
    return KNOWN_PROPERTIES + extra


def _size(body: Any) -> int | None:
    # a str/bytes subclass may override __len__ with anything
    try:
        return len(body) if isinstance(body, (bytes, bytearray, str)) else None
    except Exception:  # noqa: BLE001
        return None


def _attr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except Exception:  # noqa: BLE001 - a property of a foreign object may raise anything
        return None


def _is_success(status: Any) -> bool:
    # ConsumeStatus.CONSUME_SUCCESS == 0 (an IntEnum); anything else is a retry
    try:
        return int(status) == 0
    except (TypeError, ValueError):
        return False


def traced_callback(callback: Callable[[Any], Any], tracer: MessageTracer) -> Callable[[Any], Any]:
    """Wrap a 2.x ``PushConsumer.subscribe`` callback: stamps, ``process``/``handler`` spans and
    histograms per message. ``RECONSUME_LATER`` and exceptions count as failures and pass through.

    Raises:
        TypeError: ``callback`` is an ``async def`` or a generator: it would never run.
    """
    if getattr(callback, "__rmqtrace_wrapped__", None) is not None:
        return callback
    require_plain(callback, "callback")

    def traced(msg: Any) -> Any:
        return traced_consume(tracer, LEGACY_SEAM, callback, msg)

    traced.__rmqtrace_wrapped__ = callback  # type: ignore[attr-defined]
    traced.__wrapped__ = callback  # type: ignore[attr-defined]
    traced.__name__ = getattr(callback, "__name__", "traced_callback")
    return traced


# The C++ client exposes no pull time: the callback's entry is the pull (see the module docstring).
LEGACY_SEAM = Seam(describe_legacy, lambda info: None, _is_success, "starting a legacy consumer trace",
                   0,  # ConsumeStatus.CONSUME_SUCCESS (an IntEnum), what a settled probe returns
                   "callback")

__all__ = [
    "KNOWN_PROPERTIES",
    "LEGACY_SEAM",
    "Produced",
    "TracedLegacyProducer",
    "describe_legacy",
    "explain_legacy_send_failure",
    "legacy_message_key",
    "produced_fields",
    "remember_name_server",
    "traced_callback",
    "traced_legacy_send",
]
