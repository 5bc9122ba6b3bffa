"""Benchmarks behind BENCHMARKS.md (``rmqtrace bench ...``).

Shared here: :class:`DropExporter`, the exporter that keeps a span processor's whole cost but
sends nothing, so a benchmark measures rmqtrace and the SDK, not a network.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["DropExporter"]


class DropExporter(SpanExporter):
    """Accepts every batch and drops it."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass
