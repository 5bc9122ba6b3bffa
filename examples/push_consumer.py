"""A plain PushConsumer with no rmqtrace code: run it under ``opentelemetry-instrument`` and the
RocketMQInstrumentor wraps its listener, so the wait in the client's thread pool becomes the
measured dispatch_wait.

    OTEL_SERVICE_NAME=push-example OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 \\
    RMQTRACE_METRICS_PORT=9464 opentelemetry-instrument python examples/push_consumer.py
"""

from __future__ import annotations

import json
import signal
import threading
import time

from _env import CASE_MS, EXPECT, GROUP, TOPIC, WORKERS, client_configuration
from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

done = threading.Event()
handled = 0
lock = threading.Lock()


class TestCaseGroupListener(MessageListener):
    def consume(self, message):  # type: ignore[no-untyped-def]
        global handled
        time.sleep(json.loads(message.body)["cases"] * CASE_MS / 1000)
        with lock:
            handled += 1
            if EXPECT and handled >= EXPECT:
                done.set()
        return ConsumeResult.SUCCESS


def main() -> None:
    consumer = PushConsumer(client_configuration(), GROUP, TestCaseGroupListener(), {TOPIC: FilterExpression()},
                            consumption_thread_count=WORKERS)
    consumer.startup()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    finally:
        consumer.shutdown()
    print(f"handled {handled}")


if __name__ == "__main__":
    main()
