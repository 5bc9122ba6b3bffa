"""Spans as JSON lines: the embedded mode's trace store, read back by ``rmqtrace report``.

One object per line with the fields a report needs (ids as hex, times in ns since the epoch).
Appending whole lines keeps a file written by several runs readable.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["JsonLinesSpanExporter", "SpanRecord", "read_spans", "span_to_dict"]


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    parent = span.parent
    resource = span.resource.attributes if span.resource is not None else {}
    return {
        "trace_id": f"{ctx.trace_id:032x}" if ctx else "",
        "span_id": f"{ctx.span_id:016x}" if ctx else "",
        "parent_span_id": f"{parent.span_id:016x}" if parent else None,
        "name": span.name,
        "kind": span.kind.name if span.kind else "INTERNAL",
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name if span.status else "UNSET",
        "service": resource.get("service.name"),
        "attributes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in (span.attributes or {}).items()},
    }


class JsonLinesSpanExporter(SpanExporter):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fh = self.path.open("a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_to_dict(s), separators=(",", ":")) + "\n" for s in spans)
        with self._lock:
            if self._fh.closed:
                return SpanExportResult.FAILURE
            self._fh.write(lines)
            self._fh.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._fh.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


@dataclass
class SpanRecord:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status: str = "UNSET"
    service: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    # the resource's service.instance.id where the source names it (Jaeger); a span file names the
    # service only, which then stands for the instance (tracer.report.model.instance_of)
    instance: str | None = None


def read_spans(path: str | Path) -> Iterator[SpanRecord]:
    """Spans from a JSON-lines file; lines that are not span objects are skipped."""
    with Path(path).open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                d = json.loads(line)
                yield SpanRecord(
                    trace_id=str(d["trace_id"]), span_id=str(d["span_id"]),
                    parent_span_id=d.get("parent_span_id"), name=str(d["name"]),
                    kind=str(d.get("kind", "INTERNAL")), start_ns=int(d["start_ns"]),
                    end_ns=int(d["end_ns"]), status=str(d.get("status", "UNSET")),
                    service=d.get("service"), attributes=dict(d.get("attributes") or {}),
                )
            except (ValueError, KeyError, TypeError):
                continue
