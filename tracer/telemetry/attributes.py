"""Every span attribute rmqtrace writes, built in one place (the names are in tracer.path.names).

:mod:`tracer.telemetry.tracer` decides *when* spans start and end; this module says *what they
carry*: the ``send`` span's attributes (all known before the send, so all go to the sampler), the
``process`` span's sampling-relevant ones (at its start) and the rest (at its end), and the caps a
hostile message cannot get past. Which attributes and why: docs/semconv.md.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..path import names as n
from ..path.message import ClientFacts, MessageInfo, message_type
from ..path.stages import Outcome
from ..path.stamps import MISSING

__all__ = [
    "BODY_ATTR", "MAX_ATTR_CHARS", "MAX_KEYS", "body_preview", "cap", "client_attributes", "job_order",
    "process_attributes", "process_sampling_attributes", "send_attributes", "server_attributes",
]

BODY_ATTR = n.BODY
# Message fields become span attributes and names: a hostile message must not make a span huge
# (queued spans would hold it, and an export batch could outgrow what a backend takes).
MAX_ATTR_CHARS = 256
MAX_KEYS = 32
_JOB_ORDERS = n.JOB_ORDERS  # a tuple: `in` compares, so an unhashable property value cannot raise
_STAMP_ATTRS: tuple[tuple[int, str], ...] = tuple((int(s), key) for s, key in n.STAMP_ATTRS.items())


def cap(value: str) -> str:
    return value if len(value) <= MAX_ATTR_CHARS else value[:MAX_ATTR_CHARS]


def body_preview(body: bytes | bytearray | str, limit: int) -> str:
    """The first ``limit`` bytes of a body as text: valid UTF-8 whatever the bytes were."""
    raw = body[:limit].encode("utf-8", "replace") if isinstance(body, str) else bytes(body[:limit])
    return raw[:limit].decode("utf-8", "replace")


def server_attributes(client: ClientFacts) -> dict[str, Any]:
    """``server.address``/``server.port`` of the client's endpoint (empty when it does not say)."""
    if not client.server_address:
        return {}
    out: dict[str, Any] = {n.SERVER_ADDRESS: client.server_address}
    if client.server_port is not None:
        out[n.SERVER_PORT] = client.server_port
    return out


def client_attributes(attrs: dict[str, Any], client: ClientFacts, namespace: str | None) -> None:
    """The namespace (the message's when it has one, passed in) and ``messaging.client.id``."""
    if namespace is not None:
        attrs[n.NAMESPACE] = cap(namespace)
    if client.client_id:
        attrs[n.CLIENT_ID] = client.client_id


def _message_attributes(attrs: dict[str, Any], tag: str | None, keys: Sequence[str],
                        group: str | None, body_size: int | None) -> None:
    if tag:
        attrs[n.MESSAGE_TAG] = cap(tag)
    if keys:
        attrs[n.MESSAGE_KEYS] = tuple(cap(k) for k in keys[:MAX_KEYS])  # a tuple, as the SDK stores a sequence
    if group:
        attrs[n.MESSAGE_GROUP] = cap(group)
    if body_size is not None:
        attrs[n.BODY_SIZE] = body_size


def send_attributes(topic: str, client: ClientFacts, server: Mapping[str, Any], *, tag: str | None,
                    keys: Sequence[str], message_group: str | None, job_id: str | None,
                    body_size: int | None, delivery_ms: int | None) -> dict[str, Any]:
    """The ``send {topic}`` span's attributes, every one known before the send (``topic`` capped)."""
    attrs: dict[str, Any] = {
        n.SYSTEM: n.SYSTEM_VALUE,
        n.OPERATION_NAME: n.SEND,
        n.OPERATION_TYPE: n.SEND,
        n.DESTINATION: topic,
        **server,
    }
    client_attributes(attrs, client, client.namespace)
    _message_attributes(attrs, tag, keys, message_group, body_size)
    attrs[n.MESSAGE_TYPE] = message_type(None, message_group, delivery_ms)
    if delivery_ms:
        attrs[n.DELIVERY_TIMESTAMP] = delivery_ms
    if job_id:
        attrs[n.JOB_ID] = job_id
    return attrs


def process_sampling_attributes(info: MessageInfo, consumer_group: str, server: Mapping[str, Any]) -> dict[str, Any]:
    """What the sampler sees when it decides a ``process`` span (the spec's sampling-relevant set)."""
    attrs: dict[str, Any] = {
        n.SYSTEM: n.SYSTEM_VALUE,
        n.OPERATION_NAME: n.PROCESS,
        n.OPERATION_TYPE: n.PROCESS,
        n.DESTINATION: cap(info.topic),
    }
    if consumer_group:
        attrs[n.CONSUMER_GROUP] = consumer_group
    if info.server_address:
        attrs[n.SERVER_ADDRESS] = cap(info.server_address)
        if info.server_port:
            attrs[n.SERVER_PORT] = info.server_port
    elif server:
        attrs.update(server)
    return attrs


def job_order(props: Mapping[str, Any]) -> str | None:
    """The job order a message's properties carry, when it is one rmqtrace knows; read once per
    written span, not in extract(): only a span shows it (the report's job view)."""
    try:
        order = props.get(n.JOB_ORDER_PROPERTY)
    except Exception:  # noqa: BLE001 - a foreign mapping whose get raises: extract() counted it unreadable
        return None
    if isinstance(order, bytes):  # the 2.x client's property values
        order = order.decode("ascii", "replace")
    return order if order is not None and order in _JOB_ORDERS else None


def process_attributes(info: MessageInfo, client: ClientFacts, outcome: Outcome, times: Sequence[int],
                       job_id: str | None, cost: float | None, worker: int | None, record_body_size: bool,
                       body: bytes | bytearray | str | None, capture_body: int,
                       into: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``process`` attributes not given to the sampler at its start (set at its end), in a
    new dict or put into ``into`` (which is returned).

    Once per sampled message, so written out flat: the same attributes, in the same order, as
    :func:`client_attributes` and the message fields would give, without their calls."""
    attrs: dict[str, Any] = into if into is not None else {}
    attrs[n.OUTCOME] = outcome._value_  # Enum.value is a descriptor call
    namespace = info.namespace if info.namespace is not None else client.namespace
    if namespace is not None:
        attrs[n.NAMESPACE] = namespace if len(namespace) <= MAX_ATTR_CHARS else namespace[:MAX_ATTR_CHARS]
    if client.client_id:
        attrs[n.CLIENT_ID] = client.client_id
    value = info.message_id
    if value:
        attrs[n.MESSAGE_ID] = value if len(value) <= MAX_ATTR_CHARS else value[:MAX_ATTR_CHARS]
    attempt = info.delivery_attempt
    if attempt and attempt < 2**31:  # the broker's is an int32
        attrs[n.DELIVERY_ATTEMPT] = attempt
    value = info.tag
    if value:
        attrs[n.MESSAGE_TAG] = value if len(value) <= MAX_ATTR_CHARS else value[:MAX_ATTR_CHARS]
    keys = info.keys
    if keys:
        if len(keys) <= MAX_KEYS and max(map(len, keys)) <= MAX_ATTR_CHARS:
            attrs[n.MESSAGE_KEYS] = tuple(keys)  # within the caps, as nearly every message is; a tuple, as the SDK stores it
        else:
            attrs[n.MESSAGE_KEYS] = tuple(cap(k) for k in keys[:MAX_KEYS])
    group = info.message_group
    if group:
        attrs[n.MESSAGE_GROUP] = cap(group)
    if record_body_size and info.body_size is not None:
        attrs[n.BODY_SIZE] = info.body_size
    delivery_ms = info.delivery_ms
    attrs[n.MESSAGE_TYPE] = info.declared_type or message_type(None, group, delivery_ms)
    if delivery_ms:
        attrs[n.DELIVERY_TIMESTAMP] = delivery_ms
    if job_id:
        attrs[n.JOB_ID] = job_id
    if cost is not None:
        attrs[n.COST] = cost
    props = info.properties
    if props:
        order = job_order(props)
        if order is not None:
            attrs[n.JOB_ORDER] = order
    if worker is not None:
        attrs[n.WORKER] = worker
    for i, name in _STAMP_ATTRS:
        if times[i] != MISSING:
            attrs[name] = times[i]
    if body is not None:
        attrs[BODY_ATTR] = body_preview(body, capture_body)
    return attrs
