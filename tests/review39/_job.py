"""Shared rig: an embedded broker with a PRIORITY topic ``jobs`` (8 queues) and a normal topic
``plain``, a started TracedProducer on both, and jobs of embedded messages keyed ``k0``, ``k1`` …"""
from __future__ import annotations

from tracer import MessageTracer, TracedProducer
from tracer.embedded import EmbeddedBroker, Message, Producer

PRIORITY_TOPIC, PLAIN_TOPIC = "jobs", "plain"


def rig(**broker_kw: object) -> tuple[EmbeddedBroker, TracedProducer]:
    broker = EmbeddedBroker(**broker_kw)  # type: ignore[arg-type]
    broker.create_topic(PRIORITY_TOPIC, priority=True, queues=8)
    broker.create_topic(PLAIN_TOPIC)
    producer = TracedProducer(Producer(broker, [PRIORITY_TOPIC, PLAIN_TOPIC]), MessageTracer())
    producer.startup()
    return broker, producer


def job(n: int, topic: str = PRIORITY_TOPIC) -> list[Message]:
    out = []
    for i in range(n):
        m = Message()
        m.topic, m.keys, m.body = topic, f"k{i}", f"{i}".encode()
        out.append(m)
    return out
