"""One topic ``T`` on an embedded broker (driven by a manual clock, or on real time), with messages
already sent."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer


def consumer_with_messages(clock: Callable[[], float] | None = None, *, await_duration: float = 0.0,
                           wall: bool = False, bodies: tuple[bytes, ...] = (b"x",),
                           properties: Mapping[str, str] | None = None) -> tuple[EmbeddedBroker, SimpleConsumer]:
    """A started consumer of group ``G`` on ``T``, which holds ``bodies`` (each with ``properties``).
    ``clock``: the broker's monotonic clock (None: real time); ``wall``: its pop times (in its
    receipt handles) read the same clock, so a lease's start moves with it."""
    extra: dict[str, Any] = {}
    if clock is not None:
        extra["monotonic"] = clock
        if wall:
            extra["wall_ms"] = lambda: int(clock() * 1000)
    broker = EmbeddedBroker(min_receive_invisible=1, **extra)
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    for body in bodies:
        m = Message()
        m.topic, m.body = "T", body
        for name, value in (properties or {}).items():
            m.add_property(name, value)
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=await_duration)
    consumer.startup()
    return broker, consumer
