"""A demand-driven consume loop over a ``SimpleConsumer`` (5.x client or embedded broker).

It receives only as many messages as the dispatcher has free slots, so nothing ages in a local
buffer where no other consumer can reach it; acks on success; on failure shortens the message's
invisibility to a backoff so it comes back soon (with ``delivery_attempt + 1``); and renews the
lease of every message it still holds before the lease runs out, so a long-tail message is not
redelivered to a second consumer while it is still running.

Delivery is at-least-once: a message is acked only after its handler returned, so a crash
between the handler's end and the ack, an ack lost on the wire, or a lease that could not be
renewed (broker unreachable for longer than the lease) delivers it again. Handlers must be
idempotent for those cases; the loop itself never runs one delivery twice.

When receiving keeps failing, the loop re-announces the client's settings to the broker: the 5.x
client sends them only at start-up and every five minutes, and a proxy that restarted meanwhile
refuses every receive ("settings is null") until it has them again.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from opentelemetry.instrumentation.utils import suppress_instrumentation

from ..dispatch import Dispatcher, DispatchMetrics
from ..path.message import body_of, describe
from ..path.stages import Outcome
from ..telemetry.tracer import MessageTrace, MessageTracer

log = logging.getLogger(__name__)


def whole_seconds(seconds: float) -> int:
    """What the broker is told: RocketMQ counts invisibility in whole seconds, and the 5.x client
    rejects anything but an ``int`` (a float fails every receive and every lease renewal)."""
    return max(1, math.ceil(seconds))


def _attempt(msg: Any) -> int:
    """The message's delivery attempt, 1 when it has none that makes sense; never raises (the
    loop must not die on one odd message)."""
    try:
        attempt = int(getattr(msg, "delivery_attempt", 1) or 1)
    except Exception:  # noqa: BLE001
        return 1
    return attempt if attempt >= 1 else 1


def exponential_backoff(attempt: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Seconds until a failed delivery comes back: 1, 2, 4 … capped."""
    return float(min(cap, base * (2.0 ** max(0, attempt - 1))))


@dataclass
class ConsumeStats:
    received: int = 0
    succeeded: int = 0
    failed: int = 0
    acked: int = 0
    ack_errors: int = 0
    retry_scheduled: int = 0
    leases_extended: int = 0
    lease_errors: int = 0
    redelivered: int = 0  # received with delivery_attempt > 1
    receive_errors: int = 0
    resyncs: int = 0  # settings re-announced after failed receives
    resync_errors: int = 0
    errors_by_kind: dict[str, int] = field(default_factory=dict)


@dataclass
class _Held:
    message: Any
    deadline: float  # monotonic seconds when the broker will hand it out again
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False


class ConsumeLoop:
    """Receive → dispatch → ack, with lease renewal and retry backoff. Stops on :meth:`stop`.

    A handler that raises, or runs past ``handler_timeout`` seconds, is not acked: the message
    comes back after ``retry_backoff(delivery_attempt)`` seconds. ``resync_after``: failed
    receives in a row before the client's settings are re-announced (0: never).
    """

    def __init__(
        self,
        consumer: Any,
        handler: Callable[[Any], object],
        *,
        tracer: MessageTracer | None = None,
        dispatcher: Dispatcher[Any] | None = None,
        policy: Any = "aggressive",
        workers: int = 8,
        key: Callable[[Any], str | None] | None = None,
        cost: Callable[[Any], float] | None = None,
        dispatch_metrics: DispatchMetrics | None = None,
        invisible_duration: float = 30.0,
        max_batch: int = 32,
        prefetch: int = 0,
        renew_margin: float | None = None,
        retry_backoff: Callable[[int], float] = exponential_backoff,
        handler_timeout: float | None = None,
        resync_after: int = 3,
        ack_threads: int = 4,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.consumer = consumer
        self.tracer = tracer
        self.invisible_duration = invisible_duration
        self._invisible_s = whole_seconds(invisible_duration)
        self.max_batch = max_batch
        # prefetch > 0 imitates a push consumer's local cache (the 5.x client keeps up to 1024
        # messages per queue): messages are received ahead and wait here, unseen by the broker
        # and by other consumers, until the dispatcher takes them. Kept to reproduce the incident;
        # 0 (the default) receives only what the dispatcher can start now.
        self.prefetch = prefetch
        self._cache: deque[tuple[Any, MessageTrace | None]] = deque()
        self._cache_cond = threading.Condition()
        self.renew_margin = renew_margin if renew_margin is not None else invisible_duration / 3
        self.retry_backoff = retry_backoff
        self.resync_after = resync_after
        self.ack_threads = max(1, ack_threads)
        self.stats = ConsumeStats()
        self._monotonic = monotonic
        self.dispatcher: Dispatcher[Any] = dispatcher or Dispatcher(
            handler, policy=policy, workers=workers, key=key, cost=cost,
            on_done=self._on_done, metrics=dispatch_metrics, handler_timeout=handler_timeout, name="consume")
        self._held: dict[int, _Held] = {}
        self._held_lock = threading.Lock()
        self._stop = threading.Event()
        self._drained = threading.Event()  # set once the dispatcher has finished every message
        self._acks: deque[tuple[_Held, Outcome]] = deque()
        acks_lock = threading.Lock()
        self._acks_ready = threading.Condition(acks_lock)  # an outcome to settle: for the ack workers
        self._acks_taken = threading.Condition(acks_lock)  # one was taken: for the receive loop
        self._stats_lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # -- the loop ------------------------------------------------------------------------
    def run(self, until: Callable[[ConsumeStats], bool] | None = None) -> ConsumeStats:
        """Consume until :meth:`stop` (or ``until(stats)`` is true), then drain and ack."""
        self._start_helpers()
        failures = 0  # receives failed in a row
        try:
            while not self._stop.is_set():
                if until is not None and until(self.stats):
                    break
                free = self._room()
                if free <= 0:
                    self._wait_for_room()
                    continue
                try:
                    # the loop traces its messages itself: an instrumented client must not too
                    with suppress_instrumentation():
                        messages = self.consumer.receive(min(free, self.max_batch), self._invisible_s)
                except Exception as exc:  # noqa: BLE001 - broker down: keep trying, don't die
                    self._count("receive_errors", exc)
                    failures += 1
                    if self.resync_after and failures % self.resync_after == 0:
                        self._resync()
                    self._stop.wait(0.5)
                    continue
                failures = 0
                pulled_ns = self.tracer.clock.now_ns() if self.tracer else 0
                for msg in messages or ():
                    self._accept(msg, pulled_ns)
        finally:
            self._shutdown()
        return self.stats

    def stop(self) -> None:
        """Stop receiving; in-flight and already-accepted messages finish and are acked."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the loop gracefully (call from the main thread)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def _resync(self) -> None:
        """Send the client's settings to every endpoint again (5.x client; others: nothing)."""
        routes = getattr(self.consumer, "route_manager", None)
        announce = getattr(self.consumer, "on_new_endpoints", None)
        if routes is None or announce is None:
            return
        try:
            for endpoints in list(routes.get_all_endpoints().values()):
                announce(endpoints)
        except Exception as exc:  # noqa: BLE001
            self._count("resync_errors", exc)
            return
        with self._stats_lock:
            self.stats.resyncs += 1

    def _room(self) -> int:
        # Handled messages waiting for their ack count against the room: were acks slower than
        # handlers, the unacked pile (all redelivered if this process dies, or once their lease
        # runs out) would otherwise grow without bound.
        with self._acks_ready:
            unacked = len(self._acks)
        if self.prefetch > 0:
            with self._cache_cond:
                return self.prefetch - len(self._cache) - unacked
        return self.dispatcher.free_slots() - unacked

    def _wait_for_room(self) -> None:
        with self._acks_taken:
            if self._acks and not self._stop.is_set():
                self._acks_taken.wait(0.2)  # ack workers notify as they take acks
                return
        if self.prefetch > 0:
            with self._cache_cond:
                if len(self._cache) >= self.prefetch and not self._stop.is_set():
                    self._cache_cond.wait(0.2)
        else:
            self.dispatcher.wait_for_free_slot(timeout=0.2)

    def _feeder(self) -> None:
        """Prefetch mode: move cached messages into the dispatcher, blocking when it is full."""
        while True:
            with self._cache_cond:
                while not self._cache and not self._stop.is_set():
                    self._cache_cond.wait(0.2)
                if not self._cache:
                    return
                msg, trace = self._cache.popleft()
                self._cache_cond.notify_all()
            self.dispatcher.submit(msg, trace)

    def _accept(self, msg: Any, pulled_ns: int) -> None:
        with self._stats_lock:
            self.stats.received += 1
            if _attempt(msg) > 1:
                self.stats.redelivered += 1
        held = _Held(msg, self._monotonic() + self.invisible_duration)
        with self._held_lock:
            self._held[id(msg)] = held
        trace: MessageTrace | None = None
        if self.tracer is not None:
            try:
                body = body_of(self.tracer, msg)
                trace = self.tracer.start_message(describe(msg), pulled_ns, body)
            except Exception as exc:  # noqa: BLE001
                self.tracer.hook_failed("starting a message trace", exc)
        if self.prefetch > 0:
            with self._cache_cond:
                self._cache.append((msg, trace))
                self._cache_cond.notify_all()
            return
        # We asked for no more than the free slots, so this returns at once; a policy that
        # still blocks (ordering keys) only delays the next receive.
        self.dispatcher.submit(msg, trace)

    def _on_done(self, msg: Any, outcome: Outcome, error: BaseException | None) -> None:
        with self._held_lock:
            held = self._held.pop(id(msg), None)
        if held is None:
            return
        with self._stats_lock:
            if outcome is Outcome.SUCCESS:
                self.stats.succeeded += 1
            else:
                self.stats.failed += 1
        with self._acks_ready:
            self._acks.append((held, outcome))
            self._acks_ready.notify()

    # -- acks and leases, off the workers' threads ---------------------------------------------
    def _start_helpers(self) -> None:
        helpers = [(self._ack_worker, f"rmqtrace-ack-{i}") for i in range(self.ack_threads)]
        helpers.append((self._lease_keeper, "rmqtrace-lease"))
        if self.prefetch > 0:
            helpers.append((self._feeder, "rmqtrace-feeder"))
        for target, name in helpers:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _ack_worker(self) -> None:
        while True:
            with self._acks_ready:
                while not self._acks and not self._drained.is_set():
                    self._acks_ready.wait(0.5)
                if not self._acks:
                    return
                held, outcome = self._acks.popleft()
                self._acks_taken.notify()  # the receive loop may wait for the pile to shrink
            self._settle(held, outcome)

    def _settle(self, held: _Held, outcome: Outcome) -> None:
        with held.lock, suppress_instrumentation():
            held.done = True
            msg = held.message
            try:
                if outcome is Outcome.SUCCESS:
                    self.consumer.ack(msg)
                    with self._stats_lock:
                        self.stats.acked += 1
                else:
                    attempt = _attempt(msg)
                    self.consumer.change_invisible_duration(msg, whole_seconds(self.retry_backoff(attempt)))
                    with self._stats_lock:
                        self.stats.retry_scheduled += 1
            except Exception as exc:  # noqa: BLE001 - the broker redelivers after the lease
                self._count("ack_errors", exc)

    def _lease_keeper(self) -> None:
        tick = max(0.05, min(1.0, self.renew_margin / 3))
        while not self._drained.wait(tick):
            now = self._monotonic()
            with self._held_lock:
                due = [h for h in self._held.values() if h.deadline - now <= self.renew_margin]
            for held in due:
                with held.lock:
                    if held.done:
                        continue
                    try:
                        self.consumer.change_invisible_duration(held.message, self._invisible_s)
                        held.deadline = self._monotonic() + self.invisible_duration
                        with self._stats_lock:
                            self.stats.leases_extended += 1
                    except Exception as exc:  # noqa: BLE001
                        self._count("lease_errors", exc)

    def _count(self, what: str, exc: BaseException) -> None:
        kind = f"{what}:{type(exc).__name__}"
        with self._stats_lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)
            first = kind not in self.stats.errors_by_kind
            self.stats.errors_by_kind[kind] = self.stats.errors_by_kind.get(kind, 0) + 1
        if first:
            log.warning("rmqtrace consume loop: %s (%s); further ones are counted", what, exc)

    def _shutdown(self) -> None:
        self._stop.set()
        with self._cache_cond:
            self._cache_cond.notify_all()
        for t in self._threads:
            if t.name == "rmqtrace-feeder":
                t.join()  # the cache drains into the dispatcher before it closes
        self.dispatcher.close(drain=True)
        self._drained.set()
        with self._acks_ready:
            self._acks_ready.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=30)
