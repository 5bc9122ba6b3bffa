"""Clocks that give wall-clock nanoseconds which never go backwards within one process.

Consumer-side stamps must subtract exactly (a gap of 3 ms must not become -40 ms because NTP
stepped the wall clock), yet spans need wall-clock times. :class:`MonotonicWallClock` reads the
wall clock once and then advances it by the monotonic clock, so both hold.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicWallClock", "default_clock"]


class Clock(Protocol):
    def now_ns(self) -> int:
        """Wall-clock time in ns since the Unix epoch, monotonic within this clock."""
        ...


class MonotonicWallClock:
    """Wall time anchored once, advanced by ``time.monotonic_ns``.

    Drifts from the system clock only by what NTP slews after the anchor; call :meth:`reanchor`
    from a long-running process if that matters more than monotonicity.
    """

    __slots__ = ("_offset",)

    def __init__(self) -> None:
        self._offset = 0
        self.reanchor()

    def reanchor(self) -> None:
        self._offset = time.time_ns() - time.monotonic_ns()

    def now_ns(self) -> int:
        return time.monotonic_ns() + self._offset


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
