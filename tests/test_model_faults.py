"""The consume loop under each fault *class* of issue #30 (RELIABILITY.md, "The fault table").

:class:`FaultModel` is a hypothesis ``RuleBasedStateMachine`` over :class:`ConsumeLoop` on the
strict embedded broker, driven step by step (``poll``, ``renew_leases``, ``settle_ready``) on an
injected clock — the loop's ``monotonic=`` and ``wall=`` and the broker's (the pop time in each
receipt handle, which the loop dates a lease on) — behind :class:`fault_double.FaultyClient`: a
stall is a jump of that clock *inside* a broker call (before the broker acts, while the answer
is in flight, or just after it returned), so every fault is deterministic. A stall stops the
whole process; a slow answer or a request timeout holds up only its thread, and the keeper's
passes and the watchdog run meanwhile (:meth:`FaultModel.fault_jump`). Handlers run on the dispatcher's real
worker threads and block on events the harness sets. A stop hands the loop to the real ``run()``
(on a thread) for its drain, and a restart builds a new loop on the same client.

Rules, one or more per fault class: a stall before / during / after each broker call (receive,
ack, nack, renew); a call slow past the renew margin, raising an ``Exception``, raising a
``BaseException``, timing out; a handler that succeeds, raises, raises a ``BaseException``
(``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``, its own), returns an awaitable or a
generator, runs very slowly (renewed throughout), hangs past ``handler_timeout``, calls
``stop()`` on its own loop; ``key=`` and ``cost=`` raising or returning junk, and a junk
``retry_backoff=``; stop unbounded, ``stop(timeout=0)``, ``stop(timeout=inf)``; a restart after
a stop; a signal handler calling ``stop()`` while the loop's lock is held; every policy with
all its workers hung; and, built every time they are drawn (deterministic interleavings, not
chance), the keeper's pass racing an ack that is finishing both ways (``keeper_pass_during_an_ack``,
``ack_during_a_keeper_renewal``), the keeper's pass before the watchdog's ``TIMEOUT`` of a hung
handler (``keeper_before_the_watchdog``), and a ``BaseException`` from the first call of a batch
(two ready settles, two leases due in one pass: ``a_base_exception_inside_a_batch``; every driven
settle and pass is checked to finish its batch, ``batch_after``).

**The promises, as named invariants** checked after every step (messages start
``invariant <name>:``):

``acked_only_after_success``
    every ack the broker applied is of a delivery whose handler ran and returned in time (not a
    failure, a timeout, a returned awaitable or generator, nor a message that never ran);
``no_two_copies_at_once``
    no two copies of one message run at once in this process, across loop objects;
``started_only_with_a_live_lease``
    no handler starts on a delivery whose lease *at the broker* has ended;
``held_leases_stay_renewed``
    a held message's lease at the broker never lapses unless a fault hit it (else a peer gets a
    copy while this one still runs); a driven renewal pass leaves no lease that was due unrenewed;
``held_settled_or_given_back``
    every delivery the broker handed out is held by the loop, settled (acked or given back), or
    past its lease (left to expire; a lease the loop dated early, by the loop's end); no renewal
    once its settle began; a ``settle_ready()`` leaves no outcome that was ready before it queued;
``stop_keeps_its_bound``
    ``stop(timeout=t)`` answers True once ``run()`` returned (or ``run()`` returns within
    ``STOP_MARGIN_S`` real seconds more: the stop deadline is on real time), and no stop raises;
``memory_bounded``
    what the loop holds stays within its room; with every worker hung it receives nothing and
    renews no lease no worker can start; live blame keeps O(workers + held) records;
``counters_add_up``
    the snapshot's identity holds; ``failed`` counts only handlers that ran and failed (a copy
    that never started is ``not_started``, never a failure); a submit is refused only for a
    raising ``key=``/``cost=``; broker errors are only the faults the harness injected; no
    Exception escapes a driven step (``run()`` would stop on it);
``nothing_received_after_stop``
    once ``run()`` returned after a stop, the loop received nothing more.

The promise-by-fault-class table is in RELIABILITY.md ("The fault table").

Known bugs: ``OPEN_ITEMS`` (issue #30's items, all fixed now) and ``OPEN_NEW`` (bugs this harness
found) hold the faults that reach an open bug back from the random search (``open_item``), and
each has a fixed-sequence test below marked ``xfail(strict=True)``: once a fix is merged, remove
its name and the xfail mark (it then XPASSes, which strict turns into a failure, so neither can
be forgotten). The ``test_itemN_*`` tests replay #30's items; each failed before its fix.

Default: 300 examples of up to 30 steps (35-85 s on the shared 2-CPU machine at load 3-8);
``RMQTRACE_LONG=1``: 1500.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pytest
from embedded_rig import consumer_with_messages
from fault_double import FaultyClient, Injected, InjectedBase, Plan
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from manual_clock import Clock
from prometheus_client import CollectorRegistry
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop, DispatchOptions, FlowOptions, LeaseOptions
from tracer.clients.lease import SETTLING
from tracer.dispatch import Aggressive, CostAware, DispatchMetrics, Random, RoundRobin
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer

LONG = os.environ.get("RMQTRACE_LONG") == "1"

# Items of issue #30 (/tmp/issue30.md, "What breaks") not fixed on this branch. Remove one once its
# fix is merged: its rules join the random search and its xfail test below must lose its mark.
OPEN_ITEMS: frozenset[int] = frozenset()
# Bugs this harness found that #30 does not list (each with an xfail test below, same rule).
OPEN_NEW: frozenset[str] = frozenset()

LEASE, MARGIN, BACKOFF = 3.0, 1.0, 1  # seconds on the manual clock
KEEPER_TICK = MARGIN / 3  # the loop's keeper passes this often (ConsumeLoop._tick)
RECEIVE_S = 0.005  # the clock moves this much at each receive
STOP_MARGIN_S = 5.0  # real seconds past stop(timeout=)'s own answer (see begin_drain)
TIMEOUT, GRACE = 4.0, 1.0  # handler_timeout, hang_grace
STALL = LEASE + 0.5  # past every lease
SLOW = MARGIN + 0.3  # past the renew margin, inside the lease
REQUEST_TIMEOUT = 0.5  # the client gave up (below the margin: the timeout alone loses no lease)
POLICIES = ("aggressive", "round_robin", "cost_aware", "random")

# per-message faults of the user's callables, on a message's first delivery (property "f")
KEY_FAULTS = ("key-raise", "key-int", "key-none", "key-base")
COST_FAULTS = ("cost-raise", "cost-nan", "cost-inf", "cost-neg", "cost-str", "cost-huge", "cost-base")
HANDLER_ENDS = ("success", "failure", "keyboard-interrupt", "system-exit", "generator-exit", "own-base",
                "awaitable", "generator", "stop-own-loop", "overrun")


class OwnBase(BaseException):
    """A user's own BaseException subclass."""


class _Awaitable:
    """What ``lambda m: handle_async(m)`` returns: an awaitable whose work never ran."""

    def __await__(self) -> Generator[None, None, None]:  # pragma: no cover - nobody awaits it
        yield None


def _never_run_generator() -> Generator[None, None, None]:  # pragma: no cover - nobody iterates it
    yield None


@dataclass(eq=False)
class Call:
    message: Any
    started: float
    loop: int  # which loop object ran it (restarts)
    gate: threading.Event = field(default_factory=threading.Event)
    end: str = "success"


def overran(started: float, now: float) -> bool:
    """Whether a handler that started at ``started`` has run past ``handler_timeout`` at ``now``, as
    the dispatcher decides it: on whole nanoseconds of the loop's clock (``_SecondsClock``), longer
    than the timeout. A float difference is not that: a run of 0.9 * 3 + 1.3 = 4 s reads
    4.000000000000227 s one way and exactly 4_000_000_000 ns the other (in time, acked)."""
    return int(now * 1e9) - int(started * 1e9) > int(TIMEOUT * 1e9)


def _policy(name: str) -> Any:
    return {"aggressive": Aggressive(max_parked=1), "round_robin": RoundRobin(buffer=1),
            "cost_aware": CostAware(window=2), "random": Random(buffer=1, seed=7)}[name]


class GuardLock:
    """The loop's lock, refusing the one thing a signal handler must never do: block on it while
    its own thread holds it (the signal interrupted that holder: a deadlock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None
        self.violations: list[str] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        if blocking and self.owner == me:
            self.violations.append("a blocking acquire of the loop's lock by the thread that holds it")
            raise AssertionError("invariant stop_keeps_its_bound: stop() would deadlock in a signal handler")
        got = self._lock.acquire(blocking, timeout)
        if got:
            self.owner = me
        return got

    def release(self) -> None:
        self.owner = None
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


class WatchedLock:
    """A message's lock (``Lease.lock``) that says who blocked on it: a blocking acquire while it
    is held (the settle waiting for a renewal in flight is right; the keeper waiting for an ack in
    flight is not: it must skip)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waiters = 0
        self.blocked: list[str] = []  # the keeper's threads that blocked on it
        # set: the keeper's first touch of this lock waits here (its due list is taken, its lock
        # attempt not yet made) until the harness lets it go on
        self.hold_keeper: threading.Event | None = None
        self.keeper_arrived = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        name = threading.current_thread().name
        keeper = "keeper" in name or "renew" in name
        if keeper and self.hold_keeper is not None:
            hold, self.hold_keeper = self.hold_keeper, None
            self.keeper_arrived.set()
            hold.wait(30)
        if blocking and not self._lock.acquire(False):
            self.waiters += 1
            if keeper:
                self.blocked.append(name)
            return self._lock.acquire(True, timeout)
        return True if blocking else self._lock.acquire(False)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


class FaultModel(RuleBasedStateMachine):
    @initialize(policy=st.sampled_from(POLICIES), workers=st.integers(1, 3),
                backoff=st.sampled_from(["ok", "ok", "ok", "neg", "nan", "inf", "huge", "str", "raise"]),
                ahead=st.booleans(), prefetch=st.sampled_from([0, 0, 2]))
    def start(self, policy: str, workers: int, backoff: str, ahead: bool = False, prefetch: int = 0) -> None:
        if self.open_item("junk-backoff") and backoff not in ("ok", "neg"):
            backoff = "ok"
        self.policy, self.workers, self.backoff = policy, workers, backoff
        self.ahead = ahead  # receive_ahead: a handler within a round trip of its cost's end is room
        # prefetch (a push consumer's cache, refused beside receive_ahead): the loop's own room rules
        # (every worker hung: no room) are then the only guard, not the dispatcher's free slots
        self.prefetch = 0 if ahead else prefetch
        self.clock = Clock()
        # one clock for both: the broker's pop time in each receipt handle (what the loop dates a
        # lease on, #30 item 3) moves with the stalls the double injects
        self.broker = EmbeddedBroker(monotonic=self.clock, min_receive_invisible=1,
                                     wall_ms=lambda: int(self.clock() * 1000))
        self.broker.create_topic("T")
        self.producer = Producer(self.broker, ["T"])
        self.producer.startup()
        consumer = SimpleConsumer(self.broker, "G", {"T": None}, await_duration=0)
        consumer.startup()
        self.client = FaultyClient(consumer, self.clock)
        self.client.jump = self.fault_jump
        self.driver = threading.get_ident()
        self.cond = threading.Condition()
        self.calls: list[Call] = []
        self.running: set[Call] = set()
        self.sent: list[str] = []
        self.excused: set[str] = set()  # message ids that may run again: a documented reason
        self.lease_excused: set[str] = set()  # message ids a stall or clock step may have cost their lease
        self.runs: Counter[str] = Counter()
        self.keep: list[Any] = []
        self.succeeded: set[int] = set()  # id(delivery): ran and returned in time
        self.failed: set[int] = set()  # id(delivery): ran and raised or overran
        self.unrun_work: set[int] = set()  # id(delivery): returned an awaitable or generator
        self.callable_failed: set[int] = set()  # id(delivery): its key= or cost= raised (never ran)
        self.key_failed: set[int] = set()  # id(delivery): its key= raised or returned a wrong type
        self.handler_failures = 0  # handler runs that ended failed or timed out (what `failed` may count)
        self.started_stale: list[str] = []
        self.stop_errors: list[str] = []
        self.bounded_stop_answers: list[bool] = []
        self.loops: list[ConsumeLoop] = []
        self.retired: list[ConsumeLoop] = []  # earlier loops (restarted): their hung calls may still run
        self.stopped = False
        self.interrupted = False  # key= or cost= raised a KeyboardInterrupt: the loop stops, run() re-raises it
        self.escaped: list[str] = []  # an Exception no fault injected, out of a driven step
        self.hung_since: tuple[int, int] | None = None  # every worker hung: (received, renewals) then
        self.stalls = 0  # stalls past every lease inside a broker call so far (fault_jump)
        self.were_settling: set[int] = set()  # lease ids seen in SETTLING (memory_bounded: they may be renewed)
        self.batch_cut: list[str] = []  # a driven settle or pass that left part of its batch (batch_after)
        self.runner: threading.Thread | None = None
        self.metrics = DispatchMetrics(registry=CollectorRegistry())
        self.new_loop()

    forcing: frozenset[int | str] = frozenset()  # a fixed-sequence test of open items: their gates let them through

    def open_item(self, item: int | str) -> bool:
        """Whether a known bug is still open here (its fault is then held back from the search)."""
        return item not in self.forcing and (item in OPEN_ITEMS or item in OPEN_NEW)

    def new_loop(self) -> None:
        self.loop = ConsumeLoop(
            self.client, self.handler, monotonic=self.clock, wall=self.clock,
            dispatch=DispatchOptions(policy=_policy(self.policy), workers=self.workers, key=self.key_of,
                                     cost=self.cost_of, handler_timeout=TIMEOUT, metrics=self.metrics),
            lease=LeaseOptions(invisible_duration=LEASE, renew_margin=MARGIN, hang_grace=GRACE),
            flow=FlowOptions(retry_backoff=self.retry_backoff, ack_threads=2, receive_ahead=self.ahead,
                             prefetch=self.prefetch))
        guard = GuardLock()  # before any thread uses it: the loop's own lock, watched
        self.loop._lock = guard  # type: ignore[assignment]
        self.loop._changed = threading.Condition(guard)  # type: ignore[arg-type]
        self.guard = guard
        self.loops.append(self.loop)
        self.loop_index = len(self.loops) - 1
        self.stopped = False
        self.runner = None
        self.received_at_stop = 0

    # -- the user's code ---------------------------------------------------------------------------
    def _first(self, m: Any) -> str | None:
        return m.properties.get("f") if (m.delivery_attempt or 1) == 1 else None

    def key_of(self, m: Any) -> Any:
        f = self._first(m)
        if f == "key-raise":
            self.callable_failed.add(id(m))
            self.key_failed.add(id(m))
            raise ValueError("the user's key= failed")
        if f == "key-base":
            self.callable_failed.add(id(m))
            self.interrupted = True
            raise KeyboardInterrupt  # Ctrl-C while key= runs
        if f == "key-int":  # refused by contract (str or None): that delivery fails, loudly
            self.callable_failed.add(id(m))
            self.key_failed.add(id(m))
            return 10**400
        if f == "key-none":
            return None
        return m.properties.get("key")

    def cost_of(self, m: Any) -> Any:
        f = self._first(m)
        if f == "cost-raise":
            self.callable_failed.add(id(m))
            raise ValueError("the user's cost= failed")
        if f == "cost-base":
            self.callable_failed.add(id(m))
            self.interrupted = True
            raise KeyboardInterrupt
        return {"cost-nan": math.nan, "cost-inf": math.inf, "cost-neg": -1.0, "cost-str": "heavy",
                "cost-huge": 10**400}.get(f or "", 1.0)

    def retry_backoff(self, attempt: int) -> Any:
        b = self.backoff
        if b == "raise":
            raise ValueError("the user's retry_backoff= failed")
        return {"ok": BACKOFF, "nan": math.nan, "inf": math.inf, "neg": -1.0, "huge": 10**400, "str": "soon"}[b]

    def handler(self, m: Any) -> object:
        call = Call(m, self.clock(), self.loop_index)
        with self.client.lock:
            if self.client.lease_end.get(id(m), 0.0) <= call.started:
                self.started_stale.append(m.message_id)
        with self.cond:
            self.runs[m.message_id] += 1
            self.keep.append(m)
            self.calls.append(call)
            self.running.add(call)
        call.gate.wait(120)
        end = call.end
        in_time = not overran(call.started, self.clock())
        if end == "stop-own-loop":
            try:
                self.loops[call.loop].stop()  # asks; never waits for its own worker
            except BaseException as exc:  # noqa: BLE001 - recorded: a stop must never raise
                self.stop_errors.append(f"stop() from its own handler raised {exc!r}")
        with self.cond:
            if end in ("awaitable", "generator"):  # a failure (#30 item 1): never acked
                self.unrun_work.add(id(m))
                self.failed.add(id(m))
                self.handler_failures += 1
            elif in_time and end in ("success", "stop-own-loop"):
                self.succeeded.add(id(m))
            else:
                self.failed.add(id(m))
                self.handler_failures += 1
            self.running.discard(call)
        if end == "failure":
            raise RuntimeError("handler failed")
        if end == "keyboard-interrupt":
            raise KeyboardInterrupt
        if end == "system-exit":
            raise SystemExit(3)
        if end == "generator-exit":
            raise GeneratorExit
        if end == "own-base":
            raise OwnBase("the user's own BaseException")
        if end == "awaitable":
            return _Awaitable()
        if end == "generator":
            return _never_run_generator()
        return None

    # -- helpers ---------------------------------------------------------------------------------
    def my_running(self) -> list[Call]:
        with self.cond:
            return sorted((c for c in self.running if c.loop == self.loop_index),
                          key=lambda c: (c.started, c.message.message_id))

    def quiesce(self) -> None:
        """Every outcome the dispatcher reported reached the loop, every message it handed out is
        inside its handler, no released handler is still on its way out; with run() draining,
        its ack threads have settled what was reported."""
        loop, d = self.loop, self.loop.dispatcher

        def settled() -> bool:
            s, ds = loop.statistics(), d.statistics()
            with self.cond:
                mine = [c for c in self.running if c.loop == self.loop_index]
                released = any(c.gate.is_set() for c in self.running)
            ok = (not released and s.reported == ds.handled + ds.failed + ds.timed_out + ds.skipped + ds.not_started
                  and ds.in_flight + ds.overrun == len(mine))
            if ok and self.runner is not None:  # an ack thread, or the reporting thread, mid-settle
                ok = loop.state().settling == 0
            return ok

        wait_until(settled, timeout=10, interval=0.001, what="the loop's threads to settle")

    def fault_jump(self, op: str, seconds: float) -> None:
        """A fault moves the clock inside a call of ``op``. A stall past the lease stops the whole
        process at once: every lease held when it lands may go. A slow answer or a request timeout
        holds up only the thread in the call: the lease keeper's next passes (on its pool, #30
        item 4) and the watchdog run meanwhile, so the clock moves one keeper tick at a time with
        a keeper pass after each — every other lease must stay renewed. (With run() draining, its
        own keeper thread runs beside the call.)"""
        if seconds >= LEASE:
            self.excuse_held()
            self.stalls += 1
            self.clock.advance(seconds)
            return
        left = seconds
        self.keeper_beside()  # the pool's other threads take what is due now, at once
        while left > 0:
            d = min(KEEPER_TICK, left)
            self.clock.advance(d)
            left -= d
            self.keeper_beside()

    def keeper_beside(self) -> None:
        """A keeper pass and the watchdog, beside a call held up on this thread (see fault_jump)."""
        if self.runner is not None:
            return
        self.moved()
        try:
            self.loop.renew_leases()
        except (Injected, TimeoutError, InjectedBase):
            pass  # (as in step(): the pass renewed every other due lease before it re-raised)

    def excuse_held(self) -> None:
        with self.client.lock:
            mids = {m.message_id for m in self.client.held.values()}
        self.excused.update(mids)
        self.lease_excused.update(mids)

    def excuse_let_go(self) -> None:
        """Every worker hung: what waits in the dispatcher, or in the loop's backlog (received by a
        call in flight when the last worker hung), is let go on purpose (#30 item 5, ``let_go``):
        its lease is not renewed, a peer takes it. Judged by the dispatcher's own overrun list, after
        every driven step and at every check (a rule that frees a worker later in the same step
        must not hide that the lease was let go while all were hung)."""
        if self.stopped:
            return
        with self.cond:
            running = {c.message.message_id for c in self.running}
        for lp in self.loops:
            if len(lp.dispatcher.overrun()) >= self.workers:
                with lp._lock:
                    queued = {h.message.message_id for h in lp._leases.values()
                              if h.state != SETTLING and not h.started}
                self.lease_excused.update(queued - running)
                self.excused.update(queued - running)

    def moved(self) -> None:
        """The clock moved: the watchdog's TIMEOUT for whatever is past handler_timeout, now."""
        with self.cond:
            for c in self.running:
                if overran(c.started, self.clock()):
                    self.excused.add(c.message.message_id)
                    self.lease_excused.add(c.message.message_id)
        for lp in self.loops:
            lp.dispatcher.check_timeouts()

    def step(self, what: str) -> None:
        """One driven step of the loop's own, its BaseExceptions caught (as a user's run() would
        see them), then any stall planned after the call."""
        if self.stopped:
            return
        batch = self.batch_before(what)
        try:
            if what == "poll":
                # a receive takes a moment: live blame's pending marks (2 ms) are not pinned by a
                # clock that never moves, as they would be by nothing real
                self.clock.advance(RECEIVE_S)
                self.moved()
                self.loop.poll()
                if self.prefetch:  # with prefetch, run()'s feeder thread hands the backlog out: its one pass
                    self.loop._feed()
            elif what == "renew":
                self.loop.renew_leases()
            else:
                self.loop.settle_ready()
        except (Injected, TimeoutError, KeyboardInterrupt, InjectedBase):
            # run() counts an Exception; a BaseException ends it: the model goes on driving. A
            # BaseException from one broker call is re-raised only once the rest of its batch (the
            # ready settles, the pass's due leases) is done: nothing is excused for it
            pass
        except Exception as exc:  # noqa: BLE001 - recorded: run() would stop on it and re-raise it
            self.escaped.append(f"{what}: {exc!r}")
        self.excuse_let_go()
        self.batch_after(what, batch)
        if self.client.after_step():
            self.excuse_held()
        self.quiesce()

    def batch_before(self, what: str) -> dict[int, Any]:
        """What a driven settle or renewal pass must finish, whatever one of its calls raises: the
        outcomes ready now (by id(lease)), or the leases due now (by id(lease): (lease, deadline))."""
        loop = self.loop
        with loop._lock:
            if what == "settle":
                return {id(h): h for h, _, _ in loop._acks}
            if what == "renew":
                now = self.clock()
                return {id(h): (h, h.deadline) for h in loop._leases.values()
                        if not h.done and not h.given_up and h.deadline - now <= MARGIN}
        return {}

    def batch_after(self, what: str, batch: dict[int, Any]) -> None:
        """Recorded (the step may run on a helper thread), asserted by the invariants: a settle left
        an outcome that was ready before it queued; a pass left a due lease neither renewed, given
        up, settled nor hit by a fault."""
        if not batch:
            return
        loop = self.loop
        with loop._lock:
            if what == "settle":
                left = [h.message.message_id for h, _, _ in loop._acks if id(h) in batch]
            else:
                left = [h.message.message_id for h, deadline in batch.values()
                        if h.deadline == deadline and not h.done and not h.given_up and id(h.message) in loop._leases
                        and h.message.message_id not in self.client.faulted]
        if left:
            self.batch_cut.append(f"{what}: {left}")

    # -- rules: traffic ----------------------------------------------------------------------------
    @rule(key=st.sampled_from([None, "a", "b"]), count=st.integers(1, 3))
    def send(self, key: str | None, count: int, fault: str | None = None) -> None:
        for _ in range(count):
            m = Message()
            m.topic, m.body = "T", f"m{len(self.sent)}".encode()
            if key is not None:
                m.add_property("key", key)
            if fault is not None:
                m.add_property("f", fault)
            self.sent.append(self.producer.send(m).message_id)

    @rule(fault=st.sampled_from(KEY_FAULTS + COST_FAULTS))
    def send_junk_for_a_callable(self, fault: str) -> None:
        self.send("a" if fault.startswith("cost") else None, 1, fault)

    @rule()
    def send_a_user_message_named_like_a_probe(self) -> None:
        m = Message()
        m.topic, m.body = "T", b"user"
        m.add_property("rmqtrace_probe", "false")
        self.sent.append(self.producer.send(m).message_id)

    @rule()
    def poll(self) -> None:
        self.step("poll")

    @rule()
    def settle(self) -> None:
        self.step("settle")

    @rule(frac=st.sampled_from([0.3, 0.6, 0.95]), times=st.integers(1, 3))
    def tick(self, frac: float, times: int) -> None:
        """Time passes below the renew margin, then the keeper runs: no lease is lost."""
        for _ in range(times):
            self.clock.advance(frac * MARGIN)
            self.moved()
            self.step("renew")

    @rule()
    def stall_between_calls(self) -> None:
        """The process stalls past every lease with no call in flight."""
        self.excuse_held()
        self.clock.advance(STALL)
        self.moved()
        self.step("renew")

    # -- rules: broker calls -----------------------------------------------------------------------
    @rule(op=st.sampled_from(["receive", "ack", "nack", "renew"]),
          when=st.sampled_from(["before", "during", "after"]), slow=st.booleans())
    def stall_in_a_call(self, op: str, when: str, slow: bool) -> None:
        """A stall (past every lease) or a slow answer (past the margin) at a point of the next
        call of ``op``."""
        seconds = SLOW if slow else STALL
        if not slow:
            self.excuse_held()  # whatever is held when the stall lands may lose its lease
        self.client.plan(op, Plan("stall", when, seconds))
        self.planned_stall = seconds

    @rule(op=st.sampled_from(["receive", "ack", "nack", "renew"]),
          kind=st.sampled_from(["raise", "base", "timeout"]), when=st.sampled_from(["before", "after"]))
    def fail_a_call(self, op: str, kind: str, when: str) -> None:
        self.client.plan(op, Plan(kind, when, REQUEST_TIMEOUT))

    # -- rules: handlers ---------------------------------------------------------------------------
    @rule(pick=st.integers(0, 10), end=st.sampled_from(HANDLER_ENDS))
    def release(self, pick: int, end: str) -> None:
        calls = self.my_running()
        if not calls:
            return
        call = calls[pick % len(calls)]
        if end == "overrun":
            self.excuse_held()  # a clock step past the margin for everybody else
            self.clock.advance(TIMEOUT + 0.1)
            self.moved()
        call.end = end
        if end != "success" or overran(call.started, self.clock()):
            self.excused.add(call.message.message_id)
        if end == "stop-own-loop":
            self.prepare_drain()
        call.gate.set()
        self.quiesce()
        if end == "stop-own-loop":
            wait_until(lambda: self.loop.stopping, timeout=10, what="the handler's stop()")
            self.finish_drain()

    @rule(end=st.sampled_from(["keyboard-interrupt", "system-exit", "generator-exit", "own-base"]))
    def a_base_exception_from_the_handler(self, end: str) -> None:
        """Aimed: one message runs and ends with a BaseException, then the loop settles it (random
        search reached a settled BaseException end in only some runs)."""
        if self.stopped:
            return
        self.send(None, 1)
        self.step("poll")
        if self.my_running():
            self.release(0, end)
        self.step("settle")

    @rule(op=st.sampled_from(["ack", "nack", "renew"]), kind=st.sampled_from(["base", "base", "raise"]))
    def a_base_exception_inside_a_batch(self, op: str, kind: str = "base") -> None:
        """Aimed: one call of a batch of broker calls raises a BaseException (or, ``kind="raise"``,
        an Exception: counted, the batch goes on) — the first of two ready settles (ack, nack) or of
        two leases due in one renewal pass. The rest of the batch is still done before it is
        raised (checked after the step: ``batch_after``)."""
        if self.stopped or self.loop.stopping:
            return
        self.send(None, 2)
        self.step("poll")
        if op == "renew":
            self.client.plan("renew", Plan(kind, "before"))
            self.tick(0.95, 3)  # the two received together fall due in one pass
            return
        for _ in range(2):
            with self.loop._lock:
                held = [c for c in self.my_running() if id(c.message) in self.loop._leases]
            if held:
                self.release(0, "success" if op == "ack" else "failure")
        self.client.plan(op, Plan(kind, "before"))
        self.step("settle")

    @rule(pick=st.integers(0, 10))
    def very_slow_handler(self, pick: int) -> None:
        """A handler runs for most of handler_timeout, far past its lease, renewed all along; then
        succeeds: acked, nothing lost."""
        calls = self.my_running()
        if not calls:
            return
        call = calls[pick % len(calls)]
        oldest = min(c.started for c in self.running)  # no other handler may overrun meanwhile
        while self.clock() - oldest + 0.9 * MARGIN < TIMEOUT:
            self.clock.advance(0.9 * MARGIN)
            self.step("renew")
        call.gate.set()
        self.quiesce()

    @rule()
    def hang(self) -> None:
        """Whatever runs now hangs past handler_timeout: TIMEOUT, given back while it goes on."""
        self.excuse_held()
        with self.cond:
            self.excused.update(c.message.message_id for c in self.running)
            self.lease_excused.update(c.message.message_id for c in self.running)
        self.clock.advance(TIMEOUT + 0.1)
        self.moved()
        self.step("renew")

    def one_settling(self) -> Any:
        """A fresh message runs and succeeds: its outcome is reported, its ack not yet sent. Its
        lease (the loop's record), or None when none could start now."""
        if self.stopped or self.loop.stopping:
            return None
        before = set(self.my_running())
        self.send(None, 1)
        self.step("poll")
        new = [c for c in self.my_running() if c not in before]
        if not new:  # every worker busy: one of them, still in time and held, ends now
            with self.loop._lock:
                new = [c for c in self.my_running() if id(c.message) in self.loop._leases
                       and not overran(c.started, self.clock())]
        if not new:
            return None
        call = new[0]
        self.step("settle")  # the outcomes reported before: this one is settled first
        call.end = "success"
        call.gate.set()
        self.quiesce()
        with self.loop._lock:
            h = self.loop._leases.get(id(call.message))
        return h if h is not None and h.state == SETTLING else None

    def keeper_pass_on_a_thread(self) -> threading.Thread:
        """One keeper pass on its own thread (one that blocked on a message's lock must not
        deadlock the harness)."""
        def keeper_pass() -> None:
            try:
                self.loop.renew_leases()
            except (Injected, TimeoutError, InjectedBase):
                pass

        t = threading.Thread(target=keeper_pass, name="keeper-pass", daemon=True)
        t.start()
        return t

    @rule(past_grace=st.booleans())
    def keeper_before_the_watchdog(self, past_grace: bool) -> None:
        """Aimed ordering (#30): a hung handler's lease is renewed by the keeper's passes below the
        margin until past ``handler_timeout`` (``past_grace``: and past ``+ hang_grace``), all of
        them before the watchdog's TIMEOUT; then the TIMEOUT and the settle. Past the grace the
        keeper gives the lease up first (``abandoned``); either way the TIMEOUT then settles it."""
        if self.stopped or self.loop.stopping:
            return
        def held_calls() -> list[Call]:  # (a call already given back may still hang: not that one)
            with self.loop._lock:
                return [c for c in self.my_running() if id(c.message) in self.loop._leases]

        if not held_calls():
            self.send(None, 1)
            self.step("poll")
        calls = held_calls()
        if not calls:
            return
        call = calls[0]
        mid = call.message.message_id
        hit = mid in self.lease_excused or mid in self.client.faulted  # a fault may cost it its lease
        self.excused.add(mid)
        if past_grace:
            self.lease_excused.add(mid)  # abandoned past hang_grace: on purpose
        with self.loop._lock:
            h = self.loop._leases[id(call.message)]
        abandoned = self.loop.statistics().abandoned
        # the keeper first, every tick, no check_timeouts(): past handler_timeout to just inside the
        # grace (the lease must still be renewed there), or past the grace until the lease fell due
        # once more (the keeper decides on a lease when it is due)
        def more() -> bool:
            age = self.clock() - call.started
            if past_grace:
                return age <= TIMEOUT + GRACE or not h.given_up
            return age + KEEPER_TICK < TIMEOUT + GRACE

        passes, stalls = 0, self.stalls
        while more() and passes < 40:
            self.clock.advance(KEEPER_TICK)
            self.step("renew")
            passes += 1
        # a stall planned for the renewal (past every lease) may fire in one of these passes: the
        # keeper then finds this lease lost (leases_lost), neither renewed nor abandoned
        hit = hit or mid in self.client.faulted or self.stalls > stalls
        if past_grace:
            # (the dispatcher's own watchdog thread wakes on real time: on a slow machine it may
            # report the TIMEOUT first; then the settle gives the message back instead)
            assert h.given_up or h.state == SETTLING, (
                "invariant held_settled_or_given_back: a handler hung past handler_timeout + hang_grace still "
                "has its lease renewed")
            if h.given_up and not hit:
                assert self.loop.statistics().abandoned > abandoned, (
                    "invariant counters_add_up: a hung handler's lease given up is not counted `abandoned`")
        elif not hit:
            # within handler_timeout + hang_grace the keeper keeps the lease (its TIMEOUT gives it back)
            assert not h.given_up, ("invariant held_leases_stay_renewed: a handler within handler_timeout + "
                                    "hang_grace lost its lease to the keeper")
        self.moved()  # the watchdog now
        self.step("renew")
        self.step("settle")
        with self.loop._lock:
            h = self.loop._leases.get(id(call.message))
        assert h is None, ("invariant held_settled_or_given_back: the TIMEOUT of a hung handler the keeper "
                           "passed first left its message held")

    @rule(until_settled=st.booleans())
    def keeper_pass_during_an_ack(self, until_settled: bool = False) -> None:
        """Aimed ordering (#30): the keeper's pass has taken its due list (the message's lease is
        due, its outcome reported) when the message's settle begins and its ack goes in flight;
        only then does the pass reach the message's lock. It must skip the message — never wait
        for the ack (every lease after it in the pass would wait behind one slow ack), never
        renew it once its settle began (on the proxy that revives an acked message)."""
        h = self.one_settling()
        if h is None:
            return
        watched = WatchedLock()
        h.lock = watched
        hold = threading.Event()
        watched.hold_keeper = hold
        keeper: threading.Thread | None = None
        settler: threading.Thread | None = None
        gate = threading.Event()
        try:
            # passes until one takes the message as due and reaches its lock (held there)
            while not watched.keeper_arrived.is_set() and h.deadline > self.clock():
                self.clock.advance(KEEPER_TICK)
                self.moved()
                keeper = k = self.keeper_pass_on_a_thread()
                wait_until(lambda k=k: watched.keeper_arrived.is_set() or not k.is_alive(), timeout=10,  # type: ignore[misc]
                           what="a keeper pass")
            if not watched.keeper_arrived.is_set():
                return
            self.client.ack_entered.clear()
            with self.client.lock:
                self.client.ack_gate = (id(h.message), gate)
            settler = threading.Thread(target=self.step, args=("settle",), daemon=True)
            settler.start()
            wait_until(lambda: self.client.ack_entered.is_set() or not settler.is_alive(), timeout=10,
                       what="the ack to be in flight")
            if until_settled:  # or only once the settle is over: the lock is free, the lease settled
                gate.set()
                settler.join(20)
            hold.set()  # the pass goes on to the message's lock (held by the settle, or free again)
            assert keeper is not None
            keeper.join(2.0)  # a pass that skips returns at once; one that waits is still here
            assert not watched.blocked, ("invariant held_leases_stay_renewed: the keeper's pass waited for "
                                         "an ack in flight (every other lease waits behind it)")
        finally:
            hold.set()
            gate.set()
            with self.client.lock:
                self.client.ack_gate = None
            if settler is not None:
                settler.join(20)
            if keeper is not None:
                keeper.join(20)
        self.quiesce()

    @rule()
    def ack_during_a_keeper_renewal(self) -> None:
        """Aimed ordering (#30), the other way round: the keeper's renewal of a message is in flight
        (its pass holds the message's lock, the double holds the call) when the message's settle
        begins: the settle waits for that renewal, and its ack reaches the broker after it — never
        a renewal after the ack (revived on the proxy)."""
        h = self.one_settling()
        if h is None:
            return
        watched = WatchedLock()
        h.lock = watched
        gate = threading.Event()
        self.client.renew_entered.clear()
        with self.client.lock:
            self.client.renew_gate = (id(h.message), gate)
        keeper: threading.Thread | None = None
        settler: threading.Thread | None = None
        try:
            while not self.client.renew_entered.is_set() and h.deadline > self.clock():
                self.clock.advance(KEEPER_TICK)
                self.moved()
                keeper = k = self.keeper_pass_on_a_thread()
                wait_until(lambda k=k: self.client.renew_entered.is_set() or not k.is_alive(), timeout=10,  # type: ignore[misc]
                           what="a keeper pass")
            if not self.client.renew_entered.is_set():
                return
            settler = threading.Thread(target=self.step, args=("settle",), daemon=True)
            settler.start()
            wait_until(lambda: watched.waiters > 0 or not settler.is_alive(), timeout=10,
                       what="the settle to reach the message's lock")
        finally:
            gate.set()
            with self.client.lock:
                self.client.renew_gate = None
            if keeper is not None:
                keeper.join(20)
            if settler is not None:
                settler.join(20)
        self.quiesce()

    @rule()
    def hang_every_worker(self) -> None:
        """Every worker hangs (each policy): more messages come; the loop must not hold what no
        worker can start."""
        self.send(None, self.workers + 2)
        for _ in range(self.workers + 2):
            self.step("poll")
        self.hang()
        self.memory_bounded()  # from the moment every worker hangs
        self.step("poll")
        self.step("poll")
        self.tick(0.95, 2)  # the keeper's passes meanwhile: nothing no worker can start is renewed

    # -- rules: stop, restart, signals -----------------------------------------------------------------
    def prepare_drain(self) -> None:
        """The real run() takes over the loop for its stop and drain: started on a thread, held in
        its first ``until=`` call (before any receive) until :meth:`finish_drain`; a stop() asked
        meanwhile then finds a running loop, as it would in production."""
        if self.stopped:
            return
        self.stopped = True
        self.bounded_drain = False
        self.received_at_stop = self.loop.statistics().received
        go, entered = threading.Event(), threading.Event()
        self.drain_now = go

        def until(_: Any) -> bool:
            entered.set()
            go.wait(60)
            return True

        self.runner = threading.Thread(target=self._run, args=(self.loop, until), daemon=True)
        self.runner.start()
        # (a loop a key=/cost= Ctrl-C already stops never asks until=: its run() drains at once)
        wait_until(lambda: entered.is_set() or self.loop.stopping, timeout=10, what="run() to start")

    def finish_drain(self) -> None:
        self.drain_now.set()
        self.quiesce()

    def begin_drain(self, bounded: float | None = None) -> None:
        """stop() (unbounded: it asks) or stop(timeout=bounded) from another thread, then the drain."""
        self.prepare_drain()
        self.bounded_drain = bounded is not None and not math.isinf(bounded)
        loop = self.loop
        if bounded is None:
            try:
                loop.stop()
            except BaseException as exc:  # noqa: BLE001 - recorded: a stop must never raise
                self.stop_errors.append(f"stop() raised {exc!r}")
            self.finish_drain()
            return

        def bounded_stop() -> None:
            try:
                answer = loop.stop(timeout=bounded)
            except BaseException as exc:  # noqa: BLE001 - recorded: a stop must never raise
                self.stop_errors.append(f"stop(timeout={bounded}) raised {exc!r}")
                return
            runner = self.runner
            if not answer and runner is not None:
                # the stop deadline is on real time (time.monotonic, not the loop's monotonic=):
                # a loaded 2-core machine may miss stop()'s own half second past it; a drain that
                # ignores the deadline (waits for a hung handler) is still running after this
                runner.join(STOP_MARGIN_S)
                answer = not runner.is_alive()
            self.bounded_stop_answers.append(answer)

        stopper = threading.Thread(target=bounded_stop, daemon=True)
        stopper.start()
        wait_until(lambda: loop.stopping or not stopper.is_alive(), timeout=10, what="the stop")
        self.finish_drain()
        if not math.isinf(bounded):
            stopper.join(30)

    def _run(self, loop: ConsumeLoop, until: Any) -> None:
        try:
            loop.run(until=until)
        except KeyboardInterrupt as exc:
            if not self.interrupted:  # (one key=/cost= raised is re-raised by run() after its drain)
                self.stop_errors.append(f"run() raised {exc!r} during its drain")
        except InjectedBase:
            # a BaseException from ack, nack or renew is counted, settled, then re-raised by run() after
            # its drain (docs/consume.md): the fault the harness injected, not a failure of stop()
            pass
        except BaseException as exc:  # noqa: BLE001 - recorded
            self.stop_errors.append(f"run() raised {exc!r} during its drain")

    @precondition(lambda self: not self.stopped)
    @rule(how=st.sampled_from(["ask", "zero", "small", "inf"]))
    def stop(self, how: str) -> None:
        self.begin_drain(None if how == "ask" else {"zero": 0.0, "small": 0.05, "inf": math.inf}[how])

    @precondition(lambda self: not self.stopped)
    @rule(where=st.sampled_from(["statistics", "wait", "run"]), installed=st.booleans())
    def signal_while_the_lock_is_held(self, where: str, installed: bool) -> None:
        """A signal lands while this thread holds the loop's lock (inside statistics(), a wait()
        predicate, run()'s own step): its handler stops the loop — and must not block on the lock."""
        import signal

        self.prepare_drain()
        previous = signal.getsignal(signal.SIGTERM)
        try:
            if installed:
                self.loop.install_signal_handlers()
            handler = signal.getsignal(signal.SIGTERM)
            with self.guard:
                if installed and callable(handler):
                    handler(signal.SIGTERM, None)
                else:
                    self.loop.stop()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self.finish_drain()

    @precondition(lambda self: self.stopped)
    @rule()
    def restart(self) -> None:
        """A new loop on the same client after a stop (the old one's hung calls may still run)."""
        if self.runner is not None:
            # decided by the model, not by how long the drain took (the rules hypothesis may draw
            # next must not depend on timing): an unbounded drain waits for this loop's hung
            # handlers, so they end first (late); a bounded one ends by its deadline
            deadline = time.monotonic() + 30
            while self.runner.is_alive() and time.monotonic() < deadline:
                if not self.bounded_drain:  # (and what the drain starts meanwhile ends too)
                    with self.cond:
                        for c in self.running:
                            if c.loop == self.loop_index:
                                c.gate.set()
                self.runner.join(0.05)
            assert not self.runner.is_alive(), "invariant stop_keeps_its_bound: run() did not return after its drain"
            self.quiesce()
        self.retired.append(self.loop)
        self.new_loop()
        self.step("poll")

    # -- invariants --------------------------------------------------------------------------------
    @invariant()
    def acked_only_after_success(self) -> None:
        if hasattr(self, "loop"):
            with self.cond, self.client.lock:
                bad = self.client.acked_deliveries - self.succeeded
            assert not bad, f"invariant acked_only_after_success: {len(bad)} acked without a successful run"

    @invariant()
    def no_two_copies_at_once(self) -> None:
        if hasattr(self, "loop"):
            with self.cond:
                ids = Counter(c.message.message_id for c in self.running)
            twice = {mid: n for mid, n in ids.items() if n > 1}
            assert not twice, f"invariant no_two_copies_at_once: {twice}"

    @invariant()
    def started_only_with_a_live_lease(self) -> None:
        if hasattr(self, "loop"):
            assert not self.started_stale, f"invariant started_only_with_a_live_lease: {self.started_stale}"

    @invariant()
    def held_leases_stay_renewed(self) -> None:
        """A held message's lease at the broker never lapses unless a fault hit it (else a peer gets
        a copy while this one still has it: two copies at once, across processes)."""
        if not hasattr(self, "loop"):
            return
        passes = [c for c in self.batch_cut if c.startswith("renew")]
        assert not passes, f"invariant held_leases_stay_renewed: a renewal pass left due leases unrenewed: {passes}"
        if self.stopped:
            return
        self.excuse_let_go()
        now = self.clock()
        holding: set[int] = set()
        # a retired loop (stopped, then replaced by restart) renews nothing any more: what its bounded
        # drain left running is let go by design (docs/consume.md), so only live loops promise renewal
        for lp in self.loops:
            if any(lp is r for r in self.retired):
                continue
            with lp._lock:
                holding.update(i for i, h in lp._leases.items() if not h.done)
        with self.client.lock:
            lapsed = [m.message_id for i, m in self.client.held.items()
                      if i in holding and self.client.lease_end.get(i, 0.0) <= now
                      and m.message_id not in self.lease_excused and m.message_id not in self.client.faulted]
        assert not lapsed, f"invariant held_leases_stay_renewed: lease ended while held: {lapsed}"

    @invariant()
    def held_settled_or_given_back(self) -> None:
        if not hasattr(self, "loop"):
            return
        now = self.clock()
        with self.client.lock:
            out = [(i, m, self.client.lease_end.get(i, 0.0)) for i, m in self.client.held.items()]
            after = list(self.client.renewed_after_settle)
        assert not after, f"invariant held_settled_or_given_back: renewed after its settle began: {after}"
        settles = [c for c in self.batch_cut if c.startswith("settle")]
        assert not settles, f"invariant held_settled_or_given_back: a settle_ready() left ready outcomes queued: {settles}"
        holding: set[int] = set()
        for lp in self.loops:
            with lp._lock:
                holding.update(lp._leases)
        # (past its lease as the loop could know it: a lease it dated early ends that much sooner)
        dropped = [m.message_id for i, m, end in out if i not in holding and end - self.client.dated_early.get(i, 0.0) > now
                   and m.message_id not in self.lease_excused and m.message_id not in self.client.faulted
                   and m.message_id not in self.client.dated_late]
        assert not dropped, f"invariant held_settled_or_given_back: neither held, settled nor expired: {dropped}"
        ghosts = [i for i in holding if i not in {i for i, _, _ in out}
                  and i not in self.client.settle_began]
        assert not ghosts, f"invariant held_settled_or_given_back: held but never handed out: {ghosts}"

    @invariant()
    def stop_keeps_its_bound(self) -> None:
        if hasattr(self, "loop"):
            assert not self.guard.violations, f"invariant stop_keeps_its_bound: {self.guard.violations}"
            assert not self.stop_errors, f"invariant stop_keeps_its_bound: {self.stop_errors}"
            assert all(self.bounded_stop_answers), (
                f"invariant stop_keeps_its_bound: a bounded stop() answered False: {self.bounded_stop_answers}")

    @invariant()
    def memory_bounded(self) -> None:
        if not hasattr(self, "loop"):
            return
        # receive_ahead: at most one more per ending handler (one per worker)
        room = ((2 + self.ahead) * self.workers + 2 + self.loop.flow.max_batch + self.loop.flow.ack_threads
                + self.prefetch)
        held = self.loop.state().held
        assert held <= room, f"invariant memory_bounded: {held} held > {room}"
        ds = self.loop.dispatcher.statistics()
        if ds.overrun >= self.workers and not self.stopped and not self.loop.stopping:
            # every worker hung (#30 item 5): the loop receives nothing, and renews no lease of a
            # message no worker can start (a peer takes it once it ends) — only those settling
            received = self.loop.statistics().received
            with self.client.lock:
                renewals = list(self.client.renewals)
                settled = set(self.client.settle_began)
            if self.hung_since is None:
                self.hung_since = (received, len(renewals))
            got, seen = self.hung_since
            assert received == got, f"invariant memory_bounded: every worker hung, yet {received - got} received"
            with self.loop._lock:
                settling = {i for i, h in self.loop._leases.items() if h.state == SETTLING}
            # a lease once settling never goes back (its outcome waits for an ack thread, renewed:
            # RELIABILITY); one renewed then may have ended since (expired, its lease lost in a
            # stall), so the ids seen settling are kept, not only those settling now
            self.were_settling |= settling
            late = [i for i, _ in renewals[seen:] if i not in self.were_settling and i not in settled]
            assert not late, (f"invariant memory_bounded: every worker hung, yet {len(late)} leases renewed "
                              "of messages no worker can start")
        else:
            self.hung_since = None
        blame = self.loop.dispatcher._core.blame
        with blame._lock:
            # a pending `pull + grace` mark lives until the first event past it: bounded by the
            # submits of the last 2 ms, not by the messages held (a drain retrying a refused submit
            # on real time, with the injected clock standing still, leaves one per retry)
            marks, latest = [at for at, _ in blame._marks], blame._t
        stale = [at for at in marks if latest is not None and at <= latest]
        assert not stale, f"invariant memory_bounded: live blame keeps {len(stale)} marks past their time"
        size = blame.statistics().entries - len(marks)
        bound = 6 * self.workers + 2 * held + 8
        assert size <= bound, f"invariant memory_bounded: live blame keeps {size} records > {bound}"

    @invariant()
    def counters_add_up(self) -> None:
        if not hasattr(self, "loop"):
            return
        with self.loop._lock:  # one snapshot with the settles in progress (the identity holds once idle)
            s, settling = self.loop._snapshot_locked(), self.loop._settling
        state = self.loop.state()
        # (an ack thread counts a failed settle before it lets the message go: while run() drains,
        # a snapshot may fall between the two; the identity is promised with nothing settling)
        assert settling or s.received == (s.acked + s.retry_scheduled + s.given_back + s.ack_errors + s.expired
                                          + s.held), f"invariant counters_add_up: {s}"
        assert state.held >= 0 and state.waiting + state.settling <= state.held, f"invariant counters_add_up: {state}"
        now = self.clock()
        with self.cond:  # a run that failed, or runs past handler_timeout (TIMEOUT is a failure)
            ran_and_failed = len(self.failed | {id(c.message) for c in self.running if overran(c.started, now)})
        if self.open_item("key-error-counted-failed"):  # a raising key= is counted `failed` today
            ran_and_failed += len(self.key_failed)
        counts = [("loop", sum(lp.statistics().failed for lp in self.loops)),
                  # the dispatcher's own failure count (and its outcome counter), #30 item 11
                  ("dispatcher", sum(lp.dispatcher.statistics().failed + lp.dispatcher.statistics().timed_out
                                     for lp in self.loops))]
        for what, total in counts:
            assert total <= ran_and_failed, (
                f"invariant counters_add_up: {what} failed={total} but only {ran_and_failed} handler runs "
                "failed (a copy that never started counted as a failure)")
        assert not self.escaped, (f"invariant counters_add_up: an error escaped the loop's step (run() would stop "
                                  f"and re-raise it): {self.escaped}")
        refused = sum(lp.statistics().submit_errors for lp in self.loops)
        assert refused <= len(self.callable_failed), (
            f"invariant counters_add_up: {refused} submits refused, only {len(self.callable_failed)} "
            "key=/cost= calls raised (a junk value must not fail its message)")
        with self.client.lock:
            injected = self.client.errors["ack"] + self.client.errors["nack"]
            renew_injected = self.client.errors["renew"]
        junk_backoff = self.backoff not in ("ok", "neg")
        if not junk_backoff:
            assert not self.client.refused, f"invariant counters_add_up: the broker refused {self.client.refused}"
        ack_errors = sum(lp.statistics().ack_errors for lp in self.loops)
        lease_errors = sum(lp.statistics().lease_errors for lp in self.loops)
        if not junk_backoff:
            assert ack_errors == injected, (
                f"invariant counters_add_up: {ack_errors} ack errors, {injected} injected: the loop sent a dead call")
        assert lease_errors == renew_injected, (
            f"invariant counters_add_up: {lease_errors} lease errors, {renew_injected} injected")

    @invariant()
    def nothing_received_after_stop(self) -> None:
        if hasattr(self, "loop") and self.stopped and self.runner is not None and not self.runner.is_alive():
            got = self.loop.statistics().received
            assert got == self.received_at_stop, f"invariant nothing_received_after_stop: {got} > {self.received_at_stop}"

    def check_all(self) -> None:
        for name in ("acked_only_after_success", "no_two_copies_at_once", "started_only_with_a_live_lease",
                     "held_leases_stay_renewed",
                     "held_settled_or_given_back", "stop_keeps_its_bound", "memory_bounded", "counters_add_up"):
            getattr(self, name)()

    def teardown(self) -> None:
        if not hasattr(self, "loop"):
            return
        self.client.clear()
        try:
            for _ in range(100 + 4 * len(self.sent)):
                with self.cond:
                    for c in self.running:
                        if c.end not in ("failure",):
                            c.end = "success"
                        c.gate.set()
                self.quiesce()
                self.step("settle")
                self.check_all()
                ended = self.runner is None or not self.runner.is_alive()
                if self.stopped or self.loop.stopping:  # (stopping: a key=/cost= raised a Ctrl-C)
                    if ended and self.loop.state().held == 0:
                        break
                elif self.broker.backlog("G", "T") == 0 and self.loop.state().held == 0:
                    break
                self.clock.advance(0.95 * MARGIN)
                self.moved()
                self.step("renew")
                self.step("poll")
            if self.runner is not None:
                self.runner.join(20)
                assert not self.runner.is_alive(), "invariant stop_keeps_its_bound: run() did not return after " \
                                                   "stop() with every handler released"
            held = self.loop.state().held
            assert held == 0, f"invariant held_settled_or_given_back: {held} still held after the drain"
            if not self.stopped and not self.loop.stopping and self.backoff == "ok":
                acked = {mid for mid, n in self.client.acked.items() if n}
                missing = [mid for mid in self.sent if mid not in acked]
                assert not missing, f"invariant held_settled_or_given_back: never acked after the drain: {missing}"
        finally:
            with self.cond:
                for c in self.calls:
                    c.gate.set()
            for lp in self.loops:
                lp.stop()
                lp.dispatcher.close(timeout=5)


_NO_SHRINK = os.environ.get("RMQTRACE_NO_SHRINK") or os.environ.get("RMQTRACE_SEEDED") == "1"
FaultModel.TestCase.settings = settings(
    max_examples=1500 if LONG else 300, stateful_step_count=30, deadline=None,
    phases=[p for p in Phase if p is not Phase.shrink] if _NO_SHRINK else list(Phase),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_fault_model = FaultModel.TestCase


# -- fixed sequences, reached through the model's own rules -------------------------------------------
# test_itemN_*: #30 item N, each failed on the code before its fix (strict xfails until the fixes
# were merged); the rest: bugs this harness found that are still open (OPEN_NEW, strict xfails).
def replay(item: int | str, steps: list[tuple[str, dict[str, Any]]], *, policy: str = "aggressive",
           workers: int = 1, backoff: str = "ok", prefetch: int = 0) -> None:
    """Run ``steps`` (rule name, arguments) on a fresh model with ``item``'s gates open, every
    invariant after each, then the teardown's drain (which checks the promise too)."""
    m = FaultModel()
    m.forcing = frozenset({item})
    try:
        m.start(policy=policy, workers=workers, backoff=backoff, prefetch=prefetch)
        m.check_all()
        for name, kw in steps:
            getattr(m, name)(**kw)
            m.check_all()
    finally:
        m.teardown()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("workers", [1, 2])
def test_every_worker_hung_with_a_prefetch_backlog_receives_nothing(policy: str, workers: int) -> None:
    """#30 item 5 where only the loop's own guard holds it: with ``prefetch`` the room is the
    cache's, not the dispatcher's free slots, so with every worker hung the loop itself must say
    no room (memory_bounded: received stays put). Seeded bug
    fault-receive-while-every-worker-hangs is caught here (cost_aware, one worker)."""
    replay("none", [("hang_every_worker", {})], policy=policy, workers=workers, prefetch=2)


def test_a_lease_renewed_while_settling_that_expires_later_is_no_stray_renewal() -> None:
    """Found by the long search (RMQTRACE_LONG=1): with the one worker hung, the hung message's
    TIMEOUT outcome waits for an ack thread and its lease is renewed (documented); a stall then
    costs the lease and the settle skips it (expired). The invariant read the settling set only at
    its own check, after the lease was gone, and took those renewals for strays: a model flaw."""
    replay("none", [("a_base_exception_inside_a_batch", {"kind": "base", "op": "ack"}),
                    *[("ack_during_a_keeper_renewal", {})] * 3,
                    *[("tick", {"frac": 0.95, "times": 3})] * 2, ("hang", {}), ("settle", {})],
           policy="round_robin", workers=1)


def test_a_message_received_while_the_last_worker_hung_is_let_go_not_lost() -> None:
    """Found by CI's random search (3.10): a slow receive carries the one worker past
    handler_timeout; the message it returns waits in the loop's backlog (not yet the dispatcher's)
    and is let go with the rest (`let_go`). The model excused only what waited in the dispatcher:
    a model flaw, the loop did what docs/consume.md says."""
    replay("none", [("send_a_user_message_named_like_a_probe", {}), ("ack_during_a_keeper_renewal", {}),
                    ("tick", {"frac": 0.3, "times": 3}),
                    ("stall_in_a_call", {"op": "receive", "slow": True, "when": "during"}),
                    ("a_base_exception_inside_a_batch", {"kind": "base", "op": "renew"})],
           policy="round_robin", workers=1)


def test_a_lease_let_go_while_every_worker_hung_is_excused_after_they_free() -> None:
    """Found by CI's random search (3.10): every worker is carried past handler_timeout by a slow
    receive, the queued message is let go, then (in the same rule) both workers free and the
    let-go message is settled NOT_STARTED and forgotten, its broker lease still running out. The
    model judged "every worker hung" only at its checks, after the workers had freed: a model flaw
    (the excuse is now taken after every driven step)."""
    replay("none", [("send", {"count": 3, "key": None}), ("ack_during_a_keeper_renewal", {}),
                    ("tick", {"frac": 0.3, "times": 3}),
                    ("stall_in_a_call", {"op": "receive", "slow": True, "when": "before"}),
                    ("a_base_exception_inside_a_batch", {"kind": "base", "op": "ack"})],
           policy="cost_aware", workers=2)


def _xfail(item: int | str, why: str) -> pytest.MarkDecorator:
    reason = f"#30 item {item}: {why}" if isinstance(item, int) else f"found by this harness ({item}): {why}"
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


ONE = [("send", {"key": None, "count": 1}), ("poll", {})]


@pytest.mark.parametrize("end", ["awaitable", "generator"])
def test_item1_a_handler_that_returns_unrun_work_is_not_acked(end: str) -> None:
    replay(1, [*ONE, ("release", {"pick": 0, "end": end}), ("settle", {})])


def test_item2_live_blame_stays_bounded_at_low_load() -> None:
    steps: list[tuple[str, dict[str, Any]]] = []
    for _ in range(40):
        steps += [*ONE, ("release", {"pick": 0, "end": "success"}), ("settle", {})]
    replay(2, steps, workers=3)


def test_item3_a_stall_during_receive_never_starts_a_dead_lease() -> None:
    replay(3, [("send", {"key": None, "count": 1}), ("stall_in_a_call", {"op": "receive", "when": "during", "slow": False}),
            ("poll", {})])


def test_item3_a_slow_receive_answer_keeps_the_lease_renewed() -> None:
    replay(3, [("send", {"key": None, "count": 1}), ("stall_in_a_call", {"op": "receive", "when": "during", "slow": True}),
            ("poll", {}), ("tick", {"frac": 0.95, "times": 2})])


def test_item4_a_slow_renewal_loses_no_other_lease() -> None:
    m_steps: list[tuple[str, dict[str, Any]]] = [
        ("send", {"key": None, "count": 1}), ("poll", {}), ("tick", {"frac": 0.3, "times": 2}),  # A at t, then 0.6 s
        ("send", {"key": None, "count": 1}), ("poll", {}),  # B at t + 0.6
        ("tick", {"frac": 0.6, "times": 2}),  # t + 1.8: A has 1.2 left, B 1.8: nothing due yet
        ("stall_in_a_call", {"op": "renew", "when": "during", "slow": True}),
        ("tick", {"frac": 0.6, "times": 1})]  # t + 2.4: A due (0.6 left), B not (1.2): A's renewal takes 1.3 s
    replay(4, m_steps, workers=2)


@pytest.mark.parametrize("policy", ["cost_aware"])
def test_item5_every_worker_hung_holds_nothing_it_cannot_start(policy: str) -> None:
    replay(5, [("hang_every_worker", {}), ("tick", {"frac": 0.3, "times": 1}), ("poll", {}), ("poll", {})],
           policy=policy, workers=1)


@pytest.mark.parametrize("fault", ["key-base", "cost-base"])
def test_item6_a_base_exception_from_a_user_callable_leaves_nothing_held(fault: str) -> None:
    replay(6, [("send_junk_for_a_callable", {"fault": fault}), ("poll", {}), ("poll", {})])


def test_item7_a_restarted_loop_never_runs_a_copy_beside_a_hung_one() -> None:
    replay(7, [*ONE, ("hang", {}), ("settle", {}), ("stop", {"how": "zero"}), ("restart", {}),
            ("tick", {"frac": 0.95, "times": 2}), ("poll", {})], workers=2)


def test_item10_a_huge_cost_still_runs() -> None:
    replay(10, [("send_junk_for_a_callable", {"fault": "cost-huge"}), ("poll", {})])


def test_item11_a_refused_copy_is_never_a_failure() -> None:
    replay(11, [*ONE, ("hang", {}), ("settle", {}), ("tick", {"frac": 0.95, "times": 2}), ("poll", {}), ("settle", {})],
           workers=2)


def test_item13_a_user_message_named_like_a_probe_runs() -> None:
    replay(13, [("send_a_user_message_named_like_a_probe", {}), ("poll", {}), ("settle", {})])


@pytest.mark.parametrize("backoff", ["nan", "inf", "huge", "str"])
def test_a_junk_retry_backoff_still_gives_the_message_back(backoff: str) -> None:
    replay("junk-backoff", [*ONE, ("release", {"pick": 0, "end": "failure"}), ("settle", {})], backoff=backoff)


def test_a_raising_retry_backoff_is_not_an_interrupt() -> None:
    replay("junk-backoff", [*ONE, ("release", {"pick": 0, "end": "failure"}), ("settle", {})], backoff="raise")


@pytest.mark.parametrize("op", ["ack", "nack"])
def test_a_base_exception_from_a_settle_leaves_nothing_held(op: str) -> None:
    end = "success" if op == "ack" else "failure"
    replay("base-from-a-settle", [*ONE, ("release", {"pick": 0, "end": end}),
                                  ("fail_a_call", {"op": op, "kind": "base", "when": "before"}),
                                  ("settle", {}), ("settle", {})])


def test_a_base_exception_from_a_settle_settles_the_rest_of_the_batch() -> None:
    """Found by this harness: the key= failure's give-back and the hung handler's TIMEOUT are both
    ready when the give-back's nack raises a BaseException in the driven settle_ready(); the
    TIMEOUT's settle stayed queued, the message held (fixed: the batch is settled, then it raises)."""
    replay("base-from-a-settle", [("send_junk_for_a_callable", {"fault": "key-raise"}),
                                  ("fail_a_call", {"op": "nack", "kind": "base", "when": "before"}),
                                  ("keeper_before_the_watchdog", {"past_grace": False})], workers=2)


def test_a_base_exception_from_a_renewal_renews_the_rest_of_the_pass() -> None:
    """The keeper's twin: two leases due in one driven pass, the first renewal raises a
    BaseException; the second is still renewed (its lease must not lapse: held_leases_stay_renewed)."""
    replay("base-from-a-settle", [("send", {"key": None, "count": 2}), ("poll", {}),
                                  ("fail_a_call", {"op": "renew", "kind": "base", "when": "before"}),
                                  ("tick", {"frac": 0.95, "times": 4})], workers=2)


@pytest.mark.parametrize("restart", [False, True])
def test_a_lease_dated_early_and_let_expire_is_not_dropped(restart: bool) -> None:
    """Found by this harness with RMQTRACE_LONG=1: a receive slowed 1.3 s before the broker popped
    looks like a broker clock 1.3 s ahead (``BrokerLead`` keeps an upper bound), so the loop dates
    the lease from the call's start — 1.3 s before the broker's end, the documented price. Time then
    passes during the drain faster than run()'s keeper ticks; the loop lets the lease expire by its
    own (earlier) end, no broker call. The broker holds it 1.3 s more, then hands it out again: no
    message lost, so the model now reads "past its lease" as the loop could know it (dated_early)."""
    steps: list[tuple[str, dict[str, Any]]] = [
        ("send", {"key": None, "count": 1}), ("stall_in_a_call", {"op": "receive", "when": "before", "slow": True}),
        ("poll", {}), ("stop", {"how": "ask"}), ("tick", {"frac": 0.6, "times": 3})]
    replay("dated-early", [*steps, ("restart", {})] if restart else steps)


@pytest.mark.parametrize("past_grace", [False, True])
def test_a_stall_inside_the_keepers_passes_excuses_the_hung_lease(past_grace: bool) -> None:
    """Found by this harness with RMQTRACE_LONG=1 (also before this round's fixes): a stall past
    every lease, planned for the next renewal, fires inside ``keeper_before_the_watchdog``'s passes.
    The keeper then finds the hung handler's lease lost (``leases_lost``) — right, the process
    stalled — but the rule read only faults that hit this message, and asserted "within the grace
    lost its lease" or "given up, not counted abandoned". The rule now counts that stall too."""
    replay("stall-in-the-passes", [
        ("hang_every_worker", {}), ("a_base_exception_from_the_handler", {"end": "keyboard-interrupt"}),
        ("keeper_before_the_watchdog", {"past_grace": False}), ("tick", {"frac": 0.3, "times": 1}),
        ("a_base_exception_from_the_handler", {"end": "keyboard-interrupt"}),
        ("fail_a_call", {"kind": "raise", "op": "receive", "when": "after"}), ("ack_during_a_keeper_renewal", {}),
        ("tick", {"frac": 0.3, "times": 1}), ("tick", {"frac": 0.3, "times": 2}),
        ("fail_a_call", {"kind": "raise", "op": "ack", "when": "before"}),
        ("stall_in_a_call", {"op": "renew", "slow": False, "when": "before"}),
        ("keeper_before_the_watchdog", {"past_grace": past_grace})], policy="round_robin", workers=2)


def test_a_run_of_exactly_handler_timeout_is_in_time_and_acked() -> None:
    """Found by this harness (``acked_only_after_success`` 3 of 3): a very slow handler renewed at
    0.9 s steps, then a renewal slow by 1.3 s, is released at exactly handler_timeout (4 s) on the
    dispatcher's nanosecond clock — in time, acked, by the documented rule (TIMEOUT is *longer*
    than handler_timeout) — while the model's float difference read 4.000000000000227 s: late. The
    model now reads a handler's age as the dispatcher does (:func:`overran`)."""
    replay("exact-timeout", [*[("hang", {})] * 5,
                             ("a_base_exception_from_the_handler", {"end": "keyboard-interrupt"}),
                             ("stall_in_a_call", {"op": "renew", "when": "after", "slow": True}), ("hang", {}),
                             ("a_base_exception_from_the_handler", {"end": "keyboard-interrupt"}),
                             ("very_slow_handler", {"pick": 0}), ("settle", {})], workers=2)


@pytest.mark.parametrize("fault", ["key-raise", "key-int"])
def test_a_message_whose_key_failed_is_not_a_handler_failure(fault: str) -> None:
    replay("key-error-counted-failed", [("send_junk_for_a_callable", {"fault": fault}), ("poll", {}), ("settle", {})])


def test_a_base_exception_from_a_renewal_leaves_the_keeper_renewing() -> None:
    """The threaded twin of ``fail_a_call(op=renew, kind=base)``: the driven model renews on its
    own thread (``renew_leases()``), so only run()'s keeper and its pool show it. The lease stays
    due after the failed call (the broker changed nothing, the clock does not move): the keeper's
    next passes hand it to the pool again, and a pool that outlived the BaseException renews it."""
    clock = Clock()
    broker, consumer = consumer_with_messages(clock, await_duration=0, wall=True)
    client = FaultyClient(consumer, clock)
    client.plan("renew", Plan("base", "before"))
    release = threading.Event()
    loop = ConsumeLoop(client, lambda msg: release.wait(30), monotonic=clock, wall=clock, invisible_duration=LEASE,
                       renew_margin=MARGIN, workers=1)
    def run() -> None:
        try:
            loop.run()
        except InjectedBase:
            pass  # re-raised by run() after its drain, as promised: the injected fault, not a failure

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        wait_until(lambda: loop.state().held == 1, timeout=10, what="the message to be held")
        clock.advance(LEASE - MARGIN / 2)  # due: the keeper's next tick renews it, and the call raises
        wait_until(lambda: client.fired["renew:base"] == 1, timeout=10, what="the failing renewal")
        # the keeper ticks every renew_margin / 3 of real time: 10 s is thirty passes
        deadline = time.monotonic() + 10
        while client.calls["renew"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # real-time: the keeper ticks on real time (renew_margin / 3), not on the clock
        assert client.calls["renew"] >= 2, ("invariant held_leases_stay_renewed: after one renewal raised a "
                                            "BaseException, the due lease was never renewed again")
    finally:
        release.set()
        loop.stop(timeout=5)
