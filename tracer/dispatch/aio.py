"""The asyncio engine: the same policies, stamps, metrics and rules for ``async`` handlers.

Only the concurrent half lives here; validation, counters, admission and its fairness, the
exception and timeout rules and reporting are :mod:`.core`'s, shared with the thread engine.
Workers are tasks of the running loop (created on first use); hand-off sets the worker's
``asyncio.Event``. Everything runs on the loop, so nothing needs a lock. A submitter that finds
no room waits on a future as a :class:`.core.Waiter`; whoever frees room admits waiters
(:meth:`.core.Core.admit_waiters_locked`: oldest first, each one that fits) and resolves them.

Differences from the thread engine (:class:`.engine.Dispatcher`):

* ``handler_timeout``: at its deadline on the event loop's clock the message is reported
  ``Outcome.TIMEOUT`` with a :class:`.HandlerTimeout` and given back — with what waited behind it,
  reported ``SKIPPED``, exactly as in the thread engine — and then the handler is *cancelled*. A
  handler that swallows the cancellation keeps its worker (``statistics().overrun``) until it
  returns; its result is dropped. A handler the injected clock says overran is TIMEOUT too.
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
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, cast

from ..bounds import timeout_s
from ..callables import never_ran, require_async
from ..path.clock import MonotonicClock
from ..path.stages import Outcome
from .core import Core, EngineBase, Running, Waiter, WaitState, WouldBlock
from .metrics import DispatchMetrics
from .policy import Policy
from .protocol import DispatchPhase, DispatchStats, HandlerTimeout, MessageTraceLike
from .scheduler import Entry

__all__ = ["AsyncDispatcher"]

T = TypeVar("T")

logger = logging.getLogger("tracer.dispatch")

_FAILURE = Outcome.FAILURE
_OPEN = DispatchPhase.OPEN
_STOPPING = DispatchPhase.STOPPING

def _uncancel(task: asyncio.Task[Any] | None) -> None:
    """Undo one cancel() of ours, so the task's own cancellation state stays its caller's (3.11+)."""
    fn = getattr(task, "uncancel", None)
    if fn is not None:
        fn()


def _being_cancelled(task: asyncio.Task[Any] | None) -> bool:
    """Whether ``task`` itself is being cancelled (3.10 cannot tell: assume it is)."""
    if task is None:
        return False
    cancelling = getattr(task, "cancelling", None)
    return True if cancelling is None else bool(cancelling())


class _AioWorker:
    __slots__ = ("entry", "event", "expired", "index", "running", "task")

    def __init__(self, index: int) -> None:
        self.index = index
        self.event = asyncio.Event()
        self.entry: Entry[Any] | None = None  # the hand-off box
        self.running: Running | None = None  # (entry, start ns, its index as the slot): see core.Running
        self.expired: Entry[Any] | None = None  # reported TIMEOUT at its deadline, handler still running
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


class AsyncDispatcher(EngineBase[T], Generic[T]):
    """Run ``async handler(item)`` on ``workers`` tasks under a dispatch ``policy``.

    Same parameters, meaning and rules as :class:`.engine.Dispatcher`; create it anywhere, use it
    from one event loop.

    Raises:
        ValueError: ``workers`` < 1, ``handler_timeout`` not a finite number > 0, unknown policy.
        TypeError: ``handler`` is not an ``async def`` function (a plain one would block the
            loop); ``key``, ``cost`` or ``on_done`` is not a plain callable.
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
        clock: MonotonicClock | None = None,
        name: str = "rmqtrace",
        consumer_group: str = "",
        successors_follow: bool = False,
    ) -> None:
        require_async(handler, "handler")
        self._core = Core(
            policy=policy, workers=workers, key=key, cost=cost, on_done=on_done, metrics=metrics,
            handler_timeout=handler_timeout, clock=clock, name=name, kind="async dispatcher",
            consumer_group=consumer_group, successors_follow=successors_follow,
        )  # fmt: skip
        self._sched = self._core.sched
        self._handler = handler
        self._name = name
        self._n_workers = workers
        self._workers: list[_AioWorker] | None = None
        self._watch_futs: set[asyncio.Future[None]] = set()  # watchers (wait_until)

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
            self._watch_futs = set()
            for f in futs:
                if not f.done():
                    f.set_result(None)

    async def _wait_until(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        core = self._core
        timeout = timeout_s(timeout, "wait timeout", negative_waits=True)
        deadline = core.deadline(timeout)
        core.watchers += 1
        try:
            while not ready():
                left = core.remaining(deadline)
                if left is not None and left <= 0:
                    return False
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._watch_futs.add(fut)
                try:
                    done, _ = await asyncio.wait({fut}, timeout=left)
                finally:
                    self._watch_futs.discard(fut)  # a timed-out wait leaves nothing behind
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
            RuntimeError: it would wait, awaited from this dispatcher's own handler (a worker
                waiting for room that only workers free); there, use ``timeout=0``.
            ValueError: ``timeout`` is NaN (``math.inf``: no bound; <= 0: do not wait).
        """
        core = self._core
        timeout = timeout_s(timeout, "submit timeout", negative_waits=True)
        if core.phase is not _OPEN:
            raise core.closed_error()
        e = core.build(item, trace)
        self._started()
        core.number_locked(e)
        if e.error is not None:
            core.reject_locked(e)
            core.report(e, Outcome.NOT_STARTED, e.error, on_worker=False)  # its key= failed: it never ran
            core.reported_locked(1)
            core.observe_unblocked()
            return True
        try:
            r = core.try_admit_locked(e)
        except WouldBlock:
            if timeout is not None and timeout <= 0:
                core.refused_locked(e)
                return False
            if self._on_worker():
                raise RuntimeError(
                    f"async dispatcher {self._name!r} is full and submit was awaited from its own worker, "
                    "which would wait for itself; use submit(..., timeout=0)"
                ) from None
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
        return core.waited(w)

    def _on_worker(self) -> bool:
        task = asyncio.current_task()
        return task is not None and any(w.task is task for w in self._workers or ())

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
        ok = await self._wait_until(lambda: core.phase is not _OPEN or core.sched.free_slots() > 0, timeout)
        return ok and core.phase is _OPEN

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or in flight (True), or ``timeout`` passes (False)."""
        return await self._wait_until(self._core.idle_locked, timeout)

    def statistics(self) -> DispatchStats:
        """One frozen, consistent snapshot of the counters (taken on the loop)."""
        live = sum(1 for w in self._workers or () if w.task is not None and not w.task.done())
        return self._core.stats_locked(live)

    def running(self) -> list[tuple[T, float]]:
        """Items whose handler is running and has no outcome yet, with seconds since it started."""
        return self._ages(overrun=False)

    def overrun(self) -> list[tuple[T, float]]:
        """Items already reported TIMEOUT whose handler still runs, with seconds since it started."""
        return self._ages(overrun=True)

    def blocks(self, key: str) -> bool:
        """Whether a message of ``key`` cannot start until a hung handler returns (as
        :meth:`Dispatcher.blocks <tracer.dispatch.engine.Dispatcher.blocks>`)."""
        return self._core.blocked_locked(key)

    def _ages(self, overrun: bool) -> list[tuple[T, float]]:
        now = self._core.now()
        return [
            (cast(T, entry.item), max(0, now - started) / 1e9)
            for w in (self._workers or ()) if (r := w.running) is not None
            for entry, started, _slot in (r,) if (w.expired is entry) is overrun
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
                error = None  # an idle worker keeps no traceback (the handler's frames, its message)
                if cancelled is not None:
                    if e is not None:
                        w.entry = e
                        self._spawn(w)  # the next entry must not go down with this task
                    raise cancelled
                if e is None and self._core.phase >= _STOPPING:
                    return

    async def _run(self, w: _AioWorker, e: Entry[Any]) -> tuple[Outcome, BaseException | None]:
        """Run the handler of ``e`` inside its trace scope; its outcome by the rules of :mod:`.core`.

        Raises:
            asyncio.CancelledError: the worker task itself is being cancelled (scope exited first).
        """
        core = self._core
        t0 = core.begin(e, w.index)
        w.running = (e, t0, w.index)
        scope = None if e.trace is None else core.enter_scope(e.trace)
        error: BaseException | None = None
        task = asyncio.current_task()
        timer = None
        if core.timeout_s is not None and task is not None:
            timer = asyncio.get_running_loop().call_later(core.timeout_s, self._expire, w, e, t0, task)
        try:
            result = await self._handler(cast(T, e.item))
            if result is not None:  # an async def that returns a coroutine (forgot an await) ran nothing
                error = never_ran(result, "handler")
                result = None
        except asyncio.CancelledError as exc:
            ours = w.expired is e
            if ours:
                _uncancel(task)  # our own cancel, at the deadline
            if (not ours or hasattr(task, "uncancel")) and _being_cancelled(task):
                w.running = None
                w.expired = None
                if timer is not None:
                    timer.cancel()
                core.exit_scope(scope, exc)
                raise
            error = exc
        except BaseException as exc:  # noqa: BLE001 - the handler's failure is the message's outcome
            error = exc
            if w.expired is e:
                _uncancel(task)  # it swallowed our cancel, then raised something else
        else:
            if w.expired is e:
                _uncancel(task)  # it swallowed our cancel and returned
        if timer is not None:
            timer.cancel()
        core.exit_scope(scope, error)
        return core.outcome_of(error, t0)

    def _expire(self, w: _AioWorker, e: Entry[Any], t0: int, task: asyncio.Task[Any]) -> None:
        """The deadline of ``e``: report it TIMEOUT and give it back with what waits behind it; cancel it."""
        r = w.running
        if r is None or w.expired is e:
            return
        entry, _started, _slot = r
        if entry is not e:
            return
        core = self._core
        w.expired = e
        back = core.expire_locked(w.index, e)
        tns = cast(int, core.timeout_ns)
        core.report(e, Outcome.TIMEOUT, HandlerTimeout(max(tns, core.now() - t0) / 1e9, tns / 1e9))
        core.report_skipped(back, on_worker=True)
        core.reported_locked(1 + len(back))
        if core.waiters:
            self._admit_waiters(-1, None)  # parking room may have freed
        self._notify()
        task.cancel()

    def _finish(self, w: _AioWorker, e: Entry[Any], outcome: Outcome, error: BaseException | None) -> Entry[Any] | None:
        """Report ``e`` (unless its deadline did), free the worker; the entry it runs next, or None."""
        self._core.ended(e, w.index)  # the worker is free now, whoever reports the outcome
        core = self._core
        mine = w.expired is not e
        w.running = None
        w.expired = None
        if mine:
            core.report(e, outcome, error)
            core.count_locked(outcome)
        else:
            core.overrun -= 1
        back = core.drop_successors_locked(w.index, e, outcome) if mine else []  # before done
        nxt = self._core.done_locked(w.index, e)
        if back:  # successors_follow: reported right after the message they follow, as at a TIMEOUT
            core.report_skipped(back, on_worker=True)
            core.reported_locked(len(back))
        if core.waiters:
            nxt = self._admit_waiters(w.index, nxt)
        self._notify()
        return nxt

    # ---------------------------------------------------------------------------------- shutdown
    async def close(self, drain: bool = True, timeout: float | None = None) -> bool:
        """As :meth:`.engine.Dispatcher.close` (same meaning, same True/False). Idempotent.

        Raises:
            RuntimeError: awaited from one of this dispatcher's own handlers.
            ValueError: ``timeout`` is NaN or negative (``math.inf``: no bound); nothing changed.
        """
        timeout = timeout_s(timeout, "close timeout")
        if self._on_worker():
            raise RuntimeError("close() awaited from a dispatcher worker (a handler) would wait for itself")
        core = self._core
        deadline = core.deadline(timeout)
        core.close_locked()
        for wt in core.close_waiters_locked():
            assert isinstance(wt, _AioWaiter)
            wt.wake()
        self._notify()
        if not drain:
            self._give_back(core.take_queued_locked())
        left = core.remaining(deadline)
        quiet = await self._wait_until(core.quiet_locked, None if left is None else max(0.0, left))
        ws = self._workers or []
        back = core.take_queued_locked()  # drain: what no worker can take; timeout: all not started
        if not quiet:
            stolen = []
            for w in ws:
                e = w.entry
                if e is not None:  # handed over, its task has not started it: it must not start now
                    w.entry = None
                    self._core.done_locked(w.index, e)
                    stolen.append(e)
            back.extend(core.give_back_locked(stolen))
        self._give_back(back)
        if core.stop_locked(abandon=not quiet):
            for i in self._sched.idle_workers() if ws else ():
                iw = ws[i]
                if iw.task is not None and not iw.task.done():
                    iw.entry = None
                    iw.event.set()
        core.abandon([w.expired for w in ws if w.expired is not None])  # never awaited: their open spans end now
        tasks = [w.task for w in ws if w.task is not None and not w.task.done() and w.expired is None]
        if tasks:
            left = core.remaining(deadline)
            await asyncio.wait(tasks, timeout=None if left is None else max(0.0, left))
        settled = core.idle_locked()
        core.leave_gauges()
        if not settled:
            logger.warning("async dispatcher %r: close timed out with %d in flight", self._name,
                           self.statistics().in_flight)  # fmt: skip
        return settled

    def _give_back(self, entries: list[Entry[Any]]) -> None:
        if entries:
            entries.sort(key=lambda x: x.seq)
            try:
                self._core.report_skipped(entries, on_worker=False)
            finally:
                self._core.reported_locked(len(entries))
                self._notify()

    async def __aenter__(self) -> AsyncDispatcher[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close(drain=True)
