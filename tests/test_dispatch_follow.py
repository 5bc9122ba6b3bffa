"""``successors_follow``: a keyed message that ends without success takes its key's waiting
successors with it (SKIPPED, unrun, right after it), on both engines and under every policy — the
consume loop's per-key order (``tests/test_fifo_loop.py``). Without it (the default) they run.

Each case: ``k0`` holds its key while ``k1``, ``b`` (another key), ``k2``, ``k3`` and an unkeyed
``u`` are submitted behind it, then ends as the case says. Only ``k``'s messages follow it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from tracer.dispatch import AsyncDispatcher, CostAware, Dispatcher, NotStarted, RoundRobin
from tracer.path.clock import MonoNs
from tracer.path.stages import Outcome

ENGINES = ["threads", "asyncio"]
POLICIES = {"aggressive": "aggressive", "cost-aware": CostAware(window=8), "round-robin": RoundRobin(buffer=8)}
ITEMS = ["k0", "k1", "b", "k2", "k3", "u"]
HOUR = 3600.0


class _Clock:
    """Monotonic nanoseconds moved by hand: ``k0`` ends past its deadline without the watchdog's
    deadline having come on the real clock it sleeps by (its own worker reports the TIMEOUT)."""

    def __init__(self) -> None:
        self.ns = 0

    def monotonic_ns(self) -> MonoNs:
        return MonoNs(self.ns)


def _key(m: str) -> str | None:
    return None if m == "u" else m[0]


def _ending(how: str, clock: _Clock) -> None:
    """How ``k0``'s handler ends."""
    if how == "fails":
        raise RuntimeError("k0 fails")
    if how == "not-started":
        raise NotStarted("k0 is refused")
    if how == "late":
        clock.ns += int(2 * HOUR * 1e9)  # past handler_timeout: a TIMEOUT its worker reports


def _drive(engine: str, policy: str, how: str, follow: bool) -> tuple[list[tuple[str, Outcome]], Any]:
    clock = _Clock()
    got: list[tuple[str, Outcome]] = []
    kw: dict[str, Any] = dict(workers=2, policy=POLICIES[policy], key=_key, clock=clock, successors_follow=follow,
                              on_done=lambda m, o, e: got.append((m, o)), handler_timeout=HOUR)
    if engine == "threads":
        gate = threading.Event()

        def handler(m: str) -> None:
            if m == "k0":
                assert gate.wait(60)
                _ending(how, clock)

        d: Any = Dispatcher(handler, **kw)
        for m in ITEMS:
            assert d.submit(m, timeout=10)
        gate.set()
        assert d.close(timeout=60) is True
        return got, d.statistics()

    async def main() -> Any:
        agate = asyncio.Event()

        async def ahandler(m: str) -> None:
            if m == "k0":
                await agate.wait()
                _ending(how, clock)

        d = AsyncDispatcher(ahandler, **kw)
        for m in ITEMS:
            assert await d.submit(m, timeout=10)
        agate.set()
        assert await d.close(timeout=60) is True
        return d.statistics()

    return got, asyncio.run(main())


FIRST = {"fails": Outcome.FAILURE, "not-started": Outcome.NOT_STARTED, "late": Outcome.TIMEOUT}


@pytest.mark.parametrize("how", list(FIRST))
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("engine", ENGINES)
def test_a_keyed_message_that_does_not_succeed_takes_its_successors_back(engine: str, policy: str, how: str) -> None:
    got, stats = _drive(engine, policy, how, follow=True)
    mine = [(m, o) for m, o in got if m.startswith("k")]
    # fails before (no successors_follow): k1 k2 k3 SUCCESS, run past the failed k0
    assert mine == [("k0", FIRST[how]), ("k1", Outcome.SKIPPED), ("k2", Outcome.SKIPPED), ("k3", Outcome.SKIPPED)]
    assert sorted((m, o) for m, o in got if not m.startswith("k")) == [("b", Outcome.SUCCESS), ("u", Outcome.SUCCESS)]
    assert stats.skipped == 3 and stats.handled == 2 and stats.submitted == len(ITEMS)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("engine", ENGINES)
def test_without_successors_follow_a_key_runs_on_after_a_failure(engine: str, policy: str) -> None:
    got, stats = _drive(engine, policy, "fails", follow=False)
    assert [(m, o) for m, o in got if m.startswith("k")] == [
        ("k0", Outcome.FAILURE), ("k1", Outcome.SUCCESS), ("k2", Outcome.SUCCESS), ("k3", Outcome.SUCCESS)]
    assert stats.skipped == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_successors_follow_must_be_a_bool(engine: str) -> None:
    make: Any = Dispatcher if engine == "threads" else AsyncDispatcher

    async def handler(m: Any) -> None:
        return None

    with pytest.raises(TypeError, match="successors_follow"):
        make(handler if engine == "asyncio" else (lambda m: None), successors_follow="yes")
