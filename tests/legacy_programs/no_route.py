"""The real 2.x client (rocketmq-client-python 2.0.0) sending with no name server at its address,
traced by rmqtrace: print one JSON line per seam with what was raised. Run in the legacy venv,
driven by tests/test_legacy_real.py:

    .cache/legacy-venv/bin/python tests/legacy_programs/no_route.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

os.environ.setdefault("ROCKETMQ_CLIENT_LOG_DIR", tempfile.mkdtemp(prefix="rmq-cpplog-"))

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402
from rocketmq.client import Message, Producer  # noqa: E402

from tracer.clients.legacy import TracedLegacyProducer  # noqa: E402
from tracer.telemetry.tracer import MessageTracer  # noqa: E402

NOBODY = "127.0.0.1:1"  # nothing listens on port 1


def attempt(seam: str, producer: object) -> dict[str, object]:
    msg = Message("jobs")
    msg.set_body("x")
    try:
        producer.send_sync(msg)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - what was raised is the result
        return {"seam": seam, "type": type(exc).__name__, "problem": str(getattr(exc, "problem", None)),
                "message": str(exc), "client_error": str(getattr(exc, "client_error", ""))}
    return {"seam": seam, "type": None}


def main() -> int:
    raw = Producer("rmqtrace-no-route-w")
    traced = TracedLegacyProducer(raw, MessageTracer(tracer_provider=TracerProvider()))
    traced.set_name_server_address(NOBODY)
    traced.start()
    print(json.dumps(attempt("TracedLegacyProducer", traced)))
    raw.shutdown()

    from tracer.clients.instrumentor import RocketMQInstrumentor

    inst = RocketMQInstrumentor()
    inst.instrument(tracer_provider=TracerProvider(), registry=CollectorRegistry())
    try:
        plain = Producer("rmqtrace-no-route-i")
        plain.set_name_server_address(NOBODY)
        plain.start()
        print(json.dumps(attempt("instrumentor", plain)))
        plain.shutdown()
    finally:
        inst.uninstrument()
    return 0


if __name__ == "__main__":
    sys.exit(main())
