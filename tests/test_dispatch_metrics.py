"""Dispatcher series read back from a fresh registry: counts, labels, gauges at scrape time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from waiting import wait_until

from tracer.dispatch import DEFAULT_BUCKETS, AsyncDispatcher, CostAware, Dispatcher, DispatchMetrics, RoundRobin
from tracer.path.clock import ManualClock
from tracer.path.stages import Outcome, Stage

WAIT = 10.0


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    labels.setdefault("consumer_group", "")  # every dispatcher series has it ("" for none)
    v = reg.get_sample_value(name, labels)
    return 0.0 if v is None else v


def test_slot_wait_count_equals_messages_handled_and_outcomes_counted() -> None:
    reg = CollectorRegistry()
    m = DispatchMetrics(reg)

    def handler(i: int) -> None:
        if i % 4 == 0:
            raise ValueError(i)

    with Dispatcher(handler, workers=3, metrics=m, on_done=lambda *a: None) as d:
        for i in range(100):
            d.submit(i)
    s = d.statistics()
    assert value(reg, "rmqtrace_dispatch_slot_wait_seconds_count", policy="aggressive", consumer_group="") == 100
    assert value(reg, "rmqtrace_dispatch_submit_blocked_seconds_count", policy="aggressive", consumer_group="") == 100
    done = {"policy": "aggressive", "consumer_group": ""}
    assert value(reg, "rmqtrace_dispatch_messages_total", **done, outcome="success") == s.handled == 75
    assert value(reg, "rmqtrace_dispatch_messages_total", **done, outcome="failure") == s.failed == 25
    for o in Outcome:  # every outcome child exists from the start (pre-bound)
        labels = {"policy": "aggressive", "consumer_group": "", "outcome": o.value}
        assert reg.get_sample_value("rmqtrace_dispatch_messages_total", labels) is not None


def test_slot_wait_measured_on_the_injected_clock() -> None:
    reg = CollectorRegistry()
    clock = ManualClock()
    started = threading.Event()
    release = threading.Event()

    def handler(i: int) -> None:
        if i == 0:
            started.set()
            assert release.wait(WAIT)

    d = Dispatcher(handler, workers=1, policy=CostAware(window=4), metrics=DispatchMetrics(reg), clock=clock)
    d.submit(0)
    assert started.wait(WAIT)
    d.submit(1)  # waits in the window...
    clock.advance_s(0.3)  # ...for 0.3 s of the injected clock
    release.set()
    d.close()
    assert value(reg, "rmqtrace_dispatch_slot_wait_seconds_sum", policy="cost_aware", consumer_group="") == pytest.approx(0.3)
    assert value(reg, "rmqtrace_dispatch_slot_wait_seconds_bucket", policy="cost_aware", consumer_group="", le="0.25") == 1
    assert value(reg, "rmqtrace_dispatch_slot_wait_seconds_bucket", policy="cost_aware", consumer_group="", le="0.5") == 2


def test_gauges_follow_live_dispatchers_and_are_summed_per_policy() -> None:
    reg = CollectorRegistry()
    m = DispatchMetrics(reg)
    started = threading.Event()
    release = threading.Event()

    def handler(i: int) -> None:
        started.set()
        assert release.wait(WAIT)

    a = Dispatcher(handler, workers=2, policy=CostAware(window=5), metrics=m)
    b = Dispatcher(handler, workers=3, policy=CostAware(window=5), metrics=m)
    a.submit(1)
    assert started.wait(WAIT)
    a.submit(2)
    a.submit(3)
    assert value(reg, "rmqtrace_dispatch_workers", policy="cost_aware", consumer_group="") == 5
    assert value(reg, "rmqtrace_dispatch_busy_workers", policy="cost_aware", consumer_group="") == 2
    assert value(reg, "rmqtrace_dispatch_queued_messages", policy="cost_aware", consumer_group="") == 1
    release.set()
    a.close()
    b.close()
    assert value(reg, "rmqtrace_dispatch_workers", policy="cost_aware", consumer_group="") == 0
    assert value(reg, "rmqtrace_dispatch_busy_workers", policy="cost_aware", consumer_group="") == 0


def test_buckets_and_shared_instance() -> None:
    assert DEFAULT_BUCKETS[0] == 0.001 and DEFAULT_BUCKETS[-1] == 600.0
    reg = CollectorRegistry()
    assert DispatchMetrics.shared(reg) is DispatchMetrics.shared(reg)
    with pytest.raises(ValueError):  # prometheus-client refuses duplicate series
        DispatchMetrics(reg)
    text = generate_latest(reg).decode()
    assert "rmqtrace_dispatch_slot_wait_seconds_bucket{" not in text  # no children yet
    assert "rmqtrace_dispatch_messages_total" in text


class ExemplarTrace:
    def mark(self, stage: Stage) -> None:
        pass

    @contextmanager
    def handler_scope(self) -> Iterator[object]:
        yield None

    def finish(self, outcome: Outcome, error: BaseException | None) -> None:
        pass

    def exemplar(self) -> dict[str, str]:
        return {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}


def test_slot_wait_carries_the_trace_exemplar() -> None:
    reg = CollectorRegistry()
    with Dispatcher(lambda i: None, workers=1, metrics=DispatchMetrics(reg)) as d:
        d.submit(1, ExemplarTrace())
    text = generate_openmetrics(reg).decode()
    assert '# {trace_id="4bf92f3577b34da6a3ce929d0e0e4736"}' in text


def test_no_unbounded_labels() -> None:
    reg = CollectorRegistry()
    with Dispatcher(lambda i: None, workers=2, metrics=DispatchMetrics(reg), key=str) as d:
        for i in range(50):
            d.submit(i)
    labelsets: set[tuple[Any, ...]] = set()
    for fam in reg.collect():
        for sample in fam.samples:
            labelsets.add(tuple(sorted(k for k in sample.labels if k != "le")))
    assert labelsets <= {("consumer_group", "outcome", "policy"), ("consumer_group", "policy")}


def test_gauge_sources_are_public_and_unbind_is_idempotent() -> None:
    reg = CollectorRegistry()
    m = DispatchMetrics(reg)
    d = Dispatcher(lambda i: None, workers=2, metrics=m)
    assert value(reg, "rmqtrace_dispatch_workers", policy="aggressive", consumer_group="") == 2
    assert m.sources_for("aggressive").workers() == 2.0
    d.close()
    d.close()
    assert m.sources_for("aggressive").workers() == 0.0


# -- #31 item 8: one series per consumer group -----------------------------------------------------
def test_gauges_of_two_consumer_groups_are_not_summed() -> None:
    """A saturated group beside an idle group of the same policy: before, one summed series read
    "1 queued, 2 of 3 busy" (head-of-line blocking nobody has); now each group has its own."""
    reg = CollectorRegistry()
    m = DispatchMetrics(reg)
    started = threading.Event()
    release = threading.Event()

    def handler(i: int) -> None:
        started.set()
        assert release.wait(WAIT)

    busy = Dispatcher(handler, workers=1, policy=CostAware(window=5), metrics=m, consumer_group="orders")
    idle = Dispatcher(handler, workers=2, policy=CostAware(window=5), metrics=m, consumer_group="audit")
    try:
        busy.submit(1)
        assert started.wait(WAIT)
        busy.submit(2)
        orders = {"policy": "cost_aware", "consumer_group": "orders"}
        audit = {"policy": "cost_aware", "consumer_group": "audit"}
        assert [value(reg, f"rmqtrace_dispatch_{s}", **orders) for s in ("workers", "busy_workers",
                                                                           "queued_messages")] == [1, 1, 1]
        assert [value(reg, f"rmqtrace_dispatch_{s}", **audit) for s in ("workers", "busy_workers",
                                                                          "queued_messages")] == [2, 0, 0]
    finally:
        release.set()
        busy.close()
        idle.close()


def test_consumer_group_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="consumer_group"):
        Dispatcher(lambda i: None, workers=1, metrics=DispatchMetrics(CollectorRegistry()),
                   consumer_group=None)  # type: ignore[arg-type]


def test_consume_loop_labels_its_dispatcher_with_the_tracers_group() -> None:
    from tracer.clients.consume import _group_of

    class Consumer:
        consumer_group = "from-consumer"

    class Tracer:
        consumer_group = "from-tracer"

    assert _group_of(Tracer(), Consumer()) == "from-tracer"  # type: ignore[arg-type]
    assert _group_of(None, Consumer()) == "from-consumer"
    assert _group_of(None, object()) == ""


# -- #32 item 1: worker-seconds that accrue, on both engines -----------------------------------------
class _ThreadDriver:
    """Drive a thread :class:`Dispatcher` whose handler ``i`` runs until ``release(i)``."""

    def __init__(self, metrics: DispatchMetrics, clock: ManualClock) -> None:
        self.gates: dict[int, threading.Event] = {}
        self.d: Dispatcher[int] = Dispatcher(self._handler, workers=2, policy=RoundRobin(buffer=4),
                                             metrics=metrics, clock=clock, consumer_group="g")

    def _handler(self, i: int) -> None:
        assert self.gates[i].wait(WAIT)

    def submit(self, i: int) -> None:
        self.gates[i] = threading.Event()
        assert self.d.submit(i)

    def release(self, i: int) -> None:
        self.gates[i].set()

    def close(self) -> None:
        for g in self.gates.values():
            g.set()
        self.d.close()


class _AsyncDriver:
    """Drive an :class:`AsyncDispatcher` on an event loop of its own thread, step by step."""

    def __init__(self, metrics: DispatchMetrics, clock: ManualClock) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gates: dict[int, asyncio.Event] = {}

        async def build() -> AsyncDispatcher[int]:
            return AsyncDispatcher(self._handler, workers=2, policy=RoundRobin(buffer=4), metrics=metrics,
                                   clock=clock, consumer_group="g")

        self.d = self._run(build())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    async def _handler(self, i: int) -> None:
        await self.gates[i].wait()

    def submit(self, i: int) -> None:
        async def go() -> None:
            self.gates[i] = asyncio.Event()
            assert await self.d.submit(i)
            for _ in range(5):
                await asyncio.sleep(0)  # let a worker take it

        self._run(go())

    def release(self, i: int) -> None:
        async def go() -> None:
            self.gates[i].set()

        self._run(go())

    def close(self) -> None:
        async def go() -> None:
            for g in self.gates.values():
                g.set()
            await self.d.close()

        try:
            self._run(go())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT)
            self.loop.close()


def _settle(reg: CollectorRegistry, busy: int, queued: int) -> None:
    """Wait until the engine has applied a release (a worker frees after its outcome is reported)."""
    labels = {"policy": "round_robin", "consumer_group": "g"}
    wait_until(lambda: (value(reg, "rmqtrace_dispatch_busy_workers", **labels),
                        value(reg, "rmqtrace_dispatch_queued_messages", **labels)) == (busy, queued),
               interval=0.001, what=f"the dispatcher at busy={busy} queued={queued}")


@pytest.mark.parametrize("driver", [_ThreadDriver, _AsyncDriver], ids=["threads", "asyncio"])
def test_worker_seconds_accrue_exactly_and_survive_close(driver: Any) -> None:
    """Round-robin, 2 workers: 0 → w0, 1 → w1, 2 → w0's buffer. On the injected clock:
    3 s all busy; 4 s w1 idle while 2 waits behind w0 (head-of-line); 5 s w0 runs 2, w1 idle,
    nothing waits (not head-of-line). Exact integrals: busy 2·3 + 1·4 + 1·5 = 15, hol 1·4 = 4;
    they stay after close (a closed dispatcher must not lower a counter)."""
    reg = CollectorRegistry()
    clock = ManualClock()
    drv = driver(DispatchMetrics(reg), clock)
    labels = {"policy": "round_robin", "consumer_group": "g"}

    def seconds() -> tuple[float, float]:
        return (value(reg, "rmqtrace_dispatch_busy_worker_seconds_total", **labels),
                value(reg, "rmqtrace_dispatch_hol_idle_worker_seconds_total", **labels))

    try:
        for i in range(3):
            drv.submit(i)
        _settle(reg, busy=2, queued=1)
        clock.advance_s(3)
        assert seconds() == pytest.approx((6.0, 0.0))
        drv.release(1)
        _settle(reg, busy=1, queued=1)
        clock.advance_s(4)
        assert seconds() == pytest.approx((10.0, 4.0))
        drv.release(0)
        _settle(reg, busy=1, queued=0)
        clock.advance_s(5)
        assert seconds() == pytest.approx((15.0, 4.0))
        drv.release(2)
        _settle(reg, busy=0, queued=0)
    finally:
        drv.close()
    clock.advance_s(100)
    assert seconds() == pytest.approx((15.0, 4.0))


def test_worker_seconds_never_go_down_across_scrapes() -> None:
    """Many scrapes racing a busy dispatcher: each counter reading is >= the one before."""
    reg = CollectorRegistry()
    m = DispatchMetrics(reg)
    labels = {"policy": "round_robin", "consumer_group": ""}
    seen = [0.0, 0.0]
    with Dispatcher(lambda i: None, workers=3, policy=RoundRobin(buffer=8), metrics=m) as d:
        for i in range(2000):
            d.submit(i)
            if i % 50 == 0:
                now = [value(reg, "rmqtrace_dispatch_busy_worker_seconds_total", **labels),
                       value(reg, "rmqtrace_dispatch_hol_idle_worker_seconds_total", **labels)]
                assert now[0] >= seen[0] and now[1] >= seen[1]
                seen = now
    final = value(reg, "rmqtrace_dispatch_busy_worker_seconds_total", **labels)
    assert final >= seen[0] > 0
