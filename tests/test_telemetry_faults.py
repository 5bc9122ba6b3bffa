"""Telemetry faults: what the counters, events and traces say when things go wrong (or on purpose)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace as api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan
from prometheus_client import CollectorRegistry

from tracer.config import DropCounter
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.metrics import TracerMetrics

_PROVIDERS: list[TracerProvider] = []


@pytest.fixture(autouse=True)
def _shut_down_providers() -> Iterator[None]:
    yield
    while _PROVIDERS:
        _PROVIDERS.pop().shutdown()


# -- 1. a policy drop is not an export loss ---------------------------------------------------------
@pytest.mark.parametrize("ours", [True, False], ids=["opened-here", "marked-foreign"])
def test_late_spans_of_a_trace_the_policy_dropped_are_no_export_loss(ours: bool) -> None:
    """A handler's thread ending its span after the keep policy dropped the trace: dropped with
    it, counted as the policy's (rmqtrace_spans_policy_dropped), never in rmqtrace_spans_dropped
    (which RmqtraceSpansDropped reads: a healthy exporter must not page)."""
    reg = CollectorRegistry()
    metrics = TracerMetrics(reg)
    lost, policy = DropCounter(), DropCounter()
    lost.bind(metrics.spans_dropped)
    policy.bind(metrics.spans_policy_dropped)
    memory = InMemorySpanExporter()
    hold = HoldingSpanProcessor([SimpleSpanProcessor(memory)], on_dropped=lost, on_policy_dropped=policy,
                                ticker=False)
    provider = TracerProvider()
    _PROVIDERS.append(provider)
    provider.add_span_processor(hold)
    tracer = provider.get_tracer("t")
    if ours:
        ctx = hold.open_trace(RandomIdGenerator())
        parent = api.set_span_in_context(NonRecordingSpan(ctx))
        root = tracer.start_span("process", context=parent)
    else:
        root = tracer.start_span("process")
        hold.hold(root.get_span_context().trace_id)
    with api.use_span(root, end_on_exit=False):
        late = [tracer.start_span(f"late-{i}") for i in range(3)]
    root.end()
    assert hold.release(root.get_span_context().trace_id, keep=False)
    for span in late:
        span.end()
    assert memory.get_finished_spans() == ()
    s = hold.statistics()
    assert s.dropped == 0 and s.policy_dropped == 3
    assert lost.dropped == 0 and policy.dropped == 3
    assert reg.get_sample_value("rmqtrace_spans_dropped_total") == 0
    assert reg.get_sample_value("rmqtrace_spans_policy_dropped_total") == 3


# -- 2. the exception event: no deprecated exception.escaped -----------------------------------------
MS = 1_000_000


def _fail_send(provider, monkeypatch) -> None:
    from tracer.path.clock import ManualClock
    from tracer.telemetry.tracer import MessageTracer

    mt = MessageTracer(tracer_provider=provider, clock=ManualClock())
    mt.start_send("T", {}.__setitem__).end(error=ValueError("bad"))


def _fail_message(provider, monkeypatch, compact: bool = False) -> None:
    from tracer.path.clock import ManualClock
    from tracer.path.message import MessageInfo
    from tracer.path.stages import Outcome, Stage
    from tracer.telemetry.tracer import MessageTracer

    if compact:
        monkeypatch.setenv("RMQTRACE_TRACE_SHAPE", "compact")
    clock = ManualClock()
    mt = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    info = MessageInfo(topic="T", message_id="M1", properties={}, store_ms=clock.now_ns() // MS - 1,
                       delivery_attempt=1)
    t = mt.start_message(info)
    clock.advance(2 * MS)
    t.mark(Stage.DISPATCH_ENQUEUE)
    with t.handler_scope():
        clock.advance(MS)
    t.finish(Outcome.FAILURE, ValueError("bad"))


def _fail_operation(provider, monkeypatch, which: str) -> None:
    from tracer.path.clock import ManualClock
    from tracer.telemetry.operations import ConsumerOperations
    from tracer.telemetry.tracer import MessageTracer

    ops = ConsumerOperations(MessageTracer(consumer_group="G", tracer_provider=provider, clock=ManualClock()),
                             settle_spans=True)

    def boom() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError):
        if which == "receive":
            ops.receive(boom)
        else:
            ops.settle("ack", type("M", (), {"topic": "T", "message_id": "M1"})(), boom)


_CALL_SITES = {
    "send span (SendTrace.end)": _fail_send,
    "handler span (MessageTrace._write_spans)": _fail_message,
    "compact process span (MessageTrace._write_spans)": lambda p, m: _fail_message(p, m, compact=True),
    "receive span (ConsumerOperations._end)": lambda p, m: _fail_operation(p, m, "receive"),
    "settle span (ConsumerOperations._end)": lambda p, m: _fail_operation(p, m, "settle"),
}


@pytest.mark.parametrize("site", list(_CALL_SITES))
def test_every_exception_event_is_the_current_semconv_one(site: str, monkeypatch) -> None:
    """Every place that records an exception writes type, message, stacktrace and no
    exception.escaped (deprecated in semconv 1.44; the SDK's record_exception writes it)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    _PROVIDERS.append(provider)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _CALL_SITES[site](provider, monkeypatch)
    events = [e for s in memory.get_finished_spans() for e in s.events if e.name == "exception"]
    assert len(events) == 1, [(s.name, s.events) for s in memory.get_finished_spans()]
    attrs = dict(events[0].attributes)
    assert "exception.escaped" not in attrs
    assert attrs["exception.type"] == "ValueError" and attrs["exception.message"] == "bad"
    assert "ValueError: bad" in attrs["exception.stacktrace"]


def test_deferred_span_record_exception_writes_no_escaped() -> None:
    """Our own span class's record_exception (its public API) follows the same event shape."""
    from tracer.telemetry.spans import DeferredSpan, span_writer

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    _PROVIDERS.append(provider)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    writer = span_writer(provider.get_tracer("rmqtrace"))
    assert writer is not None
    root = provider.get_tracer("rmqtrace").start_span("root")
    ctx = root.get_span_context()
    span = DeferredSpan(writer, "handler", writer.child_context(ctx), ctx, 1)
    try:
        raise ValueError("bad")
    except ValueError as exc:
        span.record_exception(exc, escaped=True)
    span.end(end_time=2)
    root.end()
    [handler] = [s for s in memory.get_finished_spans() if s.name == "handler"]
    attrs = dict(handler.events[0].attributes)
    assert "exception.escaped" not in attrs and attrs["exception.type"] == "ValueError"


# -- 3. a nack (change_invisible_duration) on the wrapper paths finishes the trace --------------------
def _seam(kind: str, provider, registry):
    """(receive, ack, nack, processing or None, cleanup) of one embedded consumer through ``kind``."""
    from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
    from tracer.telemetry.tracer import MessageTracer

    broker = EmbeddedBroker()
    producer = Producer(broker, ["T"])
    producer.startup()
    m = Message()
    m.topic, m.body = "T", b"x"
    producer.send(m)
    raw = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    raw.startup()
    if kind == "TracedSimpleConsumer":
        from tracer.clients.official import TracedSimpleConsumer

        c = TracedSimpleConsumer(raw, MessageTracer(consumer_group="G", tracer_provider=provider,
                                                    metrics=TracerMetrics(registry)), settle_spans=True)
        return c.receive, c.ack, c.change_invisible_duration, c.processing, lambda: None
    pytest.importorskip("rocketmq")
    from tracer.clients.instrumentor import RocketMQInstrumentor

    inst = RocketMQInstrumentor()
    inst.instrument(tracer_provider=provider, registry=registry, settle_spans=True)
    # the patched methods' wrappers, called with the embedded consumer as the instance
    return (lambda n, d: inst._receive(raw.receive, raw, (n, d), {}),
            lambda msg: inst._ack(raw.ack, raw, (msg,), {}),
            lambda msg, d: inst._change_invisible(raw.change_invisible_duration, raw, (msg, d), {}),
            None, inst.uninstrument)


@pytest.mark.parametrize(("kind", "scope"), [("TracedSimpleConsumer", "no-scope"),
                                           ("TracedSimpleConsumer", "after-processing"),
                                           ("TracedSimpleConsumer", "inside-processing"),
                                           ("instrumentor", "no-scope")])  # it has no processing()
def test_a_nacked_delivery_finishes_its_trace_as_a_failure_once(kind: str, scope: str) -> None:
    """The 5.x nack (change_invisible_duration of a received message) ended nothing before: no
    failure count, no histogram entry, no process span; the trace waited for an ack that never came."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    _PROVIDERS.append(provider)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    reg = CollectorRegistry()
    receive, ack, nack, processing, cleanup = _seam(kind, provider, reg)
    try:
        (msg,) = receive(1, 30)
        if scope == "after-processing":
            assert processing is not None
            with processing(msg):
                processing.__self__.renew_lease(msg, 20)  # said to be a renewal: the trace stays open
            assert not [s for s in memory.get_finished_spans() if s.name == "process T"]
        if scope == "inside-processing":  # review #31 finding 4: read as a renewal, dropped uncounted
            assert processing is not None
            with processing(msg):
                nack(msg, 10)  # the nack: the block's end settles the delivery
                assert not [s for s in memory.get_finished_spans() if s.name == "process T"]
            # fails before: nothing until an ack that never comes (the trace later forgotten)
            assert [s.name for s in memory.get_finished_spans() if s.name == "process T"] == ["process T"]
        nack(msg, 10)
        nack(msg, 10)  # twice: still one finish
    finally:
        cleanup()
    labels = {"topic": "T", "consumer_group": "G"}
    assert reg.get_sample_value("rmqtrace_messages_total", {**labels, "outcome": "failure"}) == 1
    assert not reg.get_sample_value("rmqtrace_messages_total", {**labels, "outcome": "success"})
    assert reg.get_sample_value("rmqtrace_stage_duration_seconds_count", {**labels, "stage": "handler"}) == 1
    assert reg.get_sample_value("rmqtrace_stage_duration_seconds_count", {**labels, "stage": "dispatch_wait"}) == 1
    [process] = [s for s in memory.get_finished_spans() if s.name == "process T"]
    assert process.status.status_code.name == "ERROR"
    assert process.attributes["error.type"] == "failure"
