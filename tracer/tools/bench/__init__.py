"""Benchmarks behind BENCHMARKS.md (``rmqtrace bench ...``).

Shared here: :class:`DropExporter`, the exporter that keeps a span processor's whole cost but
sends nothing, so a benchmark measures rmqtrace and the SDK, not a network; and what every
result records about the run (:func:`loadavg`, :func:`client_version`), since on a shared machine
a figure without its load is not a result.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["DropExporter", "client_version", "loadavg"]


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


def client_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"rocketmq-python-client {version('rocketmq-python-client')}"
    except PackageNotFoundError:
        return "rocketmq-python-client ?"
