"""Send and consume through the real broker with the LEGACY client (rocketmq-client-python 2.0.0),
traced by rmqtrace; print one JSON object with what happened. Run in the legacy venv
(services/rocketmq/legacy_venv.sh), driven by tests/test_legacy_real.py:

    .cache/legacy-venv/bin/python tests/legacy_programs/roundtrip.py wrappers|instrumentor

Environment: RMQ_NAMESRV (127.0.0.1:9876), RMQ_TOPIC (created by the caller), RMQ_GROUP, N (messages),
FAIL_SEQ (the message whose first delivery returns RECONSUME_LATER; -1: none), DEADLINE (seconds).

- ``wrappers``: ``TracedLegacyProducer(Producer)`` and ``subscribe(topic, traced_callback(cb, tracer))``.
- ``instrumentor``: plain 2.x code under ``RocketMQInstrumentor().instrument(...)``; afterwards
  ``uninstrument()`` and a check that every patched attribute is the original object again.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
import threading
import time

os.environ.setdefault("ROCKETMQ_CLIENT_LOG_DIR", tempfile.mkdtemp(prefix="rmq-cpplog-"))

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402
from rocketmq.client import ConsumeStatus, Message, Producer, PushConsumer  # noqa: E402
from rocketmq.ffi import dll  # noqa: E402

from tracer.clients.legacy import TracedLegacyProducer, traced_callback  # noqa: E402
from tracer.telemetry.metrics import TracerMetrics  # noqa: E402
from tracer.telemetry.tracer import MessageTracer  # noqa: E402

NAMESRV = os.environ.get("RMQ_NAMESRV", "127.0.0.1:9876")
TOPIC = os.environ["RMQ_TOPIC"]
GROUP = os.environ["RMQ_GROUP"]
N = int(os.environ.get("N", "10"))
FAIL_SEQ = int(os.environ.get("FAIL_SEQ", "-1"))
DEADLINE = float(os.environ.get("DEADLINE", "60"))


def avoid_shutdown_crash(consumer: PushConsumer) -> None:
    """librocketmq.so 2.1.0 segfaults in PushConsumer.shutdown() unless message trace is on
    (services/rocketmq/README.md): turn it on before start()."""
    f = dll["SetPushConsumerMessageTrace"]
    f.argtypes = [ctypes.c_void_p, ctypes.c_int]
    f.restype = ctypes.c_int
    if f(consumer._handle, 0) != 0:
        raise RuntimeError("SetPushConsumerMessageTrace failed")


def span_json(s):  # type: ignore[no-untyped-def]
    return {
        "name": s.name,
        "kind": s.kind.name,
        "trace_id": f"{s.context.trace_id:032x}",
        "span_id": f"{s.context.span_id:016x}",
        "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
        "start": s.start_time,
        "end": s.end_time,
        "status": s.status.status_code.name,
        "attributes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in (s.attributes or {}).items()},
    }


def main(mode: str) -> int:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    result: dict = {"mode": mode, "topic": TOPIC, "group": GROUP}

    instrumentor = None
    originals = {}
    if mode == "instrumentor":
        from tracer.clients.instrumentor import RocketMQInstrumentor

        names = [(Producer, "send_sync"), (Producer, "send_orderly_with_sharding_key"), (Producer, "send_oneway"),
                 (Producer, "set_name_server_address"), (PushConsumer, "__init__"), (PushConsumer, "subscribe")]
        originals = {(c.__name__, n): c.__dict__[n] for c, n in names}
        instrumentor = RocketMQInstrumentor()
        instrumentor.instrument(tracer_provider=provider, registry=registry)
        result["patched"] = all(c.__dict__[n] is not originals[(c.__name__, n)] for c, n in names)
        tracer = None
    else:
        tracer = MessageTracer(consumer_group=GROUP, tracer_provider=provider, metrics=TracerMetrics(registry))

    handled: list[dict] = []
    probes = threading.Event()
    lock = threading.Lock()
    done = threading.Event()
    refused: set[str] = set()

    deliveries = [0]  # every callback, probes included: what the histograms count

    def on_message(msg):  # type: ignore[no-untyped-def]
        with lock:
            deliveries[0] += 1
        kind = msg.get_property("kind")
        if kind == b"probe":
            probes.set()
            return ConsumeStatus.CONSUME_SUCCESS
        if kind != b"real":
            return ConsumeStatus.CONSUME_SUCCESS
        seq = int(msg.get_property("seq"))
        with lock:
            handled.append({"seq": seq, "id": msg.id, "reconsume_times": msg.reconsume_times,
                            "store_timestamp": msg.store_timestamp, "thread": threading.current_thread().name})
            if seq == FAIL_SEQ and str(seq) not in refused:
                refused.add(str(seq))
                return ConsumeStatus.RECONSUME_LATER
            firsts = {h["seq"] for h in handled}
            if len(firsts) >= N and (FAIL_SEQ < 0 or any(h["seq"] == FAIL_SEQ and h["reconsume_times"] >= 1
                                                         for h in handled)):
                done.set()
        time.sleep(0.002)  # real-time: stands for the handler's work
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(GROUP)
    consumer.set_name_server_address(NAMESRV)
    consumer.set_thread_count(2)
    avoid_shutdown_crash(consumer)
    consumer.subscribe(TOPIC, on_message if tracer is None else traced_callback(on_message, tracer))
    consumer.start()

    raw = Producer(f"{GROUP}-p")
    raw.set_name_server_address(NAMESRV)
    raw.start()
    producer = raw if tracer is None else TracedLegacyProducer(raw, MessageTracer(tracer_provider=provider))

    # A new group may start at the queues' end: wait until the consumer gets what is sent now.
    end = time.monotonic() + DEADLINE
    while not probes.is_set() and time.monotonic() < end:
        m = Message(TOPIC)
        m.set_body("probe")
        m.set_property("kind", "probe")
        raw.send_sync(m)
        probes.wait(0.5)
    result["consumer_ready"] = probes.is_set()

    sent = []
    for i in range(N):
        m = Message(TOPIC)
        m.set_keys(f"key-{i}")
        m.set_tags("legacy")
        m.set_body(f"body-{i}")
        m.set_property("kind", "real")
        m.set_property("seq", str(i))
        if tracer is None:
            r = producer.send_sync(m)
        else:
            r = producer.send_sync(m, job_id="legacy-job", cost=i + 1)
        sent.append({"seq": i, "msg_id": r.msg_id, "status": r.status.name})
    result["sent"] = sent
    result["done"] = done.wait(max(1.0, end - time.monotonic()))
    consumer.shutdown()
    raw.shutdown()

    if instrumentor is not None:
        instrumentor.uninstrument()
        result["restored"] = all(c.__dict__[n] is originals[(c.__name__, n)]
                                 for c, n in [(Producer, "send_sync"), (Producer, "send_orderly_with_sharding_key"),
                                              (Producer, "send_oneway"), (Producer, "set_name_server_address"),
                                              (PushConsumer, "__init__"), (PushConsumer, "subscribe")])
        # after uninstrument a send writes no properties and makes no span
        before = len(exporter.get_finished_spans())
        p2 = Producer(f"{GROUP}-p2")
        p2.set_name_server_address(NAMESRV)
        p2.start()
        m = Message(TOPIC)
        m.set_body("after")
        m.set_property("kind", "after")
        p2.send_sync(m)
        p2.shutdown()
        result["spans_after_uninstrument"] = len(exporter.get_finished_spans()) - before

    result["handled"] = handled
    result["deliveries"] = deliveries[0]
    spans = exporter.get_finished_spans()
    # only the traces of the test's own messages (tag "legacy"), not the readiness probes
    mine = {s.context.trace_id for s in spans if (s.attributes or {}).get("messaging.rocketmq.message.tag") == "legacy"}
    result["spans"] = [span_json(s) for s in spans if s.context.trace_id in mine]
    result["stage_counts"] = {
        stage: registry.get_sample_value("rmqtrace_stage_duration_seconds_count",
                                         {"stage": stage, "topic": TOPIC, "consumer_group": GROUP})
        for stage in ("send", "broker_wait", "client_buffer", "dispatch_wait", "handler", "end_to_end")
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "wrappers"))
