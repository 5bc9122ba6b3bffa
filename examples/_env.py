"""Settings shared by the examples, all from environment variables."""

from __future__ import annotations

import os

ENDPOINT = os.environ.get("RMQ_ENDPOINT", "127.0.0.1:8081")  # the proxy's gRPC port
TOPIC = os.environ.get("RMQ_TOPIC", "rmqtrace-test")
GROUP = os.environ.get("RMQ_GROUP", "rmqtrace-example")
GROUPS = int(os.environ.get("JOB_GROUPS", "200"))  # test-case groups in the job
JOB_ID = os.environ.get("JOB_ID", "example-job")
WORKERS = int(os.environ.get("WORKERS", "8"))
POLICY = os.environ.get("POLICY", "aggressive")
CASE_MS = float(os.environ.get("CASE_MS", "5"))  # how long one test case takes
EXPECT = int(os.environ.get("EXPECT", "0"))  # stop after this many handled messages (0: run until SIGTERM)


def client_configuration():  # type: ignore[no-untyped-def]
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(ENDPOINT, Credentials())
