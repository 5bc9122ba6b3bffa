"""The telemetry the conformance checks read: a demo run and the traced 5.x wrapper path.

Shared by tests/test_semconv_conformance.py (in-repo registry, in-memory exporters) and
tests/semconv/weaver_live_check.py (weaver's live check over OTLP), so both judge the same spans and
metrics: the demo (both dispatch policies, the blame links) and, on the embedded broker, send,
receive, process with a success, a nack and a failure whose exception is an event on the ``handler``
span, and the settle spans of the ack and the nack: through the wrappers, and through a
``ConsumeLoop`` on a FIFO topic (its failure retried by the loop's own nack) with the client facts
a 5.x client gives, and a delay send.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

__all__ = ["consume_loop", "demo", "wrappers"]


def demo(provider: Any) -> None:
    from tracer.tools.demo import DemoOptions, run_demo

    run_demo(DemoOptions(groups=30, workers=3, case_ms=0.5, policies=("round_robin", "aggressive"), seed=3),
             tracer_provider=provider, registry=CollectorRegistry())


def wrappers(provider: Any) -> None:
    from tracer.clients.official import TracedSimpleConsumer
    from tracer.clients.producer import TracedProducer
    from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
    from tracer.telemetry.tracer import MessageTracer

    broker = EmbeddedBroker()
    producer = TracedProducer(Producer(broker, ["T"]), MessageTracer(tracer_provider=provider))
    producer.startup()
    for body in (b"ok", b"nack", b"boom"):
        m = Message()
        m.topic, m.body = "T", body
        m.keys = "k1", "k2"
        producer.send(m)
    raw = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    raw.startup()
    consumer = TracedSimpleConsumer(raw, MessageTracer(consumer_group="G", tracer_provider=provider),
                                    settle_spans=True)
    for msg in consumer.receive(3, 30):
        if msg.body == b"ok":
            with consumer.processing(msg):
                pass
            consumer.ack(msg)
        elif msg.body == b"nack":
            consumer.change_invisible_duration(msg, 10)
        else:
            with pytest.raises(ValueError), consumer.processing(msg):
                raise ValueError("a user's bug")


def consume_loop(provider: Any) -> None:
    """A FIFO topic (message group, tag) through a ``ConsumeLoop``, with the client facts a 5.x client
    gives (``messaging.client.id``, the namespace, ``server.address``/``.port``), the opt-in body size,
    and a delay send."""
    from tracer.clients.consume import ConsumeLoop
    from tracer.clients.producer import TracedProducer
    from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
    from tracer.path.message import ClientFacts
    from tracer.telemetry.tracer import MessageTracer

    def facts(client_id: str) -> ClientFacts:
        return ClientFacts(client_id=client_id, namespace="", server_address="127.0.0.1", server_port=8081)

    broker = EmbeddedBroker()
    broker.create_topic("L", fifo=True)
    producer = TracedProducer(Producer(broker, ["L", "D"]),
                              MessageTracer(tracer_provider=provider, client=facts("producer-1"),
                                            record_body_size=True))
    producer.startup()
    for body in (b"ok", b"boom"):
        m = Message()
        m.topic, m.body, m.tag, m.message_group = "L", body, "t1", "g1"
        producer.send(m)
    delayed = Message()
    delayed.topic, delayed.body = "D", b"later"
    delayed.delivery_timestamp = int(time.time() * 1000) + 60_000  # type: ignore[attr-defined]  # as a 5.x message has
    producer.send(delayed)
    consumer = SimpleConsumer(broker, "GL", {"L": None}, await_duration=0)
    consumer.startup()

    def handler(msg: Any) -> None:
        if msg.body == b"boom":
            raise ValueError("a user's bug")

    tracer = MessageTracer(consumer_group="GL", tracer_provider=provider, client=facts("consumer-1"),
                           record_body_size=True)
    loop = ConsumeLoop(consumer, handler, tracer=tracer, settle_spans=True, workers=2, invisible_duration=30)
    loop.run(until=lambda s: s.acked + s.retry_scheduled >= 2)
