"""Model-based test of ``ConsumeLoop`` over the strict embedded broker (hypothesis stateful).

The test drives the loop itself — :meth:`ConsumeLoop.poll`, :meth:`~ConsumeLoop.renew_leases`,
:meth:`~ConsumeLoop.settle_ready` — on a manual clock shared with the broker, so every
interleaving of receives, renewals, acks, clock steps and handler ends is chosen by hypothesis.
Handlers run on the dispatcher's real worker threads and block on events the test sets (success,
failure, or an overrun past ``handler_timeout`` on the manual clock); a handler never released
is a hang. Broker errors are injected one at a time, before or after the broker acted.

After every step, once the threads have settled (a deadline wait, no fixed sleep):

* no delivery (one ``receive`` result) runs twice, and no message runs again without a
  documented reason (its handler failed or overran, an injected broker error hit it, or its
  lease was given up or lost);
* no two copies of one message run at once — unless the broker handed it out again because the
  loop gave its lease up or lost it (a hung handler abandoned, a clock jump past the lease, a
  renewal refused), the documented duplicates;
* every message is acked at the broker or still at the broker (``acked + backlog == sent``),
  so none is lost and none revived after its ack; an untainted message is acked once;
* the loop's stats add up (``received == acked + retry_scheduled + ack_errors + expired + held``;
  one outcome per delivery); broker errors are only the injected ones (the loop
  never acks or renews with a handle it knows has expired);
* the loop is alive (``poll`` raises only the injected error) unless stopped, and receives
  nothing once stopped — also when the user's ``key=`` raises on a message (a "poison" key on
  its first delivery): that one message is failed, nacked, and comes back.

At the end everything is released and drained: with the loop still running, every message is
acked. 300 examples by default (a few seconds), 1000 with ``RMQTRACE_LONG=1``.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from manual_clock import Clock
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop, DispatchOptions, FlowOptions, LeaseOptions
from tracer.dispatch import Aggressive, RoundRobin
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer

LONG = os.environ.get("RMQTRACE_LONG") == "1"
LEASE, MARGIN, BACKOFF = 3, 2.0, 1  # seconds; renewals ask for LEASE, nacks for BACKOFF
TIMEOUT, GRACE = 2.0, 1.0  # handler_timeout and hang_grace


POISON = "poison"  # a key whose callable raises on a message's first delivery


def key_of(m: Any) -> str | None:
    """The user's ``key=``: raises on the first delivery of a poison-keyed message, which must fail
    that one message (nacked, back with attempt 2) and never stop the loop."""
    key = m.properties.get("key")
    if key == POISON and (m.delivery_attempt or 1) == 1:
        raise ValueError("the user's key callable failed")
    return key


class Injected(ConnectionError):
    """A broker error the test injected."""


@dataclass(eq=False)
class Call:
    message: Any
    started: float
    gate: threading.Event = field(default_factory=threading.Event)
    fail: bool = False


class Broker:
    """The 5.x client's surface over the embedded broker, recording what reached the broker and
    failing once on request (``before``: the call never reached it; ``after``: its answer was lost)."""

    def __init__(self, consumer: SimpleConsumer) -> None:
        self.consumer = consumer
        self.inject: dict[str, str] = {}  # op -> "before" | "after"
        self.fired: Counter[str] = Counter()  # op -> injected failures raised
        self.faulted: set[str] = set()  # message ids an injected failure hit
        self.acked: Counter[str] = Counter()  # message id -> acks the broker applied
        self.held: dict[int, Any] = {}  # id(message) -> message, received and not yet settled

    def _fail(self, op: str, when: str, mid: str | None = None) -> None:
        if self.inject.get(op) == when:
            del self.inject[op]
            self.fired[op] += 1
            if mid is not None:
                self.faulted.add(mid)
            raise Injected(f"injected {op} failure ({when})")

    def receive(self, n: int, invisible: int) -> list[Any]:
        self._fail("receive", "before")
        got = self.consumer.receive(n, invisible)
        self._fail("receive", "after")  # the answer is lost: those come back after their lease
        for m in got:
            self.held[id(m)] = m
        return got

    def ack(self, m: Any) -> None:
        self.held.pop(id(m), None)
        self._fail("ack", "before", m.message_id)
        self.consumer.ack(m)
        self.acked[m.message_id] += 1
        self._fail("ack", "after", m.message_id)

    def change_invisible_duration(self, m: Any, seconds: int) -> None:
        if seconds == BACKOFF:
            self.held.pop(id(m), None)
        op = "renew" if seconds == LEASE else "nack"
        self._fail(op, "before", m.message_id)
        self.consumer.change_invisible_duration(m, seconds)
        self._fail(op, "after", m.message_id)


class ConsumeModel(RuleBasedStateMachine):
    @initialize(policy=st.sampled_from(["aggressive", "round_robin"]), workers=st.integers(1, 3))
    def start(self, policy: str, workers: int) -> None:
        self.clock = Clock()
        self.broker = EmbeddedBroker(monotonic=self.clock, min_receive_invisible=1)
        self.broker.create_topic("T")
        self.producer = Producer(self.broker, ["T"])
        self.producer.startup()
        consumer = SimpleConsumer(self.broker, "G", {"T": None}, await_duration=0)
        consumer.startup()
        self.client = Broker(consumer)
        self.cond = threading.Condition()
        self.calls: list[Call] = []
        self.running: set[Call] = set()
        self.sent: list[str] = []
        self.tainted: set[str] = set()  # message ids whose lease the loop gave up or lost
        self.retried: set[str] = set()  # message ids whose handler failed or overran: nacked, run again
        self.runs: Counter[str] = Counter()  # message id -> handler runs
        self.stopped = False
        self.deliveries: Counter[int] = Counter()  # id(message) -> handler runs
        self.keep: list[Any] = []  # every delivered message object, so ids are never reused
        self.loop = ConsumeLoop(
            self.client, self.handler, monotonic=self.clock,
            dispatch=DispatchOptions(
                policy=Aggressive(max_parked=1) if policy == "aggressive" else RoundRobin(buffer=1),
                workers=workers, key=key_of, handler_timeout=TIMEOUT),
            lease=LeaseOptions(invisible_duration=LEASE, renew_margin=MARGIN, hang_grace=GRACE),
            flow=FlowOptions(retry_backoff=lambda attempt: BACKOFF))

    def handler(self, m: Any) -> None:
        call = Call(m, self.clock())
        with self.cond:
            self.deliveries[id(m)] += 1
            self.runs[m.message_id] += 1
            self.keep.append(m)
            self.calls.append(call)
            self.running.add(call)
        call.gate.wait(120)
        with self.cond:
            self.running.discard(call)
        if call.fail:
            raise RuntimeError("handler failed")

    # -- helpers ------------------------------------------------------------------------------
    def quiesce(self) -> None:
        """Wait until every outcome the dispatcher reported reached the loop, every message it
        handed out is inside its handler, and no released handler is still on its way out."""
        d = self.loop.dispatcher

        def settled() -> bool:
            s, ds = self.loop.stats, d.statistics()
            with self.cond:
                running = len(self.running)
                released = any(c.gate.is_set() for c in self.running)
            return (not released and s.reported == ds.handled + ds.failed + ds.timed_out + ds.skipped
                    and ds.in_flight + getattr(ds, "overrun", 0) == running)

        wait_until(settled, timeout=10, interval=0.001, what="the loop's threads to settle")

    def moved(self) -> None:
        """The clock moved: a handler now past handler_timeout may be reported TIMEOUT (the thread
        engine's watchdog; checked here at once so the report does not depend on thread timing)
        and given back while it still runs — a second copy of it may run, by design."""
        for c in list(self.running):
            if self.clock() - c.started > TIMEOUT:
                self.tainted.add(c.message.message_id)
        check = getattr(self.loop.dispatcher, "check_timeouts", None)
        if check is not None:
            check()

    def taint_held(self) -> None:
        self.tainted.update(m.message_id for m in self.client.held.values())

    def excused(self, mid: str) -> bool:
        """A message that may run again: the documented reasons for a duplicate or a retry."""
        return mid in self.tainted or mid in self.retried or mid in self.client.faulted

    def renew(self) -> None:
        self.moved()
        self.loop.renew_leases()

    # -- rules --------------------------------------------------------------------------------
    @rule(key=st.sampled_from([None, "a", "b", POISON]), count=st.integers(1, 3))
    def send(self, key: str | None, count: int) -> None:
        for _ in range(count):  # runs of one key: what fills a key's parking room
            m = Message()
            m.topic, m.body = "T", f"m{len(self.sent)}".encode()
            if key is not None:
                m.add_property("key", key)
            self.sent.append(self.producer.send(m).message_id)

    @rule()
    def poll(self) -> None:
        before = self.loop.stats.received
        try:
            self.loop.poll()
        except Injected:
            pass  # counted by run() in production; here the step just failed
        if self.stopped:
            assert self.loop.stats.received == before, "received after stop()"
        self.quiesce()

    @rule()
    def settle(self) -> None:
        self.loop.settle_ready()

    @rule(dt=st.sampled_from([0.5, 1.0, 1.9]), times=st.integers(1, 3))
    def tick(self, dt: float, times: int) -> None:
        """Time passes less than the renew margin, then the lease keeper runs: no lease is lost."""
        for _ in range(times):
            self.clock.advance(dt)
            self.renew()
            self.quiesce()

    @rule()
    def jump(self) -> None:
        """The process stalls past every lease (no renewal in time): what it held comes back."""
        self.taint_held()
        self.clock.advance(LEASE + 0.5)
        self.renew()
        self.quiesce()

    @rule(pick=st.integers(0, 10), outcome=st.sampled_from(["success", "failure", "overrun"]))
    def release(self, pick: int, outcome: str) -> None:
        with self.cond:  # no precondition on it: what runs depends on threads, draws must not
            calls = sorted(self.running, key=lambda c: (c.started, c.message.message_id))
        if not calls:
            return
        call = calls[pick % len(calls)]
        if outcome == "overrun":  # runs past handler_timeout on the clock: TIMEOUT, not acked
            self.clock.advance(TIMEOUT + 0.1)
            self.taint_held()  # the overrun is a clock step past the margin for everybody else
            self.moved()
        call.fail = outcome == "failure"
        if call.fail or self.clock() - call.started > TIMEOUT:
            self.retried.add(call.message.message_id)
        call.gate.set()
        self.quiesce()

    @rule(op=st.sampled_from(["receive", "ack", "nack", "renew"]), when=st.sampled_from(["before", "after"]))
    def inject(self, op: str, when: str) -> None:
        self.client.inject[op] = when

    @precondition(lambda self: not self.stopped)
    @rule()
    def stop(self) -> None:
        assert self.loop.stop() is False  # nobody runs run(): it only asks
        self.stopped = True

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def no_delivery_runs_twice(self) -> None:
        if hasattr(self, "loop"):
            assert all(n == 1 for n in self.deliveries.values()), self.deliveries

    @invariant()
    def no_message_runs_again_without_a_reason(self) -> None:
        if hasattr(self, "loop"):
            with self.cond:
                again = [mid for mid, n in self.runs.items() if n > 1 and not self.excused(mid)]
            assert not again, again

    @invariant()
    def no_two_copies_at_once(self) -> None:
        if hasattr(self, "loop"):
            with self.cond:
                ids = Counter(c.message.message_id for c in self.running)
            assert all(n == 1 or self.excused(mid) for mid, n in ids.items()), ids

    @invariant()
    def nothing_lost_and_nothing_revived(self) -> None:
        if hasattr(self, "loop"):
            acked = {mid for mid, n in self.client.acked.items() if n}
            assert len(acked) + self.broker.backlog("G", "T") == len(self.sent)
            assert all(n == 1 or self.excused(mid) for mid, n in self.client.acked.items())

    @invariant()
    def stats_add_up(self) -> None:
        if hasattr(self, "loop"):
            s, state = self.loop.stats, self.loop.state()
            assert s.received == s.acked + s.retry_scheduled + s.given_back + s.ack_errors + s.expired + state.held, (s, state)
            assert state.held >= 0 and state.waiting + state.settling <= state.held
            assert state.stopping == self.stopped
            # only injected failures are broker errors: the loop never sends a call it knows is dead
            fired = self.client.fired
            assert s.ack_errors == fired["ack"] + fired["nack"] and s.lease_errors == fired["renew"], (s, fired)

    def teardown(self) -> None:
        if not hasattr(self, "loop"):
            return
        self.client.inject.clear()
        try:
            for _ in range(200):  # release and drain everything
                with self.cond:
                    for c in self.running:
                        c.fail = False
                        c.gate.set()
                self.quiesce()
                self.loop.settle_ready()
                if self.broker.backlog("G", "T") == 0 or (self.stopped and self.loop.state().held == 0):
                    break
                self.clock.advance(1.9)
                self.renew()
                self.loop.poll()
            self.nothing_lost_and_nothing_revived()
            if not self.stopped:
                assert self.broker.backlog("G", "T") == 0, "a message was neither acked nor drained"
                assert set(self.client.acked) == set(self.sent)
            assert self.loop.state().held == 0
        finally:
            with self.cond:
                for c in self.calls:
                    c.gate.set()
            self.loop.dispatcher.close(timeout=10)


ConsumeModel.TestCase.settings = settings(
    phases=[p for p in Phase if p is not Phase.shrink] if os.environ.get("NOSHRINK") else list(Phase),
    max_examples=1000 if LONG else 300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_consume_loop_model = ConsumeModel.TestCase
