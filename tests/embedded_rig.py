"""One topic ``T`` on an embedded broker driven by a manual clock, with messages already sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer


def consumer_with_messages(clock: Callable[[], float], *, await_duration: float = 0.0, wall: bool = False,
                           bodies: tuple[bytes, ...] = (b"x",)) -> tuple[EmbeddedBroker, SimpleConsumer]:
    """A started consumer of group ``G`` on ``T``, which holds ``bodies``. ``wall``: the broker's
    pop times (in its receipt handles) read the same clock, so a lease's start moves with it."""
    extra: dict[str, Any] = {"wall_ms": lambda: int(clock() * 1000)} if wall else {}
    broker = EmbeddedBroker(min_receive_invisible=1, monotonic=clock, **extra)
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    for body in bodies:
        m = Message()
        m.topic, m.body = "T", body
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=await_duration)
    consumer.startup()
    return broker, consumer
