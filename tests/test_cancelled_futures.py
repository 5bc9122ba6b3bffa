"""A cancelled client future still ends its operation: span ended ERROR (``error.type``
``CancelledError``) and one duration point.

``Future.exception()`` raises on a cancelled future, so a done-callback that calls it died before
ending the span (review #31, finding 12: ``asyncio.wait_for(asyncio.wrap_future(f), t)`` cancels
on timeout). Every seam that ends an operation from a done-callback is a case here; the last test
finds them in the source, so a new one cannot be added without its case.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any

import pytest
from conftest import REPO
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tracer.clients.official import TracedSimpleConsumer
from tracer.clients.producer import TracedProducer
from tracer.embedded import Message
from tracer.telemetry.otel_metrics import MessagingMeters
from tracer.telemetry.tracer import MessageTracer


class _Pending:
    """A client whose ``*_async`` calls return a future nobody resolves (the 5.x client's shape)."""

    def __init__(self) -> None:
        self.futures: list[Future[Any]] = []

    def _future(self) -> Future[Any]:
        f: Future[Any] = Future()
        self.futures.append(f)
        return f

    def send_async(self, message: Any) -> Future[Any]:
        return self._future()

    def receive_async(self, n: int, invisible: Any) -> Future[Any]:
        return self._future()


def _send_async(tracer: MessageTracer, client: _Pending) -> Future[Any]:
    m = Message()
    m.topic, m.body = "T", b"x"
    return TracedProducer(client, tracer).send_async(m)


def _receive_async(tracer: MessageTracer, client: _Pending) -> Future[Any]:
    return TracedSimpleConsumer(client, tracer).receive_async(8, 30)


# (seam, the module whose done-callback ends it, span name prefix, operation name)
SEAMS: dict[str, tuple[Callable[[MessageTracer, _Pending], Future[Any]], str, str, str]] = {
    "TracedProducer.send_async": (_send_async, "tracer/clients/producer.py", "send", "send"),
    "TracedSimpleConsumer.receive_async": (_receive_async, "tracer/telemetry/operations.py", "receive", "receive"),
}


@pytest.mark.parametrize("seam", sorted(SEAMS))
def test_a_cancelled_future_ends_its_span_as_an_error_and_is_measured(seam: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider)
    tracer.meters = MessagingMeters(MeterProvider(metric_readers=[reader]))
    client = _Pending()
    call, _, prefix, operation = SEAMS[seam]
    returned = call(tracer, client)
    (inner,) = client.futures
    assert inner.cancel()  # the caller's wait_for gave up (for send_async, returned is inner)
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["error.type"] == "CancelledError"
    data = reader.get_metrics_data()
    assert data is not None
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              for p in m.data.data_points if p.attributes.get("messaging.operation.name") == operation
              and m.name in ("messaging.client.operation.duration",)]
    assert [p.attributes.get("error.type") for p in points] == ["CancelledError"]
    assert returned.cancelled() and pytest.raises(CancelledError, returned.result, 0)


def _done_callback_modules() -> set[str]:
    """Library modules (not tools/) that end something from a future's done-callback."""
    found = set()
    for path in sorted((REPO / "tracer").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("tracer/tools/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "add_done_callback":
                found.add(rel)
    return found


def test_every_done_callback_seam_has_a_case() -> None:
    assert _done_callback_modules() == {module for _, module, _, _ in SEAMS.values()}
