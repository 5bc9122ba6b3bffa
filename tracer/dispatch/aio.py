"""The asyncio engine: the same policies, stamps, metrics and rules for ``async`` handlers.

Only the concurrent half lives here; validation, counters, admission and its fairness, the
exception and timeout rules and reporting are :mod:`.core`'s, shared with the thread engine.
Workers are tasks of the running loop (created on first use); hand-off sets the worker's
``asyncio.Event``. Everything runs on the loop, so nothing needs a lock. A submitter that finds
no room waits on a future as a :class:`.core.Waiter`; whoever frees room admits waiters
(:meth:`.core.Core.admit_waiters_locked`: oldest first, each one that fits) and resolves them.

Differences from the thread engine (:class:`.engine.Dispatcher`):

* ``handler_timeout`` *cancels* the handler (``asyncio.timeout``) at its deadline on the event
  loop's clock; the message's outcome is ``Outcome.TIMEOUT`` with a :class:`.HandlerTimeout`,
  also when the handler swallows the cancellation and returns later (it keeps its worker until
  then), and when the injected clock says it overran.
* Worker tasks and cancellation: a worker task cancelled while it runs a handler reports that
  message ``FAILURE`` (the ``CancelledError`` is the error) and ends; the entry the policy gives
  it next, if any, runs on a fresh task for that worker. A worker task cancelled while idle
  ends; the next message handed to that worker starts a fresh task. So a cancelled worker never
  strands a message. Close the dispatcher before its loop ends: a loop that shuts down cancels
  the workers and the messages still queued then get no outcome.
* ``on_done`` and the trace methods are plain (synchronous) callables, as in the thread engine.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, cast

from ..path.clock import Clock
from ..path.stages import Outcome
from .core import Core, Waiter, WaitState, WouldBlock
from .metrics import DispatchMetrics
from .policy import Policy
from .protocol import DispatchStats, MessageTraceLike
from .scheduler import Entry

__all__ = ["AsyncDispatcher"]

T = TypeVar("T")

logger = logging.getLogger("tracer.dispatch")

_FAILURE = Outcome.FAILURE

if sys.version_info >= (3, 11):
    _timeout = asyncio.timeout
else:  # pragma: no cover - Python 3.10

    class _timeout:
        """The part of 3.11's ``asyncio.timeout`` used here: cancel the task at the deadline."""

        def __init__(self, delay: float) -> None:
            self._delay = delay
            self._expired = False
            self._handle: asyncio.TimerHandle | None = None

        def expired(self) -> bool:
            return self._expired

        async def __aenter__(self) -> _timeout:
            task = asyncio.current_task()
            assert task is not None

            def fire() -> None:
                self._expired = True
                task.cancel()

            self._handle = asyncio.get_running_loop().call_later(self._delay, fire)
            return self

        async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
            if self._handle is not None:
                self._handle.cancel()
            if self._expired and et is asyncio.CancelledError:
                raise asyncio.TimeoutError from e


def _being_cancelled(task: asyncio.Task[Any] | None) -> bool:
    """Whether ``task`` itself is being cancelled (3.10 cannot tell: assume it is)."""
    if task is None:
        return False
    cancelling = getattr(task, "cancelling", None)
    return True if cancelling is None else bool(cancelling())


class _AioWorker:
    __slots__ = ("entry", "event", "index", "running", "task")

    def __init__(self, index: int) -> None:
        self.index = index
        self.event = asyncio.Event()
        self.entry: Entry[Any] | None = None  # the hand-off box
        self.running: tuple[Entry[Any], int] | None = None  # (entry, start ns)
        self.task: asyncio.Task[None] | None = None


class _AioWaiter(Waiter):
    __slots__ = ("fut",)

    def __init__(self, entry: Entry[Any], t0: int, fut: asyncio.Future[None]) -> None:
        super().__init__(entry, t0)
        self.fut = fut

    def alive(self) -> bool:
        return not self.fut.done()  # a cancelled submit is no longer waiting

    def wake(self) -> None:
        if not self.fut.done():
            self.fut.set_result(None)


class AsyncDispatcher(Generic[T]):
    """Run ``async handler(item)`` on ``workers`` tasks under a dispatch ``policy``.

    Same parameters, meaning and rules as :class:`.engine.Dispatcher`; create it anywhere, use it
    from one event loop.

    Raises:
        ValueError: ``workers`` < 1, ``handler_timeout`` not a finite number > 0, unknown policy.
        TypeError: ``handler``, ``key``, ``cost`` or ``on_done`` is not callable.
    """

    def __init__(
        self,
        handler: Callable[[T], Awaitable[object]],
        *,
        policy: Policy | str = "aggressive",
        workers: int = 8,
        key: Callable[[T], str | None] | None = None,
        cost: Callable[[T], float] | None = None,
        on_done: Callable[[T, Outcome, BaseException | None], None] | None = None,
        metrics: DispatchMetrics | None = None,
        handler_timeout: float | None = None,
        clock: Clock | None = None,
        name: str = "rmqtrace",
    ) -> None:
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {type(handler).__name__}")
        self._core: Core[T] = Core(
            policy=policy, workers=workers, key=key, cost=cost, on_done=on_done, metrics=metrics,
            handler_timeout=handler_timeout, clock=clock, name=name, kind="async dispatcher",
        )  # fmt: skip
        self._sched = self._core.sched
        self._handler = handler
        self._name = name
        self._n_workers = workers
        self._workers: list[_AioWorker] | None = None
        self._watch_futs: list[asyncio.Future[None]] = []  # watchers (wait_until)

    @property
    def policy(self) -> Policy:
        return self._core.policy

    @property
    def workers(self) -> int:
        return self._n_workers

    @property
    def closed(self) -> bool:
        return self._core.closed

    def _started(self) -> list[_AioWorker]:
        ws = self._workers
        if ws is None:
            ws = self._workers = [_AioWorker(i) for i in range(self._n_workers)]
            for w in ws:
                self._spawn(w)
        return ws

    def _spawn(self, w: _AioWorker) -> None:
        w.task = asyncio.get_running_loop().create_task(self._loop(w), name=f"{self._name}-dispatch-{w.index}")
        if w.entry is not None:
            w.event.set()

    def _hand(self, r: int, e: Entry[Any]) -> None:
        w = self._started()[r]
        w.entry = e
        if w.task is None or w.task.done():
            self._spawn(w)  # its task was cancelled while idle: a fresh one takes the message
        else:
            w.event.set()

    # ----------------------------------------------------------------------------------- waiting
    def _notify(self) -> None:
        futs = self._watch_futs
        if futs:
            self._watch_futs = []
            for f in futs:
                if not f.done():
                    f.set_result(None)

    async def _wait_until(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        core = self._core
        deadline = core.deadline(timeout)
        core.watchers += 1
        try:
            while not ready():
                left = core.remaining(deadline)
                if left is not None and left <= 0:
                    return False
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._watch_futs.append(fut)
                try:
                    done, _ = await asyncio.wait({fut}, timeout=left)
                finally:
                    if not fut.done():
                        fut.cancel()
                if not done:
                    return ready()
            return True
        finally:
            core.watchers -= 1

    # ------------------------------------------------------------------------------------ submit
    async def submit(self, item: T, trace: MessageTraceLike | None = None, *, timeout: float | None = None) -> bool:
        """As :meth:`.engine.Dispatcher.submit`, awaiting instead of blocking.

        Cancelling a waiting ``submit`` withdraws its message (unless it was accepted in the same
        loop step, in which case it runs and ``on_done`` reports it).

        Raises:
            DispatcherClosed: after :meth:`close` began, also in a ``submit`` waiting then.
        """
        core = self._core
        if core.closed:
            raise core.closed_error()
        e = core.build(item, trace)
        self._started()
        e.seq = core.seq  # unique: the cost heap breaks ties with it
        core.seq += 1
        if e.error is not None:
            core.reject_locked(e)
            core.report(e, _FAILURE, e.error, on_worker=False)
            core.observe_unblocked()
            return True
        try:
            r = core.try_admit_locked(e)
        except WouldBlock:
            if timeout is not None and timeout <= 0:
                return False
            return await self._submit_blocked(e, timeout)
        if r is not None:
            self._hand(r, e)
        core.observe_unblocked()
        return True

    async def _submit_blocked(self, e: Entry[Any], timeout: float | None) -> bool:
        core = self._core
        t0 = core.now()
        w = _AioWaiter(e, t0, asyncio.get_running_loop().create_future())
        core.waiters.append(w)
        try:
            left = core.remaining(core.deadline(timeout))
            if left is None:
                await asyncio.wait({w.fut})
            elif left > 0:
                await asyncio.wait({w.fut}, timeout=left)
        finally:
            if w.state is WaitState.WAITING:
                core.withdraw_locked(w)
                if not w.fut.done():
                    w.fut.cancel()
        if w.state is WaitState.CLOSED:
            raise core.closed_error(blocked=True)
        if w.state is WaitState.WAITING:
            return False
        core.observe_blocked(core.now() - t0)
        return True

    def _admit_waiters(self, index: int, nxt: Entry[Any] | None) -> Entry[Any] | None:
        for wt in self._core.admit_waiters_locked():
            r = wt.worker
            if r is not None:
                if r == index and nxt is None:
                    nxt = wt.entry
                else:
                    self._hand(r, wt.entry)
            assert isinstance(wt, _AioWaiter)
            wt.wake()
        return nxt

    def free_slots(self) -> int:
        """How many (unkeyed) messages ``submit`` would take now without waiting; 0 once closed."""
        return self._core.free_slots_locked()

    async def wait_for_free_slot(self, timeout: float | None = None) -> bool:
        """Wait until :meth:`free_slots` > 0 (True), or ``timeout`` passes / the dispatcher closes (False)."""
        core = self._core
        ok = await self._wait_until(lambda: core.closed or core.sched.free_slots() > 0, timeout)
        return ok and not core.closed

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or in flight (True), or ``timeout`` passes (False)."""
        return await self._wait_until(self._core.settled_locked, timeout)

    @property
    def stats(self) -> DispatchStats:
        live = sum(1 for w in self._workers or () if w.task is not None and not w.task.done())
        return self._core.stats_locked(live)

    def running(self) -> list[tuple[T, float]]:
        """Items whose handler is running now, with seconds since it started (on ``clock``)."""
        now = self._core.now()
        return [
            (cast(T, r[0].item), max(0, now - r[1]) / 1e9)
            for w in (self._workers or ())
            if (r := w.running) is not None
        ]

    # ----------------------------------------------------------------------------------- workers
    async def _loop(self, w: _AioWorker) -> None:
        while True:
            try:
                await w.event.wait()
            except asyncio.CancelledError:
                if w.entry is not None:  # handed a message it had not started: a fresh task runs it
                    self._spawn(w)
                raise  # idle: the task ends; the next hand-off to this worker starts a fresh one
            w.event.clear()
            e = w.entry
            if e is None:
                return
            w.entry = None
            while e is not None:
                cancelled: BaseException | None = None
                try:
                    outcome, error = await self._run(w, e)
                except asyncio.CancelledError as exc:  # the worker task itself is being cancelled
                    outcome, error = _FAILURE, exc
                    cancelled = exc
                except BaseException as exc:  # noqa: BLE001 - only our own bug can get here
                    self._core.log("dispatcher internals", exc)
                    outcome, error = _FAILURE, exc
                e = self._finish(w, e, outcome, error)
                if cancelled is not None:
                    if e is not None:
                        w.entry = e
                        self._spawn(w)  # the next entry must not go down with this task
                    raise cancelled
                if e is None and self._core.stopping:
                    return

    async def _run(self, w: _AioWorker, e: Entry[Any]) -> tuple[Outcome, BaseException | None]:
        """Run the handler of ``e`` inside its trace scope; its outcome by the rules of :mod:`.core`.

        Raises:
            asyncio.CancelledError: the worker task itself is being cancelled (scope exited first).
        """
        core = self._core
        t0 = core.begin(e, w.index)
        w.running = (e, t0)
        scope = None if e.trace is None else core.enter_scope(e.trace)
        error: BaseException | None = None
        expired = False
        try:
            if core.timeout_s is None:
                await self._handler(cast(T, e.item))
            else:
                cm = _timeout(core.timeout_s)
                try:
                    async with cm:
                        await self._handler(cast(T, e.item))
                except (TimeoutError, asyncio.TimeoutError) as exc:
                    if not cm.expired():
                        raise
                    error = exc
                expired = cm.expired()  # also when the handler swallowed the cancellation
        except asyncio.CancelledError as exc:
            if _being_cancelled(asyncio.current_task()):
                w.running = None
                core.exit_scope(scope, exc)
                raise
            error = exc
        except BaseException as exc:  # noqa: BLE001 - the handler's failure is the message's outcome
            error = exc
        core.exit_scope(scope, error)
        return core.settle(error, t0, expired)

    def _finish(self, w: _AioWorker, e: Entry[Any], outcome: Outcome, error: BaseException | None) -> Entry[Any] | None:
        """Report ``e``, free the worker; the entry it runs next, or None."""
        core = self._core
        w.running = None
        core.report(e, outcome, error)
        core.count_locked(outcome)
        nxt = self._sched.done(w.index, e)
        if core.waiters:
            nxt = self._admit_waiters(w.index, nxt)
        self._notify()
        return nxt

    # ---------------------------------------------------------------------------------- shutdown
    async def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """As :meth:`.engine.Dispatcher.close`. Idempotent; must not be awaited from a handler."""
        core = self._core
        deadline = core.deadline(timeout)
        core.closed = True
        for wt in core.close_waiters_locked():
            assert isinstance(wt, _AioWaiter)
            wt.wake()
        self._notify()
        skipped = [] if drain else core.take_skipped_locked()
        for e in skipped:
            core.report(e, Outcome.SKIPPED, None, on_worker=False)
        left = core.remaining(deadline)
        settled = await self._wait_until(core.settled_locked, None if left is None else max(0.0, left))
        ws = self._workers or []
        if not core.stopping:
            core.stopping = True
            for i in self._sched.idle_workers():
                w = ws[i] if ws else None
                if w is not None and w.task is not None and not w.task.done():
                    w.entry = None
                    w.event.set()
        tasks = [w.task for w in ws if w.task is not None and not w.task.done()]
        if tasks:
            left = core.remaining(deadline)
            await asyncio.wait(tasks, timeout=None if left is None else max(0.0, left))
        if core.m is not None and settled:
            core.m.unbind()
        if not settled:
            s = self.stats
            logger.warning("async dispatcher %r: close timed out with %d in flight, %d queued", self._name,
                           s.in_flight, s.queued)  # fmt: skip

    async def __aenter__(self) -> AsyncDispatcher[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close(drain=True)
