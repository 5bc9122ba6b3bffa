"""Send one job with the LEGACY client's ``TracedLegacyProducer.send_job``, longest first, with
priorities for a PRIORITY topic; print one JSON object. Run in the legacy venv, driven by
tests/test_priority_jobs.py:

    .cache/legacy-venv/bin/python tests/legacy_programs/send_job.py

Environment: RMQ_NAMESRV (127.0.0.1:9876), RMQ_TOPIC (a PRIORITY topic, created by the caller),
COSTS (comma-separated seconds, one message each, keyed by its index), LEVELS (the topic's queues).
"""

from __future__ import annotations

import json
import os
import tempfile

os.environ.setdefault("ROCKETMQ_CLIENT_LOG_DIR", tempfile.mkdtemp(prefix="rmq-cpplog-"))

from rocketmq.client import Message, Producer  # noqa: E402

from tracer.clients.legacy import TracedLegacyProducer  # noqa: E402
from tracer.telemetry.tracer import MessageTracer  # noqa: E402

topic = os.environ["RMQ_TOPIC"]
costs = [float(c) for c in os.environ["COSTS"].split(",")]
producer = Producer(f"rmqtrace-legacy-job-{os.getpid()}")
traced = TracedLegacyProducer(producer, MessageTracer())
traced.set_name_server_address(os.environ.get("RMQ_NAMESRV", "127.0.0.1:9876"))
producer.start()
try:
    messages = []
    for i in range(len(costs)):
        m = Message(topic)
        m.set_keys(str(i))
        m.set_body(str(i))
        messages.append(m)
    receipts = traced.send_job(messages, cost=lambda m: costs[messages.index(m)], job_id="legacy-job",
                               priority_levels=int(os.environ["LEVELS"]))
    print(json.dumps({"sent": len(receipts)}))
finally:
    producer.shutdown()
