"""Where the broker bench's CPU goes: each thread's ticks by role, the cyclic collector, a child's.

Linux ``/proc`` readings (zero or empty elsewhere), taken around a round of ``rmqtrace bench broker``
(:mod:`tracer.tools.bench.broker`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

__all__ = ["PARTS", "ROLES", "GcTimer", "cpu_by_role", "process_cpu_s", "thread_cpu", "thread_role"]


# Whose CPU it is, by thread name: the 5.x client's asyncio/gRPC thread, its other threads (and
# native gRPC threads, which `threading` does not know), the loop's own, the span exporter's.
ROLES = ("client_io", "client_other", "loop_receive", "loop_workers", "loop_acks", "exporter", "main")
PARTS = (*ROLES, "gc")  # the consumer's CPU per message: by role, and the cyclic collector's share


def thread_role(name: str | None) -> str:
    if name is None or "message_decode" in name or "_poll_wrapper" in name or "schedule_thread" in name:
        return "client_other"
    if name == "channel_io_loop_thread":
        return "client_io"
    if name.startswith("consume-dispatch"):
        return "loop_workers"
    if name.startswith("rmqtrace-ack"):
        return "loop_acks"
    if name.startswith(("OtelBatch", "rmqtrace-export")):
        return "exporter"
    if name == "MainThread":
        return "main"
    return "loop_receive"  # the thread running ConsumeLoop.run (and the prefetch feeder, if any)


def thread_cpu() -> dict[int, tuple[str, int]]:
    """CPU ticks of each live thread of this process (Linux ``/proc``; empty elsewhere), by role."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        out[int(tid)] = (thread_role(names.get(int(tid))), int(fields[11]) + int(fields[12]))
    return out


def cpu_by_role(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], n: int) -> dict[str, float]:
    """µs of CPU per message by role between two snapshots (threads that started meanwhile count from 0)."""
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    by = dict.fromkeys(ROLES, 0.0)
    for tid, (role, ticks) in after.items():
        by[role] += (ticks - before.get(tid, (role, 0))[1]) / hz / n * 1e6
    return by


class GcTimer:
    """Collections and the seconds they took, counted by a ``gc.callbacks`` hook."""

    def __init__(self) -> None:
        self.collections = 0
        self.seconds = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.collections += 1
            self.seconds += time.perf_counter() - self._t0


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (Linux ``/proc``; 0 elsewhere or when gone)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
