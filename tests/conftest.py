"""Shared fixtures. Integration tests (real RocketMQ, Jaeger, Prometheus) are marked
``integration``; they skip when a service cannot be had unless ``RMQTRACE_REQUIRE_SERVICES=1``
(what ``make test`` sets), in which case they fail."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))  # helper modules beside the tests

if os.environ.get("RMQTRACE_SEEDED") == "1":
    # tests/mutation/run_seeded.py: only whether a bug is caught, and by which invariant, counts —
    # no shrinking, no example database (loaded before the test modules build their settings)
    from hypothesis import Phase, settings

    settings.register_profile("seeded", phases=[Phase.explicit, Phase.generate], database=None)
    settings.load_profile("seeded")

REPO = Path(__file__).resolve().parent.parent


def require_services() -> bool:
    return os.environ.get("RMQTRACE_REQUIRE_SERVICES") == "1"


def unavailable(reason: str) -> None:
    """Skip, or fail when services are required (make test / CI)."""
    if require_services():
        pytest.fail(f"required service unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()
