"""The consume loop's leases: one record per held message, and the keeper that renews them.

A message the loop received is invisible to every other consumer until its lease ends; the
keeper renews every lease that ends within ``renew_margin``, several at once (at most
``renew_threads`` broker calls side by side: with a slow broker, leases ending together are
renewed together instead of one after the other past their end). It gives a lease up on
purpose when its handler hung past ``handler_timeout + hang_grace``, and counts it lost when it
ended before it could be renewed (a process stall, an unreachable broker). A given-up or lost
lease is never renewed again, and a message whose lease is gone never starts (the loop checks
:meth:`Held.live` when a worker is about to run it).

One lock per message orders a renewal against that message's ack or nack: once ``done`` is set
(the settle began) no renewal may happen — on the proxy, renewing an acked message revives it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

from opentelemetry.instrumentation.utils import suppress_instrumentation

from ..telemetry.tracer import MessageTrace
from .consume_options import LeaseOptions, whole_seconds

__all__ = ["Held", "LeaseKeeper"]

WAITING, SUBMITTED, SETTLING = 0, 1, 2  # where a held message is: loop backlog, dispatcher, ack side


class Held:
    """One received message from ``receive`` until its ack or nack (see the module docstring)."""

    __slots__ = ("deadline", "done", "given_up", "handle", "key", "lock", "message", "state", "trace")

    def __init__(self, message: Any, deadline: float, key: str | None = None) -> None:
        self.message = message
        # our own copy: the 5.1.2 client overwrites message.receipt_handle with the empty handle
        # of a refused renewal, which would poison every later ack
        self.handle: Any = getattr(message, "receipt_handle", None)
        self.deadline = deadline  # on the loop's clock: when the broker may hand it out again
        self.key = key  # the ordering key, as the loop's key= gave it (None: unkeyed or unknown)
        self.trace: MessageTrace | None = None
        self.state = WAITING
        self.lock = threading.Lock()
        self.done = False
        self.given_up = False  # lease lost or abandoned: never renewed again

    def live(self, now: float) -> bool:
        """Whether the loop still holds this message's lease at ``now`` (so it may start or be acked)."""
        return not self.given_up and now < self.deadline

    def restore_handle(self) -> None:
        with contextlib.suppress(Exception):  # a message that refuses it keeps its own
            if getattr(self.message, "receipt_handle", None) != self.handle:
                self.message.receipt_handle = self.handle


def _mark_lost(h: Held, reason: str) -> None:
    """The message's trace hears of it (counter, span mark, the redelivery's link)."""
    if h.trace is not None:
        h.trace.lease_lost(reason)


# what the keeper tells its owner: (counter, error or None, why) — counted and logged once per kind
Report = Callable[[str, "BaseException | None", str], None]


class LeaseKeeper:
    """Renews leases through ``consumer.change_invisible_duration``, at most ``renew_threads`` at once."""

    def __init__(self, consumer: Any, options: LeaseOptions, monotonic: Callable[[], float], report: Report,
                 handler_timeout: float | None) -> None:
        self._consumer = consumer
        self._options = options
        self._seconds = whole_seconds(options.invisible_duration)
        self._monotonic = monotonic
        self._report = report
        self._handler_timeout = handler_timeout

    def due(self, held: list[Held], now: float) -> list[Held]:
        """The messages whose lease ends within the margin and may still be renewed."""
        margin = self._options.margin
        return [h for h in held if not h.done and not h.given_up and h.deadline - now <= margin]

    def renew(self, due: list[Held], ages: dict[int, float]) -> int:
        """Renew each of ``due`` (``ages``: seconds each running handler has run, by ``id(message)``);
        returns how many were renewed. Calls run side by side, at most ``renew_threads`` at once;
        returns when all have."""
        if not due:
            return 0
        renewed = [0]
        count = threading.Lock()
        pending = iter(due)
        take = threading.Lock()

        def drain() -> None:
            while True:
                with take:
                    h = next(pending, None)
                if h is None:
                    return
                if self._renew_if_free(h, ages.get(id(h.message))):
                    with count:
                        renewed[0] += 1

        helpers = [threading.Thread(target=drain, name="rmqtrace-renew", daemon=True)
                   for _ in range(min(len(due), self._options.renew_threads) - 1)]
        for t in helpers:
            t.start()
        drain()
        for t in helpers:
            t.join()
        return renewed[0]

    def _renew_if_free(self, h: Held, age: float | None) -> bool:
        # a message whose ack is being sent is skipped, not waited for: one slow ack must not
        # hold up a renewal (and it is about to be settled anyway)
        if not h.lock.acquire(blocking=False):
            return False
        try:
            return self._renew_one(h, age)
        finally:
            h.lock.release()

    def _renew_one(self, h: Held, age: float | None) -> bool:
        """Renew ``h``'s lease (its lock held); False when given up, refused, or settled."""
        if h.done or h.given_up:
            return False
        timeout = self._handler_timeout
        if timeout is not None and age is not None and age > timeout + self._options.grace:
            h.given_up = True
            _mark_lost(h, "abandoned")
            self._report("abandoned", None, "a handler ran past handler_timeout + hang_grace; its lease is "
                         "given up and the broker will redeliver it")
            return False
        started = self._monotonic()
        if started >= h.deadline:
            h.given_up = True
            _mark_lost(h, "expired")
            self._report("leases_lost", None, "a lease ran out before it could be renewed")
            return False
        h.restore_handle()
        try:
            with suppress_instrumentation():
                self._consumer.change_invisible_duration(h.message, self._seconds)
        except Exception as exc:  # noqa: BLE001
            h.restore_handle()
            self._report("lease_errors", exc, "a lease renewal failed")
            return False
        h.handle = getattr(h.message, "receipt_handle", h.handle)
        h.deadline = started + self._options.invisible_duration
        self._report("leases_extended", None, "")
        return True
