"""A demand-driven consume loop over a ``SimpleConsumer`` (5.x client or embedded broker).

It receives only as many messages as the dispatcher has free slots, so nothing ages in a local
buffer where no other consumer can reach it; acks on success; on failure shortens the message's
invisibility to a backoff so it comes back soon (with ``delivery_attempt + 1``).

**The loop owns every message from the moment ``receive`` returns it until its ack or nack.**
The whole batch is held at once — waiting for the dispatcher, running, or waiting for its ack —
and every held message has its lease renewed before it runs out (:mod:`.lease`), so a message is
never handed to a second consumer while this one still has it. A message whose lease is gone
(a process stall longer than the lease, a broker unreachable) before a worker starts it never
starts: its copy is the broker's again. Messages the dispatcher cannot take yet wait in the
loop's own backlog, in arrival order per ordering key; messages of other keys (and unkeyed ones)
pass a key whose parking room is full, and the loop keeps receiving while fewer than
``max_batch`` messages wait in its backlog behind busy keys (at that bound it stops receiving
until one of them starts). A renewal never happens once a message's ack has begun (one lock per
message): on the proxy, renewing an acked message brings it back.

Verbs, one meaning each: the dispatcher *reports* a delivery's outcome; the loop then *settles*
it — ends its hold on it, exactly once: *acks* it (its handler succeeded), *nacks* it (shortens
its invisibility to a backoff: *gives it back*, "retry" when it ran and failed), or, its lease
already gone, lets it *expire* (no broker call). *Renew* extends a held message's lease.

Delivery is at-least-once: a message is acked only after its handler returned successfully, so a
crash between the handler's end and the ack, an ack lost on the wire, or a lease that could not
be renewed delivers it again. A handler that hangs past ``handler_timeout`` has its message given
back on purpose, so the broker can hand it to a healthy consumer: that is a duplicate by design
(see :class:`ConsumeLoop`). Handlers must be idempotent for those cases; the loop itself never
runs one delivery twice.

When receiving keeps failing, the loop re-announces the client's settings to the broker: the 5.x
client sends them only at start-up and every five minutes, and a proxy that restarted meanwhile
refuses every receive ("settings is null") until it has them again.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from opentelemetry.instrumentation.utils import suppress_instrumentation

from ..bounds import timeout_s
from ..callables import exact_str, holds, require_plain, unrun
from ..dispatch import Dispatcher, DispatcherClosed, NotStarted
from ..logonce import OnceLogger
from ..path import names as n
from ..path.clock import Anchor, MonoNs
from ..path.message import body_of, describe
from ..path.stages import Outcome
from ..telemetry.operations import ConsumerOperations
from ..telemetry.tracer import MessageTrace, MessageTracer
from .ahead import ReceiveAhead, sent_cost
from .consume_options import (
    MAX_BATCH,
    MAX_INVISIBLE_S,
    MIN_INVISIBLE_S,
    MIN_RENEW_MARGIN_S,
    ConsumeKeywords,
    DispatchOptions,
    FlowOptions,
    LeaseOptions,
    backoff_seconds,
    exponential_backoff,
    resolve_options,
    whole_seconds,
)
from .each import each_then_raise
from .lease import SETTLING, SUBMITTED, WAITING, BrokerLead, Lease, LeaseKeeper, broker_lease
from .probe import is_probe, probe_stage, skip_probes
from .refusal import lease_gone
from .startup import SETTINGS_WAIT_S, wait_for_settings

if TYPE_CHECKING:  # typing.Unpack is 3.11+; only the annotation needs it
    from typing_extensions import Unpack

__all__ = [
    "MAX_BATCH",
    "MAX_INVISIBLE_S",
    "MIN_INVISIBLE_S",
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


def _attempt(msg: Any) -> int:
    """The message's delivery attempt, 1 when it has none that makes sense; never raises (the
    loop must not die on one odd message)."""
    try:
        attempt = int(getattr(msg, "delivery_attempt", 1) or 1)
    except Exception:  # noqa: BLE001
        return 1
    return attempt if attempt >= 1 else 1


# -- state ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConsumeStats:
    """One consistent snapshot of the loop's counters (taken under its lock). Once the loop is idle::

        received == acked + retry_scheduled + given_back + ack_errors + expired + held

    ``expired`` messages (their lease lost or given up before their ack or nack) are left to the
    broker without a call; ``let_go`` counts leases not renewed because every worker hung while
    the message waited in the dispatcher (it then expires, unrun). ``succeeded + failed`` count
    handlers that ran and ended (``failed`` includes TIMEOUT); ``not_started`` counts messages
    given back or expired without running (their lease was gone when a worker was about to start
    them, the stop deadline had passed, or the dispatcher skipped them).
    """

    received: int = 0
    reported: int = 0  # outcomes the dispatcher reported (one per message it accepted)
    succeeded: int = 0
    failed: int = 0
    not_started: int = 0
    acked: int = 0
    ack_errors: int = 0
    retry_scheduled: int = 0  # nacked after a handler failed or timed out
    given_back: int = 0  # nacked without having run
    expired: int = 0  # no broker call: the loop no longer held a lease for it
    leases_extended: int = 0
    lease_errors: int = 0
    # the lease ran out before it could be renewed (broker unreachable, a stall), or the broker
    # refused a renewal, an ack or a nack because it was already gone (40013)
    leases_lost: int = 0
    abandoned: int = 0  # handlers past handler_timeout + hang_grace: lease given up on purpose
    let_go: int = 0  # held unstarted while every worker hung: lease not renewed, a peer may take it
    submit_errors: int = 0  # the dispatcher refused one message (given back for a retry)
    redelivered: int = 0  # received with delivery_attempt > 1
    receive_errors: int = 0
    resyncs: int = 0  # settings re-announced after failed receives
    resync_errors: int = 0
    held: int = 0  # now: received, not yet settled (as ConsumeState.held, but in this snapshot)
    errors_by_kind: Mapping[str, int] = field(default_factory=dict)
    ahead_lead_s: float = 0.0  # receive_ahead's lead (ReceiveAhead.lead): 0 when off or not measured yet


_COUNTERS = tuple(f.name for f in dataclasses.fields(ConsumeStats) if f.name not in ("errors_by_kind", "held", "ahead_lead_s"))

_LOG_KIND = {  # counter -> what failed, as one OnceLogger kind
    "lease_errors": "lease renewal", "ack_errors": "ack or nack", "receive_errors": "receive",
    "resync_errors": "settings resync", "submit_errors": "dispatcher submit",
    "abandoned": "a hung handler's lease (given up)", "leases_lost": "a lease (ran out before renewal)",
    "let_go": "a lease no worker could start (every worker hung)",
}


@dataclass(frozen=True)
class ConsumeState:
    """What the loop holds now (a snapshot under its lock)."""

    held: int  # every message received and not yet settled
    waiting: int  # received, not yet taken by the dispatcher
    settling: int  # outcome known, ack or nack not yet done
    stopping: bool


class _Phase(enum.IntEnum):
    """The loop's life cycle. It only moves forward, under the loop's lock; lock-free readers (the
    feeder, stop() from a signal handler) read one atomic attribute.

    Beside it, each for a reason the lock cannot serve: ``_stop`` is the stop *request* (a
    :class:`_StopRequest`: set from a signal handler, which must never take a lock — not even an
    event's) and ``_finished`` is the event :meth:`ConsumeLoop.stop` and the lease keeper wait on
    without the loop's lock.
    """

    NEW = 0  # built: neither run() nor poll() yet
    POLLED = 1  # the caller drives it with poll(): stop() only asks
    RUNNING = 2  # run() receives
    DRAINING = 3  # run() stopped receiving: the backlog goes to the dispatcher, which then closes
    SETTLING = 4  # the dispatcher is closed: the ack threads drain their queue; later outcomes settle inline
    FINISHED = 5  # the helpers ended; run() returns
    UNRUN = 6  # stop() came before run() or poll(): the dispatcher is closed, run() returns at once


class _StopRequest:
    """The stop request: one attribute assignment, so setting it never takes a lock.
    ``threading.Event.set`` takes the event's own lock: a signal landing while its thread is inside
    that lock (its own ``stop()``, a wait on the event) would wait for ever on it. Waiters poll it
    (at most ``_SLICE_S`` late); the loop's own waits are bounded by its tick anyway."""

    _SLICE_S = 0.05

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._set and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(self._SLICE_S, left))
        return self._set


class _Changes(threading.Condition):
    """The loop's one condition, counting its notifications: :meth:`ConsumeLoop.wait` evaluates a
    predicate outside the lock (it may call the loop's readers) and still misses no change that
    came while it did."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.generation = 0

    def notify_all(self) -> None:
        self.generation += 1
        super().notify_all()


class _NotStarted(NotStarted):
    """Raised in place of the handler: this message must not start (its lease is gone, or the
    stop deadline passed). Never reaches the user; the loop counts the message ``not_started``."""


def _never_ran(outcome: Outcome, error: BaseException | None) -> bool:
    if outcome is Outcome.SKIPPED or outcome is Outcome.NOT_STARTED:
        return True
    return isinstance(error, _NotStarted) or isinstance(getattr(error, "__cause__", None), _NotStarted)


class _RunningCopies:
    """The messages whose handler runs now in this process, hung ones included, by (consumer
    group, message id): process-wide, not per loop, because a loop stopped with ``stop(timeout=)``
    leaves its hung calls running, and a new loop on the same group would otherwise start the
    broker's redelivered copy beside them. An entry ends when its call really returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[tuple[str | None, Any]] = set()

    def claim(self, key: tuple[str | None, Any]) -> bool:
        """Mark ``key`` running; False (nothing changed) when a copy of it already runs."""
        with self._lock:
            if key in self._ids:
                return False
            self._ids.add(key)
            return True

    def release(self, key: tuple[str | None, Any]) -> None:
        with self._lock:
            self._ids.discard(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._ids


_RUNNING = _RunningCopies()


class _SecondsClock:
    """The loop's seconds clock as the dispatcher's monotonic clock, so handler ages match."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic

    def monotonic_ns(self) -> MonoNs:
        return MonoNs(int(self._monotonic() * 1e9))


def _group_of(tracer: MessageTracer | None, consumer: Any) -> str:
    """The consumer group the dispatcher's gauges are labelled with: the tracer's (the label of
    the stage histograms too), else the consumer's own, else ""."""
    group = tracer.consumer_group if tracer is not None else ""
    if not group:
        own = getattr(consumer, "consumer_group", "")
        group = own if isinstance(own, str) else ""
    return group


def _invisible_seconds(consumer: Any, lease: LeaseOptions) -> int:
    """The whole seconds a receive asks the broker for.

    Raises:
        ValueError: below the broker's minimum receive invisible time (a consumer that states it):
            every receive would be refused.
    """
    seconds = whole_seconds(lease.invisible_duration)
    minimum = getattr(consumer, "min_receive_invisible", None)
    if isinstance(minimum, (int, float)) and seconds < minimum:
        raise ValueError(f"invisible_duration={lease.invisible_duration:g} s is below the broker's "
                         f"minimum receive invisible time ({minimum:g} s): every receive would be refused")
    return seconds


class ConsumeLoop:
    """Receive → dispatch → settle (ack or nack), with lease renewal and retry backoff.

    Options come in three groups (:class:`DispatchOptions`, :class:`LeaseOptions`,
    :class:`FlowOptions`), or as their flat keywords (``workers=``, ``invisible_duration=`` …,
    see :class:`ConsumeKeywords`), which override the groups' fields.

    A handler that raises, or runs past ``handler_timeout`` seconds, is not acked: the message
    comes back after ``retry_backoff(delivery_attempt)`` seconds. With ``key=``, the later messages
    of its key the loop holds unstarted go back with it, unrun (the dispatcher's
    ``successors_follow``, and the loop's backlog), as for a message refused at the start: none
    runs past it here. On a FIFO topic the broker hands them out again behind it; on a normal
    topic each comes back after its own backoff (a normal topic keeps no order).

    **A hung handler.** A Python thread cannot be stopped. The thread dispatcher's watchdog
    reports a handler still running at ``handler_timeout`` as ``TIMEOUT`` at that deadline; the
    loop then gives the message back at once (``retry_backoff``, no more renewals), so the broker
    hands it to a healthy consumer after the backoff; the later messages of its ordering key that
    the loop still holds unstarted are given back with it (they follow it, instead of waiting for
    the hung thread). Should no outcome come, the loop's own backstop applies: a handler still
    running ``handler_timeout + hang_grace`` seconds after it started is *abandoned* — its lease
    is no longer renewed (``abandoned``), and the broker hands the message out again once that
    lease runs out, at most ``invisible_duration`` later. Either way (plus the proxy's revive
    delay, 2–3 s) what you see is a **duplicate by design**: the same ``message_id`` with
    ``delivery_attempt + 1``, possibly while the hung call is still running. Without
    ``handler_timeout`` a handler is never let go.
    A redelivered copy never starts while an earlier copy of the same message still runs in this
    process: it is given back at once, invisible for ``max(retry_backoff(attempt),
    invisible_duration)`` — so, while the hung call lasts, the copy bounces between the broker and
    this loop at most once per lease (a peer consumer may take it meanwhile).

    **Tracing** (``tracer=``): every message gets a trace (``process``, ``handler`` and gap spans);
    each ``receive`` call is a ``receive`` operation (span and ``messaging.client.operation.duration``),
    each ack and nack a settle operation (``ack`` / ``change_invisible_duration``; the histogram
    always, a span with ``settle_spans=True``); lease renewals are not operations. The consumer's
    client id, namespace and endpoint go on the tracer (:func:`tracer.path.message.client_facts`).
    A :class:`~tracer.clients.official.TracedSimpleConsumer` passed in is unwrapped (one trace per
    message, not two): the loop uses its tracer when ``tracer=`` is not given, and its
    ``settle_spans`` when ``settle_spans=`` is not; ``loop.consumer`` is the wrapped client.

    **A handler must not submit to this loop's dispatcher** (``loop.dispatcher``): it would wait
    for its own worker. When the pool is full the dispatcher refuses it (``RuntimeError``, so that
    message fails and is retried); hand such follow-up work to another dispatcher or a queue.

    **When a lease starts.** A message's lease is dated from what the broker decided: the pop
    time its receipt handle carries (the 5.x proxy's and the embedded broker's handles both do,
    :func:`~tracer.clients.lease.broker_lease`), placed on the loop's clock by the ``wall``
    reading taken when ``receive`` returned (how long ago the broker popped it), less the most
    the broker's clock may run ahead of this process's (learnt from recent calls: a pop is never
    before its call began, :class:`~tracer.clients.lease.BrokerLead`), and kept within the call.
    A handle that cannot be read dates it from the call's start. So a stall while ``receive`` was in flight does not make a
    lease the broker already ended look live.

    ``monotonic``: the loop's clock in seconds (leases, renewals, handler ages); ``wall``: the
    wall clock in seconds (only to read the pop time in receipt handles); tests pass manual
    ones and drive the loop with :meth:`poll`, :meth:`renew_leases` and
    :meth:`settle_ready` instead of :meth:`run`.

    Raises:
        ValueError: an option that cannot work, e.g. a lease shorter than the consumer's
            declared minimum (``consumer.min_receive_invisible``, the embedded broker's).
        TypeError: an unknown keyword; a handler, ``key=``, ``cost=`` or ``retry_backoff=`` that
            is not a plain callable (an ``async def`` or generator function is refused).
    """

    def __init__(
        self,
        consumer: Any,
        handler: Callable[[Any], object],
        *,
        tracer: MessageTracer | None = None,
        settle_spans: bool | None = None,
        dispatch: DispatchOptions | None = None,
        lease: LeaseOptions | None = None,
        flow: FlowOptions | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        **keywords: Unpack[ConsumeKeywords],
    ) -> None:
        self.dispatch_options, self.lease, self.flow = resolve_options(dispatch, lease, flow, dict(keywords))
        require_plain(handler, "handler")  # an async def would "succeed" without running
        consumer, tracer, self._ops = _one_tracing_path(consumer, tracer, settle_spans)
        self.consumer = consumer
        self.tracer = tracer
        self._invisible_s = _invisible_seconds(consumer, self.lease)
        self._monotonic, self._wall = monotonic, wall
        self._n: Counter[str] = Counter()  # the counters; snapshots via statistics()
        self._errors: Counter[str] = Counter()
        self._log = OnceLogger("rmqtrace consume loop", log, logging.WARNING)
        # probes (tracer.clients.probe) ride the dispatcher like any message but never reach the handler
        self._user_handler = skip_probes(handler)
        self.dispatcher = self._make_dispatcher(_group_of(tracer, consumer))
        self._keeper = LeaseKeeper(consumer, self.lease, monotonic, self._count, self.dispatch_options.handler_timeout,
                                   self._interrupted)
        # receive_ahead: running handlers about to end count as room (ahead.py)
        self._ahead = ReceiveAhead(self.dispatch_options.cost or sent_cost) if self.flow.receive_ahead else None
        # one lock for all of the loop's state and its counters: _room() and snapshots are consistent
        self._lock = threading.Lock()
        self._changed = _Changes(self._lock)  # any state change: receive loop, waiters
        self._leases: dict[int, Lease] = {}
        self._broker_lead = BrokerLead()  # how far the broker's clock may run ahead (only _own, one thread)
        self._backlog: deque[Lease] = deque()  # received, not yet taken by the dispatcher (in order)
        self._acks: deque[tuple[Lease, Outcome, bool]] = deque()  # (held, outcome, ran) not yet taken
        self._settling = 0  # outcomes reported and not yet settled (queued or being settled)
        group = getattr(consumer, "consumer_group", None)
        # one message id is two deliveries in two groups: the process-wide guard is per group
        self._group: str | None = group if isinstance(group, str) else None
        self._phase = _Phase.NEW
        self._stop = _StopRequest()  # the stop request (see _Phase: why not an event)
        self._stop_deadline: float | None = None  # real monotonic seconds
        self._finished = threading.Event()  # phase FINISHED or UNRUN reached (see _Phase)
        self._feeder: threading.Thread | None = None
        self._ack_workers: list[threading.Thread] = []
        self._keeper_thread: threading.Thread | None = None
        # the first BaseException (KeyboardInterrupt, SystemExit) user code raised on one of the
        # loop's own threads: it stops the loop, and run() re-raises it once the drain is done
        self._interrupt: BaseException | None = None
        self._inside = threading.local()  # .thread is True on the threads the drain waits for
        # set by the drain's last give-back: a message an offer puts back after it is given back
        # at once (nothing would take it any more)
        self._backlog_closed = False
        # the ordering key of each message reported TIMEOUT, by id(message), while it still runs:
        # the start gate reads them here instead of calling key= again (a slow key= there would
        # run on the watchdog's clock of the message being started)
        self._timed_out_keys: dict[int, str] = {}

    def _make_dispatcher(self, group: str) -> Dispatcher[Any]:
        """The dispatcher the loop feeds: its options, on the loop's monotonic clock."""
        d = self.dispatch_options
        return Dispatcher(self._start_handler, policy=d.policy, workers=d.workers, key=d.key, cost=d.cost,
                          on_done=self._on_done, metrics=d.metrics, handler_timeout=d.handler_timeout,
                          clock=_SecondsClock(self._monotonic), name="consume", consumer_group=group,
                          successors_follow=True)  # per-key order: no successor runs past a failure

    # -- public state ------------------------------------------------------------------------
    @property
    def invisible_duration(self) -> float:
        return self.lease.invisible_duration

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def statistics(self) -> ConsumeStats:
        """One frozen snapshot of the counters (see :class:`ConsumeStats`)."""
        with self._lock:
            return self._snapshot_locked()

    def _snapshot_locked(self) -> ConsumeStats:
        n = self._n
        return ConsumeStats(**{name: n[name] for name in _COUNTERS}, held=len(self._leases),
                            errors_by_kind=dict(self._errors),  # a copy: the snapshot shares nothing
                            ahead_lead_s=self._ahead.lead if self._ahead is not None else 0.0)

    def state(self) -> ConsumeState:
        with self._lock:
            # a backlog entry whose outcome is already reported (its submit failed) is settling, not
            # waiting, until the feeder rebuilds the backlog: counted once
            waiting = sum(1 for h in self._backlog if h.state != SETTLING)
            return ConsumeState(len(self._leases), waiting, self._settling, self._stop.is_set())

    def wait(self, predicate: Callable[[ConsumeStats], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate(snapshot)`` holds (True), or ``timeout`` seconds pass (None or
        ``math.inf``: no bound), or the loop has finished holding nothing (:meth:`run` returned
        and every message is settled: no counter can change any more) — then False. The
        predicate is evaluated after every change, outside the loop's lock: it may call
        :meth:`statistics` or :meth:`state` (under the lock it would wedge the whole loop).

        Raises:
            ValueError: ``timeout`` is NaN or negative.
            TypeError: the predicate returned a coroutine or generator (its check never ran).
        """
        require_plain(predicate, "predicate")  # a coroutine is truthy: it would "hold" at once
        limit = timeout_s(timeout, "wait timeout")
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            with self._lock:
                seen, snapshot = self._changed.generation, self._snapshot_locked()
            if holds(predicate, snapshot, "wait() predicate"):
                return True
            with self._changed:
                if self._finished.is_set() and not self._leases:
                    return False  # nothing will ever change: no wait (bounded or not) may block on it
                while self._changed.generation == seen:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._changed.wait(left)
            if deadline is not None and time.monotonic() >= deadline:
                return holds(predicate, self.statistics(), "wait() predicate")

    # -- the loop ----------------------------------------------------------------------------
    def run(self, until: Callable[[ConsumeStats], bool] | None = None) -> ConsumeStats:
        """Consume until :meth:`stop` (or ``until(snapshot)`` is true), then drain; the last snapshot.

        Raises:
            LeaseRefused: (a ValueError) the broker refused the lease length (the proxy's
                ``minInvisibleTimeMillsForRecv``, 10 s by default): no receive can succeed.
            TypeError: ``until`` returned a coroutine or generator (its check never ran), after the drain.
            KeyboardInterrupt, SystemExit: raised by user code or a broker call on one of the loop's
                threads, this one too (``key=``, ``cost=``, ``retry_backoff=``, ``until=``, a Ctrl-C
                inside ``receive``), after the drain, which gives back what has not started; an
                ``Exception`` from user code is contained.
        """
        require_plain(until, "until", optional=True)  # a coroutine is truthy: run() would end at once
        with self._lock:
            phase = self._phase
            if phase <= _Phase.POLLED:
                self._phase = _Phase.RUNNING
        if phase == _Phase.UNRUN:
            self._finished.wait()  # stop() closes the dispatcher
            return self.statistics()  # stopped before it ran: it never receives
        if phase > _Phase.POLLED:
            raise RuntimeError("a ConsumeLoop runs once")
        self._inside.thread = True
        self._start_helpers()
        # the 5.1.2 client's first receive before its settings fails with a traceback (startup.py)
        if wait_for_settings(self.consumer, SETTINGS_WAIT_S, self._stop) is False and not self._stop.is_set():
            log.debug("rmqtrace consume loop: no settings from the proxy within %g s; receiving anyway", SETTINGS_WAIT_S)
        failures = 0  # receives failed in a row
        tick = self._tick()
        try:
            while not self._stop.is_set():
                if until is not None and holds(until, self.statistics(), "until="):
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
                    ahead = None if self._ahead is None else self._ahead.wake_in(self.dispatcher.running())
                    with self._changed:
                        if not self._stop.is_set():
                            # a waiting backlog is offered again soon: room frees just after an outcome
                            wait = min(tick, 0.05) if self._backlog else tick
                            self._changed.wait(wait if ahead is None else min(wait, ahead))
                    continue
                failures = 0
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # a Ctrl-C or SystemExit on this very thread (inside receive's long poll, until=,
                # receive_ahead's cost=) is the loop's interrupt as on its other threads: the
                # drain gives back what has not started instead of running it
                self._interrupted(exc)
            raise
        finally:
            try:
                self._shutdown()
            finally:
                self._inside.thread = False  # the caller's thread again: its later stop(timeout=) may wait
        if self._interrupt is not None:  # raised on a helper thread (the feeder, an ack thread)
            raise self._interrupt
        return self.statistics()

    def _interrupted(self, exc: BaseException) -> None:
        """User code raised a BaseException on one of the loop's threads: the loop stops (a Ctrl-C
        or a SystemExit means the program wants out), and run() re-raises it after the drain."""
        with self._changed:
            if self._interrupt is None:
                self._interrupt = exc
            self._stop.set()
            self._changed.notify_all()

    def poll(self) -> int | None:
        """One step of the receive side, never blocking on the dispatcher: hand the backlog to
        the dispatcher as far as it takes it now, then receive once if there is room.

        Returns how many messages were received, or None when there was no room to receive.
        Receive errors propagate (``run`` counts them). With ``prefetch`` > 0 the backlog is
        handed out by :meth:`run`'s feeder thread, not here.
        """
        if self._phase == _Phase.NEW:
            with self._lock:
                first = self._phase == _Phase.NEW
                if first:
                    self._phase = _Phase.POLLED
            # a caller driving poll() itself gets run()'s wait before its first receive (startup.py)
            if first and wait_for_settings(self.consumer, SETTINGS_WAIT_S, self._stop) is False:
                log.debug("rmqtrace consume loop: no settings from the proxy within %g s; receiving anyway",
                          SETTINGS_WAIT_S)
        if self.flow.prefetch == 0:
            self._feed()
        free = self._room()
        if free <= 0:
            return None
        size = min(free, self.flow.max_batch)
        started: list[tuple[Any, MessageTrace]] = []
        called, called_wall = self._monotonic(), self._wall()  # no lease of this batch began before this
        try:
            # the loop traces its messages itself: an instrumented client must not too
            with suppress_instrumentation():
                if self._ops is None:
                    messages = self.consumer.receive(size, self._invisible_s)
                else:
                    # traces start inside the receive operation, so its span links to them
                    messages = self._ops.receive(lambda: self.consumer.receive(size, self._invisible_s),
                                                 lambda got: self._start_traces(got, started))
        except Exception as exc:
            if "invisibleTime is too small" in str(exc):
                raise LeaseRefused(
                    f"the broker refuses invisible_duration={self._invisible_s} s ({exc}); the proxy's "
                    "minInvisibleTimeMillsForRecv is 10 s by default: use a longer lease or lower it") from exc
            raise
        batch = list(messages or ())
        if batch and self._ahead is not None:
            self._ahead.observe(self._monotonic() - called)
        if batch:
            self._own(batch, dict((id(m), t) for m, t in started) if self._ops is not None else None, called,
                      called_wall)
            if self.flow.prefetch == 0:
                self._feed()
        return len(batch)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop receiving; what the loop holds is still run and settled.

        Without ``timeout`` this only asks and returns at once — safe from a signal handler: it
        never waits for a lock (the loop's, which the interrupted thread may hold, is only tried;
        the request itself is a lock-free flag, not an event); :meth:`run`
        drains everything it holds (bounded by ``stop_timeout`` if set) and returns.
        With ``timeout`` (seconds; None or ``math.inf``: no bound) the drain ends at most that
        long from now — a later, shorter one moves that point forward, also while the drain
        already waits: at that point every held message that has not started is given back to
        the broker (nacked, or left to its lease) and **none starts afterwards**; handlers still
        running then go on (a thread cannot be stopped), are settled when they end, and their
        leases are no longer renewed. This call waits for :meth:`run` to return and says whether
        it has: True means nothing more starts. On one of the loop's own threads (a handler,
        ``key=``, ``until=``, ``retry_backoff=``) it does not wait — the drain waits for that very
        call — and returns False. A loop stopped before it ever received (neither :meth:`run`
        nor :meth:`poll` called) closes its dispatcher here (its worker threads end) and returns
        True; :meth:`run` then returns at once without receiving.

        Raises:
            ValueError: ``timeout`` is NaN or negative.
        """
        limit = timeout_s(timeout, "stop timeout")  # None also for math.inf and huge ones: no bound
        if limit is not None:
            # no lock here: stop() may run in a signal handler that interrupted a holder of it
            # (a float assignment is atomic; the drain re-reads the deadline at least every tick)
            deadline = time.monotonic() + limit
            current = self._stop_deadline
            if current is None or deadline < current:
                self._stop_deadline = deadline
        self._stop.set()
        never_ran = False
        # never block on the loop's lock (a signal handler on the thread that holds it would
        # deadlock): if it is busy, the loop sees the request within one tick
        if self._lock.acquire(blocking=False):
            try:
                self._changed.notify_all()
                never_ran = self._phase == _Phase.NEW
                if never_ran:
                    self._phase = _Phase.UNRUN
            finally:
                self._lock.release()
        if never_ran:
            # no run() will close the dispatcher: its workers would outlive the loop. Nothing was
            # received, so nothing is held; a later run() returns at once.
            self.dispatcher.close(drain=False)
            with self._changed:  # not a signal handler's lock holder: it was free just above
                self._finished.set()
                self._changed.notify_all()
            return True
        if timeout is None or self._on_own_thread():
            # on one of the loop's own threads (a handler, key=, until=, retry_backoff=) the drain
            # waits for this very call to return: waiting for the drain here would wait for itself
            return self._finished.is_set()
        if limit is None:
            return self._finished.wait()
        return self._finished.wait(limit + 0.5)  # the drain's own deadline is `limit`; a bit more to return

    def _on_own_thread(self) -> bool:
        """Whether the calling thread is one the drain waits for: run()'s, a helper's, or a worker
        inside :meth:`_start_handler`."""
        return bool(getattr(self._inside, "thread", False))

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the loop gracefully (call from the main thread)."""
        # only the request, a lock-free flag: a handler that took a lock (the loop's, or an
        # event's) could interrupt a holder of it; the loop sees the request within one tick
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())

    def _tick(self) -> float:
        # MIN_RENEW_MARGIN_S keeps margin / 3 at or above the shortest tick: the keeper looks at
        # every lease at least three times within its margin
        return max(MIN_RENEW_MARGIN_S / 3, min(1.0, self.lease.margin / 3))

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
            self._n["resyncs"] += 1

    def _room(self) -> int:
        # Everything held but not running counts against the room: a backlog the dispatcher
        # cannot take, and handled messages waiting for an ack thread (were acks slower than
        # handlers, the unacked pile — all redelivered if this process dies — would grow). An ack
        # an ack thread is sending does not: a freed worker would otherwise wait one ack round
        # trip before its receive, on every message; the pile stays bounded by ack_threads.
        with self._lock:
            if self._stop.is_set():
                return 0
            waiting, settling = len(self._backlog), len(self._acks)
            blocked_unkeyed = any(h.key is None for h in self._backlog)
            # receive_ahead: every held message not started yet (the backlog, and what the
            # dispatcher accepted without a worker: a keyed one parked behind its busy key, a
            # window) will take the worker of a handler about to end — the backlog alone missed
            # a parked one, and each poll received one more for the same handler
            unstarted = 0 if self._ahead is None else sum(
                1 for h in self._leases.values() if h.state != SETTLING and not h.started)
        if self._all_workers_hung():
            # a window or a worker's buffer is no room when no worker can ever start from it:
            # what the loop received now would only be held and renewed, out of every peer's reach
            return 0
        if self.flow.prefetch > 0:
            return self.flow.prefetch - waiting - settling
        # Messages waiting behind busy keys do not stop receiving for other keys, up to a bound
        # (each is held and renewed); an unkeyed one waiting means the pool itself is full.
        if blocked_unkeyed or waiting >= self.flow.max_batch:
            return 0
        # a message already held unstarted took the room of a handler about to end: one ahead each
        ahead = 0 if self._ahead is None else max(0, self._ahead.soon(self.dispatcher.running()) - unstarted)
        return min(self.dispatcher.free_slots() + ahead - settling, self.flow.max_batch - waiting)

    def _key_of(self, msg: Any) -> str | None:
        """The message's ordering key for the backlog's per-key order; None when it has none, or
        when ``key=`` fails (the dispatcher then fails that message at submit: it never waits)."""
        fn = self.dispatch_options.key
        if fn is None:
            return None
        try:
            k = fn(msg)
        except Exception:  # noqa: BLE001 - the dispatcher reports it (a BaseException propagates)
            return None
        if isinstance(k, str):
            return exact_str(k)
        unrun(k)  # a returned coroutine is closed (the dispatcher's own key= call refuses the message)
        return None

    def _start_traces(self, messages: Any, into: list[tuple[Any, MessageTrace]]) -> list[MessageTrace]:
        """A trace for each received message (appended to ``into``); returns the traces."""
        tracer = self.tracer
        if tracer is None or isinstance(messages, (str, bytes)):
            return []
        pulled = Anchor(tracer.clock)  # the batch's pull on both clocks: a wall step after it is no gap
        for m in list(messages or ()):
            try:
                into.append((m, tracer.start_message(describe(m), pulled, body_of(tracer, m))))
            except Exception as exc:  # noqa: BLE001
                tracer.hook_failed("starting a message trace", exc)
        return [t for _, t in into]

    def _lease_end(self, msg: Any, called: float, returned: float, returned_wall: float, lead: float) -> float:
        """When ``msg``'s lease ends on the loop's clock. From what the broker decided: its pop
        time (in the receipt handle) moved onto this process's wall clock by ``lead`` (the most
        the broker's clock may run ahead, :class:`~.lease.BrokerLead`), as time elapsed before
        ``receive`` returned, kept within the call (``called`` .. ``returned``, monotonic). From
        the call's start when the handle cannot be read."""
        popped = called
        decided = broker_lease(getattr(msg, "receipt_handle", None))
        if decided is not None:
            ago = max(0.0, returned_wall - (decided[0] / 1000.0 - lead))
            popped = max(called, returned - ago)
        return popped + self.lease.invisible_duration

    def _lead(self, batch: list[Any], called_wall: float) -> float:
        """The tightest bound on the broker clock's lead after this call (see :class:`~.lease.BrokerLead`):
        its earliest pop time was after ``called_wall``; +inf when no handle of it can be read."""
        pops = [d[0] / 1000.0 for m in batch if (d := broker_lease(getattr(m, "receipt_handle", None))) is not None]
        return self._broker_lead.bound(min(pops) - called_wall) if pops else float("inf")

    def _own(self, batch: list[Any], traces: dict[int, MessageTrace] | None = None,
              called: float | None = None, called_wall: float | None = None) -> None:
        """Own the whole batch at once: held (so renewed) before any of it is submitted.
        ``traces``: those the receive operation started, by ``id(message)`` (None: start them here);
        ``called``, ``called_wall``: the loop's clocks when ``receive`` was called (None: now)."""
        returned, returned_wall = self._monotonic(), self._wall()
        if called is None:
            called = returned
        lead = self._lead(batch, returned_wall if called_wall is None else called_wall)
        held = [Lease(m, self._lease_end(m, called, returned, returned_wall, lead)) for m in batch]
        with self._lock:
            for h in held:
                self._leases[id(h.message)] = h
            self._n["received"] += len(held)
            self._n["redelivered"] += sum(1 for m in batch if _attempt(m) > 1)
        if self.tracer is not None:
            if traces is None:
                started: list[tuple[Any, MessageTrace]] = []
                self._start_traces(batch, started)
                traces = {id(m): t for m, t in started}
            for h in held:
                h.trace = traces.get(id(h.message))
        try:
            for h in held:
                h.key = self._key_of(h.message)
        except BaseException as exc:
            # key= raised a Ctrl-C: the batch is ours (held), so it goes back, none of it runs
            for h in held:
                h.state = SUBMITTED
                self._give_back_unrun(h, Outcome.SKIPPED)
            self._interrupted(exc)
            raise
        with self._changed:
            self._backlog.extend(held)
            self._changed.notify_all()

    def _feed(self) -> int:
        """Offer the backlog to the dispatcher, oldest first, without blocking; returns how many it
        took. A message it refuses keeps its place, and so does every later one of its key (the
        key's order holds); later messages of other keys are still offered (they pass it).
        Only one thread feeds (the receive loop, or the prefetch feeder)."""
        with self._lock:
            if not self._backlog:
                return 0
            offer = list(self._backlog)
        # a key whose message was reported TIMEOUT and still runs is not offered: its successors
        # follow the given-back message back to the broker
        keyed = {h.key for h in offer if h.key is not None}
        hung = self._hung_keys() if keyed else set()
        # so do the keys whose fixed worker hangs (round-robin, random): held here, they would
        # wait out the hang out of every peer's reach
        hung |= {k for k in keyed if self.dispatcher.blocks(k)}
        refused_keys: set[str] = set()
        pool_full = False  # an unkeyed message was refused: the pool has no free worker
        taken = 0
        try:
            taken = self._offer(offer, hung, refused_keys, pool_full)
        finally:
            # also after a BaseException: an entry left "submitted" in the backlog would count as
            # waiting for ever, and the drain at shutdown would wait for it for ever
            with self._changed:
                self._backlog = deque(h for h in self._backlog if h.state == WAITING)
                self._changed.notify_all()
        return taken

    def _offer(self, offer: list[Lease], hung: set[str], refused_keys: set[str], pool_full: bool) -> int:
        taken = 0
        for h in offer:
            if h.key is not None and h.key in hung:
                taken += self._give_back_key(h.key)
                continue
            if (h.key is None and pool_full) or (h.key is not None and h.key in refused_keys):
                continue
            with self._lock:
                if h.state != WAITING:  # given back meanwhile (its key's head timed out)
                    continue
                h.state = SUBMITTED
            try:
                accepted = self.dispatcher.submit(h.message, probe_stage(self.tracer, h.trace), timeout=0)
            except DispatcherClosed:
                self._put_back(h)
                break
            except BaseException as exc:
                # key= or cost= raised a Ctrl-C or a SystemExit: this message goes back unrun
                self._give_back_unrun(h, Outcome.SKIPPED)
                self._interrupted(exc)
                raise
            except Exception as exc:  # noqa: BLE001 - one message the dispatcher refuses must not stop the loop
                self._count("submit_errors", exc)
                self._give_back_unrun(h, Outcome.FAILURE)
                self._follow(h)
                taken += 1
                continue
            if accepted:
                taken += 1
                continue
            self._put_back(h)
            if h.key is None:
                pool_full = True
            else:
                refused_keys.add(h.key)
        return taken

    def _put_back(self, h: Lease) -> None:
        """An offer the dispatcher did not take: ``h`` waits in the backlog again — unless the
        drain gave the backlog back meanwhile (it skipped ``h``, then being offered): then ``h``
        goes back to the broker now, or it would be held for ever, never settled."""
        with self._lock:
            if not self._backlog_closed:
                h.state = WAITING
                return
        self._give_back_unrun(h, Outcome.SKIPPED)

    def _all_workers_hung(self) -> bool:
        """Every worker runs a handler already reported TIMEOUT (only known with handler_timeout)."""
        if self.dispatch_options.handler_timeout is None:
            return False
        return len(self.dispatcher.overrun()) >= self.dispatch_options.workers

    def _hung_keys(self) -> set[str]:
        """The keys of the messages still running past their TIMEOUT. Read from what the loop
        recorded, never by calling key= here (the start gate runs this on the clock of the
        message it is about to start): the key recorded at the TIMEOUT, else its lease's (the
        dispatcher lists it overrun just before the loop hears of the TIMEOUT)."""
        if self.dispatch_options.handler_timeout is None:
            return set()
        hung = {id(item) for item, _ in self.dispatcher.overrun()}
        with self._lock:
            for gone in [i for i in self._timed_out_keys if i not in hung]:
                del self._timed_out_keys[gone]  # it returned: its key is free again
            keys = set()
            for i in hung:
                k = self._timed_out_keys.get(i)
                if k is None and (h := self._leases.get(i)) is not None:
                    k = h.key
                if k is not None:
                    keys.add(k)
            return keys

    def _feed_loop(self) -> None:
        """Prefetch mode: move backlog messages into the dispatcher while it takes them."""
        self._inside.thread = True
        tick = self._tick()
        while self._phase < _Phase.SETTLING:
            with self._changed:
                if not self._backlog:
                    if self._stop.is_set():
                        return
                    self._changed.wait(tick)
                    continue
            try:
                fed = self._feed()
            except BaseException as exc:  # noqa: BLE001 - run() re-raises it (the first one recorded)
                self._interrupted(exc)  # also one raised before any message was marked (key= of a hung one)
                return
            if not fed:
                with self._changed:
                    self._changed.wait(min(tick, 0.05))  # room frees just after an outcome

    def _start_handler(self, msg: Any) -> object:
        """What each worker runs: the user's handler — only while the loop still holds the message's
        lease, the stop deadline has not passed, no interrupt (a Ctrl-C, a SystemExit) stopped the
        loop, no other copy of the message runs in this process (a hung first run's redelivery), no
        message of its key hangs past its TIMEOUT, and no outcome of it was reported yet (a TIMEOUT
        while it waited here: it was given back); else it does not start and is given back."""
        own = self._inside
        own.thread = True  # a stop(timeout=) from the handler must not wait for the drain
        try:
            return self._start_if_held(msg)
        finally:
            own.thread = False

    def _start_if_held(self, msg: Any) -> object:
        mid = getattr(msg, "message_id", None)
        copy = (self._group, mid)
        with self._lock:
            h = self._leases.get(id(msg))
        # the dispatcher frees a key at its message's TIMEOUT, before the loop hears of it: a
        # successor must not start while that message is given back (it follows it instead)
        if h is not None and h.key is not None and h.key in self._hung_keys():
            raise _NotStarted("a message of its key timed out and still runs: it follows that one back")
        with self._lock:
            # no lease is no go: the loop holds no lease for a message it settled already (a TIMEOUT
            # while it waited, then its settle), and a handler must not run on a lease nobody holds
            if h is None or h.state == SETTLING or self._past_stop_deadline() or not h.live(self._monotonic()):
                raise _NotStarted("its outcome was reported, the lease is gone or the stop deadline passed")
            if self._interrupt is not None:  # the program wants out: nothing more starts
                raise _NotStarted("the loop was interrupted (a Ctrl-C or SystemExit): it goes back unrun")
            if mid is not None and not _RUNNING.claim(copy):
                raise _NotStarted("another copy of this message still runs in this process")
            if h is not None:
                h.started = True  # under the lock _report decides "ran" under: a TIMEOUT from now is a run
        try:
            return self._user_handler(msg)
        finally:
            if mid is not None:
                _RUNNING.release(copy)

    def _on_done(self, msg: Any, outcome: Outcome, error: BaseException | None) -> None:
        with self._lock:
            self._n["reported"] += 1
            h = self._leases.get(id(msg))
            if h is not None and outcome is Outcome.TIMEOUT and h.key is not None:
                self._timed_out_keys[id(msg)] = h.key  # the start gate's, while it still runs
        if h is None:
            return
        # a TIMEOUT is a run only if the handler was let start: the watchdog's clock starts
        # before the start gate, which may outlast it (a stall) and then refuses to start it
        never = _never_ran(outcome, error)
        self._report(h, outcome, ran=False if never else None if outcome is Outcome.TIMEOUT else True)
        if outcome is not Outcome.SUCCESS:
            self._follow(h)

    def _follow(self, h: Lease) -> None:
        """``h`` ends without success: the later messages of its key follow it back. Without a
        key — ``key=`` failed for it, or said None — a FIFO message's message group stands in:
        the broker hands its queue out again from ``h`` on, so a later message of the group run
        now would run out of order, and again in that rerun."""
        if h.key is not None:
            self._give_back_key(h.key)
        elif self.dispatch_options.key is not None:
            group = getattr(h.message, "message_group", None)
            if isinstance(group, str) and group:
                self._give_back_key(group, lambda w: getattr(w.message, "message_group", None) == group)

    def _give_back_key(self, key: str, of: Callable[[Lease], bool] | None = None) -> int:
        """A message of ``key`` was given back (it failed, timed out or did not start): its
        successors the loop still holds unsubmitted follow it back to the broker (they must not
        overtake it here; those the dispatcher holds it gives back itself, ``successors_follow``).
        ``of``: which held messages are its successors (default: those of ``key``). How many."""
        with self._lock:
            follow = [h for h in self._backlog
                      if (h.key == key if of is None else of(h)) and h.state == WAITING]
            if not follow:
                return 0
            for h in follow:
                h.state = SUBMITTED  # out of the feeder's reach
            gone = set(map(id, follow))  # not "state != WAITING": one being offered right now stays
            self._backlog = deque(h for h in self._backlog if id(h) not in gone)
        each_then_raise(follow, lambda h: self._give_back_unrun(h, Outcome.SKIPPED))
        return len(follow)

    def _give_back_unrun(self, h: Lease, outcome: Outcome) -> None:
        """``h`` leaves the loop without the dispatcher ever having run it (its own backlog given
        back, a submit that raised): its trace is finished ``not_started`` here — the dispatcher
        finishes the traces of what it held itself — so every settled delivery is measured once
        and the occupancy tracker stops counting it as waiting. A probe's trace is never
        finished (it is no message of the user's): it only leaves the occupancy."""
        trace, tracer = h.trace, self.tracer
        if trace is not None and tracer is not None:
            try:
                if is_probe(trace.info.properties):
                    if tracer.occupancy is not None:
                        tracer.occupancy.discarded(trace.anchor.mono_ns)
                else:
                    trace.finish(Outcome.NOT_STARTED)
            except Exception as exc:  # noqa: BLE001 - telemetry never stops the give-back
                tracer.hook_failed("finishing a message given back unrun", exc)
        self._report(h, outcome, ran=False)

    def _report(self, h: Lease, outcome: Outcome, *, ran: bool | None) -> None:
        """The message's outcome is known: queue its settle (or settle it here once the ack
        threads have stopped taking, so no late outcome — a TIMEOUT after close — is left held).
        ``ran`` None: whether its handler was let start (decided here, under the start gate's lock)."""
        with self._changed:
            if h.state == SETTLING:
                return  # one outcome per delivery
            h.state = SETTLING
            if ran is None:
                ran = h.started
            if not ran:
                self._n["not_started"] += 1
            elif outcome is Outcome.SUCCESS:
                self._n["succeeded"] += 1
            else:
                self._n["failed"] += 1
            self._settling += 1
            inline = self._phase >= _Phase.SETTLING
            if not inline:
                self._acks.append((h, outcome, ran))
            self._changed.notify_all()
        if inline:
            try:
                self._settle(h, outcome, ran)
            except BaseException as exc:
                # settled all the same; run() re-raises it if it has not returned yet (a worker
                # reporting here would only log it), and the reporting thread hears of it too
                self._interrupted(exc)
                raise

    # -- settling and leases, off the workers' threads -------------------------------------------
    def _start_helpers(self) -> None:
        self._ack_workers = [threading.Thread(target=self._ack_worker, name=f"rmqtrace-ack-{i}", daemon=True)
                             for i in range(self.flow.ack_threads)]
        self._keeper_thread = threading.Thread(target=self._lease_keeper, name="rmqtrace-lease", daemon=True)
        if self.flow.prefetch > 0:
            self._feeder = threading.Thread(target=self._feed_loop, name="rmqtrace-feeder", daemon=True)
        for t in (*self._ack_workers, self._keeper_thread, self._feeder):
            if t is not None:
                t.start()

    def _take_outcome(self, timeout: float | None) -> tuple[Lease, Outcome, bool] | None:
        with self._changed:
            if not self._acks and timeout:
                self._changed.wait(timeout)
            if not self._acks:
                return None
            item = self._acks.popleft()
            self._changed.notify_all()  # the receive loop may wait for the pile to shrink
            return item

    def settle_ready(self) -> int:
        """Settle (ack or nack) every outcome reported so far, in this thread; returns how many.

        Raises:
            BaseException: the first one a broker call raised (a Ctrl-C inside the client), once
                every other ready outcome is settled too: none is left held behind it.
        """
        return each_then_raise(iter(lambda: self._take_outcome(None), None), lambda item: self._settle(*item))

    def _ack_worker(self) -> None:
        self._inside.thread = True
        tick = self._tick()
        while True:
            item = self._take_outcome(tick)
            if item is not None:
                try:
                    self._settle(*item)
                except BaseException as exc:  # noqa: BLE001 - settled all the same; run() re-raises it
                    self._interrupted(exc)
                item = None  # an idle ack thread keeps no message alive (its trace, its body)
                continue
            with self._lock:
                if self._phase >= _Phase.SETTLING and not self._acks:
                    return

    def _settle(self, h: Lease, outcome: Outcome, ran: bool) -> None:
        """Ack a message whose handler succeeded; nack (give back with a backoff) any other; or
        let it expire when the loop no longer holds its lease. Once per delivery."""
        what = "expired"
        interrupt: BaseException | None = None
        with h.lock, suppress_instrumentation():
            h.done = True  # from here on no renewal: on the proxy it would revive an acked message
            msg = h.message
            if h.live(self._monotonic()):
                h.restore_handle()
                try:
                    if outcome is Outcome.SUCCESS and ran:
                        self._call(n.ACK, msg, lambda: self.consumer.ack(msg))
                        what = "acked"
                    else:
                        try:
                            seconds = self._nack_seconds(msg, ran)
                        except BaseException as exc:  # noqa: BLE001 - re-raised after the nack
                            # retry_backoff= raised a Ctrl-C (an Exception or junk it answered is
                            # contained in backoff_seconds): the message is still given back (with
                            # the default backoff), then the interrupt goes on
                            interrupt, seconds = exc, exponential_backoff(_attempt(msg))
                        backoff = whole_seconds(seconds)
                        self._call(n.CHANGE_INVISIBLE_DURATION, msg,
                                   lambda: self.consumer.change_invisible_duration(msg, backoff))
                        what = "retry_scheduled" if ran else "given_back"
                except Exception as exc:  # noqa: BLE001 - the broker redelivers after the lease
                    self._count("ack_errors", exc)
                    what = ""
                    if lease_gone(exc):
                        # the broker found it gone first (refusal.py): a lost lease, counted as
                        # the keeper counts a renewal refused the same way
                        h.given_up = True
                        self._count("leases_lost", None, "the broker refused an ack or nack: the lease was already gone")
                        if h.trace is not None:
                            h.trace.lease_lost("expired")
                except BaseException as exc:  # noqa: BLE001 - a Ctrl-C inside the broker call: settled
                    # as a failed call (the broker redelivers after the lease), then it goes on, so
                    # nothing stays held and the counters add up
                    self._count("ack_errors", exc)
                    what, interrupt = "", exc
            elif not h.given_up and h.trace is not None:
                h.trace.lease_lost("expired")  # it ran out between two keeper passes
        with self._changed:
            if what:
                self._n[what] += 1
            self._leases.pop(id(h.message), None)
            self._settling -= 1
            self._changed.notify_all()
        if interrupt is not None:
            raise interrupt

    def _call(self, operation: str, msg: Any, call: Callable[[], object]) -> None:
        """An ack or nack of ``msg``: a settle operation when the loop traces (never a renewal)."""
        if self._ops is None:
            call()
        else:
            self._ops.settle(operation, msg, call)

    def _nack_seconds(self, msg: Any, ran: bool) -> float:
        """How long a given-back message stays invisible: ``retry_backoff(delivery_attempt)``; a
        copy refused because another copy of it still runs here (a hung handler) at least one
        lease, so it bounces between broker and loop at most once per ``invisible_duration``."""
        backoff, wrong = backoff_seconds(self.flow.retry_backoff, _attempt(msg))
        if wrong is not None:
            self._log("retry_backoff=", None, f"it {wrong}; the message is given back after {backoff:g} s")
        if not ran:
            mid = getattr(msg, "message_id", None)
            if mid is not None and (self._group, mid) in _RUNNING:
                return max(backoff, self.lease.invisible_duration)
        return backoff

    def renew_leases(self, *, wait: bool = True) -> int:
        """One pass of the lease keeper: renew every held message whose lease ends within
        ``renew_margin`` (on the keeper's pool, at most ``renew_threads`` calls at once); give up
        on hung handlers and on leases already lost. Returns how many were renewed; with
        ``wait=False`` (the keeper thread) it returns at once, so one slow broker answer never
        delays the next pass.

        Raises:
            BaseException: (``wait=True``) the first one a renewal raised, once the rest of the
                pass is renewed.
        """
        now = self._monotonic()
        with self._lock:
            due = self._keeper.due(list(self._leases.values()), now)
        if not due:
            return 0
        ages: dict[int, float] = {}
        if self.dispatch_options.handler_timeout is not None and any(h.state != SETTLING for h in due):
            ages = {id(item): age for item, age in self.dispatcher.running()}
            if self._all_workers_hung():
                due = self._let_go_unstartable(due, ages)
        return self._keeper.renew(due, ages, wait=wait)

    def _let_go_unstartable(self, due: list[Lease], running: dict[int, float]) -> list[Lease]:
        """Every worker hung: a message queued in the dispatcher (a window, a worker's buffer) or
        waiting in the loop's backlog (one received ahead for a handler that then hung) cannot
        start, so its lease is not renewed — the broker hands it to a peer once it ends; should a
        worker free first, the message does not start (its lease is gone). The rest of ``due``
        is returned, to be renewed."""
        keep: list[Lease] = []
        for h in due:
            # a started one is the dispatcher's running item until its outcome (an ended one,
            # between its return and its report, must keep its lease: its ack comes next)
            if h.state != SETTLING and not h.started and id(h.message) not in running:
                with h.lock:
                    if h.done or h.given_up:
                        continue
                    h.given_up = True
                self._count("let_go", None, "every worker hangs: a queued message's lease is not renewed, "
                            "the broker hands it to a peer")
            else:
                keep.append(h)
        return keep

    def _lease_keeper(self) -> None:
        self._inside.thread = True
        tick = self._tick()
        while not self._finished.wait(tick):
            try:
                self.renew_leases(wait=False)
            except Exception as exc:  # noqa: BLE001 - the keeper must outlive any one bug
                self._count("lease_errors", exc)
            except BaseException as exc:  # noqa: BLE001 - the loop stops; the keeper renews through the drain
                self._interrupted(exc)

    def _count(self, what: str, exc: BaseException | None = None, why: str = "") -> None:
        """Count one event; a failure (``what`` in the log kinds) is logged once per kind."""
        with self._changed:
            self._n[what] += 1
            if exc is not None:
                self._errors[f"{what}:{type(exc).__name__}"] += 1
            self._changed.notify_all()
        kind = _LOG_KIND.get(what)
        if kind is not None:
            self._log(kind if exc is None else f"{kind} ({type(exc).__name__})", exc,
                      f"{why}; further ones are counted in statistics().{what}" if why else
                      f"further ones are counted in statistics().{what}")

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
            self._phase = _Phase.DRAINING
            self._changed.notify_all()
        # the backlog is drained into the dispatcher before it closes (nothing is redelivered on
        # a stop), as far as the deadline allows — unless the program wants out (an interrupt):
        # then what has not started goes back
        if self._feeder is not None:
            self._join(self._feeder)
        else:
            try:
                while self.state().waiting and not self._past_stop_deadline() and self._interrupt is None:
                    if not self._feed():
                        left = self._left()
                        with self._changed:
                            self._changed.wait(0.05 if left is None else min(0.05, left))
            except BaseException as exc:  # noqa: BLE001 - key=/cost= again: run() re-raises it
                self._interrupted(exc)
        if self._interrupt is not None:
            self._give_back_backlog()  # the program wants out: what has not started goes back
        self._await_quiet_dispatcher()
        self.dispatcher.close(drain=self._interrupt is None, timeout=self._left())
        if self._past_stop_deadline():
            self._cut_at_deadline()
        else:
            self._give_back_backlog()  # the feeder ended early (interrupted): nothing is left held unfed
        with self._changed:
            self._phase = _Phase.SETTLING  # the ack threads drain what is queued; later outcomes settle inline
            self._changed.notify_all()
        for t in self._ack_workers:
            self._join(t)
        with self._changed:
            self._phase = _Phase.FINISHED
            # ends the lease keeper: whatever is still held now goes back to the broker
            self._finished.set()
            self._changed.notify_all()  # wait() ends once nothing is held
        if self._keeper_thread is not None:
            self._keeper_thread.join(1.0)
        self._keeper.close()

    # Every wait of the drain re-reads the stop deadline at least this often: a later, shorter
    # stop(timeout=) (set without the lock, from any thread) moves it, and no wait may outlast it.
    _DRAIN_STEP_S = 0.05

    def _step(self) -> float | None:
        """How long the drain's next wait may be; None when the deadline has passed."""
        left = self._left()
        if left is not None and left <= 0:
            return None
        return self._DRAIN_STEP_S if left is None else min(self._DRAIN_STEP_S, left)

    def _join(self, t: threading.Thread) -> None:
        """Join ``t`` until the stop deadline, however often the deadline moves meanwhile."""
        while t.is_alive() and (step := self._step()) is not None:
            t.join(step)

    def _await_quiet_dispatcher(self) -> None:
        """Wait, within the stop deadline as it moves, until no handler runs in the dispatcher but
        hung ones (what is queued behind those can never start: its close gives it back). Only
        then is it closed, with what is left of the deadline: a close already waiting could not
        hear of a shorter deadline."""
        d = self.dispatcher
        cut = False
        while (step := self._step()) is not None:
            if self._interrupt is not None and not cut:
                # the program wants out: what the dispatcher queued (parked behind a busy key, a
                # window) goes back now, SKIPPED, and nothing more starts; what runs is still
                # waited for here, within the deadline as it moves
                cut = True
                d.close(drain=False, timeout=0)
            if d.wait_idle(timeout=step) or d.statistics().in_flight == 0:
                return

    def _cut_at_deadline(self) -> None:
        """The stop deadline passed: nothing held may start any more. The dispatcher's close has
        reported what it had not started SKIPPED; the loop's backlog is given back the same way."""
        self._give_back_backlog()  # nothing starts past the deadline: _start_handler checks it too

    def _give_back_backlog(self) -> None:
        with self._lock:
            self._backlog_closed = True  # an offer in flight now gives its message back itself
            rest = [h for h in self._backlog if h.state == WAITING]
            for h in rest:
                h.state = SUBMITTED  # out of the feeder's reach
            self._backlog = deque(h for h in self._backlog if h.state == WAITING)
        each_then_raise(rest, lambda h: self._give_back_unrun(h, Outcome.SKIPPED))


def _one_tracing_path(consumer: Any, tracer: MessageTracer | None, settle_spans: bool | None
                      ) -> tuple[Any, MessageTracer | None, ConsumerOperations | None]:
    """The client the loop calls, its tracer and its operations. A
    :class:`~tracer.clients.official.TracedSimpleConsumer` traces what it receives itself; the loop
    would trace each message a second time, so it calls the wrapped client and traces once, with
    the wrapper's tracer (unless given one) and its ``settle_spans`` (unless given)."""
    from .official import TracedSimpleConsumer  # official imports nothing of the loop; kept local anyway

    ops: ConsumerOperations | None = None
    if isinstance(consumer, TracedSimpleConsumer):
        wrapper_ops = consumer.operations
        consumer = consumer.wrapped
        if settle_spans is None:
            settle_spans = wrapper_ops.settle_spans
        if tracer is None or tracer is wrapper_ops.tracer:
            tracer = wrapper_ops.tracer
            if settle_spans == wrapper_ops.settle_spans:
                ops = wrapper_ops
    if tracer is not None and ops is None:
        # reads the client's id, namespace and endpoint into the tracer: its process spans get them
        ops = ConsumerOperations(tracer, consumer, settle_spans=bool(settle_spans))
    return consumer, tracer, ops


class LeaseRefused(ValueError):
    """The broker refused the loop's lease length: no receive can ever succeed."""
