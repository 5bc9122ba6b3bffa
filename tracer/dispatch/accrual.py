"""Worker-seconds of one dispatcher, integrated exactly over its clock: what the alerts rate.

A gauge read every scrape says what holds at that instant; an incident is a share of time. Under
head-of-line blocking (round-robin into per-worker buffers, a hot ordering key) the instants
alternate between "messages wait while workers idle" and "every worker busy", so a rule needing
either instant at every evaluation for its ``for:`` is reset by the other and never fires (issue
#32: 4 m 55 s pending of 5 m, then one saturated evaluation). The integrals below only grow, so
``rate()`` over a window measures the share and a brief saturation lowers it instead of
resetting it:

* ``busy_s`` = ∫ busy dt: worker-seconds holding a message (``/ workers`` = mean occupancy);
* ``hol_s``  = ∫ min(workers − busy, queued) dt: idle worker-seconds that messages waiting in
  this dispatcher could have used (the same definition as ``rmqtrace_consumer_hol_*``,
  :mod:`tracer.telemetry.occupancy`, at the dispatcher instead of the whole consumer).

:meth:`Accrual.mark` is called by :class:`.core.Core` after every change of the scheduler's
``busy``/``queued`` (admit, done, expire, take_queued), under the engine's lock; the counts are
piecewise constant between marks, so the integrals are exact for every change made.
"""

from __future__ import annotations

from collections.abc import Callable

from ..path.clock import MonoNs
from .scheduler import Scheduler

__all__ = ["Accrual"]


class Accrual:
    """The integrals of one dispatcher; also the gauges' source (``workers``, ``busy``, ``queued``)."""

    __slots__ = ("__weakref__", "_now", "_sched", "_state")

    def __init__(self, sched: Scheduler, now: Callable[[], MonoNs]) -> None:
        self._sched = sched
        self._now = now
        # (last change ns, busy_s, hol_s, busy rate, hol rate) replaced whole at each mark, so a
        # scrape on another thread reads one consistent state without the engine's lock.
        self._state: tuple[int, float, float, int, int] = (now(), 0.0, 0.0, 0, 0)
        self.mark()  # a scheduler that starts busy (none today) starts its rates now

    @property
    def workers(self) -> int:
        return self._sched.workers

    @property
    def busy(self) -> int:
        return self._sched.busy

    @property
    def queued(self) -> int:
        return self._sched.queued

    def mark(self) -> None:
        """The scheduler's counts changed: close the interval at the old rates, start the new ones.
        The caller holds the engine's lock (or is the event loop). On the hot path: plain
        arithmetic, one clock read only when a rate changed."""
        s = self._sched
        busy = s.busy
        idle = s.workers - busy
        queued = s.queued
        hol = queued if queued < idle else (idle if idle > 0 else 0)
        t0, busy_s, hol_s, old_busy, old_hol = self._state
        if busy == old_busy and hol == old_hol:
            return  # same rates: the open interval just goes on
        now = self._now()
        if now > t0:
            dt = (now - t0) * 1e-9
            self._state = (now, busy_s + old_busy * dt, hol_s + old_hol * dt, busy, hol)
        else:  # a clock that steps back adds nothing
            self._state = (t0, busy_s, hol_s, busy, hol)

    def accrued(self) -> tuple[float, float]:
        """``(busy_s, hol_s)`` brought up to now. Safe from any thread; callers that export a
        counter keep the running maximum (a read racing a mark may run a few µs ahead of it)."""
        t0, busy_s, hol_s, busy, hol = self._state
        now = self._now()
        dt = (now - t0) / 1e9 if now > t0 else 0.0
        return busy_s + busy * dt, hol_s + hol * dt
