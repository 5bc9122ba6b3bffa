"""Consume test-case groups with rmqtrace's consume loop and dispatcher over a SimpleConsumer.

    RMQ_ENDPOINT=127.0.0.1:8081 RMQ_TOPIC=rmqtrace-test RMQ_GROUP=g1 POLICY=aggressive WORKERS=8 \\
    RMQTRACE_METRICS_PORT=9464 python examples/consumer_loop.py

Receives only as many messages as there are free workers, acks on success, renews leases of
long-running groups, stops cleanly on SIGTERM. POLICY=round_robin reproduces the incident.
"""

from __future__ import annotations

import json
import time

from _env import CASE_MS, EXPECT, GROUP, POLICY, TOPIC, WORKERS, client_configuration
from rocketmq import FilterExpression, SimpleConsumer

from tracer import ConsumeLoop, DispatchMetrics, MessageTracer, TracerMetrics, configure_tracing
from tracer.config import Settings, serve_metrics


def handle(message) -> None:  # type: ignore[no-untyped-def]
    cases = json.loads(message.body)["cases"]
    time.sleep(cases * CASE_MS / 1000)  # stands for running the group's test cases


def main() -> None:
    settings = Settings.from_env()
    metrics = TracerMetrics()
    configure_tracing(settings, metrics=metrics)  # spans lost on the way count in rmqtrace_spans_dropped_total
    serve_metrics(settings)
    consumer = SimpleConsumer(client_configuration(), GROUP, {TOPIC: FilterExpression()}, await_duration=5,
                              tls_enable=False)
    consumer.startup()  # the loop waits for the client's settings before its first receive
    loop = ConsumeLoop(consumer, handle, policy=POLICY, workers=WORKERS,
                       tracer=MessageTracer(consumer_group=GROUP, metrics=metrics),
                       dispatch_metrics=DispatchMetrics(), invisible_duration=30)
    loop.install_signal_handlers()
    try:
        stats = loop.run(until=(lambda s: s.acked >= EXPECT) if EXPECT else None)
    finally:
        consumer.shutdown()
    print(f"handled {stats.succeeded}, failed {stats.failed}, acked {stats.acked}, "
          f"leases renewed {stats.leases_extended}")


if __name__ == "__main__":
    main()
