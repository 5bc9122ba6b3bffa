"""An engine holds a message only while it is the engine's business: both engines, one table.

An idle worker thread kept the last entry it ran (its item, its trace, a failure's traceback and
the frames in it) until it ran the next one; a ``submit(timeout=0)`` refused for want of room left
its arrival in live blame, entry, item and trace with it, on every retry (the consume loop retries
its backlog that way while the workers are busy: memory grew for as long as a handler hung)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import weakref
from typing import Any

import pytest

from tracer.dispatch import AsyncDispatcher, Dispatcher
from tracer.path.stages import Outcome, Stage


class Item:
    def __init__(self, fail: bool = False, gate: threading.Event | None = None) -> None:
        self.fail = fail
        self.gate = gate


class Trace:
    """What the engines call on a message's trace; any trace turns live blame on."""

    def mark(self, stage: Stage) -> None:
        pass

    def handler_scope(self) -> Any:
        return contextlib.nullcontext()

    def finish(self, outcome: Outcome, error: BaseException | None) -> None:
        pass


def _handle(item: Item) -> None:
    if item.gate is not None:
        item.gate.wait(30)
    if item.fail:
        raise RuntimeError("the handler failed")  # its traceback's frames name the item


async def _ahandle(item: Item) -> None:
    while item.gate is not None and not item.gate.is_set():
        await asyncio.sleep(0.001)
    if item.fail:
        raise RuntimeError("the handler failed")


def _thread_engine(scenario: Any) -> None:
    d: Dispatcher[Item] = Dispatcher(_handle, workers=1, name="memory")
    try:
        scenario(d, lambda: None)
    finally:
        d.close(timeout=10)


def _async_engine(scenario: Any) -> None:
    async def main() -> None:
        d: AsyncDispatcher[Item] = AsyncDispatcher(_ahandle, workers=1, name="memory")
        ops = asyncio.get_running_loop()
        try:
            await ops.run_in_executor(None, scenario, _Sync(d, ops), None)
        finally:
            await d.close(timeout=10)

    asyncio.run(main())


class _Sync:
    """The async engine's submit/wait_idle/statistics, called from a plain thread."""

    def __init__(self, d: AsyncDispatcher[Item], loop: asyncio.AbstractEventLoop) -> None:
        self.d, self.loop = d, loop

    def submit(self, item: Item, trace: Any = None, timeout: float | None = None) -> bool:
        return asyncio.run_coroutine_threadsafe(self.d.submit(item, trace, timeout=timeout), self.loop).result(10)

    def wait_idle(self, timeout: float | None = None) -> bool:
        return asyncio.run_coroutine_threadsafe(self.d.wait_idle(timeout), self.loop).result(30)

    def statistics(self) -> Any:
        return self.d.statistics()


ENGINES = {"thread": _thread_engine, "asyncio": _async_engine}


@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_an_idle_worker_keeps_no_message_alive(engine: str, fail: bool) -> None:
    refs: list[weakref.ref[Item]] = []

    def scenario(d: Any, _: Any) -> None:
        item = Item(fail=fail)
        refs.append(weakref.ref(item))
        assert d.submit(item, Trace())
        del item
        assert d.wait_idle(10)

    def check(d: Any, unused: Any) -> None:
        scenario(d, unused)
        gc.collect()
        assert refs[0]() is None, "the idle engine still holds the message it ran last"

    ENGINES[engine](check)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_refused_submit_leaves_nothing_in_live_blame(engine: str) -> None:
    def scenario(d: Any, _: Any) -> None:
        gate = threading.Event()
        assert d.submit(Item(gate=gate), Trace())  # the one worker is busy now: no room
        refused: list[weakref.ref[Item]] = []
        for _ in range(50):  # the consume loop's retries of its backlog while the handler hangs
            item = Item()
            refused.append(weakref.ref(item))
            assert not d.submit(item, Trace(), timeout=0)
            del item
        gc.collect()
        blame = d.statistics().blame
        assert blame is not None and blame.waiting == 0, blame  # not the 50 refused ones
        assert not [r for r in refused if r() is not None], "a refused submit's item is still held"
        gate.set()
        assert d.wait_idle(10)

    ENGINES[engine](scenario)
