"""The consume loop's leases: one record per held message, and the keeper that renews them.

A message the loop received is invisible to every other consumer until its lease ends; the
keeper renews every lease that ends within ``renew_margin``, several at once on a small pool it
owns (at most ``renew_threads`` broker calls side by side: with a slow broker, leases ending
together are renewed together instead of one after the other past their end). The keeper's pass
hands the due leases to the pool and does not wait for the calls: one answer slower than the
margin holds up one pool thread, not the next pass (a lease whose renewal is in flight is not
asked for again). It gives a lease up on
purpose when its handler hung past ``handler_timeout + hang_grace``, and counts it lost when it
ended before it could be renewed (a process stall, an unreachable broker) or the broker refused a
renewal because the lease was already gone (code 40013, :func:`.refusal.lease_gone`). A given-up or lost
lease is never renewed again, and a message whose lease is gone never starts (the loop checks
:meth:`Lease.live` when a worker is about to run it).

One lock per message orders a renewal against that message's ack or nack: once ``done`` is set
(the settle began) no renewal may happen — on the proxy, renewing an acked message revives it.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import Any, Callable

from opentelemetry.instrumentation.utils import suppress_instrumentation

from ..telemetry.tracer import MessageTrace
from .consume_options import LeaseOptions, whole_seconds
from .each import each_then_raise
from .refusal import lease_gone

__all__ = ["BrokerLead", "Lease", "LeaseKeeper", "broker_lease"]

def broker_lease(handle: object) -> tuple[int, int] | None:
    """What the broker decided for this delivery, read from its receipt handle: (pop time in
    wall-clock ms, invisible time in ms), or None when the handle is not in that layout.

    The 5.x proxy hands out the broker's POP receipt handle as is (apache/rocketmq
    ``common/consumer/ReceiptHandle``): space-separated fields ``startOffset retrieveTime
    invisibleTime reviveQueueId topicType brokerName queueId offset [commitLogOffset]``, its lease
    ending at ``retrieveTime + invisibleTime`` on the broker's clock; a renewal's new handle
    carries the renewal's time and length. The embedded broker's handles use the same layout.
    Never raises."""
    if not isinstance(handle, str):
        return None
    fields = handle.split(" ")
    if len(fields) < 8:
        return None
    try:
        retrieved, invisible = int(fields[1]), int(fields[2])
    except ValueError:
        return None
    return (retrieved, invisible) if retrieved > 0 and invisible > 0 else None


class BrokerLead:
    """How far the broker's wall clock runs ahead of this process's, at most (seconds; negative:
    behind), learnt from the receives themselves: the broker popped a message after the call
    began, so ``pop time - wall reading at the call's start`` bounds the lead from above, and the
    smallest of the recent calls' bounds is the tightest (a call answered at once). Only an upper
    bound is safe: a lease dated with a lead the broker's clock may not have could look live
    after the broker ended it (a stall while the call was in flight, hidden by the skew).

    The price: until one recent call was answered soon after it began, a lease is dated as if
    popped when its call began (a long poll that waited looks like a stall). That only matters
    for a call longer than the lease itself (``await_duration`` >= ``invisible_duration``): its
    messages are then not started and come back later (delivery_attempt + 1) until a call answered
    at once (messages already waiting at the broker) tightens the bound."""

    WINDOW = 64  # receive calls remembered: an old bound is dropped (the clocks drift, a wall steps)

    def __init__(self) -> None:
        self._bounds: deque[float] = deque(maxlen=self.WINDOW)

    def bound(self, sample: float) -> float:
        """Remember one call's bound (``pop time - call start``, wall seconds); the tightest one now."""
        self._bounds.append(sample)
        return min(self._bounds)


WAITING, SUBMITTED, SETTLING = 0, 1, 2  # where a held message is: loop backlog, dispatcher, ack side


class Lease:
    """One message the loop owns, from ``receive`` until its ack or nack (see the module
    docstring): its lease on the broker, its handle, where it is in the loop. (Named for what it
    is: "hold" is kept for the spans waiting for a keep decision, :mod:`tracer.telemetry.hold`.)"""

    __slots__ = ("deadline", "done", "given_up", "handle", "key", "lock", "message", "started", "state", "trace")

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
        self.started = False  # its handler was let start (under the loop's lock, as its outcome's report)

    def live(self, now: float) -> bool:
        """Whether the loop still holds this message's lease at ``now`` (so it may start or be acked)."""
        return not self.given_up and now < self.deadline

    def restore_handle(self) -> None:
        with contextlib.suppress(Exception):  # a message that refuses it keeps its own
            if getattr(self.message, "receipt_handle", None) != self.handle:
                self.message.receipt_handle = self.handle


_IDLE_EXIT_S = 5.0  # seconds a renewal pool thread waits for work before it ends


def _mark_lost(h: Lease, reason: str) -> None:
    """The message's trace hears of it (counter, span mark, the redelivery's link)."""
    if h.trace is not None:
        h.trace.lease_lost(reason)


# what the keeper tells its owner: (counter, error or None, why) — counted and logged once per kind
Report = Callable[[str, "BaseException | None", str], None]


class LeaseKeeper:
    """Renews leases through ``consumer.change_invisible_duration``, at most ``renew_threads`` at once."""

    def __init__(self, consumer: Any, options: LeaseOptions, monotonic: Callable[[], float], report: Report,
                 handler_timeout: float | None, interrupted: Callable[[BaseException], None] | None = None) -> None:
        self._consumer = consumer
        # where a BaseException raised inside a renewal on a pool thread goes (the loop stops and
        # run() re-raises it); the pool thread itself lives on, so later renewals still happen
        self._interrupted = interrupted
        self._options = options
        self._seconds = whole_seconds(options.invisible_duration)
        self._monotonic = monotonic
        self._report = report
        self._handler_timeout = handler_timeout
        self._cond = threading.Condition()  # the pool's queue, its threads, the renewals in flight
        self._queue: deque[tuple[Lease, float | None]] = deque()
        self._inflight: set[int] = set()  # id(Lease) queued or being renewed
        self._threads: list[threading.Thread] = []
        self._idle = 0  # pool threads not in a call (waiting for work, or about to)
        self._closed = False

    def due(self, held: list[Lease], now: float) -> list[Lease]:
        """The messages whose lease ends within the margin and may still be renewed."""
        margin = self._options.margin
        return [h for h in held if not h.done and not h.given_up and h.deadline - now <= margin]

    def renew(self, due: list[Lease], ages: dict[int, float], *, wait: bool = True) -> int:
        """Renew each of ``due`` (``ages``: seconds each running handler has run, by ``id(message)``).
        A lease whose renewal is still in flight (a slow broker answer) is not asked for again.

        ``wait=False`` (the keeper thread): hand them to the keeper's pool, at most
        ``renew_threads`` calls at once, and return at once (0), so one slow answer never delays
        the next pass — leases falling due meanwhile are renewed by the other pool threads.
        ``wait=True`` (a caller driving the loop by hand, e.g. with a manual clock): renew them
        on the calling thread, one after another, and return how many were renewed.

        Raises:
            BaseException: (``wait=True``) the first one a renewal raised, once every other lease
                of the pass was renewed; the pool hands it to ``interrupted`` instead.
        """
        if not wait:
            self._hand_to_pool(due, ages)
            return 0
        renewed = 0

        def renew_one(h: Lease) -> None:
            nonlocal renewed
            with self._cond:
                if self._closed or id(h) in self._inflight:
                    return
                self._inflight.add(id(h))
            try:
                renewed += self._renew_if_free(h, ages.get(id(h.message)))
            finally:
                with self._cond:
                    self._inflight.discard(id(h))

        # a BaseException inside one renewal (re-raised once the pass is done) must not leave the
        # rest of the pass's leases to lapse
        each_then_raise(due, renew_one)
        return renewed

    def _hand_to_pool(self, due: list[Lease], ages: dict[int, float]) -> None:
        with self._cond:
            if self._closed:
                return
            for h in due:
                if id(h) in self._inflight:
                    continue
                self._inflight.add(id(h))
                self._queue.append((h, ages.get(id(h.message))))
            # the pool grows to renew_threads on demand; its threads end on close() or when idle
            # for _IDLE_EXIT_S: no thread started and joined per pass
            while len(self._queue) > self._idle and len(self._threads) < self._options.renew_threads:
                t = threading.Thread(target=self._work, name=f"rmqtrace-renew-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
                self._idle += 1  # counted idle from the start: it takes one of the queued at once
            self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    # an idle pool thread ends after a while (a loop driven by poll() is never
                    # closed); the next pass that needs one starts it again
                    if not self._cond.wait(_IDLE_EXIT_S) and not self._queue:
                        break
                self._idle -= 1
                if not self._queue:
                    self._threads.remove(threading.current_thread())
                    return  # closed or idle, nothing left
                h, age = self._queue.popleft()
            try:
                self._renew_if_free(h, age)
            except Exception as exc:  # noqa: BLE001 - a pool thread outlives any one bug
                self._report("lease_errors", exc, "a lease renewal failed")
            except BaseException as exc:  # noqa: BLE001 - counted in _renew_one; the owner stops
                # a pool thread that died here would stay counted (in _threads, idle) and no
                # renewal would ever run again: it hands the interrupt on and lives
                if self._interrupted is None:
                    raise
                self._interrupted(exc)
            finally:
                with self._cond:
                    self._inflight.discard(id(h))
                    self._idle += 1
                    self._cond.notify_all()

    def close(self) -> None:
        """End the pool: queued renewals are dropped (the loop no longer holds those leases);
        calls in flight finish on their own daemon threads."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._inflight.clear()
            self._cond.notify_all()

    def _renew_if_free(self, h: Lease, age: float | None) -> bool:
        # a message whose ack is being sent is skipped, not waited for: one slow ack must not
        # hold up a renewal (and it is about to be settled anyway)
        if not h.lock.acquire(blocking=False):
            return False
        try:
            return self._renew_one(h, age)
        finally:
            h.lock.release()

    def _renew_one(self, h: Lease, age: float | None) -> bool:
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
            if lease_gone(exc):
                # the broker says this handle's time has passed (40013): the message is the
                # broker's again, maybe a peer's already. A retry cannot bring the lease back; it
                # is lost now, so the message never starts and is never acked here (expired)
                h.given_up = True
                _mark_lost(h, "expired")
                self._report("leases_lost", None, "the broker refused a renewal: the lease was already gone")
            return False
        except BaseException as exc:
            h.restore_handle()  # the handle and the counters as after any failed call, then it goes on
            self._report("lease_errors", exc, "a lease renewal failed")
            raise
        h.handle = getattr(h.message, "receipt_handle", h.handle)
        h.deadline = started + self._options.invisible_duration
        self._report("leases_extended", None, "")
        return True
