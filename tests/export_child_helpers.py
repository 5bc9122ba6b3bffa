"""Exporters for the export child in tests (imported by the child, by module name) and an OTLP/HTTP
receiver that records what arrives."""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["GatedExporter", "OtlpReceiver", "PrintingExporter", "gated_otlp", "printing_otlp"]


class GatedExporter(SpanExporter):
    """Waits until the file ``gate`` exists before each export, then hands the batch to ``inner``:
    a child that is alive and not reading, for as long as a test keeps the gate shut."""

    def __init__(self, gate: str, inner: SpanExporter, owner: int | None = None) -> None:
        self.gate = Path(gate)
        self.inner = inner
        self.owner = owner  # the test process: when it is gone, nobody opens the gate

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        while not self.gate.exists():
            if self.owner is not None and not _alive(self.owner):
                # killed with its group, the test left this child behind (it has a session of its own)
                return SpanExportResult.FAILURE
            time.sleep(0.01)  # real-time: runs in the child exporter process, polling the test's gate file
        return self.inner.export(spans)

    def shutdown(self) -> None:
        self.inner.shutdown()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def gated_otlp(gate: str, endpoint: str, owner: int | None = None) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return GatedExporter(gate, OTLPSpanExporter(endpoint=endpoint), owner)


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint (protobuf) on a free loopback port: ``span_ids`` arrived,
    ``spans`` their decoded protobuf messages; answering ``status`` (400: a refusal the exporter
    does not retry, nothing recorded)."""

    def __init__(self, status: int = 200) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                if status != 200:
                    self.send_response(status)
                    self.end_headers()
                    return
                with receiver._lock:
                    for rs in req.resource_spans:
                        attrs = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            for s in ss.spans:
                                receiver.spans.append(s)
                                receiver.resources.append(attrs)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1/traces"

    def span_ids(self) -> list[int]:
        with self._lock:
            return [int.from_bytes(s.span_id, "big") for s in self.spans]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class PrintingExporter(SpanExporter):
    """Prints a line with ``print`` and writes one to descriptor 1 for every batch, then exports: a
    console-like exporter, and a library that writes to fd 1 behind Python's back."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        print("printed by print", flush=True)
        os.write(1, b"written to fd 1 ")  # no newline: it would split an acknowledgement line
        return self.inner.export(spans)

    def shutdown(self) -> None:
        self.inner.shutdown()


def printing_otlp(gate: str, endpoint: str, owner: int | None = None) -> SpanExporter:
    return PrintingExporter(gated_otlp(gate, endpoint, owner))
