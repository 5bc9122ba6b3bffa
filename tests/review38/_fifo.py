"""Shared rig: a ConsumeLoop on an embedded FIFO topic, recording every handler start."""
from __future__ import annotations

import threading
from typing import Any, Callable

from tracer import ConsumeLoop
from tracer.embedded import EmbeddedBroker, FilterExpression, Message, Producer, SimpleConsumer

TOPIC, GROUP = "fifo38", "g38"


def fifo_broker(groups: dict[str, int], queues: int | None = None) -> EmbeddedBroker:
    """A FIFO topic holding ``n`` messages per group, bodies ``b"<group><i>"`` in order."""
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic(TOPIC, fifo=True, queues=queues)
    p = Producer(broker, [TOPIC])
    p.startup()
    n_max = max(groups.values())
    for i in range(n_max):  # interleaved groups
        for g, n in groups.items():
            if i < n:
                m = Message()
                m.topic, m.message_group, m.body = TOPIC, g, f"{g}{i}".encode()
                p.send(m)
    return broker


def run_loop(broker: EmbeddedBroker, handler: Callable[[Any], object], until: Callable[[Any], bool],
             **kw: Any) -> tuple[Any, ConsumeLoop]:
    c = SimpleConsumer(broker, GROUP, {TOPIC: FilterExpression()}, await_duration=0.05)
    c.startup()
    kw.setdefault("key", lambda m: m.message_group)
    kw.setdefault("retry_backoff", lambda a: 1)
    kw.setdefault("invisible_duration", 5)
    loop = ConsumeLoop(c, handler, **kw)
    box: dict[str, Any] = {}

    def go() -> None:
        box["stats"] = loop.run(until=until)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():
        loop.stop(timeout=5)
        t.join(10)
        raise AssertionError(f"loop did not reach its goal in 60 s: {loop.statistics()}")
    c.shutdown()
    return box["stats"], loop
