"""receive_ahead: a running handler one round trip from its expected end counts as room (ahead.py)."""

import math
import threading
import warnings
from fractions import Fraction

import pytest
from embedded_rig import consumer_with_messages
from manual_clock import Clock
from waiting import wait_until

from tracer.clients.ahead import MAX_LEAD_S, ReceiveAhead, sent_cost
from tracer.clients.consume import ConsumeLoop, FlowOptions
from tracer.clients.demandpush import DemandPushConsumer
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.names import COST_PROPERTY


class Carrying:
    def __init__(self, **props: object) -> None:
        self.properties = props


@pytest.mark.parametrize(("raw", "cost"), [
    ("1.5", 1.5), ("0", 0.0), ("nan", None), ("-1", None), ("inf", None), ("1e15", None), ("abc", None),
    ("1" * 33, None), (1.5, None), (None, None),
])
def test_sent_cost_reads_what_send_job_wrote_and_nothing_else(raw, cost):
    msg = Carrying(**({} if raw is None else {COST_PROPERTY: raw}))
    assert sent_cost(msg) == cost


def test_sent_cost_of_a_message_without_properties_is_unknown():
    assert sent_cost(object()) is None
    assert sent_cost(Carrying.__new__(Carrying)) is None


def test_nothing_counts_ahead_before_a_round_trip_was_measured():
    ahead = ReceiveAhead(lambda m: 1.0)
    assert ahead.lead == 0.0
    assert ahead.soon([("m", 1.0)]) == 0 and ahead.wake_in([("m", 0.5)]) is None


def test_the_lead_is_the_median_round_trip_at_most_max_lead():
    ahead = ReceiveAhead(lambda m: 1.0)
    for trip in (0.004, 0.010, 0.006, math.nan, -1.0):
        ahead.observe(trip)
    assert ahead.lead == pytest.approx(0.006)
    for _ in range(40):
        ahead.observe(1.0)  # a stalled proxy: the loop still never counts a handler a second ahead
    assert ahead.lead == MAX_LEAD_S


def test_a_handler_counts_within_one_lead_of_its_cost_either_side():
    ahead = ReceiveAhead(lambda m: m)
    ahead.observe(0.01)
    running = [(1.0, 0.995), (1.0, 1.005), (1.0, 0.98), (1.0, 1.02), (1.0, 0.5), (2.0, 1.995)]
    assert ahead.soon(running) == 3  # 1.02 overran by more than the lead: a wrong cost holds no more
    assert ahead.wake_in([(1.0, 0.5), (2.0, 1.0)]) == pytest.approx(0.49)
    assert ahead.wake_in([(1.0, 1.2)]) is None  # past its cost: it never comes within the lead again


def test_an_unknown_raising_or_junk_cost_never_counts():
    def cost(m):
        if m == "raise":
            raise RuntimeError("no cost")
        return m

    async def coroutine():
        return 1.0

    ahead = ReceiveAhead(cost)
    ahead.observe(0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine left unawaited would warn
        pending = coroutine()
        assert ahead.soon([("raise", 1.0), (None, 1.0), (math.nan, 1.0), (-1.0, 0.0), (pending, 1.0),
                           (True, 1.0), (1e15, 1e15)]) == 0
    assert pending.cr_frame is None  # closed
    assert ahead.soon([(Fraction(1), 1.0), (1, 1.0)]) == 2  # any real but a bool, as the dispatcher's cost=


def test_receive_ahead_is_a_bool_and_not_with_prefetch():
    with pytest.raises(TypeError, match="receive_ahead must be a bool"):
        FlowOptions(receive_ahead="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="receive_ahead cannot work with prefetch=1"):
        FlowOptions(receive_ahead=True, prefetch=1)


def _loop(clock: Clock, handler, *, ahead: bool, n: int = 3, trip: float = 0.04) -> ConsumeLoop:
    broker = EmbeddedBroker(monotonic=clock, min_receive_invisible=1)
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    for i in range(n):
        m = Message()
        m.topic, m.body = "T", f"{i}".encode()
        m.add_property(COST_PROPERTY, "1.0")
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    consumer.startup()
    receive = consumer.receive

    def timed_receive(k: int, invisible: int):
        got = receive(k, invisible)
        if got:
            clock.advance(trip)  # the round trip, on the loop's clock
        return got

    consumer.receive = timed_receive  # type: ignore[method-assign]
    return ConsumeLoop(consumer, handler, monotonic=clock, workers=1, invisible_duration=30,
                       receive_ahead=ahead)


@pytest.mark.parametrize("ahead", [True, False])
def test_one_message_is_received_for_a_handler_about_to_end_and_no_more(ahead):
    clock = Clock()
    gate = threading.Event()
    started = []

    def handler(m):
        started.append(m)
        gate.wait(30)

    loop = _loop(clock, handler, ahead=ahead)
    try:
        assert loop.poll() == 1
        assert loop.statistics().ahead_lead_s == (pytest.approx(0.04) if ahead else 0.0)  # the round trip, measured
        wait_until(lambda: len(started) == 1, what="the first handler to start")
        clock.advance(0.5)
        assert loop.poll() is None  # half a second from its end: no room
        clock.advance(0.47)  # 0.01 s from its cost of 1 s, the lead is 0.04 s
        assert loop.poll() == (1 if ahead else None)
        assert loop.poll() is None  # that one waits for this worker: no second one for it
        assert loop.state().waiting == (1 if ahead else 0)
        gate.set()
        wait_until(lambda: loop.statistics().succeeded == 1, what="the first handler to end")
        loop.settle_ready()  # its ack: an outcome waiting for it counts against the room
        loop.poll()  # the waiting one starts on the freed worker (or, without ahead, one is received)
        wait_until(lambda: len(started) == 2, what="the second handler to start")
    finally:
        gate.set()
        loop.stop()
        loop.settle_ready()
        loop.dispatcher.close(timeout=10)


def test_the_push_replacement_passes_receive_ahead_to_its_loop():
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("T")

    class Listener:
        def consume(self, message):
            return None

    push = DemandPushConsumer(broker, "G", Listener(), {"T": None}, consumption_thread_count=2,
                              receive_ahead=True)
    push.startup()
    try:
        assert push.loop is not None and push.loop.flow.receive_ahead
    finally:
        push.shutdown()
    with pytest.raises(TypeError, match="receive_ahead must be a bool"):
        DemandPushConsumer(broker, "G", Listener(), {"T": None}, receive_ahead=1)  # type: ignore[arg-type]


def test_run_with_receive_ahead_handles_a_job_once_each_and_settles_everything():
    """run()'s wait wakes for a handler coming within the lead: the whole job runs, each once, acked."""
    broker, consumer = consumer_with_messages(bodies=tuple(f"{i}".encode() for i in range(40)), await_duration=0.05,
                                              properties={COST_PROPERTY: "0.005"})
    seen = []
    lock = threading.Lock()

    def handler(m):
        with lock:
            seen.append(m.body)
        threading.Event().wait(0.005)  # real time: the handler's cost, what receive_ahead predicts

    loop = ConsumeLoop(consumer, handler, workers=3, invisible_duration=30, receive_ahead=True)
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    try:
        assert loop.wait(lambda s: s.acked == 40, timeout=60)
    finally:
        loop.stop()
        t.join(30)
    s = loop.statistics()
    assert sorted(seen) == sorted(f"{i}".encode() for i in range(40))  # each once
    assert (s.received, s.acked, s.given_back, s.held) == (40, 40, 0, 0)
    assert s.ahead_lead_s > 0  # round trips were measured
