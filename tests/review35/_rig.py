"""Shared rig for the export-child review scripts: child-side exporters and a provider."""
from __future__ import annotations

import os
import time
from typing import Any, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the rig importable in the export child."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE, ROOT, env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


class Recording(SpanExporter):
    """In the child: appends the OTLP encoding of every span it exports to a file (one line, hex)."""

    def __init__(self, path: str, delay_s: float = 0.0) -> None:
        self.path, self.delay_s = path, delay_s

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        if self.delay_s:
            time.sleep(self.delay_s)  # real-time: a slow backend: spans stay unacknowledged a while (a slow backend: spans stay unacknowledged a while)
        with open(self.path, "a") as f:
            for span in spans:
                f.write(encode_spans([span]).SerializeToString(deterministic=True).hex() + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def recording(path: str, delay_s: float = 0.0) -> list[SpanExporter]:
    return [Recording(path, delay_s)]


def encoded(span: ReadableSpan) -> str:
    """What the in-process OTLP exporter would send for ``span``."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    return encode_spans([span]).SerializeToString(deterministic=True).hex()


def provider(processor: Any, **kw: Any) -> TracerProvider:
    p = TracerProvider(**kw)
    p.add_span_processor(processor)
    return p


def total(st: Any) -> int:
    """Where every accepted span is: the module doc's states plus the ones still on their way."""
    return st.exported + st.failed + st.lost + st.queued + st.unacknowledged


class _Null(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def null() -> list[SpanExporter]:
    """In the child: exports nothing, at once (a measure of the parent's side only)."""
    return [_Null()]
