"""Issue 18, the consume loop's side: a hung keyed handler, a process stall longer than a lease, a
slow broker, a stop in the middle — each reproduced on the strict embedded broker.

Each test failed on the loop before the fix (the issue's item number is in its name). They use
the public API only; the manual clock (``monotonic=``, shared with the broker) stands for a
stalled process or passing time, so no test sleeps for a lease.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest
from manual_clock import Clock
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop, exponential_backoff
from tracer.dispatch import Aggressive
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer


def broker_with(bodies: list[str], clock: Clock | None = None) -> tuple[EmbeddedBroker, SimpleConsumer]:
    broker = EmbeddedBroker(min_receive_invisible=1, **({"monotonic": clock} if clock else {}))
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    for body in bodies:
        m = Message()
        m.topic, m.body = "T", body.encode()
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    consumer.startup()
    return broker, consumer


def key_of(m: Any) -> str | None:
    """``A1`` → key ``A``; ``u1`` (lower case) → unkeyed."""
    body = m.body.decode()
    return body[0] if body[0].isupper() else None


def run_in_thread(loop: ConsumeLoop) -> threading.Thread:
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    return t


def test_item1_a_hung_key_with_a_full_parking_room_does_not_stop_other_keys():
    """A1 hangs, A2 fills the parking room, A3 cannot be submitted: before, A3 sat at the head of
    the loop's backlog and the loop received nothing more — unkeyed u1..u3 waited behind it while
    two workers idled. Then at A1's TIMEOUT its successors follow it back to the broker."""
    clock = Clock()
    hang = threading.Event()
    ran: list[str] = []

    def handler(m: Any) -> None:
        ran.append(m.body.decode())
        if m.body == b"A1":
            hang.wait(30)

    broker, consumer = broker_with(["A1", "A2", "A3", "A4", "u1", "u2", "u3"], clock)
    loop = ConsumeLoop(consumer, handler, monotonic=clock, workers=3, policy=Aggressive(max_parked=1), key=key_of,
                       handler_timeout=5.0, invisible_duration=30, retry_backoff=lambda attempt: 1)
    t = run_in_thread(loop)
    try:
        wait_until(lambda: {"u1", "u2", "u3"} <= set(ran), what="the unkeyed messages run while A1 hangs")
        wait_until(lambda: loop.statistics().acked == 3, what="the unkeyed messages acked")
        assert [b for b in ran if b.startswith("A")] == ["A1"]  # A's order: nothing overtook A1
        clock.advance(5.5)  # A1 past handler_timeout: TIMEOUT, given back; its successors follow it
        loop.dispatcher.check_timeouts()
        try:
            wait_until(lambda: loop.statistics().retry_scheduled == 1 and loop.statistics().given_back == 3,
                       what="A1 nacked and A2..A4 given back with it")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {loop.statistics()} {loop.state()} {loop.dispatcher.statistics()}, ran {ran}") from None
        assert [b for b in ran if b.startswith("A")] == ["A1"]
    finally:
        hang.set()
        loop.stop(timeout=5)
        t.join(10)


def test_item3_a_message_whose_lease_is_gone_before_it_starts_never_starts():
    """A process stall longer than the lease (GC pause, SIGSTOP): A2 waited behind A1 of its key;
    its lease was counted lost, yet before the fix the loop still handed that stale copy to a
    worker — while the broker had handed it out again."""
    clock = Clock()
    release = threading.Event()
    started: list[tuple[str, int]] = []

    def handler(m: Any) -> None:
        started.append((m.body.decode(), m.delivery_attempt))
        if m.body == b"A1":
            release.wait(10)

    broker, consumer = broker_with(["A1", "A2"], clock)
    loop = ConsumeLoop(consumer, handler, monotonic=clock, workers=2, key=key_of, invisible_duration=3,
                       renew_margin=1)
    try:
        assert loop.poll() == 2  # A1 runs, A2 parks behind its key
        wait_until(lambda: started == [("A1", 1)], what="A1 starts")
        clock.advance(3.5)  # the stall: no renewal came in time
        loop.renew_leases()
        assert loop.statistics().leases_lost == 2
        release.set()
        assert loop.dispatcher.wait_idle(timeout=5)
        loop.settle_ready()
        assert started == [("A1", 1)], "a copy whose lease was gone started"
        s = loop.statistics()
        assert s.not_started == 1 and s.expired == 2 and loop.state().held == 0
    finally:
        release.set()
        loop.dispatcher.close(timeout=5)


class SlowRenewals:
    """A loaded broker: every lease renewal takes 0.4 s (acks and receives are fast)."""

    def __init__(self, consumer: SimpleConsumer) -> None:
        self.consumer = consumer

    def receive(self, n: int, invisible: int) -> list[Any]:
        return self.consumer.receive(n, invisible)

    def ack(self, m: Any) -> None:
        self.consumer.ack(m)

    def change_invisible_duration(self, m: Any, seconds: int) -> None:
        if seconds > 1:  # a renewal (nacks here use 1 s)
            time.sleep(0.4)  # real-time: the slow broker call is what this test is about
        self.consumer.change_invisible_duration(m, seconds)


def test_item4_many_slow_renewals_stay_inside_the_margin():
    """8 leases ending together, 0.4 s per renewal call, 1.5 s margin: renewed one by one (before),
    the last ones ended before their turn — lost, and handed to a peer while the first runs went on."""
    release = threading.Event()
    broker, consumer = broker_with([f"u{i}" for i in range(8)])
    loop = ConsumeLoop(SlowRenewals(consumer), lambda m: release.wait(20), workers=8, invisible_duration=2,
                       renew_margin=1.5)
    t = run_in_thread(loop)
    try:
        wait_until(lambda: loop.statistics().received == 8, what="8 held")
        wait_until(lambda: loop.statistics().leases_extended >= 24 or loop.statistics().leases_lost, timeout=20,
                   what="three rounds of renewals")
        assert loop.statistics().leases_lost == 0
        release.set()
        wait_until(lambda: loop.statistics().acked == 8, what="8 acks")
        assert loop.statistics().redelivered == 0
    finally:
        release.set()
        loop.stop(timeout=5)
        t.join(10)


def test_item5_after_stop_with_a_timeout_returns_nothing_more_starts():
    """stop(timeout=) returned True while the dispatcher went on starting the messages queued
    behind a slow one — whose leases the loop had already dropped (a peer got all of them)."""
    release = threading.Event()
    starts: list[tuple[str, float]] = []

    def handler(m: Any) -> None:
        starts.append((m.body.decode(), time.monotonic()))
        if m.body == b"A1":
            release.wait(10)

    broker, consumer = broker_with(["A1", "A2", "A3", "A4"])
    loop = ConsumeLoop(consumer, handler, workers=2, key=key_of, policy=Aggressive(max_parked=8),
                       invisible_duration=30)
    t = run_in_thread(loop)
    try:
        wait_until(lambda: loop.statistics().received == 4 and starts, what="A1 runs, A2..A4 wait")
        assert loop.stop(timeout=0.3) is True
        returned = time.monotonic()
        release.set()
        assert loop.dispatcher.wait_idle(timeout=5)
        assert [b for b, at in starts if at >= returned] == [], "a handler started after stop() returned"
        wait_until(lambda: loop.statistics().acked == 1, what="A1 acked when it ends")
        s = loop.statistics()
        assert s.not_started == 3 and s.given_back == 3 and loop.state().held == 0
        assert broker.backlog("G", "T") == 3
    finally:
        release.set()
        t.join(10)


def test_item6_an_outcome_after_the_loop_stopped_is_still_settled():
    """A TIMEOUT (or any outcome) that arrives after run() returned: before, it went to the ack
    queue after the ack threads had exited — never nacked, held for good."""
    clock = Clock()
    hang = threading.Event()
    broker, consumer = broker_with(["u1"], clock)
    loop = ConsumeLoop(consumer, lambda m: hang.wait(30), monotonic=clock, workers=1, handler_timeout=2.0,
                       invisible_duration=30, retry_backoff=lambda attempt: 1)
    t = run_in_thread(loop)
    try:
        wait_until(lambda: loop.statistics().received == 1 and loop.dispatcher.running(), what="u1 runs")
        assert loop.stop(timeout=0.2) is True  # the handler still runs
        # this loop's own ack threads (another test's loop may still have some in a full run)
        wait_until(lambda: not any(w.is_alive() for w in loop._ack_workers), what="the loop's ack threads to exit")
        clock.advance(2.5)
        assert loop.dispatcher.check_timeouts() == 1  # its TIMEOUT comes now, after the loop stopped
        wait_until(lambda: loop.statistics().retry_scheduled == 1, what="the late TIMEOUT nacked")
        assert loop.state().held == 0
    finally:
        hang.set()
        t.join(10)


@pytest.mark.parametrize("bad", [{"invisible_duration": 0.5}, {"invisible_duration": math.inf},
                                 {"stop_timeout": -1}, {"stop_timeout": math.nan},
                                 {"handler_timeout": 0}, {"handler_timeout": math.nan}, {"key": "not callable"}])
def test_item8_options_that_cannot_work_are_refused_at_construction(bad):
    """A 0.5 s lease: the broker granted 1 s while the loop's own deadline was 0.5 s, so no message
    was ever acked."""
    broker, consumer = broker_with([])
    with pytest.raises((ValueError, TypeError)):
        ConsumeLoop(consumer, lambda m: None, **bad)


@pytest.mark.parametrize("name", ["stop_timeout", "handler_timeout"])
@pytest.mark.parametrize("value", [math.inf, 1e10, 10**400])
def test_item8_an_infinite_or_huge_timeout_option_is_no_bound(name, value):
    """stop_timeout=inf raised OverflowError in shutdown, leaving 7 threads alive (item 9), and a
    finite 1e10 did the same later (the adversarial review, 02): every timeout option past what a
    thread can wait for means no bound, as None, and the loop stores it so."""
    broker, consumer = broker_with([])
    loop = ConsumeLoop(consumer, lambda m: None, **{name: value})
    try:
        assert getattr(loop.flow if name == "stop_timeout" else loop.dispatch_options, name) is None
    finally:
        assert loop.stop(timeout=1) is True


def test_item8_exponential_backoff_never_overflows():
    assert exponential_backoff(1025) == 60.0 and exponential_backoff(10**9) == 60.0
    assert [exponential_backoff(a) for a in (1, 2, 3)] == [1.0, 2.0, 4.0]


async def _async_handler(m: Any) -> None:  # pragma: no cover - refused before it could run
    return None


def _generator_handler(m: Any) -> Any:  # pragma: no cover - refused before it could run
    yield m


@pytest.mark.parametrize("handler", [_async_handler, _generator_handler], ids=["async-def", "generator"])
def test_item7_a_handler_of_the_wrong_kind_is_refused_at_construction(handler):
    """Calling an async def only builds a coroutine: 10 of 10 were acked, none ran."""
    broker, consumer = broker_with([])
    with pytest.raises(TypeError, match="plain function"):
        ConsumeLoop(consumer, handler)
