"""Benchmarks behind BENCHMARKS.md (``rmqtrace bench ...``).

Shared here: :class:`DropExporter`, the exporter that keeps a span processor's whole cost but
sends nothing, so a benchmark measures rmqtrace and the SDK, not a network; and what every
result records about the run (:func:`loadavg`, :func:`client_version`), since on a shared machine
a figure without its load is not a result; :func:`rmq_admin`, the checkout's topic/group tool;
and :func:`contrib_process`, the fair baseline of a consumer trace: what a contrib-style
instrumentation does per message (the W3C context extracted, one ``process`` span current while the
handler runs), used by the overhead and the broker benches alike.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, Tracer

__all__ = ["DropExporter", "client_version", "contrib_process", "fleet_context", "loadavg", "rmq_admin"]


class DropExporter(SpanExporter):
    """Accepts every batch and drops it."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def loadavg() -> list[float]:
    """1, 5 and 15 minute load averages (empty where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def fleet_context(load_before: list[float]) -> dict[str, Any]:
    """What a real-broker fleet bench's ``--json`` says of where it ran: the load before and after,
    the client, Python and the machine (one shape for ``bench fleet`` and ``bench fleet --orders``)."""
    return {
        "loadavg": {"before": load_before, "after": loadavg()},
        "client": client_version(), "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
    }


def client_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"rocketmq-python-client {version('rocketmq-python-client')}"
    except PackageNotFoundError:
        return "rocketmq-python-client ?"


def rmq_admin(bench: str) -> Any:
    """``services/rocketmq/rmq_admin.py`` of this checkout (topics and groups over the remoting port)."""
    path = Path(__file__).resolve().parents[3] / "services" / "rocketmq" / "rmq_admin.py"
    if not path.exists():
        raise RuntimeError(f"the {bench} bench needs the local RocketMQ of an rmqtrace checkout (services/"
                           "rocketmq, not in an installed package): run it there after `make services-up`")
    spec = importlib.util.spec_from_file_location("rmq_admin", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def contrib_process(tracer: Tracer, parent: Context, topic: str, group: str,
                    message_id: str) -> AbstractContextManager[Span]:
    """The ``process`` span a contrib-style instrumentation starts for one message (as
    opentelemetry-python-contrib's aio-pika one does): under the extracted context ``parent``,
    kind ``CONSUMER``, the messaging attributes it knows at the start, current while the handler
    runs (``with contrib_process(...):``)."""
    return tracer.start_as_current_span(
        f"process {topic}", context=parent, kind=SpanKind.CONSUMER,
        attributes={"messaging.system": "rocketmq", "messaging.operation.type": "process",
                    "messaging.operation.name": "process", "messaging.destination.name": topic,
                    "messaging.consumer.group.name": group, "messaging.message.id": message_id})
