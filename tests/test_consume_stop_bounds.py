"""The adversarial review's loop findings (issue #30, RELIABILITY.md "The adversarial review"), each
as the ordering that broke a promise, driven without timed assertions.

* 07, 10: a handler's ``stop(timeout=inf)`` on its own loop, and a ``wait()`` predicate calling
  ``statistics()``, waited for themselves: run() never returned. (The joins below only detect a
  deadlock: their bound is far beyond any real run.)
* 11: a later, shorter ``stop(timeout=)`` was missed by a drain already waiting on the first one.
* 12: a drain that gave the backlog back while an offer was in flight (the feeder inside a slow
  ``key=``) stranded that message, held for ever.
* 14: a TIMEOUT reported while a worker was still in the start gate (the watchdog's clock starts
  before it) was followed by the handler starting, on a message already given back and counted
  failed.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from embedded_rig import consumer_with_messages
from manual_clock import Clock
from waiting import wait_until

from tracer import ConsumeLoop
from tracer.dispatch import HandlerTimeout
from tracer.path.stages import Outcome

DEADLOCK_S = 60.0  # a join this long only tells a deadlock from a run (which takes milliseconds)


def _run(loop: ConsumeLoop) -> threading.Thread:
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    return t


def _real_loop(handler: Any, bodies: tuple[bytes, ...] = (b"x",), **kw: Any) -> ConsumeLoop:
    import time

    _, consumer = consumer_with_messages(time.monotonic, await_duration=0.05, bodies=bodies)
    return ConsumeLoop(consumer, handler, invisible_duration=30, **kw)


def test_07_a_handler_stopping_its_own_loop_with_no_bound_does_not_wait_for_itself() -> None:
    answers: list[bool] = []
    loop: ConsumeLoop

    def handler(m: Any) -> None:
        answers.append(loop.stop(timeout=math.inf))  # fails before: waits for run(), which waits for it

    loop = _real_loop(handler, workers=2)
    t = _run(loop)
    t.join(DEADLOCK_S)
    assert not t.is_alive(), "run() and the handler's stop(timeout=inf) wait for each other"
    assert answers == [False]  # it returned at once: run() had not returned then
    assert loop.statistics().acked == 1


def test_10_a_wait_predicate_may_read_the_loop() -> None:
    loop = _real_loop(lambda m: None, bodies=(b"a", b"b"), workers=2)
    t = _run(loop)
    try:
        waiter = threading.Thread(target=lambda: loop.wait(
            lambda s: loop.state().held == 0 and loop.statistics().acked >= 2), daemon=True)
        waiter.start()
        waiter.join(DEADLOCK_S)  # fails before: the predicate took the loop's lock it ran under
        assert not waiter.is_alive(), "the predicate deadlocked the loop's lock"
    finally:
        loop.stop()
        t.join(DEADLOCK_S)
    assert not t.is_alive()


def test_wait_on_a_finished_loop_holding_nothing_returns_whatever_its_bound() -> None:
    """Adversarial 03: wait(timeout=1e10) raised OverflowError; with no bound now, it must not wait
    for a change that can never come."""
    loop = _real_loop(lambda m: None, bodies=())
    assert loop.stop(timeout=1) is True  # never ran: closed here
    for timeout in (None, math.inf, 1e10, 10**400):
        assert loop.wait(lambda s: False, timeout=timeout) is False
    for bad in (math.nan, -1):
        with pytest.raises(ValueError, match="wait timeout"):
            loop.wait(lambda s: True, timeout=bad)  # fails before for NaN: blocks for ever


@pytest.mark.parametrize("first", [None, 3600.0])
def test_11_a_later_shorter_stop_ends_a_drain_already_waiting(first: float | None) -> None:
    release = threading.Event()
    loop = _real_loop(lambda m: release.wait(DEADLOCK_S * 2), workers=2)
    t = _run(loop)
    try:
        assert loop.wait(lambda s: s.received == 1)
        stopper = threading.Thread(target=loop.stop, kwargs={"timeout": first}, daemon=True)
        stopper.start()  # e.g. SIGTERM: the drain now waits for the hung handler, bounded by `first`
        # the drain waits on the dispatcher now (for the hung handler), bounded by `first`
        wait_until(lambda: loop.dispatcher.statistics().watchers >= 1, what="the drain to wait on the dispatcher")
        loop.stop(timeout=0)
        t.join(DEADLOCK_S)  # fails before: the drain kept waiting on the first stop's bound
        assert not t.is_alive(), f"run() kept draining past stop(timeout=0) after stop({first})"
        assert not release.is_set()  # it ended while the handler still ran: the new deadline, not the handler
    finally:
        release.set()
        t.join(DEADLOCK_S)


def test_12_a_message_offered_while_the_drain_gives_the_backlog_back_is_given_back() -> None:
    """The feeder is inside submit (its key=) when stop(timeout=0) closes the dispatcher and gives
    the backlog back: that message was being offered, so it was skipped; submit then raised
    DispatcherClosed and the offer put it back to waiting, after the last give-back."""
    clock = Clock()
    _, consumer = consumer_with_messages(clock)
    loop: ConsumeLoop
    calls = []

    def key(m: Any) -> str:
        calls.append(m)
        if len(calls) == 2:  # the dispatcher's own call, inside submit: the drain passes now
            loop._give_back_backlog()
            loop.dispatcher.close(drain=False)
        return "k"

    loop = ConsumeLoop(consumer, lambda m: None, key=key, workers=1, invisible_duration=30, monotonic=clock)
    assert loop.poll() == 1
    loop.settle_ready()
    s = loop.statistics()
    assert (s.held, s.given_back, s.not_started) == (0, 1, 1), s  # fails before: held 1, never settled


def test_14_a_timeout_reported_before_the_start_gate_lets_nothing_start() -> None:
    """The watchdog reports TIMEOUT (its clock starts when a worker picks the message up) while the
    worker is still in the loop's start gate: the message is given back and counted not started,
    and its handler never starts."""
    clock = Clock()
    _, consumer = consumer_with_messages(clock)
    ran: list[Any] = []
    loop = ConsumeLoop(consumer, ran.append, workers=1, invisible_duration=30, handler_timeout=1,
                       monotonic=clock)
    try:
        msg = consumer.receive(1, 30)[0]
        loop._own([msg])  # held, as a receive leaves it
        (lease,) = loop._leases.values()
        lease.state = 1  # SUBMITTED: a worker picked it up, and is in the start gate
        loop._on_done(msg, Outcome.TIMEOUT, HandlerTimeout(2.0, 1.0))  # the watchdog, meanwhile
        with pytest.raises(Exception, match="outcome was reported"):
            loop._start_handler(msg)  # the gate ends: fails before, the handler started here
        assert ran == []
        loop.settle_ready()
        s = loop.statistics()
        assert (s.failed, s.not_started, s.given_back, s.retry_scheduled) == (0, 1, 1, 0), s
    finally:
        loop.stop(timeout=1)


@pytest.mark.parametrize("shutdown_timeout", [math.inf, None])
def test_07_sibling_a_listener_shutting_its_own_push_consumer_down_does_not_wait_for_itself(
        shutdown_timeout: float | None) -> None:
    """The same class as 07 one layer up: DemandPushConsumer.shutdown() from its listener stopped the
    loop with its shutdown_timeout and joined the runner, whose drain waited for that listener (a
    finite bound only ended it at the bound; no bound, never)."""
    from tracer.clients.demandpush import DemandPushConsumer
    from tracer.embedded import EmbeddedBroker, Message, Producer

    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("T")
    done = threading.Event()
    dp: DemandPushConsumer

    class Listener:
        def consume(self, m: Any) -> None:
            dp.shutdown()  # fails before: waits for ever (None was refused before: a TypeError)
            done.set()

    dp = DemandPushConsumer(broker, "G", Listener(), {"T": None}, consumption_thread_count=1,
                            invisible_duration=5, shutdown_timeout=shutdown_timeout)
    dp.startup()
    producer = Producer(broker, ["T"])
    producer.startup()
    m = Message()
    m.topic, m.body = "T", b"x"
    producer.send(m)
    assert done.wait(DEADLOCK_S), "the listener's shutdown() waited for its own drain"
    runner = dp._runner
    assert runner is not None
    runner.join(DEADLOCK_S)
    assert not runner.is_alive() and not dp.running
