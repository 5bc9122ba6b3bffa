"""Benchmarks behind BENCHMARKS.md (``rmqtrace bench ...``).

Shared here: :class:`DropExporter`, the exporter that keeps a span processor's whole cost but
sends nothing, so a benchmark measures rmqtrace and the SDK, not a network; and what every
result records about the run (:func:`loadavg`, :func:`client_version`), since on a shared machine
a figure without its load is not a result; and :func:`rmq_admin`, the checkout's topic/group tool.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["DropExporter", "client_version", "loadavg", "rmq_admin"]


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
