"""A manual monotonic clock in seconds, for the consume loop's and the embedded broker's ``monotonic=``.

(``tracer.path.clock.ManualClock`` is the wall clock in nanoseconds that stamps read; leases and
deadlines run on this one.)
"""

from __future__ import annotations

import threading


class Clock:
    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.t

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.t += seconds
