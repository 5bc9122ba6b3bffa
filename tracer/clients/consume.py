"""A demand-driven consume loop over a ``SimpleConsumer`` (5.x client or embedded broker).

It receives only as many messages as the dispatcher has free slots, so nothing ages in a local
buffer where no other consumer can reach it; acks on success; on failure shortens the message's
invisibility to a backoff so it comes back soon (with ``delivery_attempt + 1``).

**The loop owns every message from the moment ``receive`` returns it until its ack or nack.**
The whole batch is held at once — waiting for the dispatcher, running, or waiting for its ack —
and every held message has its lease renewed before it runs out, so a message is never handed
to a second consumer while this one still has it. Messages the dispatcher cannot take yet (a
busy ordering key whose parking room is full, a full per-worker buffer) wait in the loop's own
backlog, in order, renewed like the rest; the loop receives again only once that backlog is
empty. A renewal never happens once a message's ack has begun (one lock per message): on the
proxy, renewing an acked message brings it back.

Delivery is at-least-once: a message is acked only after its handler returned, so a crash
between the handler's end and the ack, an ack lost on the wire, or a lease that could not be
renewed (broker unreachable for longer than the lease) delivers it again. A handler that hangs
past ``handler_timeout`` has its message let go on purpose, so the broker can hand it to a
healthy consumer: that is a duplicate by design (see :class:`ConsumeLoop`).
Handlers must be idempotent for those cases; the loop itself never runs one delivery twice.

When receiving keeps failing, the loop re-announces the client's settings to the broker: the 5.x
client sends them only at start-up and every five minutes, and a proxy that restarted meanwhile
refuses every receive ("settings is null") until it has them again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, TypedDict

from opentelemetry.instrumentation.utils import suppress_instrumentation

from ..dispatch import Dispatcher, DispatcherClosed, DispatchMetrics, Policy
from ..path.message import body_of, describe
from ..path.stages import Outcome
from ..telemetry.tracer import MessageTrace, MessageTracer
from .probe import probe_stage, skip_probes

if TYPE_CHECKING:  # typing.Unpack is 3.11+; only the annotation needs it
    from typing_extensions import Unpack

__all__ = [
    "MAX_BATCH",
    "MAX_INVISIBLE_S",
    "ConsumeKeywords",
    "ConsumeLoop",
    "ConsumeState",
    "ConsumeStats",
    "DispatchOptions",
    "FlowOptions",
    "LeaseOptions",
    "LeaseRefused",
    "exponential_backoff",
    "whole_seconds",
]

log = logging.getLogger(__name__)

MAX_INVISIBLE_S = 12 * 3600.0  # the proxy's maxInvisibleTimeMills default: longer leases are refused
MAX_BATCH = 32  # the proxy's grpcClientConsumerLongPollingBatchSize: a receive returns at most this many


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


# -- options: each group configures one part of the loop ---------------------------------------
@dataclass(frozen=True)
class DispatchOptions:
    """How received messages run: passed to the loop's :class:`~tracer.dispatch.Dispatcher`."""

    policy: Policy | str = "aggressive"
    workers: int = 8
    key: Callable[[Any], str | None] | None = None
    cost: Callable[[Any], float] | None = None
    metrics: DispatchMetrics | None = None
    handler_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.handler_timeout is not None and not self.handler_timeout > 0:
            raise ValueError(f"handler_timeout must be > 0 seconds, got {self.handler_timeout}")


@dataclass(frozen=True)
class LeaseOptions:
    """How long the broker keeps a held message invisible, and when the loop renews or gives up.

    ``invisible_duration``: seconds per lease (sent rounded up to whole seconds; the proxy
    refuses receives below its ``minInvisibleTimeMillsForRecv``, 10 s by default, and leases
    above 12 h). ``renew_margin``: renew when less than this is left (default a third of the
    lease). ``hang_grace``: a handler still running ``handler_timeout + hang_grace`` seconds
    after it started is abandoned — its lease is no longer renewed (default one lease).
    """

    invisible_duration: float = 30.0
    renew_margin: float | None = None
    hang_grace: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.invisible_duration <= MAX_INVISIBLE_S:
            raise ValueError(f"invisible_duration must be in (0, {MAX_INVISIBLE_S:g}] seconds (the proxy "
                             f"refuses longer leases), got {self.invisible_duration}")
        if self.renew_margin is not None and not 0 < self.renew_margin < self.invisible_duration:
            raise ValueError(f"renew_margin must be in (0, invisible_duration={self.invisible_duration:g}), "
                             f"got {self.renew_margin}")
        if self.hang_grace is not None and not self.hang_grace >= 0:
            raise ValueError(f"hang_grace must be >= 0 seconds, got {self.hang_grace}")

    @property
    def margin(self) -> float:
        return self.renew_margin if self.renew_margin is not None else self.invisible_duration / 3

    @property
    def grace(self) -> float:
        return self.hang_grace if self.hang_grace is not None else self.invisible_duration


@dataclass(frozen=True)
class FlowOptions:
    """How messages come in and go out: receive batches, prefetch, acks, retries, stop.

    ``prefetch`` > 0 imitates a push consumer's local cache (the 5.x client keeps up to 1024
    messages per queue): messages are received ahead and wait in the loop, unseen by other
    consumers, until the dispatcher takes them (leases renewed all the while). Kept to reproduce
    the incident; 0 (the default) receives only what the dispatcher can start now.
    ``resync_after``: failed receives in a row before the client's settings are re-announced
    (0: never). ``stop_timeout``: the longest :meth:`ConsumeLoop.run` drains after a stop
    (None: until every held message is settled; :meth:`ConsumeLoop.stop` can shorten it).
    """

    max_batch: int = MAX_BATCH
    prefetch: int = 0
    retry_backoff: Callable[[int], float] = exponential_backoff
    resync_after: int = 3
    ack_threads: int = 4
    stop_timeout: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be in [1, {MAX_BATCH}] (the proxy's batch limit), got {self.max_batch}")
        if self.prefetch < 0 or self.resync_after < 0:
            raise ValueError("prefetch and resync_after must be >= 0")
        if self.ack_threads < 1:
            raise ValueError(f"ack_threads must be >= 1, got {self.ack_threads}")
        if self.stop_timeout is not None and self.stop_timeout < 0:
            raise ValueError(f"stop_timeout must be >= 0 seconds, got {self.stop_timeout}")


class ConsumeKeywords(TypedDict, total=False):
    """The loop's flat keywords (each lands in one of the option groups)."""

    policy: Policy | str
    workers: int
    key: Callable[[Any], str | None] | None
    cost: Callable[[Any], float] | None
    dispatch_metrics: DispatchMetrics | None
    handler_timeout: float | None
    invisible_duration: float
    renew_margin: float | None
    hang_grace: float | None
    max_batch: int
    prefetch: int
    retry_backoff: Callable[[int], float]
    resync_after: int
    ack_threads: int
    stop_timeout: float | None


_KEYWORD_GROUP: dict[str, tuple[str, str]] = {  # keyword -> (option group, field)
    "policy": ("dispatch", "policy"), "workers": ("dispatch", "workers"), "key": ("dispatch", "key"),
    "cost": ("dispatch", "cost"), "dispatch_metrics": ("dispatch", "metrics"),
    "handler_timeout": ("dispatch", "handler_timeout"),
    "invisible_duration": ("lease", "invisible_duration"), "renew_margin": ("lease", "renew_margin"),
    "hang_grace": ("lease", "hang_grace"),
    "max_batch": ("flow", "max_batch"), "prefetch": ("flow", "prefetch"), "retry_backoff": ("flow", "retry_backoff"),
    "resync_after": ("flow", "resync_after"), "ack_threads": ("flow", "ack_threads"),
    "stop_timeout": ("flow", "stop_timeout"),
}


def _options(dispatch: DispatchOptions | None, lease: LeaseOptions | None, flow: FlowOptions | None,
             keywords: dict[str, Any]) -> tuple[DispatchOptions, LeaseOptions, FlowOptions]:
    unknown = sorted(set(keywords) - set(_KEYWORD_GROUP))
    if unknown:
        raise TypeError(f"ConsumeLoop got unexpected keyword(s): {', '.join(unknown)}")
    changes: dict[str, dict[str, Any]] = {"dispatch": {}, "lease": {}, "flow": {}}
    for name, value in keywords.items():
        group, fname = _KEYWORD_GROUP[name]
        changes[group][fname] = value
    return (dataclasses.replace(dispatch or DispatchOptions(), **changes["dispatch"]),
            dataclasses.replace(lease or LeaseOptions(), **changes["lease"]),
            dataclasses.replace(flow or FlowOptions(), **changes["flow"]))


# -- state ------------------------------------------------------------------------------------
@dataclass
class ConsumeStats:
    """Counters, updated under the loop's lock. Once the loop is idle:
    ``received == acked + retry_scheduled + ack_errors + expired + (held now)``, where
    ``expired`` messages (lease lost or given up before their outcome) are left to the broker."""

    received: int = 0
    succeeded: int = 0
    failed: int = 0
    acked: int = 0
    ack_errors: int = 0
    retry_scheduled: int = 0
    expired: int = 0  # settled without a broker call: the loop no longer held a lease for it
    leases_extended: int = 0
    lease_errors: int = 0
    leases_lost: int = 0  # the lease ran out before it could be renewed (broker unreachable)
    abandoned: int = 0  # handlers past handler_timeout + hang_grace: lease given up on purpose
    submit_errors: int = 0  # the dispatcher refused one message (given back for a retry)
    redelivered: int = 0  # received with delivery_attempt > 1
    receive_errors: int = 0
    resyncs: int = 0  # settings re-announced after failed receives
    resync_errors: int = 0
    errors_by_kind: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ConsumeState:
    """What the loop holds now (a snapshot under its lock)."""

    held: int  # every message received and not yet settled
    waiting: int  # received, not yet taken by the dispatcher
    settling: int  # handled, ack or nack not yet done
    stopping: bool


_WAITING, _SUBMITTED, _SETTLING = 0, 1, 2


class _Held:
    """One received message from ``receive`` until its ack/nack. ``lock`` serializes renewals
    with the settle: once ``done`` is set no renewal may happen (it would revive an acked one)."""

    __slots__ = ("message", "handle", "deadline", "trace", "state", "lock", "done", "given_up")

    def __init__(self, message: Any, deadline: float) -> None:
        self.message = message
        # our own copy: the 5.1.2 client overwrites message.receipt_handle with the empty handle
        # of a refused renewal, which would poison every later ack
        self.handle: Any = getattr(message, "receipt_handle", None)
        self.deadline = deadline  # on the loop's clock: when the broker will hand it out again
        self.trace: MessageTrace | None = None
        self.state = _WAITING
        self.lock = threading.Lock()
        self.done = False
        self.given_up = False  # lease lost or abandoned: never renewed again

    def restore_handle(self) -> None:
        with contextlib.suppress(Exception):  # a message that refuses it keeps its own
            if getattr(self.message, "receipt_handle", None) != self.handle:
                self.message.receipt_handle = self.handle


class _SecondsClock:
    """The loop's seconds clock as the dispatcher's ``now_ns`` clock, so handler ages match."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic

    def now_ns(self) -> int:
        return int(self._monotonic() * 1e9)


class ConsumeLoop:
    """Receive → dispatch → ack, with lease renewal and retry backoff. Stops on :meth:`stop`.

    Options come in three groups (:class:`DispatchOptions`, :class:`LeaseOptions`,
    :class:`FlowOptions`), or as their flat keywords (``workers=``, ``invisible_duration=`` …,
    see :class:`ConsumeKeywords`), which override the groups' fields.

    A handler that raises, or runs past ``handler_timeout`` seconds, is not acked: the message
    comes back after ``retry_backoff(delivery_attempt)`` seconds.

    **A hung handler.** A Python thread cannot be stopped. The thread dispatcher's watchdog
    reports a handler still running at ``handler_timeout`` as ``TIMEOUT`` at that deadline; the
    loop then gives the message back at once (``retry_backoff``, no more renewals), so the broker
    hands it to a healthy consumer after the backoff. Should no outcome come, the loop's own
    backstop applies: a handler still running ``handler_timeout + hang_grace`` seconds after it
    started is *abandoned* — its lease is no longer renewed (``stats.abandoned``), and the broker
    hands the message out again once that lease runs out, at most ``invisible_duration`` later.
    Either way (plus the proxy's revive delay, 2–3 s) what you see is a **duplicate by design**:
    the same ``message_id`` with ``delivery_attempt + 1``, possibly while the hung call is still
    running. Without ``handler_timeout`` a handler is never let go.

    ``monotonic``: the loop's clock in seconds (leases, renewals, handler ages); tests pass a
    manual one and drive the loop with :meth:`poll`, :meth:`renew_leases` and
    :meth:`settle_ready` instead of :meth:`run`.

    Raises:
        ValueError: an option that cannot work, e.g. a lease shorter than the consumer's
            declared minimum (``consumer.min_receive_invisible``, the embedded broker's).
        TypeError: an unknown keyword.
    """

    def __init__(
        self,
        consumer: Any,
        handler: Callable[[Any], object],
        *,
        tracer: MessageTracer | None = None,
        dispatch: DispatchOptions | None = None,
        lease: LeaseOptions | None = None,
        flow: FlowOptions | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        **keywords: Unpack[ConsumeKeywords],
    ) -> None:
        self.dispatch_options, self.lease, self.flow = _options(dispatch, lease, flow, dict(keywords))
        self.consumer = consumer
        self.tracer = tracer
        self._invisible_s = whole_seconds(self.lease.invisible_duration)
        minimum = getattr(consumer, "min_receive_invisible", None)
        if isinstance(minimum, (int, float)) and self._invisible_s < minimum:
            raise ValueError(f"invisible_duration={self.lease.invisible_duration:g} s is below the broker's "
                             f"minimum receive invisible time ({minimum:g} s): every receive would be refused")
        self._monotonic = monotonic
        self.stats = ConsumeStats()
        d = self.dispatch_options
        # probes (tracer.clients.probe) ride the dispatcher like any message but never reach the handler
        self.dispatcher: Dispatcher[Any] = Dispatcher(
            skip_probes(handler), policy=d.policy, workers=d.workers, key=d.key, cost=d.cost, on_done=self._on_done,
            metrics=d.metrics, handler_timeout=d.handler_timeout, clock=_SecondsClock(monotonic), name="consume")
        # one lock for all of the loop's state and its stats: _room() and the stats are consistent
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # any state change: receive loop, waiters
        self._held: dict[int, _Held] = {}
        self._backlog: deque[_Held] = deque()  # received, not yet taken by the dispatcher (in order)
        self._acks: deque[tuple[_Held, Outcome]] = deque()  # outcomes not yet taken by a settler
        self._settling = 0  # outcomes reported and not yet settled (queued or being settled)
        self._stop = threading.Event()
        self._stop_deadline: float | None = None  # real monotonic seconds
        self._dispatch_closed = threading.Event()
        self._finished = threading.Event()
        self._started = False
        self._feeder: threading.Thread | None = None
        self._ack_workers: list[threading.Thread] = []
        self._keeper: threading.Thread | None = None
        self._logged: set[str] = set()

    # -- public state ------------------------------------------------------------------------
    @property
    def invisible_duration(self) -> float:
        return self.lease.invisible_duration

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def state(self) -> ConsumeState:
        with self._lock:
            return ConsumeState(len(self._held), len(self._backlog), self._settling, self._stop.is_set())

    def wait(self, predicate: Callable[[ConsumeStats], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate(stats)`` holds (True) or ``timeout`` passes (False); the
        predicate is evaluated under the loop's lock after every change."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self.stats), timeout)

    # -- the loop ----------------------------------------------------------------------------
    def run(self, until: Callable[[ConsumeStats], bool] | None = None) -> ConsumeStats:
        """Consume until :meth:`stop` (or ``until(stats)`` is true), then drain and ack.

        Raises:
            LeaseRefused: (a ValueError) the broker refused the lease length (the proxy's
                ``minInvisibleTimeMillsForRecv``, 10 s by default): no receive can succeed.
        """
        if self._started:
            raise RuntimeError("a ConsumeLoop runs once")
        self._started = True
        self._start_helpers()
        failures = 0  # receives failed in a row
        tick = self._tick()
        try:
            while not self._stop.is_set():
                if until is not None and until(self.stats):
                    break
                try:
                    got = self.poll()
                except LeaseRefused:
                    raise
                except Exception as exc:  # noqa: BLE001 - broker down: keep trying, don't die
                    self._count("receive_errors", exc)
                    failures += 1
                    if self.flow.resync_after and failures % self.flow.resync_after == 0:
                        self._resync()
                    self._stop.wait(0.5)
                    continue
                if got is None:  # no room, or a backlog the dispatcher cannot take yet
                    with self._changed:
                        if not self._stop.is_set():
                            self._changed.wait(tick)
                    continue
                failures = 0
        finally:
            self._shutdown()
        return self.stats

    def poll(self) -> int | None:
        """One step of the receive side, never blocking on the dispatcher: hand the backlog to
        the dispatcher as far as it takes it now, then receive once if there is room.

        Returns how many messages were received, or None when there was no room to receive (or
        the backlog is not empty). Receive errors propagate (``run`` counts them). With
        ``prefetch`` > 0 the backlog is handed out by :meth:`run`'s feeder thread, not here.
        """
        if self.flow.prefetch == 0:
            self._feed(0)
        free = self._room()
        if free <= 0:
            return None
        try:
            # the loop traces its messages itself: an instrumented client must not too
            with suppress_instrumentation():
                messages = self.consumer.receive(min(free, self.flow.max_batch), self._invisible_s)
        except Exception as exc:
            if "invisibleTime is too small" in str(exc):
                raise LeaseRefused(
                    f"the broker refuses invisible_duration={self._invisible_s} s ({exc}); the proxy's "
                    "minInvisibleTimeMillsForRecv is 10 s by default: use a longer lease or lower it") from exc
            raise
        batch = list(messages or ())
        if batch:
            self._hold(batch)
            if self.flow.prefetch == 0:
                self._feed(0)
        return len(batch)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop receiving; held messages are still handed out, run, and acked.

        Without ``timeout`` this only asks (safe from a signal handler) and returns at once.
        With ``timeout`` (seconds) the drain gets at most that long — messages still held then
        are left to the broker (their leases stop being renewed; they come back once these run
        out) — and this call waits for :meth:`run` to return. Returns whether it has.
        """
        if timeout is not None:
            deadline = time.monotonic() + max(0.0, timeout)
            with self._changed:
                if self._stop_deadline is None or deadline < self._stop_deadline:
                    self._stop_deadline = deadline
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        if timeout is None:
            return self._finished.is_set()
        return self._finished.wait(timeout + 0.5)  # the drain's own deadline is `timeout`; a bit more to return

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the loop gracefully (call from the main thread)."""
        # only the event: a handler that took the loop's lock could interrupt a holder of it
        # (run() on the main thread); the loop sees the event within one tick
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())

    def _tick(self) -> float:
        return max(0.05, min(1.0, self.lease.margin / 3))

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
        with self._lock:
            self.stats.resyncs += 1

    def _room(self) -> int:
        # Everything held but not running counts against the room: a backlog the dispatcher
        # cannot take, and handled messages still waiting for their ack (were acks slower than
        # handlers, the unacked pile — all redelivered if this process dies — would grow).
        with self._lock:
            if self._stop.is_set():
                return 0
            waiting, settling = len(self._backlog), self._settling
        if self.flow.prefetch > 0:
            return self.flow.prefetch - waiting - settling
        if waiting:
            return 0
        return self.dispatcher.free_slots() - settling

    def _hold(self, batch: list[Any]) -> None:
        """Own the whole batch at once: held (so renewed) before any of it is submitted."""
        deadline = self._monotonic() + self.lease.invisible_duration
        held = [_Held(m, deadline) for m in batch]
        with self._lock:
            for h in held:
                self._held[id(h.message)] = h
            self.stats.received += len(held)
            self.stats.redelivered += sum(1 for m in batch if _attempt(m) > 1)
        if self.tracer is not None:
            pulled_ns = self.tracer.clock.now_ns()
            for h in held:
                try:
                    h.trace = self.tracer.start_message(describe(h.message), pulled_ns, body_of(self.tracer, h.message))
                except Exception as exc:  # noqa: BLE001
                    self.tracer.hook_failed("starting a message trace", exc)
        with self._changed:
            self._backlog.extend(held)
            self._changed.notify_all()

    def _feed(self, block: float | None) -> None:
        """Hand backlog messages to the dispatcher, in order, while it takes them (each submit
        waits at most ``block`` seconds); stops at the first it does not take."""
        while True:
            with self._lock:
                if not self._backlog:
                    return
                h = self._backlog.popleft()  # only the feeding thread takes from the head
                h.state = _SUBMITTED
            try:
                accepted = self.dispatcher.submit(h.message, probe_stage(self.tracer, h.trace), timeout=block)
            except DispatcherClosed:
                accepted = False
            except Exception as exc:  # noqa: BLE001 - one message the dispatcher refuses must not stop the loop
                self._count("submit_errors", exc)
                self._report(h, Outcome.FAILURE)
                continue
            if not accepted:
                with self._lock:
                    h.state = _WAITING
                    self._backlog.appendleft(h)
                return

    def _feed_loop(self) -> None:
        """Prefetch mode: move backlog messages into the dispatcher, blocking when it is full."""
        tick = self._tick()
        while not self._dispatch_closed.is_set():
            with self._changed:
                if not self._backlog:
                    if self._stop.is_set():
                        return
                    self._changed.wait(tick)
                    continue
            self._feed(tick)

    def _on_done(self, msg: Any, outcome: Outcome, error: BaseException | None) -> None:
        with self._lock:
            h = self._held.get(id(msg))
        if h is not None:
            self._report(h, outcome)

    def _report(self, h: _Held, outcome: Outcome) -> None:
        with self._changed:
            if h.state == _SETTLING:
                return  # one outcome per delivery
            h.state = _SETTLING
            if outcome is Outcome.SUCCESS:
                self.stats.succeeded += 1
            else:
                self.stats.failed += 1
            self._settling += 1
            self._acks.append((h, outcome))
            self._changed.notify_all()

    # -- acks and leases, off the workers' threads -----------------------------------------------
    def _start_helpers(self) -> None:
        self._ack_workers = [threading.Thread(target=self._ack_worker, name=f"rmqtrace-ack-{i}", daemon=True)
                             for i in range(self.flow.ack_threads)]
        self._keeper = threading.Thread(target=self._lease_keeper, name="rmqtrace-lease", daemon=True)
        if self.flow.prefetch > 0:
            self._feeder = threading.Thread(target=self._feed_loop, name="rmqtrace-feeder", daemon=True)
        for t in (*self._ack_workers, self._keeper, self._feeder):
            if t is not None:
                t.start()

    def _take_outcome(self, timeout: float | None) -> tuple[_Held, Outcome] | None:
        with self._changed:
            if not self._acks and timeout:
                self._changed.wait(timeout)
            if not self._acks:
                return None
            item = self._acks.popleft()
            self._changed.notify_all()  # the receive loop may wait for the pile to shrink
            return item

    def settle_ready(self) -> int:
        """Settle (ack or nack) every outcome reported so far, in this thread; returns how many."""
        n = 0
        while (item := self._take_outcome(None)) is not None:
            self._settle(*item)
            n += 1
        return n

    def _ack_worker(self) -> None:
        tick = self._tick()
        while True:
            item = self._take_outcome(tick)
            if item is not None:
                self._settle(*item)
                continue
            if self._dispatch_closed.is_set() or self._past_stop_deadline():
                with self._lock:
                    if not self._acks:
                        return

    def _settle(self, h: _Held, outcome: Outcome) -> None:
        what = "expired"
        with h.lock, suppress_instrumentation():
            h.done = True  # from here on no renewal: on the proxy it would revive an acked message
            msg = h.message
            if not h.given_up and self._monotonic() < h.deadline:
                h.restore_handle()
                try:
                    if outcome is Outcome.SUCCESS:
                        self.consumer.ack(msg)
                        what = "acked"
                    else:
                        backoff = whole_seconds(self.flow.retry_backoff(_attempt(msg)))
                        self.consumer.change_invisible_duration(msg, backoff)
                        what = "retry_scheduled"
                except Exception as exc:  # noqa: BLE001 - the broker redelivers after the lease
                    self._count("ack_errors", exc)
                    what = ""
        with self._changed:
            if what:
                setattr(self.stats, what, getattr(self.stats, what) + 1)
            self._held.pop(id(h.message), None)
            self._settling -= 1
            self._changed.notify_all()

    def renew_leases(self) -> int:
        """One pass of the lease keeper: renew every held message whose lease ends within
        ``renew_margin``; give up on hung handlers and on leases already lost. Returns renewals."""
        now = self._monotonic()
        margin = self.lease.margin
        with self._lock:
            due = [h for h in self._held.values()
                   if not h.done and not h.given_up and h.deadline - now <= margin]
        if not due:
            return 0
        ages: dict[int, float] = {}
        if self.dispatch_options.handler_timeout is not None and any(h.state == _SUBMITTED for h in due):
            ages = {id(item): age for item, age in self.dispatcher.running()}
        renewed = 0
        for h in due:
            # a message whose ack is being sent is skipped, not waited for: one slow ack must not
            # hold up every other renewal (and it is about to be settled anyway)
            if not h.lock.acquire(blocking=False):
                continue
            try:
                if self._renew_one(h, ages.get(id(h.message))):
                    renewed += 1
            finally:
                h.lock.release()
        return renewed

    def _renew_one(self, h: _Held, age: float | None) -> bool:
        """Renew ``h``'s lease (its lock held); False when given up, refused, or settled."""
        if h.done or h.given_up:
            return False
        timeout = self.dispatch_options.handler_timeout
        if timeout is not None and age is not None and age > timeout + self.lease.grace:
            h.given_up = True
            self._count_quietly("abandoned", "a handler ran past handler_timeout + hang_grace; "
                                "its lease is given up and the broker will redeliver it")
            return False
        started = self._monotonic()
        if started >= h.deadline:
            h.given_up = True
            self._count_quietly("leases_lost", "a lease ran out before it could be renewed")
            return False
        h.restore_handle()
        try:
            with suppress_instrumentation():
                self.consumer.change_invisible_duration(h.message, self._invisible_s)
        except Exception as exc:  # noqa: BLE001
            h.restore_handle()
            self._count("lease_errors", exc)
            return False
        h.handle = getattr(h.message, "receipt_handle", h.handle)
        h.deadline = started + self.lease.invisible_duration
        with self._changed:
            self.stats.leases_extended += 1
            self._changed.notify_all()
        return True

    def _lease_keeper(self) -> None:
        tick = self._tick()
        while not self._finished.wait(tick):
            try:
                self.renew_leases()
            except Exception as exc:  # noqa: BLE001 - the keeper must outlive any one bug
                self._count("lease_errors", exc)

    def _count(self, what: str, exc: BaseException) -> None:
        kind = f"{what}:{type(exc).__name__}"
        with self._changed:
            setattr(self.stats, what, getattr(self.stats, what) + 1)
            first = kind not in self.stats.errors_by_kind
            self.stats.errors_by_kind[kind] = self.stats.errors_by_kind.get(kind, 0) + 1
            self._changed.notify_all()
        if first:
            log.warning("rmqtrace consume loop: %s (%s); further ones are counted", what, exc)

    def _count_quietly(self, what: str, why: str) -> None:
        with self._changed:
            setattr(self.stats, what, getattr(self.stats, what) + 1)
            first = what not in self._logged
            self._logged.add(what)
            self._changed.notify_all()
        if first:
            log.warning("rmqtrace consume loop: %s; further ones are counted in stats.%s", why, what)

    # -- shutdown --------------------------------------------------------------------------------
    def _past_stop_deadline(self) -> bool:
        d = self._stop_deadline
        return d is not None and time.monotonic() >= d

    def _left(self) -> float | None:
        with self._lock:
            d = self._stop_deadline
        return None if d is None else max(0.0, d - time.monotonic())

    def _shutdown(self) -> None:
        if self.flow.stop_timeout is not None:
            with self._lock:
                own = time.monotonic() + self.flow.stop_timeout
                if self._stop_deadline is None or own < self._stop_deadline:
                    self._stop_deadline = own
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        # the backlog is drained into the dispatcher before it closes (nothing is redelivered on
        # a stop), as far as the deadline allows
        if self._feeder is not None:
            self._feeder.join(self._left())
        else:
            while self.state().waiting and not self._past_stop_deadline():
                left = self._left()
                self._feed(self._tick() if left is None else min(self._tick(), left))
        self.dispatcher.close(drain=True, timeout=self._left())
        self._dispatch_closed.set()
        with self._changed:
            self._changed.notify_all()
        for t in self._ack_workers:
            t.join(self._left())
        self._finished.set()  # ends the lease keeper: whatever is still held now goes back to the broker
        if self._keeper is not None:
            self._keeper.join(1.0)


class LeaseRefused(ValueError):
    """The broker refused the loop's lease length: no receive can ever succeed."""
