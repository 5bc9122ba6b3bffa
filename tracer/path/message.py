"""A client-neutral view of a received message: what the tracer needs and nothing else.

The official 5.x client, the legacy 2.x client and the embedded broker name things differently;
:func:`describe` reads any of them by duck typing so the tracer core never imports a client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

__all__ = ["ClientFacts", "MessageInfo", "body_of", "client_facts", "describe", "key_tuple", "message_type"]

# The 5.x protocol's MessageType codes, as the semantic conventions name them.
_MESSAGE_TYPES = {1: "normal", 2: "fifo", 3: "delay", 4: "transaction"}


@dataclass(slots=True)
class MessageInfo:
    topic: str
    message_id: str | None = None
    tag: str | None = None
    keys: tuple[str, ...] = ()
    message_group: str | None = None
    properties: Mapping[str, Any] = field(default_factory=dict)
    store_ms: int | None = None  # broker clock, milliseconds
    decode_ms: int | None = None  # consumer clock, when the client decoded it
    delivery_attempt: int | None = None
    body_size: int | None = None
    system_trace_context: str | None = None
    namespace: str | None = None  # the RocketMQ namespace, when the client says
    declared_type: str | None = None  # normal, fifo, delay, transaction; None: see message_type()
    delivery_ms: int | None = None  # when a delay message is due, milliseconds
    server_address: str | None = None  # the broker endpoint the message came from
    server_port: int | None = None


def message_type(declared: str | None, group: str | None, delivery_ms: int | None) -> str:
    """The semantic-convention message type: the client's word if it has one, else FIFO when the
    message has a group, delay when it has a due time, normal otherwise."""
    if declared:
        return declared
    if group:
        return "fifo"
    return "delay" if delivery_ms else "normal"


def _get(obj: Any, *names: str) -> Any:
    for name in names:
        try:
            value = getattr(obj, name)
        except Exception:  # noqa: BLE001 - a property of a foreign object may raise anything
            continue
        if value is not None:
            return value
    return None


def _int(value: Any) -> int | None:
    try:
        v = int(value)
    except Exception:  # noqa: BLE001 - a foreign object's __int__ may raise anything
        return None
    return v if v > 0 else None


def key_tuple(keys: Any) -> tuple[str, ...]:
    """A message's keys as recorded (``messaging.rocketmq.message.keys``): a sequence in its order,
    one str as itself, a set (the 5.x client's) **sorted** — a set's own order is its process's hash
    order, so its first recorded key is the smallest, the one the producer's ``message_key`` reads
    and a learned cost table is keyed by."""
    # once per message on both paths: the common shapes first, map(str) rather than a generator
    if not keys:
        return ()
    if isinstance(keys, (str, bytes)):
        return (str(keys),)
    if isinstance(keys, (set, frozenset)):
        return tuple(sorted(map(str, keys))) if len(keys) > 1 else tuple(map(str, keys))
    return tuple(map(str, keys))


def describe(msg: Any) -> MessageInfo:
    """A :class:`MessageInfo` from a 5.x ``rocketmq.Message``, an embedded message, or anything
    with the same attribute names. Missing attributes stay ``None``; this never raises."""
    try:
        # every received message passes here on the loop's receive thread: plain getattr first,
        # the per-attribute guard only for an object one of whose properties raises
        return _describe(msg, _plain_get)
    except Exception:  # noqa: BLE001 - a foreign object's property raised: field by field
        return _describe(msg, _get)


def _describe(msg: Any, get: Callable[..., Any]) -> MessageInfo:
    keys = get(msg, "keys")
    try:
        keys_t = key_tuple(keys)
    except Exception:  # noqa: BLE001
        keys_t = ()
    body = get(msg, "body")
    props = get(msg, "properties")
    address, port = _endpoint(get(msg, "endpoints"))
    return MessageInfo(
        topic=_str(get(msg, "topic")) or "",
        message_id=_str(get(msg, "message_id")),
        tag=_str(get(msg, "tag")),
        keys=keys_t,
        message_group=_str(get(msg, "message_group")),
        properties=props if isinstance(props, Mapping) else {},
        # the 5.x client parses the store time but keeps it private (name-mangled)
        store_ms=_int(get(msg, "store_timestamp", "_Message__store_timestamp")),
        decode_ms=_int(get(msg, "decode_message_timestamp")),
        delivery_attempt=_int(get(msg, "delivery_attempt")),
        body_size=_size(body),
        system_trace_context=_str(get(msg, "trace_context")),
        namespace=_str(get(msg, "namespace")),
        declared_type=_MESSAGE_TYPES.get(_int(get(msg, "message_type")) or 0),
        delivery_ms=_int(get(msg, "delivery_timestamp")),
        server_address=address,
        server_port=port,
    )


def _plain_get(obj: Any, name: str, second: str | None = None) -> Any:
    """``_get`` for objects whose properties do not raise (anything but AttributeError escapes)."""
    value = getattr(obj, name, None)
    if value is None and second is not None:
        value = getattr(obj, second, None)
    return value


class ClientFacts(NamedTuple):
    """What a client object says about itself, for ``messaging.client.id``, the namespace and
    ``server.address``/``server.port``; None where it does not say."""

    client_id: str | None = None
    namespace: str | None = None
    server_address: str | None = None
    server_port: int | None = None


def client_facts(client: Any) -> ClientFacts:
    """Read a 5.x ``Producer``/``SimpleConsumer``/``PushConsumer`` (its ``client_id`` and
    ``client_configuration``) by duck typing. Never raises."""
    config = _get(client, "client_configuration")
    address, port = _endpoint(_get(config, "rpc_endpoints"))
    return ClientFacts(_str(_get(client, "client_id")), _str(_get(config, "namespace")), address, port)


def _endpoint(endpoints: Any) -> tuple[str | None, int | None]:
    """The first address of a 5.x ``RpcEndpoints`` (its protobuf ``Endpoints.addresses``)."""
    try:
        first = endpoints.endpoints.addresses[0]
        host, port = str(first.host), int(first.port)
    except Exception:  # noqa: BLE001 - absent, or a foreign object
        return None, None
    return (host or None), (port if 0 < port < 65536 else None)


def body_of(tracer: Any, msg: Any) -> Any:
    """The message body when the tracer captures bodies (an opt-in), else None — never read otherwise."""
    if not getattr(tracer, "capture_body", 0):
        return None
    try:
        return getattr(msg, "body", None)
    except Exception:  # noqa: BLE001
        return None


def _size(body: Any) -> int | None:
    # a str/bytes subclass may override __len__ with anything
    try:
        return len(body) if isinstance(body, (bytes, bytearray, str)) else None
    except Exception:  # noqa: BLE001
        return None


def _str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a foreign object's __str__ may raise anything
        return None
