"""Exposure: what rmqtrace lets out of the process.

* ``/metrics`` listens on 127.0.0.1 unless ``RMQTRACE_METRICS_ADDR`` says otherwise.
* Message bodies never reach spans or metrics unless ``capture_body`` is set, and then only the
  first ``capture_body`` bytes, as valid text.
* The client's access key and secret never reach a log record or a span (checked against the
  real broker with every logger at DEBUG).
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request
import uuid
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.clients.producer import TracedProducer
from tracer.config import Settings, serve_metrics
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import BODY_ATTR, MessageTracer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def own_address() -> str | None:
    """This host's non-loopback IPv4 address (a UDP connect sends nothing), if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def test_settings_default_to_loopback():
    assert Settings().metrics_addr == "127.0.0.1"
    assert Settings.from_env({"RMQTRACE_METRICS_PORT": "9464"}).metrics_addr == "127.0.0.1"
    assert Settings.from_env({"RMQTRACE_METRICS_ADDR": "0.0.0.0"}).metrics_addr == "0.0.0.0"


@pytest.mark.parametrize("addr", [None, "0.0.0.0"])
def test_metrics_server_binds_loopback_unless_told_otherwise(addr):
    port = free_port()
    env = {"RMQTRACE_METRICS_PORT": str(port), **({"RMQTRACE_METRICS_ADDR": addr} if addr else {})}
    server: Any = serve_metrics(Settings.from_env(env), CollectorRegistry())
    try:
        assert server.server_address[0] == (addr or "127.0.0.1")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert resp.status == 200
        other = own_address()
        if other is not None:
            assert reachable(other, port) == (addr == "0.0.0.0"), other
    finally:
        server.shutdown()
        server.server_close()


MARKER = "BODY-" + uuid.uuid4().hex


def run_embedded(capture_body: int, bodies: list[bytes]) -> tuple[list[Any], CollectorRegistry]:
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    broker = EmbeddedBroker()
    producer = TracedProducer(Producer(broker, ["T"]), MessageTracer(tracer_provider=provider))
    producer.startup()
    for body in bodies:
        m = Message()
        m.topic, m.body = "T", body
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.05)
    consumer.startup()
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry),
                           capture_body=capture_body)
    loop = ConsumeLoop(consumer, lambda m: None, tracer=tracer, workers=2)
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    wait_until(lambda: loop.statistics().acked == len(bodies), what="all acked")
    loop.stop()
    t.join(10)
    return list(exporter.get_finished_spans()), registry


def everything_in(spans: list[Any]) -> str:
    """Every name, attribute, event and resource value of the spans, as one string."""
    parts = []
    for s in spans:
        parts.append(s.name)
        parts.extend(f"{k}={v}" for k, v in (s.attributes or {}).items())
        for e in s.events:
            parts.append(e.name)
            parts.extend(f"{k}={v}" for k, v in (e.attributes or {}).items())
        parts.extend(f"{k}={v}" for k, v in s.resource.attributes.items())
    return "\n".join(parts)


def test_bodies_are_never_recorded_by_default():
    spans, registry = run_embedded(0, [MARKER.encode(), b"\xff" + MARKER.encode()])
    assert len([s for s in spans if s.name == "process T"]) == 2
    assert MARKER not in everything_in(spans)
    assert not [s for s in spans if BODY_ATTR in (s.attributes or {})]
    assert MARKER not in generate_latest(registry).decode()
    # the size too is opt-in in the conventions (MessageTracer(record_body_size=True))
    assert not [s for s in spans if "messaging.message.body.size" in (s.attributes or {})]


def test_body_capture_is_opt_in_capped_and_always_valid_text():
    bodies = [MARKER.encode() * 10, b"\xff\xfe" + b"a" * 40, "é€€€€€€€€€€".encode(), b""]
    spans, _ = run_embedded(16, bodies)
    got = sorted(s.attributes[BODY_ATTR] for s in spans if s.name == "process T" and BODY_ATTR in s.attributes)
    want = sorted([MARKER[:16], "\ufffd\ufffd" + "a" * 14, "é€€€€\ufffd", ""])  # 2 + 4×3 = 14 bytes, then a cut €
    assert got == want
    assert MARKER not in everything_in([s for s in spans if s.name != "process T"])  # only on process spans


@pytest.mark.integration
def test_credentials_never_reach_logs_or_spans():
    from fault_programs.harness import client_config, create, ensure_broker, record_figures, start_producer, unique

    ensure_broker()
    from rocketmq import FilterExpression
    from rocketmq import Message as RealMessage
    from rocketmq import SimpleConsumer as RealSimpleConsumer

    ak, sk = f"AK{uuid.uuid4().hex}", f"SK{uuid.uuid4().hex}"
    topic, group = unique("rel-creds"), unique("rel-creds-g")
    create(topic, [group])
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(logging.DEBUG)
    loggers = [logging.getLogger(), logging.getLogger("rocketmq-python-client")]  # the client's does not propagate
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(keep)
        lg.setLevel(logging.DEBUG)
    producer = consumer = None
    try:
        cfg = client_config(ak, sk)
        producer = start_producer(topic, MessageTracer(tracer_provider=provider), config=cfg)
        for i in range(5):
            m = RealMessage()
            m.topic, m.body = topic, f"{i}".encode()
            producer.send(m)
        consumer = RealSimpleConsumer(cfg, group, {topic: FilterExpression()}, await_duration=1, tls_enable=False)
        consumer.startup()
        consumer._init_settings_event.wait(15)
        tracer = MessageTracer(consumer_group=group, tracer_provider=provider, metrics=TracerMetrics(CollectorRegistry()))
        loop = ConsumeLoop(consumer, lambda m: None, tracer=tracer, workers=2, invisible_duration=10)
        t = threading.Thread(target=loop.run, daemon=True)
        t.start()
        wait_until(lambda: loop.statistics().acked >= 5, timeout=60, what="5 messages acked")
        loop.stop()
        t.join(30)
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(keep)
            lg.setLevel(level)
        if consumer is not None:
            consumer.shutdown()
        if producer is not None:
            producer.shutdown()
    spans = list(exporter.get_finished_spans())
    assert len([s for s in spans if s.name == f"process {topic}"]) == 5
    text = everything_in(spans)
    assert sk not in text and ak not in text
    assert len(records) > 20  # the capture worked: the client logs at INFO and DEBUG
    logged = "\n".join(f"{r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in records)
    assert sk not in logged and ak not in logged
    record_figures("credentials", {"log_records_checked": len(records), "spans_checked": len(spans),
                                   "secret_or_access_key_found": False})
