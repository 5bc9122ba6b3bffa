"""The thread engine: N worker threads, one policy, stamps and metrics around every handler.

Hand-off is direct: each worker blocks on its own ``_thread`` lock; ``submit`` asks the policy's
scheduler (under one engine lock) which worker takes the message, stores the entry on that worker
and releases its lock — one lock release per message, no queue of queues, no future, no
allocation besides the slotted entry. When the policy has no room, the first blocked submitter
leaves its entry in a one-entry *pending box* and sleeps on a lock of its own; the next worker to
free admits it in the same critical section and, when the policy gives it to that worker, runs it
at once instead of going idle (a full pool then costs one thread wake per message, not two).
Other waiters (more submitters, ``wait_for_free_slot``, ``wait_idle``, ``close``) wait on a
condition of the engine lock that workers notify only when someone waits.

Life cycle and failure rules:

* The handler's exception marks the message ``Outcome.FAILURE`` (passed to ``trace.finish`` and
  ``on_done``; the consume loop must not ack it) and never ends the worker.
* ``handler_timeout``: a Python thread cannot be stopped, so an overrunning handler keeps its worker
  until it returns; then the outcome is ``Outcome.TIMEOUT`` (whatever it returned or raised; the
  error is a :class:`HandlerTimeout`) and it is counted. The dispatcher never runs a message twice;
  :meth:`Dispatcher.running` lists in-flight items with their age so a consume loop can extend
  their leases (or give up on them) while they run.
* Exceptions from ``trace`` methods, ``on_done`` or the metrics are logged once per kind and
  swallowed.
* ``close(drain=True)`` finishes queued and in-flight messages; ``close(drain=False)`` finishes
  in-flight ones and reports every queued one as ``Outcome.SKIPPED`` (``trace.finish`` then
  ``on_done``) without running it, so the caller can leave it for redelivery. Either way every
  accepted message gets exactly one outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar, cast

from ..path.clock import Clock
from ..path.stages import Outcome, Stage
from .metrics import BoundDispatchMetrics, DispatchMetrics
from .policy import Policy, resolve_policy
from .protocol import DispatcherClosed, DispatchStats, HandlerTimeout, MessageTraceLike
from .scheduler import FULL, Entry

T = TypeVar("T")

logger = logging.getLogger("tracer.dispatch")

_SUCCESS = Outcome.SUCCESS
_FAILURE = Outcome.FAILURE
_TIMEOUT = Outcome.TIMEOUT
_SKIPPED = Outcome.SKIPPED
_ENQUEUE = Stage.DISPATCH_ENQUEUE


class _OnceLogger:
    """Logs the first failure of each kind with its traceback, later ones at debug level."""

    __slots__ = ("_seen", "_where")

    def __init__(self, where: str) -> None:
        self._seen: set[str] = set()
        self._where = where

    def __call__(self, kind: str, exc: BaseException) -> None:
        if kind in self._seen:
            logger.debug("%s: %s failed again: %r", self._where, kind, exc)
            return
        self._seen.add(kind)
        logger.error("%s: %s failed (logged once; later failures at debug level)", self._where, kind, exc_info=exc)


class _Worker:
    __slots__ = ("current", "entry", "index", "started", "thread", "wake")

    def __init__(self, index: int) -> None:
        self.index = index
        self.wake = threading.Lock()
        self.wake.acquire()  # held while idle; released once per hand-off
        self.entry: Entry[object] | None = None  # the hand-off box
        self.current: Entry[object] | None = None  # what it runs now (for running())
        self.started = 0
        self.thread: threading.Thread | None = None


_WAITING, _TAKEN, _CLOSED = 0, 1, 2
_ACCEPTED_BY_WORKER = -3  # _wait_admit: a worker accepted and handed over the pending entry


class _Pending:
    """The one entry a blocked submitter holds out: the first worker to free takes it directly."""

    __slots__ = ("entry", "sig", "state")

    def __init__(self, entry: Entry[object]) -> None:
        self.entry = entry
        self.sig = threading.Lock()
        self.sig.acquire()  # released by whoever decides: a worker (taken) or close (closed)
        self.state = _WAITING


def exemplar_of(trace: MessageTraceLike) -> Mapping[str, str] | None:
    """The optional ``trace.exemplar()`` labels, if the trace offers them."""
    fn = getattr(trace, "exemplar", None)
    if fn is None:
        return None
    return cast("Mapping[str, str] | None", fn())


class Dispatcher(Generic[T]):
    """Run ``handler`` on ``workers`` threads under a dispatch ``policy``.

    ``key``: ordering key (message group / sharding key), ``None`` for unordered messages.
    ``cost``: cost hint for :class:`.CostAware` (ignored by the other policies).
    ``on_done(item, outcome, error)``: called once per accepted message, after ``trace.finish``.
    ``clock``: where slot-wait and handler-timeout readings come from (default ``time.monotonic_ns``).
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
        self._timeout_ns = None if handler_timeout is None else int(handler_timeout * 1e9)
        self._now: Callable[[], int] = time.monotonic_ns if clock is None else clock.now_ns
        self._name = name
        self._log = _OnceLogger(f"dispatcher {name!r}")
        self._m: BoundDispatchMetrics | None = None if metrics is None else metrics.bind(self._policy.name, self._sched)

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._n_waiting = 0  # threads waiting on _cond; workers notify only when > 0
        self._pending: _Pending | None = None  # a blocked submitter's entry, taken by the next free worker
        self._closed = False
        self._stopping = False
        self._seq = 0
        self._submitted = 0
        self._handled = 0
        self._failed = 0
        self._timed_out = 0
        self._skipped = 0

        self._workers = [_Worker(i) for i in range(workers)]
        self._threads: set[threading.Thread] = set()
        for w in self._workers:
            t = threading.Thread(target=self._loop, args=(w,), name=f"{name}-dispatch-{w.index}", daemon=True)
            w.thread = t
            self._threads.add(t)
            t.start()

    # ----------------------------------------------------------------------------------- submit
    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def workers(self) -> int:
        return len(self._workers)

    def submit(self, item: T, trace: MessageTraceLike | None = None, *, timeout: float | None = None) -> bool:
        """Hand ``item`` to the policy; block while it has no room (back-pressure).

        Returns True once accepted (``trace.mark(DISPATCH_ENQUEUE)`` has been called), False if
        ``timeout`` (seconds; 0 = do not block) passed first. Raises :class:`DispatcherClosed` after
        :meth:`close` began, also from a ``submit`` that was blocked then (the item was not taken).
        """
        e: Entry[object] = Entry(
            item,
            trace,
            None if self._key is None else self._key(item),
            0.0 if self._cost is None else float(self._cost(item)),
        )
        m = self._m
        blocked = 0.0
        with self._lock:
            if self._closed:
                raise DispatcherClosed(f"dispatcher {self._name!r} is closed")
            e.seq = self._seq
            self._seq += 1
            r = self._sched.admit(e)
            if r == FULL:
                if timeout is not None and timeout <= 0:
                    return False
                t0 = time.monotonic()
                r = self._wait_admit(e, timeout)
                blocked = time.monotonic() - t0
                if r == FULL:
                    return False
            if r != _ACCEPTED_BY_WORKER:
                self._accept_locked(e)
        if r >= 0:
            w = self._workers[r]
            w.entry = e
            w.wake.release()
        if m is not None:
            m.submit_blocked.observe(blocked)
        return True

    def _accept_locked(self, e: Entry[object]) -> None:
        """Count ``e`` as submitted and stamp its enqueue (lock held, before any worker can see it)."""
        self._submitted += 1
        if self._m is not None:
            e.t_enq = self._now()
        trace = e.trace
        if trace is not None:
            try:
                trace.mark(_ENQUEUE)
            except Exception as exc:  # noqa: BLE001 - a tracing bug must not lose the message
                self._log("trace.mark", exc)

    def _wait_admit(self, e: Entry[object], timeout: float | None) -> int:
        """Called with the lock held after FULL: wait for room, closing, or the timeout.

        The first blocked submitter leaves its entry in the pending box and sleeps on its own
        lock; the next worker to free admits it under the engine lock (runs it itself when the
        policy picks it, without going idle) and wakes the submitter — one wake per message
        instead of two. Further blocked submitters wait on the condition for the box.
        Returns a worker index / QUEUED (the caller hands over), ``_ACCEPTED_BY_WORKER``
        (all done), or FULL (timed out).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._pending is None:
                return self._wait_pending(e, deadline)
            self._n_waiting += 1
            try:
                if deadline is None:
                    self._cond.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return FULL
                    self._cond.wait(remaining)
            finally:
                self._n_waiting -= 1
            if self._closed:
                raise DispatcherClosed(f"dispatcher {self._name!r} closed while submit was blocked")
            e.seq = self._seq
            self._seq += 1
            r = self._sched.admit(e)
            if r != FULL:
                return r

    def _wait_pending(self, e: Entry[object], deadline: float | None) -> int:
        p = _Pending(e)
        self._pending = p
        lock = self._lock
        lock.release()
        try:
            if deadline is None:
                p.sig.acquire()
            else:
                p.sig.acquire(True, max(0.0, deadline - time.monotonic()))
        finally:
            lock.acquire()
            if p.state == _WAITING:  # timed out (or interrupted): withdraw it, free the box for others
                self._pending = None
                if self._n_waiting:
                    self._cond.notify_all()
        if p.state == _TAKEN:
            return _ACCEPTED_BY_WORKER
        if p.state == _CLOSED:
            raise DispatcherClosed(f"dispatcher {self._name!r} closed while submit was blocked")
        return FULL

    def _take_pending_locked(self, index: int) -> Entry[object] | None:
        """A worker changed the policy's state: admit the pending entry if there is room now.

        Returns the entry when the policy gave it to worker ``index`` itself (it runs it next).
        """
        p = self._pending
        assert p is not None
        pe = p.entry
        pe.seq = self._seq
        self._seq += 1
        r = self._sched.admit(pe)
        if r == FULL:
            return None
        self._pending = None
        self._accept_locked(pe)
        p.state = _TAKEN
        p.sig.release()
        if r == index:
            return pe
        if r >= 0:
            w = self._workers[r]
            w.entry = pe
            w.wake.release()
        return None

    def free_slots(self) -> int:
        """How many (unkeyed) messages ``submit`` would take now without blocking; 0 once closed.

        A consume loop receives exactly this many. Keyed messages whose key is busy may also be
        accepted beyond it (parked), so it is a lower bound for them.
        """
        with self._lock:
            return 0 if self._closed else self._sched.free_slots()

    def _wait_until(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._n_waiting += 1
            try:
                while not ready():
                    if deadline is None:
                        self._cond.wait()
                    else:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            return False
                        self._cond.wait(remaining)
                return True
            finally:
                self._n_waiting -= 1

    def wait_for_free_slot(self, timeout: float | None = None) -> bool:
        """Block until :meth:`free_slots` > 0 (True), or ``timeout`` passes / the dispatcher closes (False)."""
        sched = self._sched
        ok = self._wait_until(lambda: self._closed or sched.free_slots() > 0, timeout)
        return ok and not self._closed

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or in flight (True), or ``timeout`` passes (False)."""
        sched = self._sched
        return self._wait_until(lambda: sched.busy == 0 and sched.queued == 0, timeout)

    # ------------------------------------------------------------------------------------ state
    @property
    def stats(self) -> DispatchStats:
        with self._lock:
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
        with self._lock:
            now = self._now()
            return [
                (cast(T, w.current.item), max(0, now - w.started) / 1e9) for w in self._workers if w.current is not None
            ]

    @property
    def closed(self) -> bool:
        return self._closed

    # ---------------------------------------------------------------------------------- workers
    def _loop(self, w: _Worker) -> None:
        wake = w.wake
        lock = self._lock
        sched = self._sched
        execute = self._execute
        index = w.index
        while True:
            wake.acquire()
            e = w.entry
            if e is None:
                return
            w.entry = None
            while e is not None:
                try:
                    outcome = execute(w, e)
                except BaseException as exc:  # noqa: BLE001 - only our own bug can get here
                    self._log("dispatcher internals", exc)
                    outcome = _FAILURE
                with lock:
                    if outcome is _SUCCESS:
                        self._handled += 1
                    elif outcome is _FAILURE:
                        self._failed += 1
                    else:
                        self._timed_out += 1
                    w.current = None
                    e = sched.done(index, e)
                    if self._pending is not None:
                        mine = self._take_pending_locked(index)
                        if mine is not None:
                            e = mine
                    if self._n_waiting:
                        self._cond.notify_all()
                    if e is None and self._stopping:
                        return

    def _execute(self, w: _Worker, e: Entry[object]) -> Outcome:
        now = self._now
        t0 = now()
        w.started = t0
        w.current = e
        m = self._m
        trace = e.trace
        if m is not None:
            wait = (t0 - e.t_enq) / 1e9
            if trace is None:
                m.slot_wait.observe(wait if wait > 0 else 0.0)
            else:
                try:
                    ex = exemplar_of(trace)
                    m.slot_wait.observe(wait if wait > 0 else 0.0, dict(ex) if ex else None)
                except Exception as exc:  # noqa: BLE001
                    self._log("slot-wait metric", exc)
        error: BaseException | None = None
        item = e.item
        if trace is None:
            try:
                self._handler(cast(T, item))
            except BaseException as exc:  # noqa: BLE001 - the handler's failure is the message's outcome
                error = exc
        else:
            scope = None
            if hasattr(trace, "worker"):
                trace.worker = w.index  # the report draws one lane per worker
            try:
                scope = trace.handler_scope()
                scope.__enter__()
            except Exception as exc:  # noqa: BLE001
                scope = None
                self._log("trace.handler_scope enter", exc)
            try:
                self._handler(cast(T, item))
            except BaseException as exc:  # noqa: BLE001
                error = exc
            if scope is not None:
                try:
                    if error is None:
                        scope.__exit__(None, None, None)
                    else:
                        scope.__exit__(type(error), error, error.__traceback__)
                except Exception as exc:  # noqa: BLE001
                    self._log("trace.handler_scope exit", exc)
        outcome = _SUCCESS if error is None else _FAILURE
        if self._timeout_ns is not None:
            elapsed = now() - t0
            if elapsed > self._timeout_ns:
                timeout_error = HandlerTimeout(elapsed / 1e9, self._timeout_ns / 1e9)
                timeout_error.__cause__ = error
                error = timeout_error
                outcome = _TIMEOUT
        self._report(e, outcome, error)
        return outcome

    def _report(self, e: Entry[object], outcome: Outcome, error: BaseException | None) -> None:
        trace = e.trace
        if trace is not None:
            try:
                trace.finish(outcome, error)
            except Exception as exc:  # noqa: BLE001
                self._log("trace.finish", exc)
        on_done = self._on_done
        if on_done is not None:
            try:
                on_done(cast(T, e.item), outcome, error)
            except Exception as exc:  # noqa: BLE001
                self._log("on_done", exc)
        elif error is not None and trace is None:
            self._log(f"handler ({type(error).__name__}, no on_done to report it)", error)
        m = self._m
        if m is not None:
            m.outcomes[outcome].inc()

    # -------------------------------------------------------------------------------- shutdown
    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting; finish work; stop the workers. Idempotent.

        ``drain=True`` runs everything queued and in flight; ``drain=False`` runs what is in
        flight and reports each queued message as ``Outcome.SKIPPED`` (unrun). ``timeout`` bounds
        the whole wait: when it passes, close returns while workers finish what they hold and
        then exit (they are daemon threads); nothing is dropped. Must not be called from a handler.
        """
        if threading.current_thread() in self._threads:
            raise RuntimeError("close() called from a dispatcher worker (a handler) would wait for itself")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._closed = True
            p = self._pending
            if p is not None:
                self._pending = None
                p.state = _CLOSED
                p.sig.release()
            if self._n_waiting:
                self._cond.notify_all()
            skipped = [] if drain else self._sched.take_queued()
            self._skipped += len(skipped)
        for e in skipped:
            self._report(e, _SKIPPED, None)
        sched = self._sched
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        drained = self._wait_until(lambda: sched.busy == 0 and sched.queued == 0, left)
        with self._lock:
            if not self._stopping:
                self._stopping = True
                for i in sched.idle_workers():
                    w = self._workers[i]
                    w.entry = None
                    w.wake.release()
        for t in self._threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            t.join(left)
        if self._m is not None and drained:
            self._m.unbind()
        if not drained:
            logger.warning("dispatcher %r: close timed out with %d in flight, %d queued", self._name,
                           sched.busy, sched.queued)  # fmt: skip

    def __enter__(self) -> Dispatcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close(drain=True)

    def __repr__(self) -> str:
        s = self._sched
        return (f"Dispatcher(name={self._name!r}, policy={self._policy!r}, workers={s.workers}, "
                f"busy={s.busy}, queued={s.queued}, closed={self._closed})")  # fmt: skip


__all__ = ["Dispatcher"]
