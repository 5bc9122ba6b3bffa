"""Clocks that give wall-clock nanoseconds which never go backwards within one process.

Stamps are compared with other clocks' stamps: the broker's store time, the producer's send
stamp, the SDK's own span times (``time.time_ns``) for the spans your handler opens. So the
consumer's clock has to *be* the system wall clock, not drift away from it: an earlier version
read the wall clock once and advanced it by the monotonic clock, and every wall-clock step after
that (NTP stepping a VM's clock after a pause, a time-sync agent) stayed in every later
cross-clock gap — 0.5–0.8 s after ten minutes on one CI machine, enough to turn ``broker_wait``
negative and place the process span before its own broker store. Same-clock gaps must still never
be negative, so :class:`MonotonicWallClock` follows the wall clock and holds where it steps back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicWallClock", "default_clock"]


class Clock(Protocol):
    def now_ns(self) -> int:
        """Wall-clock time in ns since the Unix epoch, monotonic within this clock."""
        ...


class MonotonicWallClock:
    """The system wall clock, held where it steps back: each reading is the latest wall-clock
    time read so far (``max`` of every reading of ``source`` up to this one).

    A step forward is followed at once, so cross-clock gaps stay right after it; the one gap that
    spans the step is longer by it. A step back holds the clock until the wall clock passes its
    last reading again, so a same-clock gap across it is short (never negative).
    ``source``: the wall clock in ns (tests pass one that steps).

    Raises:
        TypeError: ``source`` is not a function returning an ``int`` (it is read once here).
    """

    __slots__ = ("_last", "_source")

    def __init__(self, source: Callable[[], int] = time.time_ns) -> None:
        first = source()
        if type(first) is not int:
            raise TypeError(f"source must return the wall clock as int ns, got {type(first).__name__}")
        self._source = source
        self._last = first

    def now_ns(self) -> int:
        # No lock (it would triple the cost of a stamp): under the GIL nothing between the
        # comparison and the store can switch threads, so a reading never stores a value older
        # than one another thread has already returned.
        t = self._source()
        if t > self._last:
            self._last = t
            return t
        return self._last


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start_ns: int = 1_700_000_000_000_000_000) -> None:
        self._now = start_ns
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ns: int) -> int:
        with self._lock:
            self._now += ns
            return self._now

    def advance_s(self, seconds: float) -> int:
        return self.advance(int(seconds * 1e9))


_default = MonotonicWallClock()


def default_clock() -> MonotonicWallClock:
    return _default
