"""Both engines in the incident (issue 18): a hung keyed handler, a slow key, a stop with a
timeout, a TIMEOUT racing close, handlers of the wrong kind, a handler submitting to its own pool.

Each test drives only the public API and fails on the engines as they were before the fix.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from waiting import wait_until

from tracer.dispatch import Aggressive, AsyncDispatcher, CostAware, Dispatcher, RoundRobin
from tracer.path.clock import ManualClock
from tracer.path.stages import Outcome

WAIT = 10.0


class Seen:
    """``on_done`` in order, with the thread-safe wait the tests need."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.got: list[tuple[Any, Outcome]] = []

    def on_done(self, item: Any, outcome: Outcome, error: BaseException | None) -> None:
        with self.cond:
            self.got.append((item, outcome))
            self.cond.notify_all()

    def outcome(self, item: Any) -> Outcome | None:
        with self.cond:
            return next((o for i, o in self.got if i == item), None)

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.got) >= n, WAIT), self.got


class Gates:
    def __init__(self) -> None:
        self.started: dict[Any, threading.Event] = {}
        self.release: dict[Any, threading.Event] = {}
        self.ran: list[Any] = []
        self.lock = threading.Lock()

    def _ev(self, d: dict[Any, threading.Event], x: Any) -> threading.Event:
        with self.lock:
            return d.setdefault(x, threading.Event())

    def handler(self, x: Any) -> None:
        with self.lock:
            self.ran.append(x)
        self._ev(self.started, x).set()
        assert self._ev(self.release, x).wait(WAIT)

    def wait_started(self, x: Any) -> None:
        assert self._ev(self.started, x).wait(WAIT), x

    def let(self, *xs: Any) -> None:
        for x in xs:
            self._ev(self.release, x).set()


@pytest.fixture
def gates() -> Iterator[Gates]:
    g = Gates()
    yield g
    g.let(*list(g.release), *list(g.started))
    with g.lock:
        for ev in g.release.values():
            ev.set()


# ------------------------------------------------------------------------- 1. a hung keyed handler
@pytest.mark.parametrize("policy", [Aggressive(max_parked=4), CostAware(window=4)], ids=["aggressive", "cost_aware"])
def test_hung_keyed_handler_gives_back_its_successors_and_frees_its_key(policy: Any, gates: Gates) -> None:
    clock = ManualClock()
    seen = Seen()
    d: Dispatcher[str] = Dispatcher(gates.handler, policy=policy, workers=2, key=lambda s: s[0],
                                    on_done=seen.on_done, handler_timeout=1.0, clock=clock)  # fmt: skip
    d.submit("A1")
    gates.wait_started("A1")
    assert d.submit("A2", timeout=0) and d.submit("A3", timeout=0)  # parked behind A1
    clock.advance_s(2.0)
    d.check_timeouts()
    seen.wait_for(3)
    # the successors follow the message given back, in arrival order, unrun
    assert seen.got == [("A1", Outcome.TIMEOUT), ("A2", Outcome.SKIPPED), ("A3", Outcome.SKIPPED)]
    # the key no longer waits for the hung thread: a later A (say, A1's redelivery) runs now
    gates.let("A4")
    assert d.submit("A4", timeout=0)
    seen.wait_for(4)
    assert seen.outcome("A4") is Outcome.SUCCESS and "A2" not in gates.ran
    # close(drain=True) does not wait for the overrun handler, nor for anything behind it
    assert d.close(drain=True, timeout=WAIT) is True
    assert d.statistics().overrun == 1
    gates.let("A1")


def test_hung_handler_round_robin_gives_back_its_buffer(gates: Gates) -> None:
    clock = ManualClock()
    seen = Seen()
    d: Dispatcher[str] = Dispatcher(gates.handler, policy=RoundRobin(buffer=2), workers=1,
                                    on_done=seen.on_done, handler_timeout=1.0, clock=clock)  # fmt: skip
    d.submit("x1")
    gates.wait_started("x1")
    d.submit("x2", timeout=0)
    clock.advance_s(2.0)
    d.check_timeouts()
    seen.wait_for(2)
    assert seen.got == [("x1", Outcome.TIMEOUT), ("x2", Outcome.SKIPPED)]
    assert d.close(timeout=WAIT) is True
    gates.let("x1")


def test_close_drain_gives_back_what_no_worker_can_take(gates: Gates) -> None:
    """Every worker held by an overrun handler: close(drain=True) returns; the queued one is SKIPPED."""
    clock = ManualClock()
    seen = Seen()
    d: Dispatcher[str] = Dispatcher(gates.handler, policy=CostAware(window=2), workers=1,
                                    on_done=seen.on_done, handler_timeout=1.0, clock=clock)  # fmt: skip
    d.submit("a")
    gates.wait_started("a")
    d.submit("b", timeout=0)  # in the window
    clock.advance_s(2.0)
    d.check_timeouts()
    seen.wait_for(1)
    done = threading.Event()

    def close() -> None:
        d.close(drain=True)
        done.set()

    threading.Thread(target=close, daemon=True).start()
    assert done.wait(WAIT), "close(drain=True) hung on a message queued behind an overrun handler"
    assert seen.got == [("a", Outcome.TIMEOUT), ("b", Outcome.SKIPPED)]
    gates.let("a")


async def _swallowing(gate: asyncio.Event, x: str) -> None:
    try:
        await gate.wait()
    except asyncio.CancelledError:
        await gate.wait()  # ignores its cancellation: hangs on


def test_async_hung_keyed_handler_is_reported_at_its_deadline_and_frees_its_key() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        seen = Seen()

        async def handler(x: str) -> None:
            if x == "A1":
                await _swallowing(gate, x)

        d: AsyncDispatcher[str] = AsyncDispatcher(handler, workers=2, key=lambda s: s[0],
                                                  on_done=seen.on_done, handler_timeout=0.05)  # fmt: skip
        await d.submit("A1")
        assert await d.submit("A2", timeout=0)
        await asyncio.sleep(0.3)
        assert seen.got == [("A1", Outcome.TIMEOUT), ("A2", Outcome.SKIPPED)]
        assert d.overrun() and not d.running()
        assert await d.submit("A3", timeout=0)
        await asyncio.sleep(0.05)
        assert seen.outcome("A3") is Outcome.SUCCESS
        assert await d.close(timeout=WAIT) is True
        gate.set()
        await asyncio.sleep(0)

    asyncio.run(main())


# -------------------------------------------------------------------------- 2. one slow key
def test_a_slow_key_with_full_parking_does_not_stop_other_keys(gates: Gates) -> None:
    """The engine half: a refused keyed message never blocks admission of the others."""
    seen = Seen()
    d: Dispatcher[str] = Dispatcher(gates.handler, policy=Aggressive(max_parked=2), workers=3,
                                    key=lambda s: None if s.startswith("u") else s[0], on_done=seen.on_done)  # fmt: skip
    d.submit("A1")
    gates.wait_started("A1")
    assert d.submit("A2", timeout=0) and d.submit("A3", timeout=0)  # the parking room is full
    assert not d.submit("A4", timeout=0)  # refused, nothing changed
    assert d.free_slots() == 2
    gates.let("B1", "u1", "u2", "B2")
    for x in ("B1", "u1", "B2", "u2"):
        assert d.submit(x, timeout=WAIT), x
    seen.wait_for(4)
    assert {i for i, _ in seen.got} == {"B1", "u1", "B2", "u2"}
    gates.let("A1", "A2", "A3")
    assert d.close(timeout=WAIT) is True


# ------------------------------------------------------------- 5. stop with a timeout: no late starts
@pytest.mark.parametrize("policy", [Aggressive(max_parked=4), CostAware(window=4)], ids=["aggressive", "cost_aware"])
def test_close_timeout_gives_back_everything_not_started(policy: Any, gates: Gates) -> None:
    seen = Seen()
    d: Dispatcher[str] = Dispatcher(gates.handler, policy=policy, workers=1, key=lambda s: "k",
                                    on_done=seen.on_done)  # fmt: skip
    d.submit("m0")
    gates.wait_started("m0")
    for x in ("m1", "m2", "m3"):
        assert d.submit(x, timeout=0)
    settled = d.close(drain=True, timeout=0.05)
    assert seen.got == [("m1", Outcome.SKIPPED), ("m2", Outcome.SKIPPED), ("m3", Outcome.SKIPPED)]
    assert settled is False  # m0 still runs
    gates.let("m0", "m1", "m2", "m3")
    seen.wait_for(4)
    time.sleep(0.05)  # real-time: room for a late start to show
    assert gates.ran == ["m0"], "a queued handler started after close(timeout) returned"
    assert seen.outcome("m0") is Outcome.SUCCESS


def test_async_close_timeout_gives_back_everything_not_started() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        ran: list[int] = []
        seen = Seen()

        async def handler(x: int) -> None:
            ran.append(x)
            await gate.wait()

        d: AsyncDispatcher[int] = AsyncDispatcher(handler, policy=CostAware(window=4), workers=1,
                                                  on_done=seen.on_done)  # fmt: skip
        for x in range(4):
            assert await d.submit(x, timeout=0)
        await asyncio.sleep(0.01)
        settled = await d.close(timeout=0.05)
        assert seen.got == [(1, Outcome.SKIPPED), (2, Outcome.SKIPPED), (3, Outcome.SKIPPED)]
        assert settled is False
        gate.set()
        await asyncio.sleep(0.05)
        assert ran == [0] and seen.outcome(0) is Outcome.SUCCESS

    asyncio.run(main())


# ------------------------------------------------------------------ 6. a TIMEOUT racing close()
def test_close_returns_only_after_a_timeout_was_delivered(gates: Gates) -> None:
    clock = ManualClock()
    order: list[str] = []
    in_on_done = threading.Event()
    let_on_done = threading.Event()

    def on_done(item: str, outcome: Outcome, error: BaseException | None) -> None:
        if outcome is Outcome.TIMEOUT:
            in_on_done.set()
            assert let_on_done.wait(WAIT)
            order.append("on_done returned")

    d: Dispatcher[str] = Dispatcher(gates.handler, workers=1, on_done=on_done, handler_timeout=1.0, clock=clock)
    d.submit("x")
    gates.wait_started("x")
    clock.advance_s(2.0)
    threading.Thread(target=d.check_timeouts, daemon=True).start()
    assert in_on_done.wait(WAIT)
    def close() -> None:
        d.close(timeout=WAIT)
        order.append("close returned")

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    closer.join(0.2)  # real-time: close must still be waiting for the outcome being delivered
    let_on_done.set()
    closer.join(WAIT)
    assert order == ["on_done returned", "close returned"]
    gates.let("x")


# ---------------------------------------------------------------- 7. handlers of the wrong kind
async def _async_fn(x: object) -> None:
    pass


def _gen_fn(x: object) -> Iterator[None]:
    yield None


async def _async_gen_fn(x: object) -> AsyncIterator[None]:
    yield None


class _AsyncCall:
    async def __call__(self, x: object) -> None:
        pass


def _plain(x: object) -> None:
    pass


@pytest.mark.parametrize("fn", [_async_fn, _gen_fn, _async_gen_fn, _AsyncCall()], ids=["async", "gen", "agen", "acall"])
@pytest.mark.parametrize("where", ["handler", "key", "cost", "on_done"])
def test_thread_engine_refuses_callables_that_would_not_run(fn: Any, where: str) -> None:
    kw: dict[str, Any] = {} if where == "handler" else {where: fn}
    with pytest.raises(TypeError, match="plain function"):
        Dispatcher(fn if where == "handler" else _plain, workers=1, **kw)


@pytest.mark.parametrize("fn", [_plain, _gen_fn, _async_gen_fn, print], ids=["plain", "gen", "agen", "builtin"])
def test_asyncio_engine_refuses_a_handler_that_is_not_async_def(fn: Any) -> None:
    with pytest.raises(TypeError, match="async def"):
        AsyncDispatcher(fn, workers=1)


@pytest.mark.parametrize("where", ["key", "cost", "on_done"])
def test_asyncio_engine_refuses_async_key_cost_on_done(where: str) -> None:
    with pytest.raises(TypeError, match="plain function"):
        kw: dict[str, Any] = {where: _async_fn}
        AsyncDispatcher(_async_fn, workers=1, **kw)


def test_wrapped_async_handler_is_seen_through() -> None:
    from tracer.clients.probe import skip_probes

    with pytest.raises(TypeError, match="plain function"):
        Dispatcher(skip_probes(_async_fn), workers=1)
    AsyncDispatcher(_AsyncCall(), workers=1)  # an object with an async __call__ is fine


# ----------------------------------------------------------------------------------- 8. smalls
def test_async_timed_out_waits_leave_no_future_behind() -> None:
    async def main() -> None:
        gate = asyncio.Event()

        async def handler(x: int) -> None:
            await gate.wait()

        d: AsyncDispatcher[int] = AsyncDispatcher(handler, workers=1)
        await d.submit(0)
        for _ in range(50):
            assert not await d.wait_for_free_slot(timeout=0.0001)
        assert len(d._watch_futs) == 0  # each timed-out wait took its future with it
        gate.set()
        await d.close()

    asyncio.run(main())


def test_a_handler_submitting_to_its_own_full_dispatcher_is_refused() -> None:
    errors: list[BaseException] = []
    done = threading.Event()
    holder: list[Dispatcher[int]] = []

    def handler(x: int) -> None:
        if x == 0:
            try:
                holder[0].submit(1)
            except RuntimeError as exc:
                errors.append(exc)
            done.set()

    d: Dispatcher[int] = Dispatcher(handler, workers=1)
    holder.append(d)
    d.submit(0)
    assert done.wait(2.0), "the handler blocked its own worker"
    assert "own worker" in str(errors[0])
    assert d.close(timeout=WAIT) is True


def test_an_async_handler_submitting_to_its_own_full_dispatcher_is_refused() -> None:
    async def main() -> None:
        errors: list[BaseException] = []
        holder: list[AsyncDispatcher[int]] = []
        tried = asyncio.Event()

        async def handler(x: int) -> None:
            if x == 0:
                try:
                    await holder[0].submit(1)
                except RuntimeError as exc:
                    errors.append(exc)
                tried.set()

        d: AsyncDispatcher[int] = AsyncDispatcher(handler, workers=1)
        holder.append(d)
        await d.submit(0)
        # close() only once the handler has tried: a closed dispatcher refuses with DispatcherClosed
        # first. (3.12's wait_for runs close() in this task at once, 3.11's in a new task that let
        # the worker go first, so without this the test passed on 3.11 only.)
        await asyncio.wait_for(tried.wait(), 2.0)
        settled = await asyncio.wait_for(d.close(), 2.0)
        assert errors and "own worker" in str(errors[0]), errors
        assert settled is True

    asyncio.run(main())


# --------------------------------------------------------------------- 4. one frozen snapshot
@pytest.mark.parametrize("engine", ["thread", "asyncio"])
def test_statistics_is_one_frozen_snapshot(engine: str) -> None:
    async def ahandler(x: int) -> None:
        pass

    async def run_async() -> tuple[Any, Any]:
        d: AsyncDispatcher[int] = AsyncDispatcher(ahandler, workers=1)
        before = d.statistics()
        await d.submit(1)
        await d.close()
        return before, d.statistics()

    if engine == "thread":
        d: Dispatcher[int] = Dispatcher(_plain, workers=1)
        before = d.statistics()
        d.submit(1)
        d.close()
        after = d.statistics()
    else:
        before, after = asyncio.run(run_async())
    assert before.submitted == 0 and after.submitted == after.handled == 1  # before did not move
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.handled = 5  # type: ignore[misc]
    assert not hasattr(Dispatcher, "stats") and not hasattr(AsyncDispatcher, "stats")


def test_every_dispatch_outcome_waits_for_wait_idle_too() -> None:
    """wait_idle is True only once the outcomes it counted were delivered (the same rule as close)."""
    release = threading.Event()
    entered = threading.Event()

    def on_done(item: int, outcome: Outcome, error: BaseException | None) -> None:
        entered.set()
        assert release.wait(WAIT)

    d: Dispatcher[int] = Dispatcher(lambda x: None, workers=1, key=lambda x: 1 / 0, on_done=on_done)  # type: ignore[arg-type, return-value]
    t = threading.Thread(target=d.submit, args=(1,), daemon=True)
    t.start()
    assert entered.wait(WAIT)
    assert d.wait_idle(timeout=0.05) is False
    release.set()
    t.join(WAIT)
    wait_until(lambda: d.wait_idle(timeout=0))
    d.close()
