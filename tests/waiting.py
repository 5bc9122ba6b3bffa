"""Polling with a deadline: how tests wait for threads without fixed sleeps."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        time.sleep(interval)  # real-time: polling interval of a deadline wait
