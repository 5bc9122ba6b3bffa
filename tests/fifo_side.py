"""A FIFO topic and consumer group on the real proxy or the embedded broker, behind the 5.x
client's surface: what ``tests/test_broker_rules_real.py`` and ``tests/test_fifo_loop.py`` ask both."""

from __future__ import annotations

import time
from typing import Any

import pytest
from manual_clock import Clock

from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer

__all__ = ["KINDS", "FifoSide"]

KINDS = ["embedded", pytest.param("real", marks=pytest.mark.integration)]


class FifoSide:
    """A FIFO topic and group on either broker. ``queues=1`` puts every message group in one
    queue on both, so both must give the very same answers; with more queues only each queue's
    run is the same (the proxy starts a receive at a random queue, and the 5.x client's hash
    decides which groups share one)."""

    def __init__(self, kind: str, queues: int | None = None, manual_clock: bool = True) -> None:
        self.kind = kind
        self.clock: Clock | None = None
        if kind == "embedded":
            # a manual clock unless a consume loop runs on real time over it
            self.clock = Clock() if manual_clock else None
            clock = self.clock
            # the handles' wall-clock pop times move with the manual clock too
            wall_ms = (lambda: int(clock() * 1000) + 1_700_000_000_000) if clock else (lambda: time.time_ns() // 1_000_000)
            broker = EmbeddedBroker(monotonic=clock or time.monotonic, wall_ms=wall_ms, min_receive_invisible=1)
            broker.create_topic("F", fifo=True, queues=queues)
            self.producer: Any = Producer(broker, ["F"])
            self.producer.startup()
            # on real time a long poll of 1 s, as the proxy's: a loop's empty receives do not spin
            self.consumer: Any = SimpleConsumer(broker, "GF", {"F": None}, await_duration=0 if self.clock else 1)
            self.consumer.startup()

            def make(body: str, group: str) -> Any:
                m = Message()
                m.topic, m.body, m.message_group = "F", body.encode(), group
                return m
        else:
            import rmq_real

            rmq_real.ensure_broker()
            topic = rmq_real.fresh_topic("rules-fifo", fifo=True, queues=queues or 4)
            self.producer = rmq_real.start_producer(topic)
            self.consumer = rmq_real.start_simple(rmq_real.fresh_group("rules-fifo", fifo=True), topic, await_duration=1)
            self.closing = [self.consumer.shutdown, self.producer.shutdown]
            self.quietly = rmq_real.quietly

            def make(body: str, group: str) -> Any:
                return rmq_real.message(topic, body, group=group)
        self.make = make

    def send(self, *bodies: str) -> None:
        """Each body's first letter is its message group: ``send("a0", "b0", "a1")``."""
        for body in bodies:
            self.producer.send(self.make(body, body[0]))

    def receive(self, n: int, invisible: int = 10) -> list[Any]:
        """The first answer that is not empty (the proxy may answer [] while a send settles)."""
        end = time.monotonic() + 30
        while True:
            got = self.consumer.receive(n, invisible)
            if got:
                return list(got)
            assert time.monotonic() < end, "nothing received within 30 s"

    def nothing(self) -> bool:
        """One receive (a long poll of 1 s on the proxy) answers nothing."""
        return list(self.consumer.receive(8, 10)) == []

    def pass_time(self, seconds: float) -> None:
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            time.sleep(seconds)  # real-time: the proxy decides expiry on its own clock

    def close(self) -> None:
        for fn in getattr(self, "closing", []):
            self.quietly(fn)
