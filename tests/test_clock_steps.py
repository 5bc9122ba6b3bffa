"""A wall-clock step in the middle of a message (issue 31 item 2).

The rule (tracer/path/clock.py): one message's consumer stamps are the wall clock read once, at
the pull, then advanced by the monotonic clock. So a step of the wall clock, either way, wherever
it lands, leaves every gap of the message equal to its monotonic duration — none reads 0 unless
its two stamps are equal on the monotonic clock; the keep policy keeps the slow message; the
dispatcher's blame (monotonic) and the ``dispatch_wait`` it rides on agree.

The clock here also answers ``now_ns()`` as the clock before this rule did (the wall clock held
where it steps back), so these tests ran against the old code too: there each failed, a gap of
0.5 s read 0 under a step back of 3 s.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from tracer.dispatch import AsyncDispatcher, Dispatcher, RoundRobin
from tracer.path import names as n
from tracer.path.message import MessageInfo
from tracer.path.propagation import TRACEPARENT
from tracer.path.stages import Outcome, Stage
from tracer.path.stamps import compute_gaps
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.occupancy import Occupancy
from tracer.telemetry.tracer import MessageTracer

S = 1_000_000_000
STEP = 3 * S


class SteppedClock:
    """Both timelines by hand; ``now_ns`` is the old consumer clock (the wall clock's running max)."""

    def __init__(self) -> None:
        self.wall = 1_800_000_000 * S
        self.mono = 5_000 * S
        self.held = self.wall
        self._lock = threading.Lock()

    def wall_ns(self) -> int:
        with self._lock:
            return self.wall

    def monotonic_ns(self) -> int:
        with self._lock:
            return self.mono

    def now_ns(self) -> int:
        with self._lock:
            self.held = max(self.held, self.wall)
            return self.held

    def advance_s(self, seconds: float) -> None:
        with self._lock:
            self.wall += int(seconds * S)
            self.mono += int(seconds * S)

    def step_wall(self, ns: int) -> None:
        with self._lock:
            self.wall += ns


class _Collect(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


# the consumer's stages in order, and how long each gap after one lasts on the monotonic clock
_STAGES = (Stage.CLIENT_PULL, Stage.DISPATCH_ENQUEUE, Stage.HANDLER_START, Stage.HANDLER_END)
_LASTS = (0.2, 0.5, 0.3)  # client_buffer, dispatch_wait, handler


def _run_one(clock: SteppedClock, tracer: MessageTracer, step_at: int, step: int, props: dict[str, str] | None = None):
    """One message through its consumer stages; the wall clock steps by ``step`` inside gap ``step_at``."""
    t = tracer.start_message(MessageInfo(topic="T", message_id="m", properties=props or {}))
    monos = [clock.monotonic_ns()]
    for k, lasts in enumerate(_LASTS):
        clock.advance_s(lasts / 2)
        if k == step_at:
            clock.step_wall(step)
        clock.advance_s(lasts / 2)
        stage = _STAGES[k + 1]
        if stage is Stage.DISPATCH_ENQUEUE:
            t.mark(stage)
        elif stage is Stage.HANDLER_START:
            t.__enter__()
        else:
            t.__exit__(None, None, None)
        monos.append(clock.monotonic_ns())
    t.finish(Outcome.SUCCESS)
    return t, monos


@pytest.mark.parametrize("step", [-STEP, STEP], ids=["back", "forward"])
@pytest.mark.parametrize("step_at", range(len(_LASTS)), ids=["client_buffer", "dispatch_wait", "handler"])
def test_every_consumer_gap_is_its_monotonic_duration_across_a_step(step: int, step_at: int) -> None:
    clock = SteppedClock()
    pulled_wall = clock.wall_ns()
    tracer = MessageTracer(consumer_group="g", clock=clock)  # type: ignore[arg-type]
    t, monos = _run_one(clock, tracer, step_at, step)
    times = t.stamps.times
    assert times[Stage.CLIENT_PULL] == pulled_wall  # anchored at the pull, on the wall clock
    for a, b, ma, mb in zip(_STAGES, _STAGES[1:], monos, monos[1:]):
        assert times[b] - times[a] == mb - ma, (a.name, b.name)
    gaps = {g.gap.name: g for g in compute_gaps(t.stamps)}
    for name, lasts in zip(("client_buffer", "dispatch_wait", "handler"), _LASTS):
        assert gaps[name].seconds == pytest.approx(lasts) and not gaps[name].clamped, name


def test_a_step_back_no_longer_makes_the_keep_policy_drop_the_slow_message() -> None:
    clock = SteppedClock()
    out = _Collect()
    hold = HoldingSpanProcessor([out], clock=clock, ticker=False)  # type: ignore[arg-type]
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(hold)
    policy = KeepPolicy({"dispatch_wait": 0.1}, clock=clock)  # type: ignore[arg-type]
    tracer = MessageTracer(consumer_group="g", tracer_provider=provider, clock=clock,  # type: ignore[arg-type]
                           keep=policy, hold=hold)
    unsampled = {TRACEPARENT: f"00-{1:032x}-{1:016x}-00"}
    _run_one(clock, tracer, 1, -STEP, unsampled)  # dispatch_wait 0.5 s, the wall clock 3 s back inside it
    k = policy.statistics()
    assert (k.slow, k.by_reason["slow"], k.dropped) == (1, 1, 0)
    assert [s.name for s in out.spans if s.name == "process T"] == ["process T"]


def _thread_engine(clock: SteppedClock, tracer: MessageTracer, handler, on_done) -> None:
    go = threading.Event()

    def run(body: str) -> None:
        assert go.wait(30)
        handler(body)

    d = Dispatcher(run, policy=RoundRobin(buffer=4), workers=1, clock=clock, on_done=on_done)  # type: ignore[arg-type]
    for i, body in enumerate(["first", "second"]):
        d.submit(body, tracer.start_message(MessageInfo(topic="T", message_id=f"m{i}")))
    go.set()
    assert d.close(timeout=30)


def _async_engine(clock: SteppedClock, tracer: MessageTracer, handler, on_done) -> None:
    async def main() -> None:
        go = asyncio.Event()

        async def run(body: str) -> None:
            await go.wait()
            handler(body)

        d = AsyncDispatcher(run, policy=RoundRobin(buffer=4), workers=1, clock=clock,  # type: ignore[arg-type]
                            on_done=on_done)
        for i, body in enumerate(["first", "second"]):
            await d.submit(body, tracer.start_message(MessageInfo(topic="T", message_id=f"m{i}")))
        go.set()
        await d.close()

    asyncio.run(main())


@pytest.mark.parametrize("engine", [_thread_engine, _async_engine], ids=["threads", "asyncio"])
def test_dispatch_wait_and_its_blame_agree_across_a_step(engine, registry) -> None:
    """One worker, two messages: the second waits the first's 1 s handler, in which the wall clock
    steps 3 s back. Its ``dispatch_wait`` is that 1 s (the blame's clock), and the blame says no
    part of it was avoidable (the only worker was busy)."""
    clock = SteppedClock()
    provider = TracerProvider()
    out = _Collect()
    provider.add_span_processor(out)
    tracer = MessageTracer(consumer_group="g", tracer_provider=provider, clock=clock,  # type: ignore[arg-type]
                           metrics=TracerMetrics(registry))

    def handler(body: str) -> None:
        if body == "first":
            clock.advance_s(0.5)
            clock.step_wall(-STEP)
            clock.advance_s(0.5)

    engine(clock, tracer, handler, None)
    ids = {s.context.trace_id: s.attributes[n.MESSAGE_ID] for s in out.spans if s.name == "process T"}
    waits = {ids[s.context.trace_id]: s for s in out.spans if s.name == n.BLAME_SPAN}
    second = waits["m1"]
    assert second.end_time - second.start_time == S  # type: ignore[operator]
    assert second.attributes[n.BLAME_AVOIDABLE_WAIT] <= (second.end_time - second.start_time) / S  # type: ignore[operator]
    assert second.attributes[n.BLAME_REASON] == "capacity"


def test_the_keep_policy_and_the_hold_run_on_the_tracers_clock() -> None:
    """Built without a clock, they take the tracer's (the occupancy tracker too): a job's latest
    finisher is settled after job_idle_s on the clock its finish was read on, not another one."""
    from tracer.path.clock import ManualClock
    from tracer.path.propagation import JOB_ID

    clock = ManualClock()
    out = _Collect()
    hold = HoldingSpanProcessor([out], ticker=False)
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(hold)
    policy = KeepPolicy(job_idle_s=10.0)
    occupancy = Occupancy(2)
    tracer = MessageTracer(consumer_group="g", tracer_provider=provider, clock=clock, keep=policy, hold=hold,
                           occupancy=occupancy)
    assert policy.clock is clock and hold.clock is clock and occupancy.clock is clock
    for i in range(2):  # the job's first is kept at once; its latest waits for the job to be idle
        t = tracer.start_message(MessageInfo(topic="T", message_id=f"m{i}",
                                             properties={TRACEPARENT: f"00-{i + 1:032x}-{i + 1:016x}-00", JOB_ID: "j"}))
        with t.handler_scope():
            clock.advance_s(0.01)
        t.finish(Outcome.SUCCESS)
    assert policy.statistics().pending == 1
    clock.advance_s(9.0)
    hold.tick()
    assert policy.statistics().pending == 1  # idle 9 s of 10
    clock.advance_s(2.0)
    hold.tick()
    assert (policy.statistics().pending, policy.statistics().by_reason["critical_path"]) == (0, 1)


def test_a_keep_policy_on_another_clock_is_refused() -> None:
    from tracer.path.clock import ManualClock

    hold = HoldingSpanProcessor([_Collect()], ticker=False)
    with pytest.raises(ValueError, match="another clock"):
        MessageTracer(clock=ManualClock(), keep=KeepPolicy(clock=ManualClock()), hold=hold)
    with pytest.raises(ValueError, match="another clock"):
        MessageTracer(keep=KeepPolicy(), hold=HoldingSpanProcessor([_Collect()], clock=ManualClock(), ticker=False))


def test_a_head_of_line_wait_across_a_step_back_carries_no_more_blame_than_its_length(registry) -> None:
    """The issue's case: one slow message then fast ones on two round-robin workers; m2 waits
    behind the slow m0 while worker 1 is free, and the wall clock steps 3 s back during m0. Its
    dispatch_wait is the whole wait on the monotonic clock, so the avoidable part fits in it (a
    held clock made it ~0.02 s carrying ~0.25 s of avoidable wait)."""
    from tracer.path.blocking import GRACE_NS

    slow, fast = 0.25, 0.01
    clock = SteppedClock()
    provider = TracerProvider()
    out = _Collect()
    provider.add_span_processor(out)
    tracer = MessageTracer(consumer_group="g", tracer_provider=provider, clock=clock,  # type: ignore[arg-type]
                           metrics=TracerMetrics(registry))

    async def main() -> None:
        all_arrived, other_worker_done = asyncio.Event(), asyncio.Event()

        async def handler(body: str) -> None:
            await all_arrived.wait()
            if body == "slow":
                await other_worker_done.wait()
                clock.step_wall(-STEP)
                clock.advance_s(slow)
            else:
                clock.advance_s(fast)

        def on_done(body: str, outcome: Outcome, error: BaseException | None) -> None:
            if body == "c":
                other_worker_done.set()

        d = AsyncDispatcher(handler, policy=RoundRobin(buffer=4), workers=2, clock=clock,  # type: ignore[arg-type]
                            on_done=on_done)
        for i, body in enumerate(["slow", "a", "b", "c"]):
            await d.submit(body, tracer.start_message(MessageInfo(topic="T", message_id=f"m{i}")))
        all_arrived.set()
        await d.close()

    asyncio.run(main())
    ids = {s.context.trace_id: s.attributes[n.MESSAGE_ID] for s in out.spans if s.name == "process T"}
    waits = {ids[s.context.trace_id]: s for s in out.spans if s.name == n.BLAME_SPAN}
    victim = waits["m2"]  # dealt to worker 0, behind m0
    length = (victim.end_time - victim.start_time) / S  # type: ignore[operator]
    assert victim.attributes[n.BLAME_REASON] == "head_of_line"
    assert length == pytest.approx(2 * fast + slow)  # enqueued at 0, started when m0 ended
    assert victim.attributes[n.BLAME_AVOIDABLE_WAIT] == pytest.approx(slow - GRACE_NS / 1e9)
    assert victim.attributes[n.BLAME_AVOIDABLE_WAIT] <= length
