"""The asyncio engine: the same policies, stamps, metrics and life cycle for ``async`` handlers.

Workers are tasks of the running loop (created on first use); hand-off sets the worker's
``asyncio.Event``. Everything runs on the loop, so the scheduler needs no lock.

Differences from the thread engine (:class:`.engine.Dispatcher`):

* ``handler_timeout`` *cancels* the handler (``asyncio.timeout``) when it expires, measured on the
  event loop's clock; the message's outcome is ``Outcome.TIMEOUT`` with a :class:`HandlerTimeout`.
* A handler raising ``CancelledError`` on its own is a failure; if the worker task itself is being
  cancelled (loop shutdown), the message is reported ``FAILURE`` and the cancellation propagates.
* ``on_done`` and the trace methods are plain (synchronous) callables, as in the thread engine.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, cast

from ..path.clock import Clock
from ..path.stages import Outcome, Stage
from .engine import _OnceLogger, exemplar_of
from .metrics import BoundDispatchMetrics, DispatchMetrics
from .policy import Policy, resolve_policy
from .protocol import DispatcherClosed, DispatchStats, HandlerTimeout, MessageTraceLike
from .scheduler import FULL, Entry

T = TypeVar("T")

logger = logging.getLogger("tracer.dispatch")

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
    __slots__ = ("current", "entry", "event", "index", "started", "task")

    def __init__(self, index: int) -> None:
        self.index = index
        self.event = asyncio.Event()
        self.entry: Entry[object] | None = None
        self.current: Entry[object] | None = None
        self.started = 0
        self.task: asyncio.Task[None] | None = None


class AsyncDispatcher(Generic[T]):
    """Run ``async handler(item)`` on ``workers`` tasks under a dispatch ``policy``.

    Same parameters and meaning as :class:`.engine.Dispatcher`; create it anywhere, use it from one
    event loop.
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
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if handler_timeout is not None and handler_timeout <= 0:
            raise ValueError("handler_timeout must be > 0")
        self._policy = resolve_policy(policy)
        self._sched = self._policy.scheduler(workers)
        self._handler = handler
        self._key = key
        self._cost = cost
        self._on_done = on_done
        self._timeout = handler_timeout
        self._now: Callable[[], int] = time.monotonic_ns if clock is None else clock.now_ns
        self._name = name
        self._log = _OnceLogger(f"async dispatcher {name!r}")
        self._m: BoundDispatchMetrics | None = None if metrics is None else metrics.bind(self._policy.name, self._sched)
        self._workers: list[_AioWorker] | None = None
        self._n_workers = workers
        self._waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._stopping = False
        self._seq = 0
        self._submitted = 0
        self._handled = 0
        self._failed = 0
        self._timed_out = 0
        self._skipped = 0

    def _started(self) -> list[_AioWorker]:
        ws = self._workers
        if ws is None:
            ws = [_AioWorker(i) for i in range(self._n_workers)]
            for w in ws:
                w.task = asyncio.get_running_loop().create_task(self._loop(w), name=f"{self._name}-dispatch-{w.index}")
            self._workers = ws
        return ws

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def workers(self) -> int:
        return self._n_workers

    @property
    def closed(self) -> bool:
        return self._closed

    # ----------------------------------------------------------------------------------- waiting
    def _notify(self) -> None:
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for f in waiters:
                if not f.done():
                    f.set_result(None)

    async def _wait_change(self, remaining: float | None) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            if remaining is None:
                await fut
            else:
                try:
                    await asyncio.wait_for(fut, remaining)
                except asyncio.TimeoutError:
                    pass
        finally:
            if not fut.done():
                fut.cancel()
            try:
                self._waiters.remove(fut)
            except ValueError:
                pass

    async def _wait_until(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            await self._wait_change(remaining)
        return True

    # ------------------------------------------------------------------------------------ submit
    async def submit(self, item: T, trace: MessageTraceLike | None = None, *, timeout: float | None = None) -> bool:
        """As :meth:`.engine.Dispatcher.submit`, awaiting instead of blocking."""
        if self._closed:
            raise DispatcherClosed(f"async dispatcher {self._name!r} is closed")
        ws = self._started()
        e: Entry[object] = Entry(
            item,
            trace,
            None if self._key is None else self._key(item),
            0.0 if self._cost is None else float(self._cost(item)),
        )
        sched = self._sched
        e.seq = self._seq
        self._seq += 1
        r = sched.admit(e)
        blocked = 0.0
        if r == FULL:
            if timeout is not None and timeout <= 0:
                return False
            t0 = time.monotonic()
            deadline = None if timeout is None else t0 + timeout
            while r == FULL:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                await self._wait_change(remaining)
                if self._closed:
                    raise DispatcherClosed(f"async dispatcher {self._name!r} closed while submit was blocked")
                e.seq = self._seq
                self._seq += 1
                r = sched.admit(e)
            blocked = time.monotonic() - t0
        self._submitted += 1
        m = self._m
        if m is not None:
            e.t_enq = self._now()
        if trace is not None:
            try:
                trace.mark(Stage.DISPATCH_ENQUEUE)
            except Exception as exc:  # noqa: BLE001
                self._log("trace.mark", exc)
        if r >= 0:
            w = ws[r]
            w.entry = e
            w.event.set()
        if m is not None:
            m.submit_blocked.observe(blocked)
        return True

    def free_slots(self) -> int:
        """How many (unkeyed) messages ``submit`` would take now without waiting; 0 once closed."""
        return 0 if self._closed else self._sched.free_slots()

    async def wait_for_free_slot(self, timeout: float | None = None) -> bool:
        """Wait until :meth:`free_slots` > 0 (True), or ``timeout`` passes / the dispatcher closes (False)."""
        sched = self._sched
        ok = await self._wait_until(lambda: self._closed or sched.free_slots() > 0, timeout)
        return ok and not self._closed

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or in flight (True), or ``timeout`` passes (False)."""
        sched = self._sched
        return await self._wait_until(lambda: sched.busy == 0 and sched.queued == 0, timeout)

    @property
    def stats(self) -> DispatchStats:
        s = self._sched
        return DispatchStats(
            submitted=self._submitted,
            handled=self._handled,
            failed=self._failed,
            timed_out=self._timed_out,
            skipped=self._skipped,
            in_flight=s.busy,
            queued=s.queued,
            workers=s.workers,
            policy=self._policy.name,
        )

    def running(self) -> list[tuple[T, float]]:
        """Items whose handler is running now, with seconds since it started (on ``clock``)."""
        now = self._now()
        return [
            (cast(T, w.current.item), max(0, now - w.started) / 1e9)
            for w in (self._workers or ())
            if w.current is not None
        ]

    # ----------------------------------------------------------------------------------- workers
    async def _loop(self, w: _AioWorker) -> None:
        while True:
            await w.event.wait()
            w.event.clear()
            e = w.entry
            if e is None:
                return
            w.entry = None
            while e is not None:
                try:
                    outcome = await self._execute(w, e)
                except asyncio.CancelledError:
                    self._finish_count(w, e, Outcome.FAILURE)
                    raise
                except BaseException as exc:  # noqa: BLE001 - only our own bug can get here
                    self._log("dispatcher internals", exc)
                    outcome = Outcome.FAILURE
                e = self._finish_count(w, e, outcome)
                if e is None and self._stopping:
                    return

    def _finish_count(self, w: _AioWorker, e: Entry[object], outcome: Outcome) -> Entry[object] | None:
        if outcome is Outcome.SUCCESS:
            self._handled += 1
        elif outcome is Outcome.FAILURE:
            self._failed += 1
        else:
            self._timed_out += 1
        w.current = None
        nxt = self._sched.done(w.index, e)
        self._notify()
        return nxt

    async def _execute(self, w: _AioWorker, e: Entry[object]) -> Outcome:
        t0 = self._now()
        w.started = t0
        w.current = e
        m = self._m
        trace = e.trace
        if m is not None:
            wait = max(0.0, (t0 - e.t_enq) / 1e9)
            try:
                ex = None if trace is None else exemplar_of(trace)
                m.slot_wait.observe(wait, dict(ex) if ex else None)
            except Exception as exc:  # noqa: BLE001
                self._log("slot-wait metric", exc)
        scope = None
        if trace is not None:
            if hasattr(trace, "worker"):
                trace.worker = w.index  # the report draws one lane per worker
            try:
                scope = trace.handler_scope()
                scope.__enter__()
            except Exception as exc:  # noqa: BLE001
                scope = None
                self._log("trace.handler_scope enter", exc)
        error: BaseException | None = None
        outcome = Outcome.SUCCESS
        t_start = time.monotonic()
        try:
            if self._timeout is None:
                await self._handler(cast(T, e.item))
            else:
                cm = _timeout(self._timeout)
                try:
                    async with cm:
                        await self._handler(cast(T, e.item))
                except (TimeoutError, asyncio.TimeoutError) as exc:
                    if not cm.expired():
                        raise
                    error = HandlerTimeout(time.monotonic() - t_start, self._timeout)
                    error.__cause__ = exc
                    outcome = Outcome.TIMEOUT
        except asyncio.CancelledError as exc:
            if _being_cancelled(asyncio.current_task()):
                self._close_scope(scope, exc)
                self._report(e, Outcome.FAILURE, exc)
                raise
            error, outcome = exc, Outcome.FAILURE
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's outcome
            error, outcome = exc, Outcome.FAILURE
        self._close_scope(scope, error)
        self._report(e, outcome, error)
        return outcome

    def _close_scope(self, scope: object, error: BaseException | None) -> None:
        if scope is None:
            return
        try:
            exit_ = scope.__exit__  # type: ignore[attr-defined]
            if error is None:
                exit_(None, None, None)
            else:
                exit_(type(error), error, error.__traceback__)
        except Exception as exc:  # noqa: BLE001
            self._log("trace.handler_scope exit", exc)

    def _report(self, e: Entry[object], outcome: Outcome, error: BaseException | None) -> None:
        trace = e.trace
        if trace is not None:
            try:
                trace.finish(outcome, error)
            except Exception as exc:  # noqa: BLE001
                self._log("trace.finish", exc)
        if self._on_done is not None:
            try:
                self._on_done(cast(T, e.item), outcome, error)
            except Exception as exc:  # noqa: BLE001
                self._log("on_done", exc)
        elif error is not None and trace is None:
            self._log(f"handler ({type(error).__name__}, no on_done to report it)", error)
        if self._m is not None:
            self._m.outcomes[outcome].inc()

    # ---------------------------------------------------------------------------------- shutdown
    async def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """As :meth:`.engine.Dispatcher.close`. Idempotent; must not be awaited from a handler."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._closed = True
        self._notify()
        skipped = [] if drain else self._sched.take_queued()
        self._skipped += len(skipped)
        for e in skipped:
            self._report(e, Outcome.SKIPPED, None)
        sched = self._sched
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        drained = await self._wait_until(lambda: sched.busy == 0 and sched.queued == 0, left)
        ws = self._workers or []
        if not self._stopping:
            self._stopping = True
            for i in sched.idle_workers():
                if ws:
                    ws[i].entry = None
                    ws[i].event.set()
        tasks = [w.task for w in ws if w.task is not None and not w.task.done()]
        if tasks:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait(tasks, timeout=left)
        if self._m is not None and drained:
            self._m.unbind()
        if not drained:
            logger.warning("async dispatcher %r: close timed out with %d in flight, %d queued", self._name,
                           sched.busy, sched.queued)  # fmt: skip

    async def __aenter__(self) -> AsyncDispatcher[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close(drain=True)


__all__ = ["AsyncDispatcher"]
