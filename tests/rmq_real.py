"""Helpers for the tests against the real local RocketMQ (``services/rocketmq``): a plain module.

* :func:`ensure_broker` starts the shared broker if needed (``rmq.sh start`` is idempotent and
  never stopped by a test) or skips/fails through ``unavailable``.
* :func:`client` imports ``rocketmq-python-client`` without its import side effects reaching the
  real ``$HOME`` (it creates ``~/logs/rocketmq_python`` and a rotating log file at import).
* :func:`fresh_topic` / :func:`fresh_group`: one new topic and group per test (``rmq_admin``, a few
  ms each): a new group starts at the beginning of a topic's queues, so shared topics would hand
  other tests' messages to it.
* :func:`start_simple` waits for the proxy's answer to the Settings before the first receive.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
RMQ_DIR = REPO / "services" / "rocketmq"
RMQ_SH = RMQ_DIR / "rmq.sh"
ENDPOINT = os.environ.get("RMQ_ENDPOINT", "127.0.0.1:8081")
PORTS = (9876, 10911, 8081)  # name server, broker, proxy gRPC

if str(RMQ_DIR) not in sys.path:
    sys.path.insert(0, str(RMQ_DIR))
import rmq_admin  # noqa: E402  (stdlib only)

_lock = threading.Lock()
_ready: str | bool | None = None  # True, or why the broker cannot be had
_client: ModuleType | None = None


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def ensure_broker() -> None:
    """Make sure the local broker answers; ``unavailable(reason)`` (skip, or fail under
    ``RMQTRACE_REQUIRE_SERVICES=1``) when it cannot be started."""
    from conftest import RUNNING, unavailable

    # `-m "not integration"` (make test-py, make test-unit) must never start a broker: a test that
    # reaches the real one says so with the marker
    if RUNNING and RUNNING[-1].get_closest_marker("integration") is None:
        pytest.fail(f"{RUNNING[-1].nodeid} reaches the real broker but is not marked integration")
    global _ready
    with _lock:
        if _ready is None:
            _ready = _start()
    if _ready is not True:
        unavailable(str(_ready))


def _start() -> str | bool:
    if not all(_port_open(p) for p in PORTS):
        try:
            proc = subprocess.run(["bash", str(RMQ_SH), "start"], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"rmq.sh start failed: {exc}"
        if proc.returncode != 0:
            return f"rmq.sh start failed (rc={proc.returncode}): {(proc.stderr or proc.stdout).strip()[-600:]}"
    if not all(_port_open(p) for p in PORTS):
        return f"RocketMQ ports {PORTS} not all open after rmq.sh start"
    try:
        rmq_admin.create_topic(f"rmqtrace-probe-{uuid.uuid4().hex[:6]}", wait_route=10)
    except Exception as exc:  # noqa: BLE001 - any failure means: no usable broker
        return f"RocketMQ admin does not answer: {exc}"
    return True


def client() -> ModuleType:
    """``import rocketmq`` (5.x) with its log directory and file handler kept out of ``$HOME``."""
    global _client
    with _lock:
        if _client is None:
            _client = _import_client()
    return _client


def _import_client() -> ModuleType:
    from tracer.clients.quiet import import_quietly

    rocketmq = import_quietly()
    _patch_push_consumer_metrics()
    return rocketmq


def _patch_push_consumer_metrics() -> None:
    """rocketmq-clients #1191 (5.1.2): with the proxy's ``metricCollectorMode=off`` the push
    consumer's telemetry read loop dies on a None meter provider (consumption goes on). Register
    the process-queue gauges only when metrics are on (the verified workaround from the README)."""
    from rocketmq import PushConsumer
    from rocketmq.v5.consumer.consumer import Consumer

    if getattr(PushConsumer.reset_metric, "_rmqtrace_fix", False):
        return

    def reset_metric(self: Any, metric: Any) -> None:
        Consumer.reset_metric(self, metric)
        if metric.on:
            self._PushConsumer__register_process_queues_gauges()

    reset_metric._rmqtrace_fix = True  # type: ignore[attr-defined]
    PushConsumer.reset_metric = reset_metric


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def fresh_topic(prefix: str, *, fifo: bool = False, queues: int = 4, priority: bool = False) -> str:
    name = unique(prefix)
    rmq_admin.create_topic(name, fifo=fifo, queues=queues, priority=priority)
    return name


def fresh_group(prefix: str, *, fifo: bool = False) -> str:
    name = unique(prefix)
    rmq_admin.create_group(name, fifo=fifo)
    return name


def configuration() -> Any:
    rmq = client()
    return rmq.ClientConfiguration(ENDPOINT, rmq.Credentials())


def start_producer(topic: str) -> Any:
    rmq = client()
    producer = rmq.Producer(configuration(), (topic,))
    producer.startup()
    return producer


def start_simple(group: str, topic: str, await_duration: int = 1) -> Any:
    """A started SimpleConsumer whose Settings the proxy has acknowledged (``startup`` does not
    wait for that; a receive before it fails with ``50001 settings is null``)."""
    rmq = client()
    consumer = rmq.SimpleConsumer(configuration(), group, {topic: rmq.FilterExpression()},
                                  await_duration=await_duration)
    consumer.startup()
    if not consumer._init_settings_event.wait(15):
        consumer.shutdown()
        raise AssertionError(f"simple consumer {group}: no Settings from the proxy within 15 s")
    return consumer


def message(topic: str, body: str | bytes, *, group: str | None = None, tag: str | None = None,
            keys: str | None = None, **props: str) -> Any:
    m = client().Message()
    m.topic = topic
    m.body = body.encode() if isinstance(body, str) else body
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys
    if group:
        m.message_group = group
    for k, v in props.items():
        m.add_property(k, v)
    return m


def quietly(fn: Any, *args: Any) -> None:
    """Shut a client down; a failure here must not hide the test's own result."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001
        logging.getLogger(__name__).debug("shutdown failed", exc_info=True)
