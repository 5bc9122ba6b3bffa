"""Faults of the consume loop: stop() from a signal handler, infinite timeouts."""
import math
import threading
import time

import pytest
from embedded_rig import consumer_with_messages
from test_consume import pipeline, run_in_thread
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.embedded import Message


def test_stop_while_this_thread_holds_the_lock_returns_and_the_loop_stops():
    # a signal handler runs on the thread it interrupted: that thread may hold the loop's lock
    broker, loop = pipeline(3, lambda m: None)
    t = run_in_thread(loop)
    with loop._lock:  # the interrupted main thread, inside statistics() or wait()'s predicate
        t0 = time.monotonic()
        assert loop.stop() in (False, True)  # fails before: blocks forever on the held lock
        # blocking is for ever (the lock is ours): any bound a loaded machine keeps tells the two apart
        assert time.monotonic() - t0 < 10.0
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


    clock = Clock()
    broker, consumer = consumer_with_messages(clock, await_duration=0.05)
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
    # one clock for both timelines: the broker's pop time (wall, in its handles) moves with it
    broker = EmbeddedBroker(min_receive_invisible=1, monotonic=clock, wall_ms=lambda: int(clock() * 1000))
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.05)
    consumer.startup()
    client = _OneSlowRenewal(consumer, clock, t0)
    release = threading.Event()
    loop = ConsumeLoop(client, lambda m: release.wait(30), invisible_duration=10, workers=2, monotonic=clock,
                       wall=clock)

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


# -- a lease is dated from what the broker decided (#30 item 3) ----------------------------------
class _StallInReceive:
    """A client double: the broker pops the batch, then the process stalls while the answer is in
    flight (the clock jumps ``stall`` s) before ``receive`` returns. ``opaque``: the handles it
    returns cannot be read (another broker's layout)."""

    def __init__(self, consumer, clock, stall, opaque=False):
        self._c, self._clock, self._stall, self._opaque = consumer, clock, stall, opaque

    def __getattr__(self, name):
        return getattr(self._c, name)

    def receive(self, n, invisible):
        got = self._c.receive(n, invisible)
        if got:
            self._clock.advance(self._stall)
            if self._opaque:
                for m in got:
                    m.receipt_handle = "opaque-" + m.receipt_handle.replace(" ", "_")
        return got


@pytest.mark.parametrize("opaque", [False, True], ids=["handle-read", "handle-unreadable"])
def test_a_stall_while_receive_is_in_flight_does_not_start_a_dead_lease(opaque):
    from manual_clock import Clock


    clock = Clock()
    broker, consumer = consumer_with_messages(clock, await_duration=0.05, wall=True)
    ran = []
    loop = ConsumeLoop(_StallInReceive(consumer, clock, 11, opaque), lambda msg: ran.append(msg), workers=1,
                       invisible_duration=10, monotonic=clock, wall=clock)
    try:
        assert loop.poll() == 1  # the broker's lease (10 s) ended during the 11 s stall
        wait_until(lambda: loop.statistics().reported == 1, what="its outcome")
        loop.settle_ready()
        assert ran == []  # fails before: dated from receive's return, the dead lease looked live
        s = loop.statistics()
        assert s.not_started == 1 and s.expired == 1 and s.held == 0
        assert len(consumer.receive(1, 10)) == 1  # the broker's again: a peer would have it now
    finally:
        loop.dispatcher.close(timeout=5)


def test_the_embedded_handle_carries_the_pop_time_and_lease_as_the_proxys_does():
    from manual_clock import Clock

    from tracer.clients.lease import broker_lease

    clock = Clock()
    broker, consumer = consumer_with_messages(clock, await_duration=0, wall=True)
    got = consumer.receive(1, 7)
    assert broker_lease(got[0].receipt_handle) == (int(clock() * 1000), 7000)
    clock.advance(3)
    consumer.change_invisible_duration(got[0], 12)  # a renewal's handle: the renewal's time and length
    assert broker_lease(got[0].receipt_handle) == (int(clock() * 1000), 12000)
    consumer.ack(got[0])


@pytest.mark.parametrize("junk", [None, "", "a b c", "0 x 15000 7 0 b 1 0 9", "0 0 15000 7 0 b 1 0", 5])
def test_a_handle_not_in_the_proxys_layout_is_not_read(junk):
    from tracer.clients.lease import broker_lease

    assert broker_lease(junk) is None


@pytest.mark.integration
def test_the_real_proxys_handle_brackets_the_receive_call():
    from rmq_real import ensure_broker, fresh_group, fresh_topic, message, quietly, start_producer, start_simple

    from tracer.clients.lease import broker_lease

    ensure_broker()
    topic, group = fresh_topic("rt-handle"), fresh_group("rt-handle")
    producer = start_producer(topic)
    consumer = start_simple(group, topic)
    try:
        producer.send(message(topic, "x"))
        got: list = []
        for _ in range(20):  # a new group's first receives may come back empty
            before = time.time()
            got = consumer.receive(1, 15)
            after = time.time()
            if got:
                break
        assert got, "the proxy returned nothing"
        decided = broker_lease(got[0].receipt_handle)
        assert decided is not None, got[0].receipt_handle
        popped_ms, invisible_ms = decided
        # the same host, so the same wall clock: the broker popped it while the call was in flight
        assert math.floor(before * 1000) <= popped_ms <= math.ceil(after * 1000)
        assert invisible_ms == 15000
        consumer.ack(got[0])
    finally:
        quietly(consumer.shutdown)
        quietly(producer.shutdown)


def _hang_every_worker(broker, loop, ran, workers=2):
    """Send and poll until every worker runs one (``random`` may route two to one worker)."""
    producer = __import__("tracer.embedded", fromlist=["Producer"]).Producer(broker, ["T"])
    producer.startup()
    for i in range(40):
        if len(ran) >= workers:
            return
        m = Message()
        m.topic, m.body = "T", f"h{i}".encode()
        producer.send(m)
        loop.poll()
        wait_until(lambda n=i: loop.statistics().received > n, what="received")
        time.sleep(0.02)  # real-time: let a worker pick it up before the next one is routed
    wait_until(lambda: len(ran) >= workers, what="every worker hangs")


# -- every worker hung: no room, and what waits for them is let go (#30 item 5) -------------------
@pytest.mark.parametrize("policy", ["aggressive", "cost_aware", "round_robin", "random"])
def test_with_every_worker_hung_the_loop_receives_nothing_and_lets_unstartable_leases_go(policy):
    from manual_clock import Clock

    clock = Clock()
    release = threading.Event()
    ran = []

    def hang(m):
        ran.append(m.body)
        release.wait(30)

    broker, loop = pipeline(0, hang, clock=clock, workers=2, policy=policy, handler_timeout=1.0,
                            invisible=30, retry_backoff=lambda attempt: 60)
    try:
        _hang_every_worker(broker, loop, ran)
        clock.advance(2)
        assert loop.dispatcher.check_timeouts() == 2  # reported TIMEOUT: both workers now overrun
        wait_until(lambda: loop.statistics().reported >= 2, what="the TIMEOUTs")
        loop.settle_ready()
        before = loop.statistics().received
        producer = __import__("tracer.embedded", fromlist=["Producer"]).Producer(broker, ["T"])
        producer.startup()
        for i in range(3):
            m = Message()
            m.topic, m.body = "T", f"late{i}".encode()
            producer.send(m)
        # fails before (cost_aware: its window; round_robin/random: the hung workers' buffers):
        # the loop received messages no worker can start, and renewed them
        got = loop.poll()
        assert not got, f"{policy}: received {got} with every worker hung"
        assert loop.statistics().received == before
    finally:
        release.set()
        loop.dispatcher.close(timeout=5)


@pytest.mark.parametrize("policy", ["aggressive", "cost_aware", "round_robin", "random"])
def test_with_every_worker_hung_queued_messages_are_not_renewed(policy):
    from manual_clock import Clock

    clock = Clock()
    release = threading.Event()
    ran = []

    def hang(m):
        ran.append(m.body)
        release.wait(30)

    broker, loop = pipeline(4, hang, clock=clock, workers=2, policy=policy, handler_timeout=1.0,
                            invisible=30, retry_backoff=lambda attempt: 60)
    try:
        loop.poll()
        _hang_every_worker(broker, loop, ran)
        clock.advance(2)
        loop.dispatcher.check_timeouts()
        wait_until(lambda: loop.statistics().reported >= 2, what="the TIMEOUTs")
        loop.settle_ready()
        queued = loop.statistics().held  # received, waiting in the dispatcher for a worker
        clock.advance(20)  # their leases fall due
        loop.renew_leases()
        s = loop.statistics()
        # fails before (cost_aware): the window's messages were renewed for as long as the hang lasted
        assert s.leases_extended == 0 and s.let_go == queued, (policy, queued, s)
        release.set()
        assert loop.dispatcher.wait_idle(timeout=10)
        loop.settle_ready()
        s = loop.statistics()
        assert len(ran) == 2 and s.held == 0  # none of them started on its dead lease
        assert s.received == s.acked + s.retry_scheduled + s.given_back + s.ack_errors + s.expired
    finally:
        release.set()
        loop.dispatcher.close(timeout=5)


def test_base_exception_from_a_finish_listener_is_contained_and_the_loop_goes_on():
    # listeners run where a trace finishes: on a dispatcher worker, which logs and swallows even a
    # BaseException (a worker never dies, docs/dispatch.md); the loop acks all and run() returns
    from tracer.telemetry.tracer import MessageTracer

    fired = []

    def listener(trace, outcome):
        if not fired:
            fired.append(1)
            raise KeyboardInterrupt

    broker, loop = pipeline(3, lambda m: None, tracer=MessageTracer(consumer_group="G", listeners=[listener]))
    t = run_in_thread(loop)
    assert loop.wait(lambda s: s.acked == 3, 10) and fired
    loop.stop()
    t.join(10)
    assert not t.is_alive() and loop.statistics().held == 0


def test_a_ctrl_c_from_key_on_a_hung_message_in_the_feeder_stops_run():
    # the feeder asked key= of the hung (overrun) messages before it marked anything: a Ctrl-C there
    # ended the feeder silently, and run() went on receiving into a backlog nobody fed. Since the
    # adversarial review's 14 the loop never asks key= of a hung message again (it reads the key
    # recorded at its TIMEOUT); a Ctrl-C from key= of the next message, on the feeder's thread or
    # run()'s, must stop run() the same way
    from manual_clock import Clock

    clock = Clock()
    release = threading.Event()
    armed = []

    def key(m):
        if armed and m.body == b"next":
            raise KeyboardInterrupt
        return "k"

    broker, loop = pipeline(1, lambda m: release.wait(30), clock=clock, workers=1, key=key, prefetch=2,
                            handler_timeout=1.0)
    raised = []

    def run():
        try:
            loop.run()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            raised.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        wait_until(lambda: len(loop.dispatcher.running()) == 1, what="the first message runs")
        clock.advance(2)
        loop.dispatcher.check_timeouts()  # it hangs past its timeout: the feeder now asks its key
        armed.append(1)
        producer = __import__("tracer.embedded", fromlist=["Producer"]).Producer(broker, ["T"])
        producer.startup()
        m = Message()
        m.topic, m.body = "T", b"next"
        producer.send(m)
        t.join(10)
        assert not t.is_alive(), "run() went on after the feeder died"  # fails before
        assert [type(e) for e in raised] == [KeyboardInterrupt]
    finally:
        release.set()
        loop.stop(timeout=1)
        t.join(10)
