"""Faults of the consume loop: stop() from a signal handler, infinite timeouts."""
import math
import threading
import time

import pytest
from test_consume import pipeline, run_in_thread
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop


def test_stop_while_this_thread_holds_the_lock_returns_and_the_loop_stops():
    # a signal handler runs on the thread it interrupted: that thread may hold the loop's lock
    broker, loop = pipeline(3, lambda m: None)
    t = run_in_thread(loop)
    with loop._lock:  # the interrupted main thread, inside statistics() or wait()'s predicate
        t0 = time.monotonic()
        assert loop.stop() in (False, True)  # fails before: blocks forever on the held lock
        assert time.monotonic() - t0 < 1.0
    t.join(10)
    assert not t.is_alive()
    assert loop.stopping


def test_stop_with_infinite_timeout_waits_without_bound():
    broker, loop = pipeline(3, lambda m: None)
    t = run_in_thread(loop)
    loop.wait(lambda s: s.acked == 3, 10)
    assert loop.stop(timeout=math.inf) is True  # fails before: OverflowError
    t.join(5)
    assert not t.is_alive()


@pytest.mark.parametrize("bad", [math.nan, -1.0])
def test_stop_refuses_nan_and_negative_timeouts(bad):
    broker, loop = pipeline(0, lambda m: None)
    with pytest.raises(ValueError):
        loop.stop(timeout=bad)
    loop.stop()


def test_demandpush_refuses_nan_shutdown_timeout_at_construction():
    from test_demandpush import Listener

    from tracer.clients.demandpush import DemandPushConsumer
    from tracer.embedded import EmbeddedBroker

    with pytest.raises(ValueError):  # fails before: NaN passed `< 0` and was accepted
        DemandPushConsumer(client_configuration=EmbeddedBroker(), consumer_group="g",
                           message_listener=Listener(), subscription={"t": None}, shutdown_timeout=math.nan)
    DemandPushConsumer(client_configuration=EmbeddedBroker(), consumer_group="g",
                       message_listener=Listener(), subscription={"t": None}, shutdown_timeout=math.inf)


# -- a BaseException from user code the loop calls on its own threads (#30 item 6) --------------
class _Interrupt(BaseException):
    """Stands for KeyboardInterrupt/SystemExit without disturbing pytest's own handling of them."""


def _raise_on(fn_name, exc_type):
    """One user callable of the loop that raises ``exc_type`` on its first call, then behaves."""
    fired = []

    def fn(*args):
        if not fired:
            fired.append(1)
            raise exc_type("Ctrl-C while user code ran")
        return {"cost": 1.0, "key": None, "until": False, "retry_backoff": 1.0}[fn_name]
    return fn, fired


_CALLABLES = ["cost", "key", "until", "retry_backoff"]


@pytest.mark.parametrize("exc_type", [_Interrupt, KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("where", _CALLABLES)
@pytest.mark.parametrize("prefetch", [0, 4])
def test_base_exception_from_user_callable_stops_run_and_leaves_nothing_held(where, exc_type, prefetch):
    fn, fired = _raise_on(where, exc_type)
    kw = {"prefetch": prefetch}
    until = None
    if where == "until":
        until = fn
    else:
        kw[where] = fn
    handler = (lambda m: 1 / 0) if where == "retry_backoff" else (lambda m: None)  # a nack asks retry_backoff
    broker, loop = pipeline(3, handler, **kw)
    raised = []

    def run():
        try:
            loop.run(until)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            raised.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)  # fails before (cost=, key=): run() spins for ever on a message left "submitted"
    assert fired, f"{where}= was never called"
    assert not t.is_alive(), f"run() did not return after {exc_type.__name__} from {where}="
    assert loop.stopping
    assert [type(e) for e in raised] == [exc_type]  # re-raised once, on run()'s thread
    s = loop.statistics()
    assert s.held == 0
    assert s.received == s.acked + s.retry_scheduled + s.given_back + s.ack_errors + s.expired


def test_base_exception_from_a_wait_predicate_leaves_the_loop_usable():
    broker, loop = pipeline(3, lambda m: None)
    t = run_in_thread(loop)

    def pred(s):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        loop.wait(pred, 5)
    assert loop.wait(lambda s: s.acked == 3, 10)  # the lock was released: the loop goes on
    loop.stop()
    t.join(10)
    assert not t.is_alive()


# -- only the probe sender's own marker makes a probe (#30 item 13) ------------------------------
@pytest.mark.parametrize("value", ["false", "0", "true", "yes", " 1", "11"])
def test_a_user_message_with_another_probe_value_runs_and_is_acked(value):
    from tracer.embedded import Message
    from tracer.path.names import PROBE_PROPERTY

    ran = []
    broker, loop = pipeline(0, lambda m: ran.append(m.body))
    producer = __import__("tracer.embedded", fromlist=["Producer"]).Producer(broker, ["T"])
    producer.startup()
    m = Message()
    m.topic, m.body = "T", b"user"
    m.add_property(PROBE_PROPERTY, value)
    producer.send(m)
    t = run_in_thread(loop)
    assert loop.wait(lambda s: s.acked == 1, 10)
    loop.stop()
    t.join(10)
    assert ran == [b"user"]  # fails before: any non-empty value was acked unrun as a probe


@pytest.mark.parametrize("value", ["1", b"1"])
def test_the_probe_senders_marker_still_makes_a_probe(value):
    from tracer.clients.probe import is_probe
    from tracer.path.names import PROBE_PROPERTY

    assert is_probe({PROBE_PROPERTY: value})


# -- no two copies at once in the process, across loops (#30 item 7) -----------------------------
def test_a_new_loop_on_the_same_consumer_does_not_run_the_copy_beside_the_hung_first_call():
    from manual_clock import Clock

    from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer

    clock = Clock()
    broker = EmbeddedBroker(min_receive_invisible=1, monotonic=clock)
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    m = Message()
    m.topic, m.body = "T", b"x"
    producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.05)
    consumer.startup()
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def hang(msg):
        started.set()
        try:
            release.wait(30)
        finally:
            ended.set()

    first = ConsumeLoop(consumer, hang, invisible_duration=10, workers=1, monotonic=clock)
    t = run_in_thread(first)
    ran = []
    second = ConsumeLoop(consumer, lambda msg: ran.append(msg.delivery_attempt), invisible_duration=10,
                         workers=1, monotonic=clock)
    try:
        assert started.wait(10)
        assert first.stop(timeout=0.05) is True  # run() returned; the hung call goes on
        t.join(5)
        clock.advance(11)  # its lease ends (no keeper any more): the broker hands the copy out again
        assert second.poll() == 1
        wait_until(lambda: second.statistics().reported == 1, what="the copy's outcome")
        second.settle_ready()
        s = second.statistics()
        assert ran == []  # fails before: the second loop ran the copy beside the hung first call
        assert (s.not_started, s.given_back, s.failed) == (1, 1, 0)
    finally:
        release.set()
    assert ended.wait(10)
    # the first call really ended: the guard is released, the next copy runs
    clock.advance(11)
    wait_until(lambda: second.poll() == 1, what="the next copy")
    wait_until(lambda: second.statistics().reported == 2, what="its outcome")
    second.settle_ready()
    assert len(ran) == 1 and second.statistics().acked == 1
    second.dispatcher.close()


# -- one slow renewal does not hold up the others (#30 item 4) ----------------------------------
class _OneSlowRenewal:
    """A client double whose first renewal of message ``A`` stalls: the clock jumps to when ``B``
    falls due, the call waits (bounded) for ``B``'s renewal, then the clock jumps past ``B``'s
    original deadline and the call returns. A keeper that waits for ``A`` before its next pass
    renews ``B`` too late: lost."""

    def __init__(self, consumer, clock, t0):
        self._c, self._clock, self._t0 = consumer, clock, t0
        self.b_renewed = threading.Event()
        self.slow_entered = threading.Event()

    def __getattr__(self, name):
        return getattr(self._c, name)

    def change_invisible_duration(self, m, seconds):
        body = m.body
        answer = self._c.change_invisible_duration(m, seconds)  # the broker decided; its answer is slow
        if body == b"A" and seconds > 1 and not self.slow_entered.is_set():
            self.slow_entered.set()
            self._clock.advance(self._t0 + 12 - self._clock())  # B falls due while A's call is in flight
            self.b_renewed.wait(5)  # bounded: a keeper stuck on this call loses B, it does not hang
            self._clock.advance(self._t0 + 16 - self._clock())  # past B's first deadline (t0 + 15)
        elif body == b"B" and seconds > 1:
            self.b_renewed.set()
        return answer


def test_one_slow_renewal_does_not_delay_the_renewal_of_others_falling_due():
    from manual_clock import Clock

    from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer

    clock = Clock()
    t0 = clock()
    broker = EmbeddedBroker(min_receive_invisible=1, monotonic=clock)
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.05)
    consumer.startup()
    client = _OneSlowRenewal(consumer, clock, t0)
    release = threading.Event()
    loop = ConsumeLoop(client, lambda m: release.wait(30), invisible_duration=10, workers=2, monotonic=clock)

    def send(body):
        m = Message()
        m.topic, m.body = "T", body
        producer.send(m)

    t = run_in_thread(loop)
    try:
        send(b"A")
        wait_until(lambda: loop.statistics().received == 1, what="A held")  # deadline t0 + 10
        clock.advance(5)
        send(b"B")
        wait_until(lambda: loop.statistics().received == 2, what="B held")  # deadline t0 + 15
        clock.advance(2)  # t0 + 7: A is due (margin 3.3 s), B is not
        assert client.slow_entered.wait(10)
        wait_until(lambda: (s := loop.statistics()).leases_extended >= 2 or s.leases_lost > 0,
                   what="A's slow and B's renewals")
        s = loop.statistics()
        # fails before: the keeper waited for A's call, B's lease ended unrenewed (leases_lost 1)
        assert client.b_renewed.is_set() and s.leases_lost == 0
        release.set()
        assert loop.wait(lambda s: s.acked == 2, 10)
        assert loop.statistics().leases_lost == 0
    finally:
        release.set()
        loop.stop(timeout=5)
        t.join(10)
