"""A copy the dispatcher's handler refuses to start is ``not_started``, never a failure.

#30 item 11 / #31 item 3: the consume loop raises ``_NotStarted`` in place of the handler for a
copy whose lease is gone, whose key hangs or whose other copy still runs here. It was reported
like any handler exception: ``failed``, the ``failure`` outcome counters, ``error.type
_NotStarted`` on the span and a ~0 s handler observation — one hang made 3 phantom failures. A
handler that raises :class:`tracer.dispatch.NotStarted` now gives the outcome ``not_started``:
its own counters, no handler observation, no error on the span. Both engines.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry
from waiting import wait_until

from tracer.dispatch import AsyncDispatcher, Dispatcher, DispatchMetrics, NotStarted
from tracer.path.message import MessageInfo
from tracer.path.stages import Outcome
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer

ENGINES = ["threads", "asyncio"]


def _run(engine: str, tracer: MessageTracer, registry: CollectorRegistry) -> tuple[list[tuple[str, Outcome]], Any]:
    """Submit "ran" (succeeds) and "refused" (its handler raises NotStarted), traced; close."""
    got: list[tuple[str, Outcome]] = []
    metrics = DispatchMetrics(registry)

    def on_done(item: str, outcome: Outcome, error: BaseException | None) -> None:
        got.append((item, outcome))

    def decide(item: str) -> None:
        if item == "refused":
            raise NotStarted("its lease is gone")

    def trace(i: int, item: str) -> Any:
        return tracer.start_message(MessageInfo(topic="T", message_id=f"m{i}"))

    if engine == "threads":
        d: Any = Dispatcher(decide, workers=1, on_done=on_done, metrics=metrics)
        for i, item in enumerate(["ran", "refused"]):
            d.submit(item, trace(i, item))
        assert d.close() is True
        return got, d.statistics()

    async def handler(item: str) -> None:
        decide(item)

    async def main() -> Any:
        d = AsyncDispatcher(handler, workers=1, on_done=on_done, metrics=metrics)
        for i, item in enumerate(["ran", "refused"]):
            await d.submit(item, trace(i, item))
        assert await d.close() is True
        return d.statistics()

    return got, asyncio.run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_a_refused_start_is_its_own_outcome_with_no_handler_observation_and_no_error(
        engine: str, spans: Any, registry: CollectorRegistry) -> None:
    provider, exporter = spans
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry))
    got, s = _run(engine, tracer, registry)
    # fails before: ImportError (no NotStarted); with the loop's own _NotStarted it was FAILURE
    assert sorted(got) == [("ran", Outcome.SUCCESS), ("refused", Outcome.NOT_STARTED)]
    assert (s.handled, s.failed, s.not_started, s.skipped) == (1, 0, 1, 0)
    assert s.submitted == s.handled + s.failed + s.timed_out + s.skipped + s.not_started + s.in_flight + s.queued

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    dispatch = {"policy": "aggressive", "consumer_group": ""}  # a Dispatcher built without a group
    assert sample("rmqtrace_dispatch_messages_total", outcome="not_started", **dispatch) == 1
    assert sample("rmqtrace_dispatch_messages_total", outcome="failure", **dispatch) == 0
    group = {"topic": "T", "consumer_group": "G"}
    assert sample("rmqtrace_messages_total", outcome="not_started", **group) == 1
    assert sample("rmqtrace_messages_total", outcome="failure", **group) in (None, 0.0)
    # one handler observation: the run, not the refusal
    assert sample("rmqtrace_stage_duration_seconds_count", stage="handler", **group) == 1
    assert sample("rmqtrace_stage_duration_seconds_count", stage="end_to_end", **group) in (None, 1.0)
    process = {x.attributes["rmqtrace.outcome"]: x for x in exporter.get_finished_spans()
               if x.name == "process T"}
    refused = process["not_started"]
    assert "error.type" not in refused.attributes and refused.status.status_code is not StatusCode.ERROR
    assert not [x for x in exporter.get_finished_spans()
                if x.attributes and x.attributes.get("error.type") == "_NotStarted"]


def test_the_consume_loop_counts_a_bounced_copy_not_started_never_failed(registry: CollectorRegistry) -> None:
    """The scenario of the issue: a hung first run, its redelivery given back unrun."""
    from manual_clock import Clock
    from test_consume import pipeline, run_in_thread

    from tracer.clients.consume_options import LeaseOptions

    clock = Clock()
    hang = threading.Event()
    attempts: list[int] = []

    def handler(m: Any) -> None:
        attempts.append(m.delivery_attempt)
        if m.delivery_attempt == 1:
            hang.wait(30)

    broker, loop = pipeline(1, handler, invisible=1, clock=clock, workers=2, handler_timeout=1.0,
                            lease=LeaseOptions(invisible_duration=1, hang_grace=0.5),
                            retry_backoff=lambda attempt: 1, dispatch_metrics=DispatchMetrics(registry))
    t = run_in_thread(loop)
    try:
        wait_until(lambda: attempts == [1], what="the first delivery runs")
        for _ in range(4):
            clock.advance(0.7)
            loop.renew_leases()
        wait_until(lambda: loop.statistics().abandoned + loop.statistics().retry_scheduled == 1, what="let go")
        clock.advance(1.0)
        wait_until(lambda: loop.statistics().given_back == 1, what="the second delivery given back unrun")
        s, d = loop.statistics(), loop.dispatcher.statistics()
        assert attempts == [1] and s.not_started == 1
        # fails before: failed == 1 and the failure counter 1, for a copy that never ran
        assert d.failed == 0, d
        assert d.not_started == 1, d
        labels = {"policy": "aggressive", "consumer_group": "G"}
        assert registry.get_sample_value("rmqtrace_dispatch_messages_total", {**labels, "outcome": "failure"}) == 0
        assert registry.get_sample_value("rmqtrace_dispatch_messages_total", {**labels, "outcome": "not_started"}) == 1
        loop.stop(timeout=0.5)
        t.join(10)
    finally:
        hang.set()
        loop.stop(timeout=5)
        t.join(10)


def _keep_provider() -> tuple[Any, Any, Any, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    from tracer.telemetry.hold import HoldingSpanProcessor
    from tracer.telemetry.keep import KeepPolicy

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    hold = HoldingSpanProcessor([SimpleSpanProcessor(exporter)], ticker=False)
    provider.add_span_processor(hold)
    return provider, exporter, KeepPolicy(), hold


@pytest.mark.parametrize("sampling", ["head", "keep"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_refused_copy_exports_no_handler_span(engine: str, sampling: str, spans: Any,
                                                registry: CollectorRegistry) -> None:
    """Review #31 finding 13: the refusal happens inside the handler scope, and the handler span
    opened at its entry was written at the finish — a ``handler`` span (status UNSET) for a
    handler that never ran. Both engines; head-sampled, and kept by a keep policy (a copy whose
    lease was lost is kept, reason ``lease_lost``)."""
    if sampling == "head":
        provider, exporter = spans
        tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry))
    else:
        provider, exporter, keep, hold = _keep_provider()
        tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry),
                               keep=keep, hold=hold)
    start = tracer.start_message

    def traced(info: MessageInfo, *args: Any, **kwargs: Any) -> Any:
        t = start(info, *args, **kwargs)
        if sampling == "keep":
            t.lease_lost("expired")  # kept whatever its outcome: its spans are exported
        return t

    tracer.start_message = traced  # type: ignore[method-assign]
    _run(engine, tracer, registry)
    by_trace: dict[int, list[str]] = {}
    outcome: dict[int, str] = {}
    for s in exporter.get_finished_spans():
        by_trace.setdefault(s.context.trace_id, []).append(s.name)
        if s.name == "process T":
            outcome[s.context.trace_id] = str(s.attributes["rmqtrace.outcome"])
    assert sorted(outcome.values()) == ["not_started", "success"], outcome
    for trace_id, o in outcome.items():
        # fails before: the not_started copy's trace held a `handler` span
        assert ("handler" in by_trace[trace_id]) is (o == "success"), (o, by_trace[trace_id])
