"""YOUR handler, traced end to end on the embedded broker (no Java, no network): copy and adapt.

    python examples/my_handler.py

The wiring is the production one — TracedProducer → broker → ConsumeLoop (dispatcher) → your
handler — with the embedded broker in place of a real one. For the real broker, swap the
``tracer.embedded`` import for ``rocketmq`` and build the clients from a
``ClientConfiguration`` (the README's "Using it"); nothing else changes.
"""

from __future__ import annotations

import json
import time

from prometheus_client import CollectorRegistry

from tracer import ConsumeLoop, DispatchMetrics, MessageTracer, TracedProducer, TracerMetrics
from tracer.embedded import EmbeddedBroker, FilterExpression, Message, Producer, SimpleConsumer

TOPIC, GROUP, MESSAGES = "orders", "order-workers", 40


def handle(message) -> None:  # type: ignore[no-untyped-def]
    """Your code: one message in; return to ack it, raise to have it delivered again."""
    order = json.loads(message.body)
    time.sleep(order["items"] / 1000)  # stands for the real work


def main() -> None:
    broker = EmbeddedBroker()
    registry = CollectorRegistry()  # in production: the default one, served by serve_metrics()
    producer = TracedProducer(Producer(broker, [TOPIC]), MessageTracer())
    producer.startup()
    for i in range(MESSAGES):
        msg = Message()
        msg.topic = TOPIC
        msg.keys = f"order-{i}"
        msg.body = json.dumps({"items": 1 + i % 7 * 5}).encode()
        producer.send(msg, job_id="batch-1", cost=1 + i % 7 * 5)

    consumer = SimpleConsumer(broker, GROUP, {TOPIC: FilterExpression()}, await_duration=0.1)
    consumer.startup()
    loop = ConsumeLoop(consumer, handle, policy="aggressive", workers=4,
                       tracer=MessageTracer(consumer_group=GROUP, metrics=TracerMetrics(registry)),
                       dispatch_metrics=DispatchMetrics(registry))
    stats = loop.run(until=lambda s: s.acked >= MESSAGES)  # without until=: until loop.stop() / SIGTERM
    consumer.shutdown()
    producer.shutdown()

    print(f"handled {stats.succeeded}, failed {stats.failed}, acked {stats.acked}")
    # The parts add up: end_to_end = send + broker_wait + consumer_wait (waiting inside the consumer:
    # client_buffer + dispatch_wait) + handler. Here broker_wait is large: every message was sent
    # before the consumer started, so they waited in the broker (where any consumer can take them).
    for gap in ("send", "broker_wait", "consumer_wait", "handler", "end_to_end"):
        labels = {"stage": gap, "topic": TOPIC, "consumer_group": GROUP}
        n = registry.get_sample_value("rmqtrace_stage_duration_seconds_count", labels) or 0
        total = registry.get_sample_value("rmqtrace_stage_duration_seconds_sum", labels) or 0.0
        print(f"{gap:>14}: {n:.0f} messages, mean {total / n * 1000 if n else 0:.1f} ms")


if __name__ == "__main__":
    main()
