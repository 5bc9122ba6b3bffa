"""The third loop review (issues #30/#34, 2026-12-05): its scripts, and each finding as a class.

``tests/review30c/`` holds the reviewer's scripts (each exits 0 once its finding is fixed); the
tests below check each finding across the places built the same way: every dispatch policy, a
keyed and an unkeyed job, both settle calls, every junk count."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from embedded_rig import consumer_with_messages
from hypothesis import given, settings
from hypothesis import strategies as st
from manual_clock import Clock
from review_scripts import run_finding, scripts
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop, FlowOptions
from tracer.dispatch import Aggressive, CostAware, Random, RoundRobin
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.names import COST_PROPERTY

SCRIPTS = scripts("review30c")


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_finding_stays_fixed(script: Path) -> None:
    run_finding(script)


# -- 01: at most one message received ahead per ending handler, wherever the first one went ----
class _Broker:
    """A SimpleConsumer double: hands ``queue`` out in order; a receive is ``trip`` s on ``clock``."""

    consumer_group = "G30c"

    def __init__(self, queue: list[Any], clock: Clock, trip: float) -> None:
        self.queue, self.clock, self.trip = list(queue), clock, trip
        self.received = 0

    def receive(self, n: int, invisible: int) -> list[Any]:
        got, self.queue = self.queue[:n], self.queue[n:]
        self.received += len(got)
        self.clock.advance(self.trip)
        return got

    def ack(self, m: Any) -> None:
        pass

    def change_invisible_duration(self, m: Any, seconds: int) -> None:
        pass


def _message(i: int, key: str | None) -> Any:
    return SimpleNamespace(message_id=f"m{i}", receipt_handle=None, properties={COST_PROPERTY: "1.0"},
                           message_group=key, delivery_attempt=1)


# every policy, with one key for the whole job (what is received ahead parks behind the running
# one, or shares its fixed worker) and without keys
POLICIES = {"aggressive": Aggressive(), "cost_aware": CostAware(window=2), "round_robin": RoundRobin(buffer=1),
            "random": Random(buffer=1, seed=1)}


def _received_near_the_end(policy: Any, keyed: bool, ahead: bool) -> int:
    """One worker runs a 1 s message; the clock is put within one lead (10 ms) of its end and the
    loop polls five times: how many messages it received in all."""
    clock = Clock()
    broker = _Broker([_message(i, "k" if keyed else None) for i in range(30)], clock, trip=0.01)
    gate = threading.Event()
    loop = ConsumeLoop(broker, lambda m: gate.wait(30), workers=1, policy=policy, invisible_duration=30,
                       key=(lambda m: m.message_group) if keyed else None, receive_ahead=ahead, monotonic=clock)
    try:
        loop.poll()
        wait_until(lambda: len(loop.dispatcher.running()) == 1, what="the first handler to start")
        age = loop.dispatcher.running()[0][1]
        clock.advance(1.0 - 0.005 - age)
        for _ in range(5):
            loop.poll()
        return broker.received
    finally:
        gate.set()
        loop.stop()
        loop.settle_ready()
        loop.dispatcher.close(timeout=10)


@pytest.mark.parametrize("keyed", [True, False], ids=["one-key", "unkeyed"])
@pytest.mark.parametrize("policy", list(POLICIES), ids=list(POLICIES))
def test_receive_ahead_receives_at_most_one_more_for_one_ending_handler(policy: str, keyed: bool) -> None:
    """Fails before (review30c 01): aggressive, one key: 3 received against 1 without receive_ahead —
    the one received ahead parked in the dispatcher and no longer counted against the handler."""
    plain = _received_near_the_end(POLICIES[policy], keyed, ahead=False)
    ahead = _received_near_the_end(POLICIES[policy], keyed, ahead=True)
    assert plain <= ahead <= plain + 1, (plain, ahead)


# -- 02: every worker hung: nothing is renewed where no worker can start it -------------------
class _SlowReceive:
    """A consumer whose receive takes 30 ms more: receive_ahead's lead is about that."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def receive(self, n: int, invisible: int) -> Any:
        threading.Event().wait(0.03)  # the slow broker's round trip (real time, what the lead measures)
        return self._inner.receive(n, invisible)


@pytest.mark.parametrize("policy", ["aggressive", "cost_aware"])
def test_a_message_received_ahead_is_let_go_once_every_worker_hangs(policy: str) -> None:
    """Fails before (review30c 02): the message received ahead waited in the loop's backlog and was
    renewed for the whole hang (let_go 0); the peer never got it."""
    broker, consumer = consumer_with_messages(bodies=(b"0", b"1"), await_duration=0.2, properties={COST_PROPERTY: "0.1"})
    hang = threading.Event()
    first: list[str] = []

    def handler(m: Any) -> None:
        if not first:
            first.append(m.message_id)
            hang.wait(30)

    chosen = CostAware(window=1) if policy == "cost_aware" else Aggressive()
    loop = ConsumeLoop(_SlowReceive(consumer), handler, workers=1, policy=chosen, receive_ahead=True,
                       handler_timeout=0.5, invisible_duration=1)
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    try:
        assert loop.wait(lambda s: s.received == 2, timeout=10)  # the second one, received ahead
        assert loop.wait(lambda s: s.let_go == 1, timeout=10)  # its only worker hangs: not renewed
        peer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.5)
        peer.startup()
        got: set[str] = set()
        # the first comes back after its backoff (1 s), the second once its lease (1 s) ends
        for _ in range(20):
            for m in peer.receive(4, 1):
                got.add(m.message_id)
                peer.ack(m)
            if len(got) == 2:
                break
        assert len(got) == 2, got
    finally:
        hang.set()
        loop.stop(timeout=5)
        t.join(10)


# -- 03: a settle refused with 40013 is a lost lease, as a refused renewal --------------------
class _Refusing:
    """Every ack and nack refused as the proxy refuses an expired handle (code 40013)."""

    consumer_group = "G30c"

    def __init__(self, n: int) -> None:
        self.queue = [_message(i, None) for i in range(n)]

    def receive(self, n: int, invisible: int) -> list[Any]:
        got, self.queue = self.queue[:n], self.queue[n:]
        return got

    def _refuse(self, *_: Any) -> None:
        exc = RuntimeError("receipt handle is expired")
        exc.code = 40013  # type: ignore[attr-defined]
        raise exc

    ack = change_invisible_duration = _refuse


@pytest.mark.parametrize("outcome", ["ack", "nack"])
def test_a_settle_refused_because_the_lease_is_gone_is_a_lost_lease(outcome: str) -> None:
    """Fails before (review30c 03): leases_lost 0, only ack_errors 1."""
    def handler(m: Any) -> None:
        if outcome == "nack":
            raise RuntimeError("fails: given back")

    loop = ConsumeLoop(_Refusing(1), handler, workers=1, invisible_duration=30)
    try:
        loop.poll()
        wait_until(lambda: loop.state().settling == 1, what="the handler to end")
        loop.settle_ready()
        s = loop.statistics()
        assert (s.ack_errors, s.leases_lost, s.acked, s.retry_scheduled, s.held) == (1, 1, 0, 0, 0)
    finally:
        loop.stop()
        loop.dispatcher.close(timeout=10)


# -- 04: a bad prefetch is named as such, receive_ahead or not ----------------------------------
@pytest.mark.parametrize("bad", [math.nan, 1.5, -1, "2", True])
def test_a_bad_prefetch_is_not_blamed_on_receive_ahead(bad: Any) -> None:
    """Fails before (review30c 04): nan, 1.5, -1, "2" and True were all "receive_ahead cannot work"."""
    with pytest.raises((ValueError, TypeError)) as plain:
        FlowOptions(prefetch=bad)
    with pytest.raises((ValueError, TypeError)) as ahead:
        FlowOptions(prefetch=bad, receive_ahead=True)
    assert str(ahead.value) == str(plain.value)


# -- 05: the embedded broker hands each FIFO group out in send order ----------------------------
@settings(max_examples=200, deadline=None)
@given(groups=st.lists(st.sampled_from("abc"), min_size=1, max_size=12),
       steps=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 5)), min_size=1, max_size=30))
def test_the_embedded_broker_hands_each_fifo_group_out_in_send_order(groups: list[str],
                                                                     steps: list[tuple[int, int]]) -> None:
    """Any receive sizes, any acks in between: each group's messages come out in the order sent.
    Fails before (review30c 05): a receive whose batch filled part-way through the records held
    back for busy groups left them rotated (falsified with 2 groups, 5 messages)."""
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("F", fifo=True)
    producer = Producer(broker, ["F"])
    producer.startup()
    for i, g in enumerate(groups):
        m = Message()
        m.topic, m.body, m.message_group = "F", f"{i}".encode(), g
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"F": None}, await_duration=0)
    consumer.startup()
    out: dict[str, list[int]] = {}
    held: list[Any] = []
    for size, ack in steps:
        for m in consumer.receive(size, 30):
            out.setdefault(m.message_group, []).append(int(m.body))
            held.append(m)
        if held:
            consumer.ack(held.pop(ack % len(held)))
    for g, seen in out.items():
        assert seen == sorted(seen), (g, seen)


def test_demand_push_with_receive_ahead_keeps_each_fifo_group_in_order() -> None:
    """End to end, as found: DemandPushConsumer(receive_ahead=True) on an embedded FIFO topic runs
    every group in send order, each message once (before: 5 of 6 runs out of order)."""
    from rocketmq.v5.consumer import ConsumeResult

    from tracer.clients.demandpush import DemandPushConsumer

    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("F", fifo=True)
    producer = Producer(broker, ["F"])
    producer.startup()
    n = 60
    for i in range(n):
        m = Message()
        m.topic, m.body, m.message_group = "F", f"{i}".encode(), f"g{i % 4}"
        m.add_property(COST_PROPERTY, "0.005")
        producer.send(m)
    ran: dict[str, list[int]] = {}
    lock = threading.Lock()

    class Listener:
        def consume(self, m: Any) -> Any:
            with lock:
                ran.setdefault(m.message_group, []).append(int(m.body))
            threading.Event().wait(0.005)  # the cost it carries (real time)
            return ConsumeResult.SUCCESS

    push = DemandPushConsumer(broker, "G", Listener(), {"F": None}, consumption_thread_count=3,
                              receive_ahead=True, invisible_duration=10)
    push.startup()
    try:
        assert push.loop is not None and push.loop.wait(lambda s: s.acked == n, timeout=60)
    finally:
        push.shutdown()
    assert sum(map(len, ran.values())) == n
    for g, seen in ran.items():
        assert seen == sorted(seen), (g, seen)


# -- 06: an interrupt gives back what has not started, wherever it was raised and waits ----------
class _Interrupting:
    """Hands ``queue`` over in one receive; the next receive raises KeyboardInterrupt when asked."""

    consumer_group = "G30c"

    def __init__(self, queue: list[Any], raise_in_receive: bool) -> None:
        self.queue, self.raise_in_receive = list(queue), raise_in_receive
        self.calls = 0
        self.acked: list[str] = []
        self.nacked: list[str] = []

    def receive(self, n: int, invisible: int) -> list[Any]:
        self.calls += 1
        if self.calls > 1 and self.raise_in_receive:
            raise KeyboardInterrupt("Ctrl-C inside receive")
        got, self.queue = self.queue[:n], self.queue[n:]
        if not got:
            threading.Event().wait(0.01)  # an empty long poll
        return got

    def ack(self, m: Any) -> None:
        self.acked.append(m.message_id)

    def change_invisible_duration(self, m: Any, seconds: int) -> None:
        self.nacked.append(m.message_id)


@pytest.mark.parametrize("waits", ["backlog", "parked"])
@pytest.mark.parametrize("source", ["receive", "until", "retry_backoff"])
def test_an_interrupt_gives_back_what_has_not_started(source: str, waits: str) -> None:
    """m0 (key k) runs, held open; m1 (key k) waits behind it — in the loop's backlog
    (max_parked=0) or parked in the dispatcher; a KeyboardInterrupt comes from run()'s thread
    (receive, until=) or an ack thread (retry_backoff= of mf, which fails). m1 must go back unrun.
    Fails before (review30c 06): receive/until, both places, and retry_backoff with m1 in the
    backlog or parked: m1 ran in the drain and was acked."""
    queue = [SimpleNamespace(message_id=i, receipt_handle=None, properties={}, message_group=k, delivery_attempt=1)
             for i, k in (("m0", "k"), ("mf", "f"), ("m1", "k"))]
    client = _Interrupting(queue, raise_in_receive=source == "receive")
    gate = threading.Event()
    ran: list[str] = []

    def handler(m: Any) -> None:
        ran.append(m.message_id)
        if m.message_id == "m0":
            gate.wait(20)
        elif m.message_id == "mf":
            raise RuntimeError("fails: its nack asks retry_backoff")

    def backoff(attempt: int) -> float:
        if source == "retry_backoff":
            raise KeyboardInterrupt("Ctrl-C inside retry_backoff=")
        return 1.0

    def until(s: Any) -> bool:
        if source == "until" and s.failed >= 1:
            raise KeyboardInterrupt("Ctrl-C inside until=")
        return False

    loop = ConsumeLoop(client, handler, workers=3, key=lambda m: m.message_group, invisible_duration=30,
                       policy=Aggressive(max_parked=0 if waits == "backlog" else 64), retry_backoff=backoff)
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            loop.run(until=until)
        except BaseException as exc:  # noqa: BLE001 - what the test looks at
            box["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        wait_until(lambda: loop.stopping, what="the interrupt to stop the loop")
    finally:
        gate.set()
        t.join(20)
    assert isinstance(box.get("exc"), KeyboardInterrupt)
    assert "m1" not in ran and "m1" in client.nacked, (ran, client.nacked)
    s = loop.statistics()
    assert s.held == 0 and s.received == s.acked + s.retry_scheduled + s.given_back + s.ack_errors + s.expired
