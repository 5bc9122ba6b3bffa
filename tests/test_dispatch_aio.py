"""The asyncio engine: one message per worker task, back-pressure, keys, timeouts, life cycle."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tracer.dispatch import AsyncDispatcher, CostAware, DispatcherClosed, DispatchMetrics, HandlerTimeout
from tracer.path.stages import Outcome, Stage

WAIT = 10.0


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro_fn(), WAIT))


class Gates:
    def __init__(self) -> None:
        self.started: dict[Any, asyncio.Event] = collections.defaultdict(asyncio.Event)
        self.release: dict[Any, asyncio.Event] = collections.defaultdict(asyncio.Event)
        self.order: list[Any] = []
        self.tasks: dict[Any, asyncio.Task[Any] | None] = {}

    async def handler(self, item: Any) -> None:
        self.order.append(item)
        self.tasks[item] = asyncio.current_task()
        self.started[item].set()
        await self.release[item].wait()

    def open(self, *items: Any) -> None:
        for i in items:
            self.release[i].set()

    async def wait_started(self, *items: Any) -> None:
        for i in items:
            await self.started[i].wait()


async def until(cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0)  # real-time: zero-length, only yields to the event loop


def test_one_message_per_worker_and_back_pressure() -> None:
    async def main() -> None:
        g = Gates()
        d: AsyncDispatcher[str] = AsyncDispatcher(g.handler, workers=2)
        await d.submit("a")
        await d.submit("b")
        await g.wait_started("a", "b")
        assert d.free_slots() == 0
        assert await d.submit("x", timeout=0) is False
        pending = asyncio.ensure_future(d.submit("c"))
        await until(lambda: d.statistics().waiters == 1)
        assert not pending.done()
        g.open("a")
        assert await pending is True
        await g.wait_started("c")
        assert g.tasks["c"] is g.tasks["a"]  # the freed worker took it
        g.open("b", "c")
        await d.close()
        s = d.statistics()
        assert s.submitted == 3 == s.handled and s.in_flight == 0

    run(main)


def test_key_order_exclusion_and_other_keys_pass() -> None:
    async def main() -> None:
        g = Gates()
        d: AsyncDispatcher[str] = AsyncDispatcher(g.handler, workers=2, key=lambda s: s[0])
        for item in ("A1", "A2", "B1", "B2"):
            await d.submit(item)
        await g.wait_started("A1", "B1")
        g.open("B1", "B2")
        await g.wait_started("B2")
        assert "A2" not in g.order
        g.open("A1", "A2")
        await d.close()
        assert [x for x in g.order if x[0] == "A"] == ["A1", "A2"]

    run(main)


def test_cost_aware_and_exact_counts() -> None:
    async def main() -> None:
        g = Gates()
        got: list[tuple[Any, Outcome]] = []
        d: AsyncDispatcher[tuple[str, int]] = AsyncDispatcher(
            g.handler, workers=1, policy=CostAware(window=8), cost=lambda it: it[1],
            on_done=lambda i, o, e: got.append((i[0], o)),
        )  # fmt: skip
        await d.submit(("first", 0))
        await g.wait_started(("first", 0))
        for it in (("a", 1), ("b", 4), ("c", 2)):
            await d.submit(it)
        for it in (("first", 0), ("a", 1), ("b", 4), ("c", 2)):
            g.open(it)
        await d.close()
        assert [n for n, _ in g.order] == ["first", "b", "c", "a"]
        assert d.statistics().handled == d.statistics().submitted == 4 == len(got)

    run(main)


def test_failure_and_timeout_keep_workers_alive() -> None:
    async def main() -> None:
        got: list[tuple[int, Outcome, BaseException | None]] = []
        never = asyncio.Event()

        async def handler(i: int) -> None:
            if i == 0:
                raise ValueError("bad")
            if i == 1:
                await never.wait()  # cancelled by handler_timeout
            if i == 2:
                raise asyncio.CancelledError  # raised by the handler itself: a failure

        d: AsyncDispatcher[int] = AsyncDispatcher(
            handler, workers=1, handler_timeout=0.05, on_done=lambda i, o, e: got.append((i, o, e))
        )
        for i in range(4):
            await d.submit(i)
        await d.close()
        assert [(i, o) for i, o, _ in got] == [
            (0, Outcome.FAILURE),
            (1, Outcome.TIMEOUT),
            (2, Outcome.FAILURE),
            (3, Outcome.SUCCESS),
        ]
        assert isinstance(got[1][2], HandlerTimeout)
        s = d.statistics()
        assert s.submitted == s.handled + s.failed + s.timed_out == 4

    run(main)


def test_close_without_drain_skips_queued_and_rejects_submit() -> None:
    async def main() -> None:
        g = Gates()
        got: list[tuple[int, Outcome]] = []
        d: AsyncDispatcher[int] = AsyncDispatcher(
            g.handler, workers=1, policy=CostAware(window=4), on_done=lambda i, o, e: got.append((i, o))
        )
        for i in range(3):
            await d.submit(i)
        await g.wait_started(0)
        closing = asyncio.ensure_future(d.close(drain=False))
        await until(lambda: len(got) == 2)
        with pytest.raises(DispatcherClosed):
            await d.submit(9)
        g.open(0)
        await closing
        assert got == [(1, Outcome.SKIPPED), (2, Outcome.SKIPPED), (0, Outcome.SUCCESS)]
        assert d.statistics().live_workers == 0

    run(main)


class FakeTrace:
    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def mark(self, stage: Stage) -> None:
        self.log.append(("mark", stage))

    def handler_scope(self) -> Any:
        log = self.log

        class Scope:
            def __enter__(self) -> None:
                log.append("start")

            def __exit__(self, *a: object) -> None:
                log.append("end")

        return Scope()

    def finish(self, outcome: Outcome, error: BaseException | None) -> None:
        self.log.append(("finish", outcome))


def test_stamps_and_metrics() -> None:
    async def main() -> None:
        reg = CollectorRegistry()
        log: list[Any] = []

        async def handler(i: int) -> None:
            log.append("handler")

        async with AsyncDispatcher(handler, workers=2, metrics=DispatchMetrics(reg)) as d:
            await d.submit(1, FakeTrace(log))
            for i in range(9):
                await d.submit(i)
            assert await d.wait_idle(WAIT)
        assert log[:5] == [("mark", Stage.DISPATCH_ENQUEUE), "start", "handler", "end", ("finish", Outcome.SUCCESS)]
        n = reg.get_sample_value("rmqtrace_dispatch_slot_wait_seconds_count",
                                {"policy": "aggressive", "consumer_group": ""})
        assert n == d.statistics().handled == 10

    run(main)


def test_wait_for_free_slot() -> None:
    async def main() -> None:
        g = Gates()
        d: AsyncDispatcher[int] = AsyncDispatcher(g.handler, workers=1)
        await d.submit(1)
        await g.wait_started(1)
        assert await d.wait_for_free_slot(0.001) is False
        waiter = asyncio.ensure_future(d.wait_for_free_slot(WAIT))
        await asyncio.sleep(0)  # real-time: zero-length, lets the waiter register
        g.open(1)
        assert await waiter is True
        await d.close()
        assert await d.wait_for_free_slot(0) is False

    run(main)


def test_submit_after_close_starts_nothing() -> None:
    async def main() -> None:
        async def handler(i: int) -> None:
            pass

        d: AsyncDispatcher[int] = AsyncDispatcher(handler, workers=2)
        await d.close()
        with pytest.raises(DispatcherClosed):
            await d.submit(1)
        assert d.statistics().live_workers == 0

    run(main)


# ------------------------------------------------------------------------- edges (issue 11)
def test_worker_cancelled_while_holding_a_message_does_not_drop_the_next() -> None:
    async def main() -> None:
        g = Gates()
        got: list[tuple[Any, Outcome, BaseException | None]] = []
        d: AsyncDispatcher[str] = AsyncDispatcher(
            g.handler, workers=1, policy=CostAware(window=4), on_done=lambda i, o, e: got.append((i, o, e))
        )
        await d.submit("held")
        await d.submit("next")  # waits in the window for the only worker
        await g.wait_started("held")
        task = g.tasks["held"]
        assert task is not None
        task.cancel()  # the worker task itself, mid-handler
        await g.wait_started("next")  # a fresh task took the worker's next entry
        assert task.done() and task.cancelled()
        g.open("next")
        await d.close(timeout=WAIT)
        assert [(i, o) for i, o, _ in got] == [("held", Outcome.FAILURE), ("next", Outcome.SUCCESS)]
        assert isinstance(got[0][2], asyncio.CancelledError)
        s = d.statistics()
        assert s.submitted == 2 == s.handled + s.failed and s.in_flight == s.queued == 0

    run(main)


def test_worker_cancelled_while_idle_still_gets_messages() -> None:
    async def main() -> None:
        g = Gates()
        got: list[Outcome] = []
        d: AsyncDispatcher[str] = AsyncDispatcher(g.handler, workers=1, on_done=lambda i, o, e: got.append(o))
        g.open("first", "later")
        await d.submit("first")
        assert await d.wait_idle(WAIT)
        task = g.tasks["first"]
        assert task is not None
        task.cancel()  # idle, waiting for a hand-off
        await until(task.done)
        assert d.statistics().live_workers == 0
        await d.submit("later")
        await g.wait_started("later")
        await d.close(timeout=WAIT)
        assert got == [Outcome.SUCCESS, Outcome.SUCCESS]

    run(main)


def test_handler_swallowing_the_timeout_and_overrunning_is_a_timeout() -> None:
    async def main() -> None:
        got: list[tuple[Outcome, BaseException | None]] = []
        never = asyncio.Event()

        async def handler(i: int) -> None:
            try:
                await never.wait()
            except asyncio.CancelledError:
                pass  # swallowed: it "succeeds" late

        d: AsyncDispatcher[int] = AsyncDispatcher(
            handler, workers=1, handler_timeout=0.02, on_done=lambda i, o, e: got.append((o, e))
        )  # real-time: 20 ms of the loop's clock until the timeout cancels the handler
        await d.submit(1)
        await d.close()
        assert [o for o, _ in got] == [Outcome.TIMEOUT]
        assert isinstance(got[0][1], HandlerTimeout)
        assert d.statistics().timed_out == 1 and d.statistics().handled == 0

    run(main)


def test_overrun_on_the_injected_clock_is_a_timeout() -> None:
    from tracer.path.clock import ManualClock

    async def main() -> None:
        clock = ManualClock()
        got: list[Outcome] = []

        async def handler(i: int) -> None:
            clock.advance_s(5.0)

        d: AsyncDispatcher[int] = AsyncDispatcher(
            handler, workers=1, handler_timeout=1.0, clock=clock, on_done=lambda i, o, e: got.append(o)
        )
        await d.submit(1)
        await d.close()
        assert got == [Outcome.TIMEOUT]

    run(main)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_handler_base_exceptions_are_failures_and_the_worker_lives(exc: type[BaseException]) -> None:
    async def main() -> None:
        got: list[tuple[int, Outcome]] = []

        async def handler(i: int) -> None:
            if i == 0:
                raise exc

        d: AsyncDispatcher[int] = AsyncDispatcher(handler, workers=1, on_done=lambda i, o, e: got.append((i, o)))
        await d.submit(0)
        await d.submit(1)
        await d.close()
        assert got == [(0, Outcome.FAILURE), (1, Outcome.SUCCESS)]

    run(main)


def test_raising_key_and_bad_cost_fail_or_default_without_raising() -> None:
    async def main() -> None:
        g = Gates()
        got: list[tuple[Any, Outcome]] = []

        def key(it: tuple[str, Any]) -> str | None:
            if it[0] == "nokey":
                raise LookupError("no group")
            return None

        d: AsyncDispatcher[tuple[str, Any]] = AsyncDispatcher(
            g.handler, workers=1, policy=CostAware(window=8), key=key, cost=lambda it: it[1],
            on_done=lambda i, o, e: got.append((i[0], o)),
        )  # fmt: skip
        await d.submit(("first", 0))
        await g.wait_started(("first", 0))
        nan = float("nan")  # one object: NaN != NaN, the gates find it by identity
        for it in (("a", 1), ("nan", nan), ("nokey", 3), ("b", 4)):
            assert await d.submit(it) is True
        assert ("nokey", Outcome.NOT_STARTED) in got and d.statistics().cost_errors == 1
        for it in (("first", 0), ("a", 1), ("nan", nan), ("b", 4)):
            g.open(it)
        await d.close()
        assert [n for n, _ in g.order] == ["first", "b", "a", "nan"]
        assert d.statistics().not_started == 1 and d.statistics().failed == 0 and d.statistics().handled == 4

    run(main)


def test_trace_whose_worker_setter_raises_still_runs() -> None:
    async def main() -> None:
        log: list[Any] = []

        class Trace(FakeTrace):
            @property
            def worker(self) -> int:
                return 0

            @worker.setter
            def worker(self, value: int) -> None:
                raise RuntimeError("read-only")

        async def handler(i: int) -> None:
            log.append("handler")

        async with AsyncDispatcher(handler, workers=1) as d:
            await d.submit(1, Trace(log))
        assert log == [("mark", Stage.DISPATCH_ENQUEUE), "start", "handler", "end", ("finish", Outcome.SUCCESS)]

    run(main)
