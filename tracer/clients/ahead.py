"""Receive ahead: ask the broker for a worker's next message one round trip before it frees.

A demand-driven loop receives only for free workers, so every freed worker waits out one
receive round trip before its next handler starts (the hand-off: ack, receive, start; measured
5-10 ms a message on a loaded 2-core machine, BENCHMARKS.md). With ``receive_ahead=True`` the
loop (:class:`~tracer.clients.consume.ConsumeLoop`) also counts as room every running handler
expected to end within one round trip: its cost minus its age lies within ``[-lead, lead]``,
``lead`` being the median of the loop's recent receive round trips that returned messages (at
most :data:`MAX_LEAD_S`). So the next message is on its way while the handler ends.

What it promises: at most one message received ahead per running handler — the loop counts
every message it holds unstarted against the handlers about to end, wherever it waits (its
backlog, or the dispatcher: parked behind a busy key, in a window) — and only for a handler whose
cost is known (``cost=``, else the cost ``send_job`` wrote on the message: :func:`sent_cost`); a
handler past its cost by more than the lead no longer counts (a wrong cost holds at most the one
message already received for it; with ``handler_timeout``, once every worker hangs, that one's
lease is let go like any message no worker can start). What it costs: a message received
ahead waits in this process until a worker frees — about one lead when the cost is right, longer
when the handler overruns its cost; meanwhile a peer with a free worker cannot take it.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..callables import require_plain, unrun
from ..dispatch.costtable import MAX_COST_S, as_seconds
from ..path.names import COST_PROPERTY

__all__ = ["MAX_LEAD_S", "ReceiveAhead", "sent_cost"]

# The most a handler may be counted ahead of its expected end: a slow proxy (a GC pause, a
# stalled receive) must not make the loop hold messages for long-running handlers
MAX_LEAD_S = 0.05
_SAMPLES = 32  # round trips the lead is the median of


def sent_cost(message: Any) -> float | None:
    """The cost ``send_job`` wrote on ``message`` (property ``rmqtrace_cost``, seconds), or None
    when it has none that makes sense. Never raises."""
    props = getattr(message, "properties", None)
    if not isinstance(props, Mapping):
        return None
    raw = props.get(COST_PROPERTY)
    if not isinstance(raw, str) or len(raw) > 32:
        return None
    try:
        cost = float(raw)
    except ValueError:
        return None
    return cost if 0.0 <= cost < MAX_COST_S else None


class ReceiveAhead:
    """Which running handlers count as room one round trip before they end (see the module).

    ``cost``: a message's expected handler seconds, or None when unknown; a raising one or one
    answering anything but a finite number in ``[0, MAX_COST_S)`` counts as unknown.

    Raises:
        TypeError: ``cost`` is not a plain callable (an ``async def`` would never answer a number).
    """

    def __init__(self, cost: Callable[[Any], float | None]) -> None:
        require_plain(cost, "cost=")
        self._cost = cost
        self._lock = threading.Lock()
        self._trips: deque[float] = deque(maxlen=_SAMPLES)
        self._lead = 0.0  # no round trip measured yet: nothing counts ahead

    @property
    def lead(self) -> float:
        """Seconds ahead of its expected end a handler counts as room (0 before any receive)."""
        return self._lead

    def observe(self, seconds: float) -> None:
        """One receive round trip that returned messages (an empty long poll says nothing of it)."""
        if not (seconds >= 0.0 and math.isfinite(seconds)):
            return
        with self._lock:
            self._trips.append(seconds)
            self._lead = min(MAX_LEAD_S, statistics.median(self._trips))

    def _remaining(self, item: Any, age: float) -> float | None:
        try:
            cost = self._cost(item)
        except Exception:  # noqa: BLE001 - an unknown cost: this handler just does not count ahead
            return None
        seconds = as_seconds(cost)  # the dispatcher's rule of what a cost is (any real but a bool)
        if seconds is None:
            unrun(cost)  # a returned coroutine is closed: no "never awaited"
            return None
        return seconds - age if seconds < MAX_COST_S else None

    def soon(self, running: Sequence[tuple[Any, float]]) -> int:
        """How many of ``running`` (item, seconds since it started) are expected to end within the lead."""
        lead = self._lead
        if lead <= 0.0:
            return 0
        n = 0
        for item, age in running:
            left = self._remaining(item, age)
            if left is not None and -lead <= left <= lead:
                n += 1
        return n

    def wake_in(self, running: Sequence[tuple[Any, float]]) -> float | None:
        """Seconds until the next of ``running`` comes within the lead of its end (None: none will)."""
        lead = self._lead
        if lead <= 0.0:
            return None
        soonest: float | None = None
        for item, age in running:
            left = self._remaining(item, age)
            if left is not None and left > lead:
                wait = left - lead
                soonest = wait if soonest is None else min(soonest, wait)
        return soonest
