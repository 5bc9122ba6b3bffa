"""Send one job of test-case groups (long-tailed sizes) with rmqtrace stamps and trace context.

    RMQ_ENDPOINT=127.0.0.1:8081 RMQ_TOPIC=rmqtrace-test JOB_GROUPS=200 python examples/producer.py
"""

from __future__ import annotations

import json

from _env import GROUPS, JOB_ID, TOPIC, client_configuration
from rocketmq import Message, Producer

from tracer import MessageTracer, TracedProducer, configure_tracing
from tracer.config import Settings
from tracer.tools.workload import make_job


def main() -> None:
    configure_tracing(Settings.from_env())
    producer = TracedProducer(Producer(client_configuration(), (TOPIC,), tls_enable=False), MessageTracer())
    producer.startup()
    try:
        # The producer knows every group's size up front: sending longest first costs nothing
        # and lets a fleet of demand-driven consumers approach the lower bound. Without a size,
        # cost=load_costs("costs.json") reads what `rmqtrace report --costs` learned last run.
        messages = []
        for item in make_job(GROUPS):
            msg = Message()
            msg.topic = TOPIC
            msg.body = json.dumps({"group": item.group_id, "cases": item.cases}).encode()
            msg.keys = item.group_id
            messages.append(msg)
        producer.send_job(messages, cost=lambda m: float(json.loads(m.body)["cases"]), job_id=JOB_ID)
        print(f"sent {GROUPS} test-case groups of job {JOB_ID} to {TOPIC}")
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main()
