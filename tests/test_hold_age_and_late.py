"""Two ways the hold miscounted under a keep policy (review #31 findings 8 and 11).

8. A handler running past the hold's age limit (``RMQTRACE_KEEP_HELD_AGE``, 600 s) had its trace
   evicted as ``max_age`` while it ran — the limit meant for a message handled but never acked —
   so the kept failure was exported without the user's spans, counted as an export loss.
   Decision: a trace is not aged while its handler runs; its age counts from the handler's return.
   Every seam that runs a handler goes through ``MessageTrace.handler_scope``; each is a case.
11. A late span of a trace the policy dropped counted as an export loss once ~4350 more traces
    had been dropped (the table of dropped ids overflowed). Our trace ids carry a keyed check, and
    kept and evicted traces are remembered: one of ours that is neither was dropped, with no table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from tracer.clients.official import TracedListener, TracedSimpleConsumer
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.clock import ManualClock
from tracer.path.message import describe
from tracer.path.stages import Outcome
from tracer.telemetry.hold import _REMEMBERED, RECENT_TRACES, HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.tracer import MessageTracer

AGE_S = 600.0
LONG_S = 660.0  # the rest of a long test-case group, past the age limit


class Rig:
    def __init__(self) -> None:
        self.clock = ManualClock(time.time_ns())
        self.lost = [0]
        self.exporter = InMemorySpanExporter()
        self.hold = HoldingSpanProcessor([SimpleSpanProcessor(self.exporter)], max_age_s=AGE_S, ticker=False,
                                         on_dropped=lambda n: self.lost.__setitem__(0, self.lost[0] + n))
        self.provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
        self.provider.add_span_processor(self.hold)
        self.tracer = MessageTracer(consumer_group="g", tracer_provider=self.provider, keep=KeepPolicy(),
                                    hold=self.hold, clock=self.clock)
        self.broker = EmbeddedBroker(min_receive_invisible=1)
        self.broker.create_topic("t")
        producer = Producer(self.broker, ["t"])
        producer.startup()
        m = Message()
        m.topic, m.body = "t", b"x"
        producer.send(m)
        self.raw = SimpleConsumer(self.broker, "g", {"t": None}, await_duration=0)
        self.raw.startup()

    def handler(self) -> None:
        """Opens and ends a span of its own, then works past the age limit (the ticker runs), fails."""
        with self.provider.get_tracer("user").start_as_current_span("step-1"):
            self.clock.advance_s(1)
        self.clock.advance_s(LONG_S)
        self.hold.expire()  # what the hold's ticker does meanwhile
        raise ValueError("the group failed")

    def names(self) -> list[str]:
        return [s.name for s in self.exporter.get_finished_spans()]


def _listener(rig: Rig) -> None:
    from rocketmq import MessageListener

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, m: Any) -> Any:
            rig.handler()

    (m,) = rig.raw.receive(1, 30)
    m.decode_message_timestamp = rig.clock.wall_ns() // 1_000_000
    with pytest.raises(ValueError):
        TracedListener(Listener(), rig.tracer).consume(m)


def _processing(rig: Rig) -> None:
    consumer = TracedSimpleConsumer(rig.raw, rig.tracer)
    (m,) = consumer.receive(1, 30)
    with pytest.raises(ValueError), consumer.processing(m):
        rig.handler()


def _handler_scope(rig: Rig) -> None:
    (m,) = rig.raw.receive(1, 30)
    t = rig.tracer.start_message(describe(m))
    try:
        with t.handler_scope():
            rig.handler()
    except ValueError as exc:
        t.finish(Outcome.FAILURE, exc)


SEAMS: dict[str, Callable[[Rig], None]] = {
    "TracedListener": _listener,
    "TracedSimpleConsumer.processing": _processing,
    "MessageTrace.handler_scope": _handler_scope,  # the ConsumeLoop's dispatcher runs handlers in it
}


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.provider.shutdown()


@pytest.mark.parametrize("seam", sorted(SEAMS))
def test_a_handler_running_past_the_age_limit_keeps_its_spans(seam: str, rig: Rig) -> None:
    SEAMS[seam](rig)
    names = rig.names()
    assert "process t" in names, names  # kept: a failure
    # fails before: step-1 evicted with its trace (max_age) and counted as an export loss
    assert "step-1" in names and rig.lost[0] == 0, (names, rig.hold.statistics())
    assert rig.hold.statistics().traces_evicted["max_age"] == 0


def test_the_age_limit_still_applies_once_the_handler_returned(rig: Rig) -> None:
    """processing() without an ack: held from the handler's return, evicted at the limit."""
    consumer = TracedSimpleConsumer(rig.raw, rig.tracer)
    (m,) = consumer.receive(1, 30)
    with consumer.processing(m):
        rig.provider.get_tracer("user").start_span("step-1").end()
        rig.clock.advance_s(LONG_S)  # a long handler: not aged while it runs
    assert rig.hold.expire() == 0
    assert rig.hold.statistics().oldest_held_s == 0.0
    rig.clock.advance_s(AGE_S - 1)
    assert rig.hold.expire() == 0  # aged from the return, not from the start
    rig.clock.advance_s(2)
    assert rig.hold.expire() == 1 and rig.lost[0] == 1  # the never-acked message's span: lost, counted


# -- finding 11: late spans of dropped traces, however many drops later ---------------------------
@pytest.mark.parametrize("later", [0, RECENT_TRACES + 1, _REMEMBERED + RECENT_TRACES + 1, 5000])
def test_a_late_span_of_a_dropped_trace_is_the_policys_drop(later: int) -> None:
    lost, policy = [0], [0]
    exporter = InMemorySpanExporter()
    hold = HoldingSpanProcessor([SimpleSpanProcessor(exporter)], ticker=False,
                                on_dropped=lambda n: lost.__setitem__(0, lost[0] + n),
                                on_policy_dropped=lambda n: policy.__setitem__(0, policy[0] + n))
    provider = TracerProvider()
    provider.add_span_processor(hold)
    ids = RandomIdGenerator()
    ctx = hold.open_trace(ids)
    late = provider.get_tracer("user").start_span("background", context=trace.set_span_in_context(
        trace.NonRecordingSpan(ctx)))
    hold.release(ctx.trace_id, False)
    for _ in range(later):  # the consumer goes on dropping
        hold.release(hold.open_trace(ids).trace_id, False)
    late.end()
    # fails before for later >= 4353: counted "forgotten", an export loss (RmqtraceSpansDropped)
    assert (lost[0], policy[0]) == (0, 1)
    assert exporter.get_finished_spans() == ()  # never exported blind
    provider.shutdown()


def test_a_late_span_of_a_kept_trace_still_joins_it() -> None:
    exporter = InMemorySpanExporter()
    hold = HoldingSpanProcessor([SimpleSpanProcessor(exporter)], ticker=False)
    provider = TracerProvider()
    provider.add_span_processor(hold)
    ids = RandomIdGenerator()
    ctx = hold.open_trace(ids)
    late = provider.get_tracer("user").start_span("background", context=trace.set_span_in_context(
        trace.NonRecordingSpan(ctx)))
    hold.release(ctx.trace_id, True)
    for _ in range(RECENT_TRACES + 10):
        hold.release(hold.open_trace(ids).trace_id, False)
    late.end()
    assert [s.name for s in exporter.get_finished_spans()] == ["background"]
    provider.shutdown()
