"""The half of the dispatcher that is not concurrency, shared by the thread and asyncio engines.

Here: argument validation, entry building with the guarded ``key=``/``cost=`` callables, the
counters, admission with its fairness rule, the handler's trace scope, the timeout rule, outcome
reporting and the stats snapshot. The engines add only waiting and running: threads and locks
in :mod:`.engine`, tasks and futures in :mod:`.aio`. Nothing here blocks or locks; methods named
``*_locked`` must be called under the thread engine's lock (the asyncio engine calls everything
from its event loop).

Exception rules, the same in both engines:

* **Handler**: anything it raises — any ``BaseException``, ``SystemExit`` and
  ``KeyboardInterrupt`` included — makes that message ``Outcome.FAILURE`` and never ends the
  worker (a handler cannot stop a consumer; stop it with ``close``). The one exception:
  ``asyncio.CancelledError`` while the asyncio worker *task itself* is being cancelled; the
  message is reported ``FAILURE`` and the cancellation propagates (the worker's next message, if
  any, goes to a fresh task). A ``CancelledError`` the handler raises on its own is a failure.
  The other exception: :class:`.NotStarted` (the handler refuses to start this message) is
  ``Outcome.NOT_STARTED``, counted in ``not_started`` — not a failure, whatever the clock says.
  So is a *result* that means the handler never ran — a coroutine, another awaitable or a
  generator (``lambda m: handle_async(m)``): ``FAILURE`` with ``HandlerNeverRan``, never a success.
* **successors_follow** (off by default; the consume loop sets it): a keyed message whose outcome
  (reported by its worker) is not ``SUCCESS`` takes its key's waiting successors with it, reported
  ``SKIPPED`` unrun right after it (:meth:`Core.drop_successors_locked`), as a watchdog TIMEOUT does.
* **Timeout**: a handler that runs longer than ``handler_timeout`` on the injected clock is
  ``Outcome.TIMEOUT`` with a :class:`.HandlerTimeout`, whatever it returned or raised (its own
  exception is the ``__cause__``).
* **key=** raising an ``Exception``, or returning anything but ``str``/``None``: that one
  message does not run — ``submit`` returns True (accepted), the message is counted in
  ``not_started`` (never ``failed``: no handler ran) and reported
  ``trace.finish(NOT_STARTED, error)`` then ``on_done(item, NOT_STARTED, error)`` before
  ``submit`` returns; it never reaches a worker (without its key it cannot be ordered safely).
  Logged once.
* **cost=** raising, or returning a non-number, NaN, an infinity, a negative number or one too
  large for a float (``10**400``; never an OverflowError out of ``submit``): the
  message takes cost ``0.0`` (a cost is only a hint), counted in ``stats.cost_errors``, logged
  once.
* **Trace methods, on_done, the metrics**: their ``Exception`` is logged once per kind (later
  ones at debug level) and swallowed. On a worker even a ``BaseException`` is swallowed (a
  worker never dies); in the caller's thread (inside ``submit``/``close``: ``key=``, ``cost=``,
  ``trace.mark``, ``on_done`` of a failed key or a SKIPPED message) ``KeyboardInterrupt`` and
  ``SystemExit`` reach the caller, as from any call it makes.

Fairness among blocked submitters: room that frees goes first to the blocked submitters, in
arrival order, to each one whose message fits (:meth:`Core.admit_waiters`, the only place a
blocked submitter is admitted, called by whoever frees room); so after every change no blocked
submitter fits, and a newcomer admitted directly takes only room no blocked submitter can use —
it never overtakes one (trio's ``CapacityLimiter`` rule, for messages of different shapes).

Time: every reading of time — slot wait, time blocked in ``submit``, handler age and deadline,
the deadlines of ``submit``/``wait_*``/``close`` timeouts — comes from the injected ``clock``
(default ``time.monotonic_ns``).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar, cast

from ..bounds import MAX_THREADS, count, timeout_s
from ..callables import exact_str, require_plain, short_repr, unrun
from ..logonce import OnceLogger
from ..path.blocking import BlameTracker, Verdict
from ..path.clock import MonoNs, MonotonicClock, require_clock
from ..path.stages import Outcome, Stage
from .accrual import Accrual
from .costtable import as_seconds
from .metrics import BoundDispatchMetrics, DispatchMetrics
from .policy import Policy, resolve_policy
from .protocol import DispatcherClosed, DispatchPhase, DispatchStats, HandlerTimeout, MessageTraceLike, NotStarted
from .scheduler import Admission, Entry

__all__ = ["Core", "EngineBase", "Running", "WaitState", "Waiter", "WouldBlock", "exemplar_of"]

T = TypeVar("T")

logger = logging.getLogger("tracer.dispatch")

_ENQUEUE = Stage.DISPATCH_ENQUEUE
_FAILURE = Outcome.FAILURE
_FULL = Admission.FULL
_SKIPPED = Outcome.SKIPPED
_NOT_STARTED = Outcome.NOT_STARTED
_OK: tuple[Outcome, BaseException | None] = (Outcome.SUCCESS, None)
_OPEN = DispatchPhase.OPEN
_STOPPING = DispatchPhase.STOPPING


class WouldBlock(Exception):
    """Raised by :meth:`Core.try_admit_locked`: the policy has no room for the message now."""


class WaitState(enum.Enum):
    """Where a blocked submitter stands; decided under the engine's lock (or on the loop)."""

    WAITING = "waiting"
    ADMITTED = "admitted"  # a worker or the policy took its message; ``worker`` says which
    CLOSED = "closed"  # close() began: the message was not taken


# The handler a worker runs now: (entry, start ns on the core's clock, slot), one assignment so a
# reader under no lock sees all three. Read by unpacking into those names: a plain tuple, as a
# NamedTuple instance costs its allocation and dealloc once per handler run (callgrind of 20000
# submits to a 4-worker Dispatcher: about 1300 more instructions a message, 3.6 %).
Running = tuple[Entry[Any], int, int]


class Waiter:
    """One blocked submitter. The engines subclass it with the way to wake one."""

    __slots__ = ("entry", "state", "t0", "worker")

    def __init__(self, entry: Entry[Any], t0: int) -> None:
        self.entry = entry
        self.state = WaitState.WAITING
        self.worker: int | None = None  # set when admitted: the worker that holds it, None = queued
        self.t0 = t0

    def alive(self) -> bool:
        """False when its submitter gave up already (an engine whose waits can be cancelled)."""
        return True


def exemplar_of(trace: MessageTraceLike) -> Mapping[str, str] | None:
    """The optional ``trace.exemplar()`` labels, if the trace offers them."""
    fn = getattr(trace, "exemplar", None)
    if fn is None:
        return None
    return cast("Mapping[str, str] | None", fn())


class Core(Generic[T]):
    """The state and rules of one dispatcher that are not concurrency (see the module docstring)."""

    def __init__(
        self,
        *,
        policy: Policy | str,
        workers: int,
        key: Callable[[T], str | None] | None,
        cost: Callable[[T], float] | None,
        on_done: Callable[[T, Outcome, BaseException | None], None] | None,
        metrics: DispatchMetrics | None,
        handler_timeout: float | None,
        clock: MonotonicClock | None,
        name: str,
        kind: str,
        consumer_group: str = "",
        successors_follow: bool = False,
    ) -> None:
        count(workers, "workers", maximum=MAX_THREADS)
        if not isinstance(successors_follow, bool):
            raise TypeError(f"successors_follow must be a bool, got {type(successors_follow).__name__}")
        # a keyed message that ends without success takes its key's waiting successors with it
        # (SKIPPED, unrun): the consume loop's per-key order (drop_successors_locked)
        self.successors_follow = successors_follow
        # math.inf or past NO_BOUND_S: no watchdog (a deadline past what a thread can wait for)
        handler_timeout = timeout_s(handler_timeout, "handler_timeout", positive=True)
        for what, fn in (("key=", key), ("cost=", cost), ("on_done=", on_done)):
            require_plain(fn, what, optional=True)
        self.policy = resolve_policy(policy)
        self.sched = self.policy.scheduler(workers)
        self.key_fn = key
        self.cost_fn = cost
        self.on_done = on_done
        self.timeout_s = handler_timeout
        self.timeout_ns = None if handler_timeout is None else int(handler_timeout * 1e9)
        if clock is not None:
            require_clock(clock, f"{kind}(clock=)", monotonic=True)
        self.now: Callable[[], MonoNs] = time.monotonic_ns if clock is None else clock.monotonic_ns  # type: ignore[assignment]
        self.name = name
        self.log = OnceLogger(f"{kind} {name!r}", logger)
        if not isinstance(consumer_group, str):
            raise TypeError(f"consumer_group must be a str, got {type(consumer_group).__name__}")
        # worker-seconds for the alerts; only with metrics, so a bare dispatcher reads no clock for it
        self.accrual: Accrual | None = None if metrics is None else Accrual(self.sched, self.now)
        self.m: BoundDispatchMetrics | None = (
            None if metrics is None or self.accrual is None
            else metrics.bind(self.policy.name, self.accrual, consumer_group))
        # the dispatcher's life: one field, moved only forward by close_locked and stop_locked
        self.phase: DispatchPhase = _OPEN
        self.waiters: deque[Waiter] = deque()  # blocked submitters, oldest first
        self.watchers = 0  # callers blocked in wait_for_free_slot / wait_idle / close
        self.overrun = 0  # workers held by a handler already reported TIMEOUT
        # outcomes counted but whose trace.finish/on_done has not returned yet: close waits for them
        self.reporting = 0
        self.seq = 0
        self.submitted = 0
        self.handled = 0
        self.failed = 0
        self.timed_out = 0
        self.skipped = 0
        self.not_started = 0
        self.cost_errors = 0
        self._cost_lock = threading.Lock()
        # Live blame (tracer.path.blocking), fed from this dispatcher's own events on its clock.
        # Off until a trace or metrics are attached: a bare dispatcher pays one test per event.
        self.blame = BlameTracker(workers)
        self.blaming = metrics is not None

    # ------------------------------------------------------------------------------- entries
    def build(self, item: T, trace: MessageTraceLike | None) -> Entry[Any]:
        """The entry for ``item``, ``key=``/``cost=`` evaluated under the rules (no engine lock held).

        A failed key is left in ``entry.error`` (the engine rejects the entry); a failed cost is
        counted and becomes 0.
        """
        if self.key_fn is None and self.cost_fn is None:
            return Entry(item, trace, None, 0.0)
        key: str | None = None
        key_error: BaseException | None = None
        if self.key_fn is not None:
            try:
                k = self.key_fn(item)
            except Exception as exc:  # noqa: BLE001 - a raising key stops this message, not the caller
                key_error = exc
            else:
                if k is None or isinstance(k, str):
                    key = None if k is None else exact_str(k)
                else:  # a returned coroutine is closed (unrun): Python does not warn "never awaited"
                    key_error = TypeError(f"key= returned {unrun(k) or type(k).__name__}; expected str or None")
            if key_error is not None:
                self.log("key= callable", key_error, "the message does not run")
        cost = 0.0
        if self.cost_fn is not None and key_error is None:
            try:
                c: object = self.cost_fn(item)
                unrun(c)  # a returned coroutine is closed: it is no cost, and must not warn
            except Exception as exc:  # noqa: BLE001 - a cost is a hint: a broken one is 0
                self.log("cost= callable", exc, "the message takes cost 0")
                self._cost_failed()
            else:
                f = as_seconds(c)
                if f is not None:
                    cost = f
                else:
                    self.log("cost= value", None, f"{short_repr(c)} is not a finite number >= 0; "
                             "the message takes cost 0")
                    self._cost_failed()
        e: Entry[Any] = Entry(item, trace, key, cost)
        e.error = key_error
        return e

    def _cost_failed(self) -> None:
        with self._cost_lock:  # build runs outside the engine's lock; this path is rare
            self.cost_errors += 1

    def leave_gauges(self) -> None:
        """``close`` returns: this dispatcher no longer counts in the worker/busy/queued gauges,
        settled or not. The gauges show live dispatchers; a closed one whose hung handlers still
        run (close gave up on them) would otherwise add its pool to the next one's for as long
        as they hang — a restarted loop's 4-worker pool read as 8 workers, 4 busy. Its outcome
        counters stay bound: a late outcome is still counted."""
        if self.m is not None:
            self.m.unbind()

    # ---------------------------------------------------------------------------- life cycle
    def close_locked(self) -> None:
        """close() begins (every call): OPEN becomes CLOSING; a later phase stays."""
        if self.phase is _OPEN:
            self.phase = DispatchPhase.CLOSING

    def stop_locked(self, *, abandon: bool) -> bool:
        """close's wait ended, ``abandon``: by its timeout. The phase moves to STOPPING (ABANDONED),
        never back. Whether this call is the one that stopped it (the engine wakes its idle workers)."""
        first = self.phase < _STOPPING
        target = DispatchPhase.ABANDONED if abandon else _STOPPING
        if self.phase < target:
            self.phase = target
        return first

    def closed_error(self, blocked: bool = False) -> DispatcherClosed:
        if blocked:
            return DispatcherClosed(f"dispatcher {self.name!r} closed while submit was blocked")
        return DispatcherClosed(f"dispatcher {self.name!r} is closed")

    # ----------------------------------------------------------------------------- admission
    def try_admit_locked(self, e: Entry[Any]) -> int | None:
        """The non-blocking admit: the worker that now holds ``e`` (hand it over), or None (queued).

        Raises:
            WouldBlock: the policy has no room for ``e`` now (nothing changed).

        A newcomer may take any room there is: after every change of room :meth:`admit_waiters`
        has admitted each blocked submitter that fits, so what is left is room none of them can
        use (the fairness rule, stated in the module docstring).
        """
        sched = self.sched
        r = sched.admit(e)
        if self.accrual is not None and r is not _FULL:
            self.accrual.mark()
        if isinstance(r, int):  # a worker holds it (narrows the type without a cast call)
            self._accept(e)
            return r
        if r is _FULL:
            raise WouldBlock
        self._accept(e)
        if self.blaming and sched.bound is not None:  # QUEUED
            self.blame.bound(e, sched.bound, self.now() if e.t_enq == 0 else e.t_enq)
            sched.bound = None
        return None

    def admit_waiters_locked(self) -> list[Waiter]:
        """Room may have freed: admit blocked submitters, oldest first, each one that fits.

        The only place a blocked submitter gets room. Returns the admitted ones (state
        ``ADMITTED``, ``worker`` set); the caller hands their entries over and wakes them.
        """
        waiters = self.waiters
        if not waiters:
            return []
        admitted: list[Waiter] = []
        keep: deque[Waiter] = deque()
        for w in waiters:
            if not w.alive():
                continue
            try:
                w.worker = self.try_admit_locked(w.entry)
            except WouldBlock:
                keep.append(w)
                continue
            w.state = WaitState.ADMITTED
            admitted.append(w)
        if admitted:
            self.waiters = keep
        return admitted

    def refused_locked(self, e: Entry[Any]) -> None:
        """A submit that would not wait found no room: ``e`` was never taken. Its arrival is
        forgotten, or every refused retry (the consume loop retries its backlog this way while
        the workers are busy) would leave its entry, item and trace in the blame tracker."""
        if self.blaming:
            self.blame.forget(e)

    def withdraw_locked(self, w: Waiter) -> None:
        """A blocked submitter gives up (timeout): its message was not taken."""
        try:
            self.waiters.remove(w)
        except ValueError:
            pass
        if self.blaming:
            self.blame.forget(w.entry)

    def close_waiters_locked(self) -> list[Waiter]:
        """close() began: every blocked submitter gets ``CLOSED``; returns them to wake."""
        out = list(self.waiters)
        self.waiters.clear()
        for w in out:
            w.state = WaitState.CLOSED
            if self.blaming:
                self.blame.forget(w.entry)
        return out

    def _accept(self, e: Entry[Any]) -> None:
        """Count ``e`` as submitted and stamp its enqueue (before any worker can see it)."""
        self.submitted += 1
        if self.m is not None:
            e.t_enq = self.now()
        trace = e.trace
        if trace is not None:
            try:
                trace.mark(_ENQUEUE)
            except Exception as exc:  # noqa: BLE001 - a tracing bug must not lose the message
                self.log("trace.mark", exc)

    def reject_locked(self, e: Entry[Any]) -> None:
        """Accept ``e`` as not started at once (its ``key=`` failed: no handler ran, so it is no
        failure); :meth:`report` it after the lock, then :meth:`reported_locked` it."""
        self._accept(e)
        self.not_started += 1
        self.reporting += 1
        if self.blaming:
            self.blame.forget(e)

    # -------------------------------------------------------------------------------- running
    def begin(self, e: Entry[Any], worker: int) -> int:
        """A worker starts ``e``: observe its slot wait, tell the trace the lane; the start time."""
        t0 = self.now()
        m = self.m
        trace = e.trace
        if m is None and trace is None:
            if self.blaming:
                self.blame.started(e, worker, t0)
            return t0
        if self.blaming:
            self._blame(e, worker, t0)
        if m is not None:
            wait = (t0 - e.t_enq) / 1e9
            try:
                ex = None if trace is None else exemplar_of(trace)
                m.slot_wait.observe(wait if wait > 0 else 0.0, dict(ex) if ex else None)
            except BaseException as exc:  # noqa: BLE001 - on a worker: never end it
                self.log("slot-wait metric", exc)
        if trace is not None:
            try:
                if hasattr(trace, "worker"):
                    trace.worker = worker  # the report draws one lane per worker
            except BaseException as exc:  # noqa: BLE001
                self.log("trace.worker", exc)
        return t0

    def _blame(self, e: Entry[Any], worker: int, t0: int) -> None:
        """Decide why ``e`` waited and tell its trace (``trace.blame``, when it has one)."""
        trace = e.trace
        try:
            verdict: Verdict = self.blame.started(e, worker, t0, ref=trace)
            fn = getattr(trace, "blame", None)
            if fn is not None:
                fn(verdict, self.policy.name)
        except BaseException as exc:  # noqa: BLE001 - on a worker: never end it
            self.log("live blame", exc)

    def ended(self, e: Entry[Any], worker: int) -> None:
        """The handler of ``e`` on ``worker`` returned (also one reported TIMEOUT earlier): the worker is free."""
        if self.blaming:
            try:
                self.blame.ended(e, worker, self.now())
            except BaseException as exc:  # noqa: BLE001 - on a worker: never end it
                self.log("live blame", exc)

    def enter_scope(self, trace: MessageTraceLike | None) -> AbstractContextManager[object] | None:
        if trace is None:
            return None
        try:
            scope = trace.handler_scope()
            scope.__enter__()
            return scope
        except BaseException as exc:  # noqa: BLE001
            self.log("trace.handler_scope enter", exc)
            return None

    def exit_scope(self, scope: AbstractContextManager[object] | None, error: BaseException | None) -> None:
        if scope is None:
            return
        try:
            if error is None or isinstance(error, NotStarted):  # a refusal is no error of the handler
                scope.__exit__(None, None, None)
            else:
                scope.__exit__(type(error), error, error.__traceback__)
        except BaseException as exc:  # noqa: BLE001
            self.log("trace.handler_scope exit", exc)

    def outcome_of(self, error: BaseException | None, t0: int) -> tuple[Outcome, BaseException | None]:
        """The outcome of a handler that started at ``t0`` and ended with ``error`` (the timeout rule)."""
        if error is not None and isinstance(error, NotStarted):
            return _NOT_STARTED, error  # it never started: neither a failure nor a timeout
        tns = self.timeout_ns
        if tns is not None:
            elapsed = self.now() - t0
            if elapsed > tns:
                timeout = HandlerTimeout(max(0, elapsed) / 1e9, tns / 1e9)
                timeout.__cause__ = error
                return Outcome.TIMEOUT, timeout
        return _OK if error is None else (_FAILURE, error)

    def count_locked(self, outcome: Outcome) -> None:
        if outcome is Outcome.SUCCESS:
            self.handled += 1
        elif outcome is _FAILURE:
            self.failed += 1
        elif outcome is Outcome.TIMEOUT:
            self.timed_out += 1
        elif outcome is _NOT_STARTED:
            self.not_started += 1
        else:
            self.skipped += 1

    def report(self, e: Entry[Any], outcome: Outcome, error: BaseException | None, *, on_worker: bool = True) -> None:
        """``trace.finish`` then ``on_done`` then the outcome counter, each guarded (exactly once per entry)."""
        catch: type[BaseException] = BaseException if on_worker else Exception
        trace = e.trace
        if trace is not None:
            try:
                trace.finish(outcome, error)
            except catch as exc:
                self.log("trace.finish", exc)
        on_done = self.on_done
        if on_done is not None:
            try:
                unrun(on_done(cast(T, e.item), outcome, error))  # its answer is ignored: a coroutine is closed
            except catch as exc:
                self.log("on_done", exc)
        elif error is not None and trace is None and outcome is not _NOT_STARTED:
            self.log(f"handler ({type(error).__name__}, no on_done to report it)", error)
        m = self.m
        if m is not None:
            m.outcomes[outcome].inc()

    def observe_blocked(self, ns: int) -> None:
        m = self.m
        if m is not None:
            m.submit_blocked.observe(ns / 1e9 if ns > 0 else 0.0)

    def observe_unblocked(self) -> None:
        m = self.m
        if m is not None:
            m.submit_blocked.observe(0.0)

    # ------------------------------------------------------------------------- state, closing
    def idle_locked(self) -> bool:
        """Nothing queued, nothing in flight, no outcome being reported (overrun handlers aside)."""
        s = self.sched
        return s.busy - self.overrun == 0 and s.queued == 0 and self.reporting == 0

    def quiet_locked(self) -> bool:
        """No handler in flight and no outcome being reported: what is still queued cannot start.

        (Queued work with nothing in flight means every worker is held by an overrun handler.)
        """
        return self.sched.busy - self.overrun == 0 and self.reporting == 0

    def give_back_locked(self, entries: list[Entry[Any]]) -> list[Entry[Any]]:
        """Count ``entries`` (taken from the scheduler, unrun) SKIPPED; :meth:`report_skipped` them after the lock."""
        self.skipped += len(entries)
        self.reporting += len(entries)
        if self.blaming:
            for e in entries:
                self.blame.forget(e)
        return entries

    def take_queued_locked(self) -> list[Entry[Any]]:
        """Every queued entry leaves unrun, counted SKIPPED; :meth:`report_skipped` them after the lock."""
        out = self.sched.take_queued()
        if self.accrual is not None:
            self.accrual.mark()
        return self.give_back_locked(out)

    def expire_locked(self, worker: int, e: Entry[Any]) -> list[Entry[Any]]:
        """``e`` on ``worker`` ran past its deadline: count it TIMEOUT (overrun) and release what waited behind it.

        Returns the entries given back with it (counted SKIPPED). The caller reports ``e``'s
        TIMEOUT, then :meth:`report_skipped` the rest, then :meth:`reported_locked` ``1 + len``.
        """
        self.timed_out += 1
        self.overrun += 1
        self.reporting += 1
        out = self.sched.expire(worker, e)
        if self.accrual is not None:
            self.accrual.mark()
        return self.give_back_locked(out)

    def drop_successors_locked(self, worker: int, e: Entry[Any], outcome: Outcome) -> list[Entry[Any]]:
        """With ``successors_follow``: ``e`` on ``worker`` ended ``outcome`` (reported by its worker);
        unless it succeeded, the messages of its key waiting behind it leave with it, counted
        SKIPPED. Call before :meth:`done_locked`, under the same lock (while ``e`` still holds its
        key, nothing of its key can start); :meth:`report_skipped` them after the lock, then
        :meth:`reported_locked` their number."""
        if not self.successors_follow or e.key is None or outcome is Outcome.SUCCESS:
            return []
        out = self.sched.drop_successors(worker, e)
        if not out:
            return out
        if self.accrual is not None:
            self.accrual.mark()
        return self.give_back_locked(out)

    def done_locked(self, worker: int, e: Entry[Any]) -> Entry[Any] | None:
        """``worker`` finished ``e``: the scheduler's next entry for it (None: idle now). Every
        engine frees a worker through here, so the worker-seconds see each change."""
        nxt = self.sched.done(worker, e)
        if self.accrual is not None:
            self.accrual.mark()
        return nxt

    def abandon(self, entries: list[Entry[Any]]) -> None:
        """``close`` leaves these overrun handlers running (a thread cannot be stopped): each
        trace's optional ``abandon()`` ends what it still keeps open for them, so nothing the
        handler started is left without its parent. Guarded like the other trace methods."""
        for e in entries:
            fn = getattr(e.trace, "abandon", None)
            if fn is None:
                continue
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                self.log("trace.abandon", exc)

    def report_skipped(self, entries: list[Entry[Any]], *, on_worker: bool) -> None:
        for e in entries:
            self.report(e, _SKIPPED, None, on_worker=on_worker)

    def reported_locked(self, n: int) -> None:
        """``n`` outcomes counted under the lock earlier have been reported (on_done returned)."""
        self.reporting -= n

    def free_slots_locked(self) -> int:
        return 0 if self.phase is not _OPEN else self.sched.free_slots()

    def blocked_locked(self, key: str) -> bool:
        return self.sched.blocked(key)

    def deadline(self, timeout: float | None) -> MonoNs | None:
        """The clock's reading ``timeout`` seconds from now; None for no bound. ``timeout`` is one
        :func:`~tracer.bounds.timeout_s` returned (None already stands for inf and huge ones)."""
        if timeout is None:
            return None
        return MonoNs(self.now() + int(timeout * 1e9))

    def remaining(self, deadline: MonoNs | None) -> float | None:
        """Seconds left until ``deadline`` on the clock (None: no deadline; <= 0: passed)."""
        return None if deadline is None else (deadline - self.now()) / 1e9

    def number_locked(self, e: Entry[Any]) -> None:
        """Give ``e`` its arrival number: unique, increasing (the cost heap breaks ties with it).

        Also its arrival for live blame: the submit is where the dispatcher takes the message
        over (a blocked submit waits from here too, e.g. on a full round-robin buffer)."""
        e.seq = self.seq
        self.seq += 1
        if not self.blaming:
            if e.trace is None:
                return
            self.blaming = True
        self.blame.arrived(e, self.now())

    def waited(self, w: Waiter) -> bool:
        """The result of a blocked ``submit`` once its waiter is decided (or its wait ended).

        Raises:
            DispatcherClosed: close() began while it waited.
        """
        if w.state is WaitState.CLOSED:
            raise self.closed_error(blocked=True)
        if w.state is WaitState.WAITING:
            return False  # timed out: the message was not taken
        self.observe_blocked(self.now() - w.t0)
        return True

    def stats_locked(self, live_workers: int) -> DispatchStats:
        s = self.sched
        return DispatchStats(
            submitted=self.submitted,
            handled=self.handled,
            failed=self.failed,
            timed_out=self.timed_out,
            skipped=self.skipped,
            in_flight=s.busy - self.overrun,
            queued=s.queued,
            workers=s.workers,
            policy=self.policy.name,
            waiters=len(self.waiters),
            watchers=self.watchers,
            overrun=self.overrun,
            live_workers=live_workers,
            cost_errors=self.cost_errors,
            blame=self.blame.statistics() if self.blaming else None,
            not_started=self.not_started,
            phase=self.phase,
        )


class EngineBase(Generic[T]):
    """The properties both engines answer the same way, from their :class:`Core`."""

    _core: Core[T]

    @property
    def policy(self) -> Policy:
        """The dispatch policy this dispatcher was built with."""
        return self._core.policy

    @property
    def workers(self) -> int:
        """How many workers (threads or tasks) it runs."""
        return self._core.sched.workers

    @property
    def closed(self) -> bool:
        """True once :meth:`close` began (``submit`` raises ``DispatcherClosed``)."""
        return self._core.phase is not _OPEN

    @property
    def name(self) -> str:
        """The ``name=`` given at construction (thread names, log lines)."""
        return self._core.name
