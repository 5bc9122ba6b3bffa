"""The thread engine: N worker threads, one policy, stamps and metrics around every handler.

Only the concurrent half lives here; validation, counters, admission and its fairness, the
exception and timeout rules and reporting are :mod:`.core`'s, shared with the asyncio engine.

The policy's scheduler decides which *slot* (its "worker", ``0 … workers-1``: what the slot-wait,
the key rules, a round-robin buffer and live blame are about) takes a message; any of the
``workers`` threads runs a slot's message. ``submit`` puts ``(slot, entry)`` on the engine's
*ready* queue (under the one engine lock) and releases the ``wake`` lock of one sleeping thread,
unless one was released already and has not claimed yet. A thread that claims an entry and sees
more ready releases the next sleeper (a chain: at most one thread is being woken at a time), and
a thread that finishes a message takes the next ready one before it sleeps, in the same critical
section as the scheduler's ``done``. So a burst is run by the threads already awake — with the
GIL, one awake thread drains a burst of short handlers without a context switch per message —
while a single message to an idle pool still costs one lock release. The number of ready entries
never exceeds the threads not running a message (each one holds a slot, and there are as many
threads as slots), so a ready entry always has a thread to run it.

A submitter that finds no room becomes a *waiter* (:class:`.core.Waiter`, oldest first) and
sleeps on a lock of its own; the thread that frees room admits waiters in the same critical
section (:meth:`.core.Core.admit_waiters_locked`, the one place fairness is decided: oldest
first, each one that fits) and runs the first admitted message itself when it has nothing next.
Callers of ``wait_for_free_slot``, ``wait_idle`` and ``close`` wait on a condition of the engine
lock that is notified only when someone waits.

Life cycle:

* ``handler_timeout``: a Python thread cannot be stopped. A watchdog thread reports a handler
  still running at its deadline (on the injected clock) as ``Outcome.TIMEOUT`` *at the
  deadline* — ``trace.finish`` then ``on_done(item, TIMEOUT, HandlerTimeout)`` — so a consume
  loop stops renewing that message's lease and the broker can redeliver it to a healthy
  consumer (a duplicate, by design). The message is given back, and what waited behind it goes
  with it: the messages of its key parked behind it (round-robin/random: its worker's buffer) are
  reported ``SKIPPED`` right after its TIMEOUT, in arrival order, unrun, and its key is free — a
  key's successors follow the message given back, not the thread that hung. The worker stays
  held by the hung handler (``statistics().overrun``); when the handler returns, its result is
  dropped and the worker takes its next message. If it never returns the worker is lost for good.
  :meth:`Dispatcher.running` lists in-flight items (not overrun ones), :meth:`Dispatcher.overrun`
  the overrun ones, :meth:`Dispatcher.check_timeouts` runs the watchdog's check now (for manual
  clocks). A handler that returns after its deadline before the watchdog saw it is reported
  TIMEOUT by its worker.
* ``close``: see :meth:`Dispatcher.close` — it returns True only after every accepted message's
  outcome was reported (``on_done`` returned); after it returns no handler starts.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from ..bounds import timeout_s
from ..callables import never_ran, require_plain
from ..path.clock import MonotonicClock
from ..path.stages import Outcome
from .core import Core, EngineBase, Running, Waiter, WaitState, WouldBlock
from .metrics import DispatchMetrics
from .policy import Policy
from .protocol import DispatchPhase, DispatchStats, HandlerTimeout, MessageTraceLike
from .scheduler import Entry

__all__ = ["Dispatcher"]

T = TypeVar("T")

logger = logging.getLogger("tracer.dispatch")

_FAILURE = Outcome.FAILURE
_SUCCESS = Outcome.SUCCESS
_OPEN = DispatchPhase.OPEN
_STOPPING = DispatchPhase.STOPPING
_TIMEOUT = Outcome.TIMEOUT
_SKIPPED = Outcome.SKIPPED


class _Worker:
    """One worker thread; it runs whichever slot's ready entry it claims."""

    __slots__ = ("expired", "index", "running", "thread", "wake")

    def __init__(self, index: int) -> None:
        self.index = index  # the thread's number (its name); slots are the scheduler's
        self.wake = threading.Lock()
        self.wake.acquire()  # held while it sleeps; released to make it look at the ready queue
        self.running: Running | None = None  # (entry, start ns, slot): see core.Running
        self.expired: Entry[Any] | None = None  # reported TIMEOUT by the watchdog, still running
        self.thread: threading.Thread | None = None


class _ThreadWaiter(Waiter):
    __slots__ = ("sig",)

    def __init__(self, entry: Entry[Any], t0: int) -> None:
        super().__init__(entry, t0)
        self.sig = threading.Lock()
        self.sig.acquire()  # released by whoever decides: an admitter or close


_STOP = object()  # _claim_locked / _finish: nothing is ready and the dispatcher stops
_Ready = tuple[int, Entry[Any]]  # (slot, entry): handed to a slot, not claimed by a thread yet


class Dispatcher(EngineBase[T], Generic[T]):
    """Run ``handler`` on ``workers`` threads under a dispatch ``policy``.

    ``key``: ordering key (message group / sharding key), ``None`` for unordered messages.
    ``cost``: cost hint for :class:`.CostAware` (ignored by the other policies).
    ``on_done(item, outcome, error)``: called once per accepted message, after ``trace.finish``.
    ``clock``: a :class:`~tracer.path.clock.MonotonicClock`; every reading of time (slot wait,
    handler age and deadline, the deadlines of timeouts, the blame) is its ``monotonic_ns()``
    (default ``time.monotonic_ns``), the clock a message's own stamps advance by. See :mod:`.core` for what happens
    when ``key``/``cost``/``on_done``/the trace raise.
    ``consumer_group``: the ``consumer_group`` label of its gauges and worker-seconds counters
    (``metrics=``), so dispatchers of two consumers in one process are told apart.
    ``successors_follow``: when a keyed message ends without success (FAILURE, NOT_STARTED, or a
    TIMEOUT its own worker reports), the messages of its key waiting behind it are given back
    with it — reported ``SKIPPED`` right after it, in arrival order, unrun — as after a watchdog
    TIMEOUT, so none runs before the failed one has succeeded (the consume loop sets it: the
    broker brings them back in order). Default False: the next message of the key runs after a
    failure, as after a success.

    Raises:
        ValueError: ``workers`` < 1, ``handler_timeout`` not a finite number > 0, unknown policy.
        TypeError: ``consumer_group`` is not a str, ``successors_follow`` not a bool; ``handler``,
            ``key``, ``cost`` or ``on_done`` is not callable, or is an ``async def`` or generator
            function (calling one would not run it); ``clock`` has no ``monotonic_ns()``.
    """

    def __init__(
        self,
        handler: Callable[[T], object],
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
        require_plain(handler, "handler")
        self._core = Core(
            policy=policy, workers=workers, key=key, cost=cost, on_done=on_done, metrics=metrics,
            handler_timeout=handler_timeout, clock=clock, name=name, kind="dispatcher",
            consumer_group=consumer_group, successors_follow=successors_follow,
        )  # fmt: skip
        self._sched = self._core.sched
        self._handler = handler
        self._name = name
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # watchers wait here
        self._workers = [_Worker(i) for i in range(workers)]
        self._ready: deque[_Ready] = deque()
        # Threads asleep (or about to be) on their wake lock, LIFO: the latest to sleep is the warmest.
        self._sleepers: list[_Worker] = self._workers[::-1]
        self._waking = 0  # threads whose wake was released and that have not claimed yet
        self._threads: set[threading.Thread] = set()
        for w in self._workers:
            t = threading.Thread(target=self._loop, args=(w,), name=f"{name}-dispatch-{w.index}", daemon=True)
            w.thread = t
            self._threads.add(t)
            t.start()
        self._watchdog: threading.Thread | None = None
        self._watch = threading.Condition(self._lock)
        if self._core.timeout_ns is not None:
            self._watchdog = threading.Thread(target=self._watch_loop, name=f"{name}-dispatch-watchdog", daemon=True)
            self._watchdog.start()

    # ----------------------------------------------------------------------------------- submit
    def submit(self, item: T, trace: MessageTraceLike | None = None, *, timeout: float | None = None) -> bool:
        """Hand ``item`` to the policy; block while it has no room (back-pressure).

        Returns True once accepted (``trace.mark(DISPATCH_ENQUEUE)`` has been called; a message
        whose ``key=`` failed is accepted and reported NOT_STARTED at once), False if ``timeout``
        (seconds on the clock; 0 = do not block) passed first (the item was not taken).

        Raises:
            DispatcherClosed: after :meth:`close` began, also in a ``submit`` blocked then.
            RuntimeError: it would block, called from this dispatcher's own handler, ``on_done``
                or watchdog (a worker waiting for room that only workers free can wait for
                itself); from there submit with ``timeout=0`` and handle False.
            ValueError: ``timeout`` is NaN (``math.inf``: no bound; <= 0: do not block).
        """
        core = self._core
        timeout = timeout_s(timeout, "submit timeout", negative_waits=True)
        e = core.build(item, trace)  # user callables run outside the lock
        with self._lock:
            if core.phase is not _OPEN:
                raise core.closed_error()
            core.number_locked(e)
            if e.error is not None:
                core.reject_locked(e)
            else:
                try:
                    r = core.try_admit_locked(e)
                except WouldBlock:
                    if timeout is not None and timeout <= 0:
                        core.refused_locked(e)
                        return False
                    me = threading.current_thread()
                    if me in self._threads or me is self._watchdog:
                        raise RuntimeError(
                            f"dispatcher {self._name!r} is full and submit was called from its own worker, "
                            "which would wait for itself; use submit(..., timeout=0)"
                        ) from None
                    return self._submit_blocked(e, timeout)
                if r is not None:
                    self._ready.append((r, e))
                    if not self._waking and self._sleepers:
                        self._wake_one_locked()
        if e.error is not None:
            core.report(e, Outcome.NOT_STARTED, e.error, on_worker=False)  # its key= failed: it never ran
            with self._lock:
                core.reported_locked(1)
                if core.watchers:
                    self._cond.notify_all()
        if core.m is not None:
            core.observe_unblocked()
        return True

    def _submit_blocked(self, e: Entry[Any], timeout: float | None) -> bool:
        """Lock held, no room: wait as a waiter until an admitter takes ``e``, close, or the timeout."""
        core = self._core
        t0 = core.now()
        deadline = core.deadline(timeout)
        w = _ThreadWaiter(e, t0)
        core.waiters.append(w)
        lock = self._lock
        lock.release()
        try:
            left = core.remaining(deadline)
            if left is None:
                w.sig.acquire()
            elif left > 0:
                w.sig.acquire(True, left)
        finally:
            lock.acquire()
            if w.state is WaitState.WAITING:  # timed out: withdraw it (it fit nowhere, so no one else gains)
                core.withdraw_locked(w)
        return core.waited(w)  # ADMITTED: the admitter has already handed the entry to its worker

    def _wake_one_locked(self) -> None:
        """Release the warmest sleeping thread (there is one): it will look at the ready queue."""
        self._waking += 1
        self._sleepers.pop().wake.release()

    def _kick_locked(self) -> None:
        """Ready entries wait and no thread is on its way: wake one (it wakes the next if more wait)."""
        if self._ready and not self._waking and self._sleepers:
            self._wake_one_locked()

    def _claim_locked(self, w: _Worker) -> Any:
        """``w`` has nothing to run: the ready ``(slot, entry)`` it takes, else None (it sleeps) or _STOP."""
        ready = self._ready
        if ready:
            got = ready.popleft()
            if ready and not self._waking and self._sleepers:
                self._wake_one_locked()  # the chain: more wait, so the next sleeper looks too
            return got
        if self._core.phase >= _STOPPING:
            return _STOP
        self._sleepers.append(w)
        return None

    def _admit_waiters_locked(self) -> None:
        """Room changed: admit waiters, put the messages given to a slot on the ready queue and
        release their submitters.

        No thread is woken here: the caller claims or kicks after (a freed thread runs the
        first admitted message itself, without a wake)."""
        ready = self._ready
        for wt in self._core.admit_waiters_locked():
            r = wt.worker
            if r is not None:
                ready.append((r, wt.entry))
            assert isinstance(wt, _ThreadWaiter)
            wt.sig.release()

    def free_slots(self) -> int:
        """How many (unkeyed) messages ``submit`` would take now without blocking; 0 once closed.

        A consume loop receives exactly this many. Keyed messages whose key is busy may also be
        accepted beyond it (parked), so it is a lower bound for them.
        """
        with self._lock:
            return self._core.free_slots_locked()

    def _wait_until(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        core = self._core
        timeout = timeout_s(timeout, "wait timeout", negative_waits=True)
        deadline = core.deadline(timeout)
        with self._lock:
            core.watchers += 1
            try:
                while not ready():
                    left = core.remaining(deadline)
                    if left is None:
                        self._cond.wait()
                    elif left <= 0 or not self._cond.wait(left):
                        return ready()
                return True
            finally:
                core.watchers -= 1

    def wait_for_free_slot(self, timeout: float | None = None) -> bool:
        """Block until :meth:`free_slots` > 0 (True), or ``timeout`` passes / the dispatcher closes (False)."""
        core = self._core
        ok = self._wait_until(lambda: core.phase is not _OPEN or core.sched.free_slots() > 0, timeout)
        return ok and core.phase is _OPEN

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or in flight (True), or ``timeout`` passes (False).

        Overrun handlers (already reported TIMEOUT) do not count as in flight.
        """
        return self._wait_until(self._core.idle_locked, timeout)

    # ------------------------------------------------------------------------------------ state
    def statistics(self) -> DispatchStats:
        """One frozen, consistent snapshot of the counters (taken under the lock)."""
        with self._lock:
            return self._core.stats_locked(sum(t.is_alive() for t in self._threads))

    def running(self) -> list[tuple[T, float]]:
        """Items whose handler is running and has no outcome yet, with seconds since it started."""
        return self._ages(overrun=False)

    def overrun(self) -> list[tuple[T, float]]:
        """Items already reported TIMEOUT whose handler still runs, with seconds since it started."""
        return self._ages(overrun=True)

    def blocks(self, key: str) -> bool:
        """Whether a message of ``key`` cannot start until a hung handler returns: round-robin and
        random route a key to one fixed worker, and that worker still runs a message reported
        TIMEOUT. (A consume loop gives such a message back instead of holding it for the hang.)"""
        with self._lock:
            return self._core.blocked_locked(key)

    def _ages(self, overrun: bool) -> list[tuple[T, float]]:
        with self._lock:
            now = self._core.now()
            out: list[tuple[T, float]] = []
            for w in self._workers:
                r = w.running
                if r is None:
                    continue
                entry, started, _slot = r
                if (w.expired is entry) is overrun:
                    out.append((cast(T, entry.item), max(0, now - started) / 1e9))
            return out

    # ---------------------------------------------------------------------------------- workers
    def _loop(self, w: _Worker) -> None:
        wake = w.wake
        run = self._run
        finish = self._finish
        log = self._core.log
        lock = self._lock
        while True:
            wake.acquire()
            with lock:  # claim under the lock: close's timeout may have taken the ready entries back
                self._waking -= 1
                got: Any = self._claim_locked(w)
            while got is not None:
                if got is _STOP:
                    return
                slot, e = got
                try:
                    outcome, error = run(w, slot, e)
                except BaseException as exc:  # noqa: BLE001 - only our own bug can get here
                    log("dispatcher internals", exc)
                    outcome, error = _FAILURE, exc
                got = finish(w, slot, e, outcome, error)
            # an idle worker keeps no message alive (its item, its trace, the error's frames)
            e = error = None

    def _run(self, w: _Worker, slot: int, e: Entry[Any]) -> tuple[Outcome, BaseException | None]:
        """Run the handler of ``e`` inside its trace scope; its outcome by the rules of :mod:`.core`."""
        core = self._core
        t0 = core.begin(e, slot)
        w.running = (e, t0, slot)
        trace = e.trace
        scope = None if trace is None else core.enter_scope(trace)
        error: BaseException | None = None
        try:
            result = self._handler(e.item)  # Entry[Any]: no cast call on the hot path
        except BaseException as exc:  # noqa: BLE001 - the handler's failure is the message's outcome
            error = exc
        else:
            if result is not None:  # a returned coroutine ran nothing: a failure, never a success
                error = never_ran(result, "handler")
            result = None  # an idle worker keeps nothing of the message alive
        if scope is not None:
            core.exit_scope(scope, error)
        return core.outcome_of(error, t0)

    def _finish(self, w: _Worker, slot: int, e: Entry[Any], outcome: Outcome, error: BaseException | None) -> Any:
        """Report ``e`` (unless the watchdog did), free its slot; what ``w`` runs next: ``(slot, entry)``,
        None (it sleeps) or _STOP."""
        self._core.ended(e, slot)  # the slot is free now, whoever reports the outcome
        core = self._core
        lock = self._lock
        mine = True
        if self._watchdog is not None:
            with lock:  # the watchdog may be reporting this very entry: one of us claims it
                mine = w.expired is not e
                w.running = None
                w.expired = None
        else:
            w.running = None
        if mine:
            core.report(e, outcome, error)
        back: list[Entry[Any]] = []
        with lock:
            if mine:
                core.count_locked(outcome)
                if outcome is not _SUCCESS and core.successors_follow:  # before done: e still holds its key
                    back = core.drop_successors_locked(slot, e, outcome)
            else:
                core.overrun -= 1
            nxt = self._core.done_locked(slot, e)
            if core.waiters and not back:  # else after their SKIPPED reports, as after a TIMEOUT
                self._admit_waiters_locked()
            if core.watchers:
                self._cond.notify_all()
            if self._watchdog is not None and core.phase >= _STOPPING and core.idle_locked():
                # the last handler of a closed dispatcher returned after close() gave up on it: the
                # watchdog sleeps until that handler's deadline and nothing else would wake it
                self._watch.notify_all()
            if nxt is not None:  # the slot's next (its key's successor, its buffer): same slot, this thread
                if self._ready:
                    self._kick_locked()
                got: Any = (slot, nxt)
            else:
                got = self._claim_locked(w)
        if back:
            self._follow(back)
        return got

    def _follow(self, back: list[Entry[Any]]) -> None:
        """``successors_follow``: report SKIPPED, on this worker, the successors of a message that
        did not succeed (counted already), then admit the waiters their parking room lets in."""
        core = self._core
        core.report_skipped(back, on_worker=True)
        with self._lock:
            core.reported_locked(len(back))
            if core.waiters:
                self._admit_waiters_locked()
                self._kick_locked()
            if core.watchers:
                self._cond.notify_all()
            if self._watchdog is not None and core.phase >= _STOPPING and core.idle_locked():
                self._watch.notify_all()  # as in _finish: the watchdog may sleep on a closed dispatcher

    # --------------------------------------------------------------------------------- watchdog
    def check_timeouts(self) -> int:
        """Report TIMEOUT now for every handler past ``handler_timeout`` on the clock; how many.

        The watchdog thread calls it at each deadline; call it yourself after moving a manual clock.
        """
        core = self._core
        tns = core.timeout_ns
        if tns is None:
            return 0
        expired: list[tuple[Entry[Any], int, list[Entry[Any]]]] = []
        with self._lock:
            now = core.now()
            for w in self._workers:
                r = w.running
                if r is None:
                    continue
                entry, started, slot = r
                if w.expired is entry or now - started <= tns:
                    continue
                w.expired = entry
                expired.append((entry, now - started, core.expire_locked(slot, entry)))
        if not expired:
            return 0
        n = 0
        for e, elapsed, back in expired:
            core.report(e, _TIMEOUT, HandlerTimeout(elapsed / 1e9, tns / 1e9))
            core.report_skipped(back, on_worker=True)
            n += 1 + len(back)
        with self._lock:
            core.reported_locked(n)
            if core.waiters:  # parking room freed; admitted only now, after the reports above
                self._admit_waiters_locked()
                self._kick_locked()
            if core.watchers:
                self._cond.notify_all()
        return len(expired)

    def _watch_loop(self) -> None:
        core = self._core
        tns = core.timeout_ns
        assert tns is not None
        while True:
            self.check_timeouts()
            with self._lock:
                starts = [started for w in self._workers if (r := w.running) is not None
                          for entry, started, _slot in (r,) if w.expired is not entry]
                if core.phase >= _STOPPING and core.idle_locked():
                    return
                # A handler starting now has its deadline at least one timeout away: waking after
                # one timeout when none runs cannot miss it.
                wait_ns = tns if not starts else min(starts) + tns + 1 - core.now()
                if wait_ns > 0:
                    self._watch.wait(wait_ns / 1e9)

    # -------------------------------------------------------------------------------- shutdown
    def close(self, drain: bool = True, timeout: float | None = None) -> bool:
        """Stop accepting, finish or give back every accepted message, stop the workers. Idempotent.

        ``submit`` raises ``DispatcherClosed`` from now on (also in a ``submit`` blocked now).
        ``drain=True`` runs what is queued and in flight; ``drain=False`` runs what is in flight
        and gives back each queued message at once (``Outcome.SKIPPED``: ``trace.finish`` then
        ``on_done``, unrun). Queued messages no worker can ever take (every worker is held by an
        overrun handler) are given back SKIPPED too, once nothing is in flight.

        ``timeout`` (seconds on the clock) bounds the whole call. When it passes, every message
        not started yet — queued, or handed to a worker that has not claimed it — is given back
        SKIPPED before ``close`` returns, and from then on no handler starts; handlers already
        running cannot be stopped: their outcomes arrive when they return (:meth:`running`
        lists them). Overrun handlers are never waited for (their daemon threads are left to end).

        Returns:
            True when every accepted message's outcome has been reported (its ``on_done``
            returned); False when ``timeout`` passed first. Idle workers are told to exit and
            joined within what is left of ``timeout`` — with ``timeout=0`` they may still be
            exiting when this returns True (nothing more can start on them).

        Raises:
            RuntimeError: called from a handler or ``on_done`` on one of this dispatcher's threads.
            ValueError: ``timeout`` is NaN or negative (``math.inf``: no bound, as None); nothing
                changed.
        """
        timeout = timeout_s(timeout, "close timeout")
        me = threading.current_thread()
        if me in self._threads or me is self._watchdog:
            raise RuntimeError("close() called from a dispatcher worker (a handler) would wait for itself")
        core = self._core
        deadline = core.deadline(timeout)
        with self._lock:
            core.close_locked()
            for wt in core.close_waiters_locked():
                assert isinstance(wt, _ThreadWaiter)
                wt.sig.release()
            if core.watchers:
                self._cond.notify_all()
            back = [] if drain else core.take_queued_locked()
        self._give_back(back)
        left = core.remaining(deadline)
        quiet = self._wait_until(core.quiet_locked, None if left is None else max(0.0, left))
        with self._lock:
            back, hung, overrun = self._stop_locked(quiet)
        self._give_back(back)
        core.abandon(overrun)  # close never waits for them: their open spans end now
        for t in self._threads - hung:
            left = core.remaining(deadline)
            t.join(None if left is None else max(0.0, left))
        with self._lock:
            settled = core.idle_locked()
        core.leave_gauges()
        if not settled:
            s = self.statistics()
            logger.warning("dispatcher %r: close timed out with %d in flight", self._name, s.in_flight)
        return settled

    def _stop_locked(self, quiet: bool) -> tuple[list[Entry[Any]], set[threading.Thread | None], list[Entry[Any]]]:
        """:meth:`close` once its wait ended (``quiet``: every outcome reported), under the lock: take
        back what did not start — what no worker can take, or, when the wait timed out, everything
        not started, ready entries too — and tell the threads to exit. What to give back, the threads
        of overrun handlers (never joined) and their entries."""
        core = self._core
        back = core.take_queued_locked()
        if not quiet:
            n = len(back)
            ready = self._ready
            while ready:  # handed to a slot, not claimed: it must not start after we return
                slot, e = ready.popleft()
                back.append(e)
                core.done_locked(slot, e)
            core.give_back_locked(back[n:])
        if core.stop_locked(abandon=not quiet):  # a thread that finds nothing ready now exits
            while self._sleepers:
                self._wake_one_locked()
        self._watch.notify_all()
        hung = {w.thread for w in self._workers if w.expired is not None}
        overrun = [w.expired for w in self._workers if w.expired is not None]
        return back, hung, overrun

    def _give_back(self, entries: list[Entry[Any]]) -> None:
        """Deliver SKIPPED for ``entries`` (counted under the lock already), in the caller's thread."""
        if not entries:
            return
        try:
            self._core.report_skipped(entries, on_worker=False)
        finally:
            with self._lock:
                self._core.reported_locked(len(entries))
                if self._core.watchers:
                    self._cond.notify_all()

    def __enter__(self) -> Dispatcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close(drain=True)

    def __repr__(self) -> str:
        s = self._sched
        return (f"Dispatcher(name={self._name!r}, policy={self.policy!r}, workers={s.workers}, "
                f"busy={s.busy}, queued={s.queued}, closed={self.closed})")  # fmt: skip
