"""Live blame wired into the dispatcher (tracer.path.blocking via tracer.dispatch.core), end to end on
the embedded broker: the blocker a wait span names is the message that really ran on its worker."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.dispatch import AsyncDispatcher, CostAware, Random, RoundRobin
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path import names as n
from tracer.path.blocking import GRACE_NS
from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.path.stages import Stage
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer

SLOW = 0.25
FAST = 0.01
N = 12


def work(seconds: float) -> None:
    time.sleep(seconds)  # real-time: a slow handler is the subject



def _job_consumer() -> SimpleConsumer:
    """A started consumer of the job: N messages on an embedded broker, every fourth slow."""
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    for i in range(N):
        m = Message()
        m.topic, m.body = "T", (b"slow" if i % 4 == 0 else f"fast{i}".encode())
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.05)
    consumer.startup()
    return consumer


def _run(policy, spans, registry, *, shape: str = "full", key=None, workers: int = 2):
    provider, exporter = spans
    consumer = _job_consumer()
    metrics = TracerMetrics(registry)
    runs: dict[str, tuple[int, int, int]] = {}  # message id -> (worker, handler start, end)
    lock = threading.Lock()

    def listen(t, outcome):
        with lock:
            runs[t.info.message_id] = (t.worker, t.stamps.times[Stage.HANDLER_START], t.stamps.times[Stage.HANDLER_END])

    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=metrics, trace_shape=shape,
                           listeners=[listen])

    def handler(m):
        time.sleep(SLOW if m.body == b"slow" else FAST)  # real-time: a slow handler is the subject

    kw = {"key": key} if key is not None else {}
    loop = ConsumeLoop(consumer, handler, tracer=tracer, invisible_duration=30, workers=workers, policy=policy, **kw)
    th = threading.Thread(target=loop.run, daemon=True)
    th.start()
    wait_until(lambda: loop.statistics().acked == N, what=f"{N} acks", timeout=30)
    loop.stop()
    th.join(10)
    return exporter.get_finished_spans(), runs, registry


def _blamed(finished, shape):
    """(message id, wait span) of every span carrying the blame attributes."""
    name = n.BLAME_SPAN if shape == "full" else "process T"
    by_trace_process = {s.context.trace_id: s for s in finished if s.name == "process T"}
    out = []
    for s in finished:
        if s.name == name and n.BLAME_REASON in s.attributes:
            mid = by_trace_process[s.context.trace_id].attributes[n.MESSAGE_ID]
            out.append((mid, s))
    return out


def _counter_total(registry) -> float:
    total = 0.0
    for metric in registry.collect():
        if metric.name == "rmqtrace_consumer_avoidable_wait_seconds":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


def _check_blockers(finished, runs, shape):
    handler_spans = {s.context.trace_id: s for s in finished if s.name == (n.HANDLER_SPAN if shape == "full" else "process T")}
    by_id = {s.attributes[n.MESSAGE_ID]: s for s in finished if s.name == "process T"}
    named = 0
    for mid, span in _blamed(finished, shape):
        blocker = span.attributes.get(n.BLAME_BLOCKER_MESSAGE_ID)
        if blocker is None:
            assert not span.links or shape == "compact" and len(span.links) == 1  # compact: the creation link
            continue
        named += 1
        worker, start, _ = runs[mid]
        b_worker, b_start, b_end = runs[blocker]
        assert b_worker == worker, f"{blocker} ran on worker {b_worker}, {mid} waited for worker {worker}"
        assert b_start < start and b_end <= start + 1_000_000, "the blocker ran before the victim started"
        # the link points at the blocker's handler span
        target = handler_spans[by_id[blocker].context.trace_id].context.span_id
        assert target in {link.context.span_id for link in span.links}
    return named


@pytest.mark.parametrize("policy,key", [
    (RoundRobin(buffer=4), None),
    (Random(buffer=4, seed=3), None),
    (RoundRobin(buffer=4), lambda m: "k" + str(int(m.body == b"slow"))),  # a key: routed to one worker
])
@pytest.mark.parametrize("shape", ["full", "compact"])
def test_the_blocker_named_is_the_message_that_ran_on_its_worker(policy, key, shape, spans, registry):
    finished, runs, reg = _run(policy, spans, registry, shape=shape, key=key)
    blamed = _blamed(finished, shape)
    assert len(blamed) == N, "every message's wait span carries a verdict"
    assert _check_blockers(finished, runs, shape) >= 1, "a buffered policy behind slow messages names blockers"
    assert any(s.attributes[n.BLAME_REASON] == "head_of_line" for _, s in blamed)
    total = sum(s.attributes[n.BLAME_AVOIDABLE_WAIT] for _, s in blamed)
    assert total > SLOW / 2
    assert _counter_total(reg) == pytest.approx(total, rel=1e-9, abs=1e-9)


def _run_on_a_manual_clock(policy, spans, registry, *, workers: int = 2):
    """``_run``'s messages through a loop driven by hand (``poll``/``settle_ready``) on a manual
    clock, as a discrete-event run: each handler blocks on its gate and the test ends the one due
    first (its start + SLOW/FAST), moving the clock there only once the dispatcher is settled
    (every message it holds is in its handler, or waits while every worker runs one). So a worker
    that ends takes its next message at the same clock reading, however the threads are scheduled.

    Returns the finished spans, the registry and how many messages at most waited in the dispatcher."""
    provider, exporter = spans
    clock = ManualClock(time.time_ns())  # the broker stamps real wall time: the tracer's clock starts there
    consumer = _job_consumer()
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry), clock=clock)
    cond = threading.Condition()
    running: dict[int, tuple[int, threading.Event]] = {}  # handler call -> (due ns, gate)
    calls = 0

    def handler(m):
        nonlocal calls
        gate = threading.Event()
        with cond:
            me = calls
            calls += 1
            running[me] = (clock.now_ns() + int((SLOW if m.body == b"slow" else FAST) * 1e9), gate)
            cond.notify_all()
        assert gate.wait(30), "never released"

    loop = ConsumeLoop(consumer, handler, tracer=tracer, invisible_duration=30, workers=workers, policy=policy,
                       monotonic=lambda: clock.monotonic_ns() / 1e9)

    def settled():  # every message the dispatcher holds is in its handler, or it holds none
        s = loop.dispatcher.statistics()
        with cond:
            return len(running) == s.in_flight and (s.in_flight == workers or s.queued == 0)

    waited = 0
    try:
        for _ in range(4 * N):  # each round ends a handler, or receives into a free worker
            if loop.statistics().acked == N:
                break
            loop.poll()
            wait_until(settled, what="the workers to take what they can", timeout=30)
            waited = max(waited, loop.dispatcher.statistics().queued)
            loop.settle_ready()
            with cond:
                if not running:
                    continue
                first = min(running, key=lambda c: running[c][0])
                due, gate = running.pop(first)
            clock.advance(max(0, due - clock.now_ns()))
            done = loop.dispatcher.statistics().handled + 1
            gate.set()
            wait_until(lambda done=done: loop.dispatcher.statistics().handled >= done, what="its outcome", timeout=30)
            wait_until(settled, what="the freed worker to take the next", timeout=30)
            loop.settle_ready()
        assert loop.statistics().acked == N, loop.statistics()
    finally:
        with cond:
            for _, gate in running.values():
                gate.set()
        assert loop.dispatcher.close(timeout=10)
    return exporter.get_finished_spans(), registry, waited


@pytest.mark.parametrize("policy,queues", [("aggressive", False), (CostAware(window=4), True)],
                         ids=["aggressive", "cost_aware"])
def test_under_a_pool_policy_nothing_is_avoidable(policy, queues, spans, registry):
    """A shared queue: a message waits only while every worker runs, and the worker that ends takes
    it at that instant, so not one nanosecond of any wait is avoidable (on a manual clock: exact)."""
    finished, reg, waited = _run_on_a_manual_clock(policy, spans, registry)
    assert bool(waited) is queues, waited  # the loop receives only into room: aggressive's is the idle workers
    blamed = _blamed(finished, "full")
    assert len(blamed) == N
    assert [s.attributes[n.BLAME_AVOIDABLE_WAIT] for _, s in blamed] == [0.0] * N
    assert not any(n.BLAME_BLOCKER_MESSAGE_ID in s.attributes for _, s in blamed), "a shared queue binds no one"
    assert _counter_total(reg) == 0.0
    reasons = {s.attributes[n.BLAME_REASON] for _, s in blamed}
    # the cost-aware window holds messages while both workers run: they waited for capacity
    assert reasons == ({"none", "capacity"} if queues else {"none"}), reasons


def test_the_asyncio_engine_blames_the_same_way(spans, registry):
    """The sibling engine: one slow message then fast ones on one round-robin worker.

    On a manual clock that only the handlers move — each fast one by FAST; the slow one by SLOW,
    once both fast ones on the other worker have been reported — so the verdict is exact however
    the loop is scheduled (under load, real sleeps stretched the fast ones past half the wait)."""
    provider, exporter = spans
    clock = ManualClock()
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry), clock=clock)

    async def main():
        all_arrived = asyncio.Event()  # a worker may start before the next submit: the clock waits
        other_worker_done = asyncio.Event()

        async def handler(body):
            await all_arrived.wait()
            if body == "slow":
                await other_worker_done.wait()
                clock.advance_s(SLOW)
            else:
                clock.advance_s(FAST)

        def on_done(body, outcome, error):
            if body == "c":  # m3, the second of worker 1: it has ended (blame saw it) before on_done
                other_worker_done.set()

        d = AsyncDispatcher(handler, policy=RoundRobin(buffer=4), workers=2, clock=clock, on_done=on_done)
        for i, body in enumerate(["slow", "a", "b", "c"]):
            t = tracer.start_message(MessageInfo(topic="T", message_id=f"m{i}"))
            await d.submit(body, t)
        all_arrived.set()
        await d.close()

    asyncio.run(main())
    finished = exporter.get_finished_spans()
    waits = {s.context.trace_id: s for s in finished if s.name == n.BLAME_SPAN}
    ids = {s.context.trace_id: s.attributes[n.MESSAGE_ID] for s in finished if s.name == "process T"}
    handlers = {ids[s.context.trace_id]: s for s in finished if s.name == n.HANDLER_SPAN}
    victim = next(s for tid, s in waits.items() if ids[tid] == "m2")  # dealt to worker 0, behind m0
    assert victim.attributes[n.BLAME_REASON] == "head_of_line"
    assert victim.attributes[n.BLAME_BLOCKER_MESSAGE_ID] == "m0"
    assert victim.attributes[n.BLAME_AVOIDABLE_WAIT] > SLOW / 2
    # exactly: every message arrived at 0; worker 1 was available from its last end (2 x FAST)
    # plus the grace until m0 ended (2 x FAST + SLOW, on the one clock)
    assert victim.attributes[n.BLAME_AVOIDABLE_WAIT] == pytest.approx(SLOW - GRACE_NS / 1e9)
    assert [link.context.span_id for link in victim.links] == [handlers["m0"].context.span_id]


def test_the_otel_counter_adds_the_same_seconds(spans, registry):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from tracer.dispatch import Dispatcher
    from tracer.telemetry.otel_metrics import MessagingMeters

    provider, exporter = spans
    reader = InMemoryMetricReader()
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry))
    tracer.meters = MessagingMeters(MeterProvider(metric_readers=[reader]))
    d = Dispatcher(lambda body: work(SLOW if body == "slow" else FAST), policy=RoundRobin(buffer=4), workers=2)
    for i, body in enumerate(["slow", "a", "b", "c"]):
        d.submit(body, tracer.start_message(MessageInfo(topic="T", message_id=f"m{i}")))
    assert d.close(timeout=30)
    waits = [s for s in exporter.get_finished_spans() if s.name == n.BLAME_SPAN]
    total = sum(s.attributes[n.BLAME_AVOIDABLE_WAIT] for s in waits)
    points = [p for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "rmqtrace.consumer.avoidable_wait" for p in m.data.data_points]
    assert [p.attributes[n.DISPATCH_POLICY] for p in points] == ["round_robin"]
    assert points[0].value == pytest.approx(total) and total > SLOW / 2
    assert _counter_total(registry) == pytest.approx(total)


def test_the_dispatcher_snapshot_carries_the_blame_totals(spans, registry):
    from tracer.dispatch import Dispatcher

    provider, exporter = spans
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider)
    d = Dispatcher(lambda body: work(SLOW if body == "slow" else FAST), policy=RoundRobin(buffer=4), workers=2)
    assert d.statistics().blame is None  # nothing attached yet: no bookkeeping
    for i, body in enumerate(["slow", "a", "b", "c"]):
        d.submit(body, tracer.start_message(MessageInfo(topic="T", message_id=f"m{i}")))
    assert d.close(timeout=30)
    s = d.statistics().blame
    waits = [sp for sp in exporter.get_finished_spans() if sp.name == n.BLAME_SPAN]
    assert s is not None and s.started == 4 and s.waiting == 0 and s.head_of_line >= 1
    assert s.avoidable_s == pytest.approx(sum(sp.attributes[n.BLAME_AVOIDABLE_WAIT] for sp in waits))
