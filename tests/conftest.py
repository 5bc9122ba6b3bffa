"""Shared fixtures. Integration tests (real RocketMQ, Jaeger, Prometheus) are marked
``integration``; they skip when a service cannot be had unless ``RMQTRACE_REQUIRE_SERVICES=1``
(what ``make test`` sets), in which case they fail."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
elif os.environ.get("RMQTRACE_EXPLORE") != "1" and os.environ.get("RMQTRACE_LONG") != "1":
    # `make test` (and CI) runs every model test on the same examples each time, so a run fails
    # for what changed, not for what the search happened to draw; the search for new cases is its
    # own command (`make explore`: fresh random seeds, RMQTRACE_LONG's larger budgets)
    from hypothesis import settings

    settings.register_profile("reproducible", derandomize=True)
    settings.load_profile("reproducible")

REPO = Path(__file__).resolve().parent.parent


def pyproject() -> dict[str, Any]:
    """This checkout's pyproject.toml, parsed (tomllib is new in 3.11; 3.10 has the tomli backport)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())


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


# The names the library gives its threads (grep ``threading.Thread(`` in tracer/): a fixed
# ``rmqtrace-`` prefix, a dispatcher's ``{name}-dispatch-{n}`` / ``{name}-dispatch-watchdog``
# (``name=`` is the user's, default ``rmqtrace``), the demand-push runner and the demo/bench loops.
# Only these: the RocketMQ client, grpc and the OTel SDK run threads of their own, which are none
# of this check's business.
_OUR_THREAD = re.compile(r"rmqtrace-|demand-push-|demo-|fleet-demo-|fleet-member-|fleet-loop$|.+-dispatch-(\d+|watchdog)$")
_THREAD_GRACE_S = 2.0  # stops that signal a thread and return (Refresher.stop, hold shutdown) end it soon after


def _our_threads() -> dict[int, threading.Thread]:
    return {t.ident: t for t in threading.enumerate() if t.ident is not None and _OUR_THREAD.match(t.name)}


# The test running now (rmq_real.ensure_broker asks whether it is marked integration)
RUNNING: list[pytest.Item] = []


@pytest.fixture(autouse=True)
def _running_test(request: pytest.FixtureRequest) -> Iterator[None]:
    RUNNING.append(request.node)
    yield
    RUNNING.pop()


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves a library thread running after it returns: a dispatcher, consumer
    or refresher it did not close keeps running (and holding memory) into every later test."""
    before = _our_threads()
    yield
    deadline = time.monotonic() + _THREAD_GRACE_S
    left = [t for ident, t in _our_threads().items() if before.get(ident) is not t]
    for t in left:
        t.join(max(0.0, deadline - time.monotonic()))
    leaked = sorted(t.name for t in left if t.is_alive())
    if leaked:
        pytest.fail(f"test left {len(leaked)} library thread(s) running: {', '.join(leaked)}", pytrace=False)
