"""Faults at the dispatcher's edges (issue #30): junk from ``cost=``, unbounded and invalid close
timeouts, handlers that return something that never ran, gauges after a restart. Both engines."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from tracer.dispatch import AsyncDispatcher, CostAware, Dispatcher
from tracer.path.stages import Outcome

ENGINES = ["threads", "asyncio"]


def _drive(engine: str, items: list[Any], *, cost: Callable[[Any], Any] | None = None,
           policy: Any = "aggressive", workers: int = 1) -> tuple[list[tuple[Any, Outcome]], Any]:
    """Submit ``items`` to a new dispatcher of ``engine``, close it (drain); the outcomes, the stats."""
    got: list[tuple[Any, Outcome]] = []

    def on_done(item: Any, outcome: Outcome, error: BaseException | None) -> None:
        got.append((item, outcome))

    if engine == "threads":
        d: Any = Dispatcher(lambda m: None, workers=workers, policy=policy, cost=cost, on_done=on_done)
        for it in items:
            d.submit(it)
        assert d.close() is True
        return got, d.statistics()

    async def handler(m: Any) -> None:
        return None

    async def main() -> Any:
        d = AsyncDispatcher(handler, workers=workers, policy=policy, cost=cost, on_done=on_done)
        for it in items:
            await d.submit(it)
        assert await d.close() is True
        return d.statistics()

    return got, asyncio.run(main())


class _BadFloat(float):
    """A number whose float() raises: ``numbers.Real`` passes, the conversion does not."""

    def __float__(self) -> float:
        raise ArithmeticError("no float")


# #30 item 10: every cost that cannot be a finite non-negative float
JUNK_COSTS = {
    "huge-int": 10**400,  # float() raises OverflowError
    "too-long-to-repr": 10**5000,  # repr() itself raises ValueError (int max str digits)
    "huge-fraction": Fraction(10**400, 3),
    "neg-huge-int": -(10**400),
    "nan": math.nan,
    "inf": math.inf,
    "negative": -1,
    "str": "3",
    "none": None,
    "bool": True,
    "complex": 1j,
    "float-raises": _BadFloat(1.0),
}


@pytest.mark.parametrize("junk", list(JUNK_COSTS))
@pytest.mark.parametrize("engine", ENGINES)
def test_a_cost_that_is_no_finite_number_takes_cost_zero_and_never_raises(engine: str, junk: str) -> None:
    value = JUNK_COSTS[junk]
    # fails before (huge-int, huge-fraction, neg-huge-int, float-raises): OverflowError/ArithmeticError out of submit
    got, s = _drive(engine, ["junk", "ok"], cost=lambda m: value if m == "junk" else 2.0,
                    policy=CostAware(window=4))
    assert sorted(got) == [("junk", Outcome.SUCCESS), ("ok", Outcome.SUCCESS)]
    assert s.cost_errors == 1 and s.handled == 2


# #30 item 9: math.inf is "no bound" wherever a timeout is taken; NaN (and a negative close) is refused
def _timeouts_on(engine: str, call: Callable[[Any], Any]) -> Any:
    """``call(d)`` (awaited for asyncio) on a 2-worker dispatcher with one message run; then close it."""
    if engine == "threads":
        d: Any = Dispatcher(lambda m: None, workers=2)
        d.submit("a")
        try:
            return call(d)
        finally:
            d.close()

    async def handler(m: Any) -> None:
        return None

    async def main() -> Any:
        d = AsyncDispatcher(handler, workers=2)
        await d.submit("a")
        try:
            return await call(d)
        finally:
            await d.close()

    return asyncio.run(main())


INF_CALLS: dict[str, Callable[[Any], Any]] = {
    "close": lambda d: d.close(timeout=math.inf),
    "close-no-drain": lambda d: d.close(drain=False, timeout=math.inf),
    "close-huge": lambda d: d.close(timeout=1e300),  # past threading.TIMEOUT_MAX: OverflowError in a wait
    "wait_idle": lambda d: d.wait_idle(timeout=math.inf),
    "wait_for_free_slot": lambda d: d.wait_for_free_slot(timeout=math.inf),
    "submit": lambda d: d.submit("b", timeout=math.inf),
}


@pytest.mark.parametrize("call", list(INF_CALLS))
@pytest.mark.parametrize("engine", ENGINES)
def test_an_infinite_timeout_means_no_bound(engine: str, call: str) -> None:
    # fails before: OverflowError (int(inf * 1e9)) from every one of them
    assert _timeouts_on(engine, INF_CALLS[call]) is True


@pytest.mark.parametrize("engine", ENGINES)
def test_close_with_an_infinite_timeout_ends_every_worker(engine: str) -> None:
    def call(d: Any) -> Any:
        settled = d.close(timeout=math.inf)
        if engine == "threads":
            return settled, d.statistics().live_workers

        async def after() -> Any:
            return await settled, d.statistics().live_workers
        return after()

    assert _timeouts_on(engine, call) == (True, 0)  # fails before: OverflowError, the workers leak


BAD_TIMEOUTS: dict[str, Callable[[Any, float], Any]] = {
    "close": lambda d, t: d.close(timeout=t),
    "wait_idle": lambda d, t: d.wait_idle(timeout=t),
    "wait_for_free_slot": lambda d, t: d.wait_for_free_slot(timeout=t),
    "submit": lambda d, t: d.submit("b", timeout=t),
}


@pytest.mark.parametrize("bad", [math.nan, -1.0], ids=["nan", "negative"])
@pytest.mark.parametrize("call", list(BAD_TIMEOUTS))
@pytest.mark.parametrize("engine", ENGINES)
def test_a_nan_or_negative_close_timeout_is_refused_before_anything_changes(engine: str, call: str, bad: float) -> None:
    if bad < 0 and call != "close":
        pytest.skip("a negative wait or submit timeout means: do not wait (documented)")

    def refused(d: Any) -> Any:
        with pytest.raises(ValueError, match="timeout"):
            BAD_TIMEOUTS[call](d, bad)
        return not d.closed

    async def refused_async(d: Any) -> Any:
        with pytest.raises(ValueError, match="timeout"):
            await BAD_TIMEOUTS[call](d, bad)
        return not d.closed

    # fails before: close(nan) closed the dispatcher (or raised OverflowError); submit(nan) was taken
    assert _timeouts_on(engine, refused if engine == "threads" else refused_async) is True


# #30 item 12: a closed dispatcher leaves the gauges, even when close() gave up on hung handlers
def _gauges(registry: Any) -> tuple[float | None, float | None]:
    def total(name: str) -> float | None:  # over every consumer_group of the policy
        found = [s.value for m in registry.collect() for s in m.samples
                 if s.name == name and s.labels.get("policy") == "aggressive"]
        return sum(found) if found else None
    return total("rmqtrace_dispatch_workers"), total("rmqtrace_dispatch_busy_workers")


def test_after_a_bounded_close_with_hung_handlers_the_gauges_show_only_the_new_pool() -> None:
    from prometheus_client import CollectorRegistry

    from tracer.dispatch import DispatchMetrics

    registry = CollectorRegistry()
    metrics = DispatchMetrics(registry)
    release = threading.Event()
    started = threading.Semaphore(0)

    def hang(m: Any) -> None:
        started.release()
        release.wait()

    old = Dispatcher(hang, workers=4, metrics=metrics)
    try:
        for i in range(4):
            old.submit(i)
        for _ in range(4):
            assert started.acquire(timeout=10)  # all four run (and hang)
        assert old.close(timeout=0) is False
        new = Dispatcher(lambda m: None, workers=4, metrics=metrics)
        # fails before: (8.0, 4.0) — the closed pool's hung threads counted as the new one's
        assert _gauges(registry) == (4.0, 0.0)
        assert new.close() is True
        assert _gauges(registry) == (0.0, 0.0)
    finally:
        release.set()


def test_after_a_bounded_close_with_hung_tasks_the_gauges_show_only_the_new_pool() -> None:
    from prometheus_client import CollectorRegistry

    from tracer.dispatch import DispatchMetrics

    registry = CollectorRegistry()
    metrics = DispatchMetrics(registry)

    async def main() -> None:
        release = asyncio.Event()

        async def hang(m: Any) -> None:
            await release.wait()

        async def quick(m: Any) -> None:
            return None

        old = AsyncDispatcher(hang, workers=4, metrics=metrics)
        for i in range(4):
            await old.submit(i)
        await asyncio.sleep(0)
        assert await old.close(timeout=0) is False
        new = AsyncDispatcher(quick, workers=4, metrics=metrics)
        await new.submit("x")
        assert await new.wait_idle(timeout=None)
        try:
            assert _gauges(registry) == (4.0, 0.0)  # fails before: (8.0, 4.0)
        finally:
            release.set()
            assert await new.close() is True
            await old.wait_idle(timeout=None)

    asyncio.run(main())


def test_a_restarted_loop_after_a_bounded_stop_with_hung_handlers_shows_one_pool() -> None:
    """The issue's scenario: stop(timeout=) with every handler hung, a new loop on the same
    consumer and the same DispatchMetrics — one idle 4-worker pool read as 8 workers, 4 busy."""
    from prometheus_client import CollectorRegistry
    from test_consume import pipeline, run_in_thread
    from waiting import wait_until

    from tracer import ConsumeLoop
    from tracer.dispatch import DispatchMetrics

    registry = CollectorRegistry()
    metrics = DispatchMetrics(registry)
    release = threading.Event()
    started = threading.Semaphore(0)

    def hang(m: Any) -> None:
        started.release()
        release.wait(30)

    _broker, first = pipeline(4, hang, workers=4, dispatch_metrics=metrics)
    t = run_in_thread(first)
    try:
        for _ in range(4):
            assert started.acquire(timeout=10)
        first.stop(timeout=0.1)
        t.join(10)
        assert not t.is_alive()
        second = ConsumeLoop(first.consumer, lambda m: None, workers=4, dispatch_metrics=metrics)
        t2 = run_in_thread(second)
        wait_until(lambda: _gauges(registry)[0] is not None, what="the gauges")
        assert _gauges(registry) == (4.0, 0.0)  # fails before: (8.0, 4.0)
        second.stop(timeout=5)
        t2.join(10)
    finally:
        release.set()
