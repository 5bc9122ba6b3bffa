"""Each rule the tracer relies on, asked of the real RocketMQ 5.5 proxy and of the embedded broker.

The same test body runs over both (``side`` is parametrized); the real side is
``@pytest.mark.integration`` and runs against ``services/rocketmq`` (``minInvisibleTimeMillsForRecv``
is 1000 ms there, so the embedded side is built with ``min_receive_invisible=1`` to match).
Time on the embedded side is a manual clock; on the real side it is the proxy's, so the few waits
past a lease are real-time sleeps (marked).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fifo_side import KINDS, FifoSide

from tracer.embedded import (
    ILLEGAL_INVISIBLE_TIME,
    INVALID_RECEIPT_HANDLE,
    EmbeddedBroker,
    Message,
    Producer,
    SimpleConsumer,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Side:
    """One broker behind the 5.x client's surface, and a way to let its time pass."""

    consumer: Any
    producer: Any
    topic: str

    def send(self, body: str) -> str:
        raise NotImplementedError

    def pass_time(self, seconds: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def receive_one(self, invisible: int, deadline_s: float = 30.0) -> Any:
        end = time.monotonic() + deadline_s
        while True:
            got = self.consumer.receive(1, invisible)
            if got:
                return got[0]
            if time.monotonic() > end:
                raise AssertionError("no message within the deadline")


class EmbeddedSide(Side):
    def __init__(self) -> None:
        self.clock = Clock()
        self.broker = EmbeddedBroker(monotonic=self.clock, min_receive_invisible=1)
        self.topic = "T"
        self.producer = Producer(self.broker, [self.topic])
        self.producer.startup()
        self.consumer = SimpleConsumer(self.broker, "G", {self.topic: None}, await_duration=0)
        self.consumer.startup()

    def send(self, body: str) -> str:
        m = Message()
        m.topic, m.body = self.topic, body.encode()
        return str(self.producer.send(m).message_id)

    def pass_time(self, seconds: float) -> None:
        self.clock.t += seconds


class RealSide(Side):
    def __init__(self) -> None:
        import rmq_real

        rmq_real.ensure_broker()
        self.rmq = rmq_real
        self.topic = rmq_real.fresh_topic("rules")
        group = rmq_real.fresh_group("rules")
        self.producer = rmq_real.start_producer(self.topic)
        self.consumer = rmq_real.start_simple(group, self.topic, await_duration=1)

    def send(self, body: str) -> str:
        return str(self.producer.send(self.rmq.message(self.topic, body)).message_id)

    def pass_time(self, seconds: float) -> None:
        time.sleep(seconds)  # real-time: the proxy decides expiry on its own clock

    def close(self) -> None:
        self.rmq.quietly(self.consumer.shutdown)
        self.rmq.quietly(self.producer.shutdown)


@pytest.fixture(params=["embedded", pytest.param("real", marks=pytest.mark.integration)])
def side(request: pytest.FixtureRequest) -> Any:
    s: Side = EmbeddedSide() if request.param == "embedded" else RealSide()
    yield s
    s.close()


def answer(fn: Any, *args: Any) -> tuple[Any, str]:
    """(code, message) of the broker's refusal; (None, "") when it said yes."""
    try:
        fn(*args)
    except TypeError as exc:
        return "TypeError", str(exc)
    except Exception as exc:  # noqa: BLE001 - whatever the client raises, compare its answer
        return getattr(exc, "code", None), str(exc)
    return None, ""


def test_durations_must_be_whole_seconds(side: Side) -> None:
    assert answer(side.consumer.receive, 1, 2.5)[0] == "TypeError"


def test_receive_invisible_time_below_the_proxy_minimum_is_refused(side: Side) -> None:
    code, text = answer(side.consumer.receive, 1, 0)
    assert code == ILLEGAL_INVISIBLE_TIME and "the invisibleTime is too small. min is 1000" in text


def test_receive_invisible_time_above_the_proxy_maximum_is_refused(side: Side) -> None:
    code, text = answer(side.consumer.receive, 1, 12 * 3600 + 1)
    assert code == ILLEGAL_INVISIBLE_TIME and "the invisibleTime is too large. max is 43200000" in text


def test_change_invisible_duration_above_the_maximum_is_refused(side: Side) -> None:
    side.send("a")
    m = side.receive_one(10)
    handle = m.receipt_handle
    code, text = answer(side.consumer.change_invisible_duration, m, 12 * 3600 + 1)
    assert code == ILLEGAL_INVISIBLE_TIME and "the invisibleTime is too large. max is 43200000" in text
    m.receipt_handle = handle  # see the next test
    side.consumer.ack(m)


@pytest.mark.integration
def test_the_5x_client_blanks_the_receipt_handle_when_a_renewal_is_refused() -> None:
    """rocketmq-python-client 5.1.2 stores the answer's handle before it checks the status, so a
    refused renewal leaves ``receipt_handle == ""`` and every later ack fails (50001): the consume
    loop keeps its own copy of each handle for this reason."""
    side = RealSide()
    try:
        side.send("a")
        m = side.receive_one(10)
        handle = m.receipt_handle
        assert answer(side.consumer.change_invisible_duration, m, 12 * 3600 + 1)[0] == ILLEGAL_INVISIBLE_TIME
        assert m.receipt_handle == ""
        assert answer(side.consumer.ack, m)[0] is not None
        m.receipt_handle = handle
        assert answer(side.consumer.ack, m) == (None, "")
    finally:
        side.close()


def test_ack_with_an_expired_receipt_handle_is_refused(side: Side) -> None:
    side.send("a")
    m = side.receive_one(1)
    side.pass_time(1.5)
    code, _ = answer(side.consumer.ack, m)  # the ack answer's text is the code's name on the proxy
    assert code == INVALID_RECEIPT_HANDLE


def test_renewal_with_an_expired_receipt_handle_is_refused(side: Side) -> None:
    side.send("a")
    m = side.receive_one(1)
    side.pass_time(1.5)
    code, text = answer(side.consumer.change_invisible_duration, m, 10)
    assert code == INVALID_RECEIPT_HANDLE and "receipt handle is expired" in text


def test_only_expiry_invalidates_a_handle_a_replaced_one_and_a_second_ack_are_accepted(side: Side) -> None:
    side.send("a")
    m = side.receive_one(10)
    old = m.receipt_handle
    side.consumer.change_invisible_duration(m, 10)
    assert m.receipt_handle != old
    new = m.receipt_handle
    m.receipt_handle = old
    assert answer(side.consumer.ack, m) == (None, "")
    m.receipt_handle = new
    assert answer(side.consumer.ack, m) == (None, "")  # a second ack: accepted too
    side.pass_time(1.5)
    assert side.consumer.receive(1, 10) == []  # acked: it does not come back


def test_a_renewal_after_the_ack_is_accepted_and_brings_the_message_back(side: Side) -> None:
    """Why the loop never renews a message once its ack has begun (one lock per message)."""
    mid = side.send("a")
    m = side.receive_one(10)
    side.consumer.ack(m)
    assert answer(side.consumer.change_invisible_duration, m, 1) == (None, "")
    side.pass_time(1.5)
    again = side.receive_one(10)
    assert (again.message_id, again.delivery_attempt) == (mid, 2)
    side.consumer.ack(again)


def test_change_invisible_duration_to_zero_is_accepted(side: Side) -> None:
    side.send("a")
    m = side.receive_one(10)
    assert answer(side.consumer.change_invisible_duration, m, 0) == (None, "")


def test_an_unacked_message_comes_back_with_the_next_delivery_attempt(side: Side) -> None:
    mid = side.send("a")
    first = side.receive_one(1)
    assert (first.message_id, first.delivery_attempt) == (mid, 1)
    side.pass_time(1.5)
    again = side.receive_one(10)
    assert (again.message_id, again.delivery_attempt) == (mid, 2)
    side.consumer.ack(again)


def test_a_message_given_back_by_change_invisible_duration_comes_back_with_the_next_attempt(side: Side) -> None:
    mid = side.send("a")
    first = side.receive_one(10)
    side.consumer.change_invisible_duration(first, 1)  # what the loop does after a failure
    side.pass_time(1.5)
    again = side.receive_one(10)
    assert (again.message_id, again.delivery_attempt) == (mid, 2)
    side.consumer.ack(again)


# -- a FIFO topic: a queue's consecutive run, the queue blocked while one of it is in flight -----
def bodies(messages: list[Any]) -> list[str]:
    return [m.body.decode() for m in messages]


def attempts(messages: list[Any]) -> list[int]:
    return [m.delivery_attempt for m in messages]


@pytest.fixture(params=KINDS)
def one_queue(request: pytest.FixtureRequest) -> Any:
    side = FifoSide(request.param, queues=1)
    yield side
    side.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_fifo_group_is_handed_out_in_send_order_each_message_once(kind: str) -> None:
    """Four queues: each group in send order, each message once, and a receive may carry several
    of one group (a queue's run: ``a0 b0 a1 b1 a2 b2 c0 c1`` on the proxy, a and b sharing a queue)."""
    side = FifoSide(kind, queues=4)
    try:
        side.send(*(f"{g}{i}" for i in range(3) for g in "abc"))  # interleaved groups
        seen: dict[str, list[int]] = {}
        several = False
        end = time.monotonic() + 60
        while sum(map(len, seen.values())) < 9:
            assert time.monotonic() < end, f"not every message came within 60 s: {seen}"
            held = side.consumer.receive(8, 10)
            groups = [m.message_group for m in held]
            several |= any(groups.count(g) > 1 for g in groups)
            for m in held:
                seen.setdefault(m.message_group, []).append(int(m.body.decode()[1:]))
            for m in held:
                side.consumer.ack(m)
        assert seen == {g: [0, 1, 2] for g in "abc"}, seen
        assert several, "no receive carried two of one group"
    finally:
        side.close()


def test_a_fifo_receive_is_the_queues_run_and_the_queue_then_waits(one_queue: FifoSide) -> None:
    """A receive takes the queue's consecutive run in send order, several of one group and of
    several groups; nothing more comes from the queue while the run is in flight, not even what
    the receive had no room for."""
    side = one_queue
    side.send("a0", "b0", "a1", "b1", "a2")
    first = side.receive(3)
    assert (bodies(first), attempts(first)) == (["a0", "b0", "a1"], [1, 1, 1])
    assert side.nothing()
    for m in first:
        side.consumer.ack(m)
    rest = side.receive(8)
    assert (bodies(rest), attempts(rest)) == (["b1", "a2"], [1, 1])
    for m in rest:
        side.consumer.ack(m)


def test_no_later_fifo_message_while_an_earlier_one_is_in_flight(one_queue: FifoSide) -> None:
    """Acking the later messages of a run frees nothing while the first one is in flight."""
    side = one_queue
    side.send("a0", "a1", "a2")
    run = side.receive(8)
    assert bodies(run) == ["a0", "a1", "a2"]
    side.send("a3")
    side.consumer.ack(run[1])
    side.consumer.ack(run[2])
    assert side.nothing()
    side.consumer.ack(run[0])
    nxt = side.receive(8)
    assert (bodies(nxt), attempts(nxt)) == (["a3"], [1])
    side.consumer.ack(nxt[0])


def test_after_a_fifo_nack_the_run_comes_again_from_the_nacked_message(one_queue: FifoSide) -> None:
    """``change_invisible_duration`` of the first (the loop's nack) blocks the queue for its
    time; then the run comes again from it, the later messages too although they were acked."""
    side = one_queue
    side.send("a0", "a1", "a2")
    run = side.receive(8)
    # 6 s: the two acks and the long poll in nothing() (1 s on the proxy) must end before the queue
    # is free again, or the proxy wakes it with the run (seen with 1 s, and once with 3 s, on the
    # loaded machine)
    side.consumer.change_invisible_duration(run[0], 6)
    side.consumer.ack(run[1])
    side.consumer.ack(run[2])
    assert side.nothing()
    side.pass_time(6.5)
    again = side.receive(8)
    assert (bodies(again), attempts(again)) == (["a0", "a1", "a2"], [2, 2, 2])
    for m in again:
        side.consumer.ack(m)


def test_after_a_fifo_expiry_the_run_comes_again_from_the_first_unacked(one_queue: FifoSide) -> None:
    side = one_queue
    side.send("a0", "a1", "a2")
    run = side.receive(8, invisible=3)  # the two acks land before it ends, on a loaded machine too
    side.consumer.ack(run[0])
    side.consumer.ack(run[2])  # a1 is left to expire
    side.pass_time(3.5)
    again = side.receive(8)
    assert (bodies(again), attempts(again)) == (["a1", "a2"], [2, 2])
    for m in again:
        side.consumer.ack(m)


def test_a_fifo_run_holding_a_new_message_says_attempt_1_for_all(one_queue: FifoSide) -> None:
    """The local-mode proxy gives the run's attempt from the queue's count: a message handed out
    before comes again as attempt 1 when the run also holds one not handed out before. So
    ``(message_id, delivery_attempt)`` does not name one delivery on a FIFO topic."""
    side = one_queue
    side.send("a0", "a1")
    run = side.receive(8, invisible=1)
    assert bodies(run) == ["a0", "a1"]
    side.send("a2")
    side.pass_time(1.5)
    again = side.receive(8)
    assert (bodies(again), attempts(again)) == (["a0", "a1", "a2"], [1, 1, 1])
    assert [m.message_id for m in again[:2]] == [m.message_id for m in run]
    for m in again:
        side.consumer.ack(m)


def test_a_fifo_renewal_after_the_ack_is_accepted_and_brings_nothing_back(one_queue: FifoSide) -> None:
    """Unlike a normal topic's (above): the acked offset no longer blocks the queue."""
    side = one_queue
    side.send("a0", "a1")
    run = side.receive(8)
    side.consumer.ack(run[0])
    assert answer(side.consumer.change_invisible_duration, run[0], 1) == (None, "")
    side.consumer.ack(run[1])
    side.pass_time(1.5)
    assert side.nothing()


def test_a_fifo_attempt_counts_the_runs_in_a_row_that_carried_every_message(one_queue: FifoSide) -> None:
    """A rerun cut short by the receive's size counts for what it carried only: the next rerun
    of the whole run says attempt 1, the one after it 2 (the broker merges each run's counts
    with the last run's alone)."""
    side = one_queue
    side.send("a0", "a1", "a2")
    seen = []
    for n in (8, 1, 8, 8):
        run = side.receive(n, invisible=1)
        seen.append([(m.body.decode(), m.delivery_attempt) for m in run])
        side.pass_time(1.5)
    assert seen == [[("a0", 1), ("a1", 1), ("a2", 1)], [("a0", 2)],
                    [("a0", 1), ("a1", 1), ("a2", 1)], [("a0", 2), ("a1", 2), ("a2", 2)]]


def test_a_fifo_renewal_s_handle_keeps_the_pop_time_and_runs_to_the_new_end(one_queue: FifoSide) -> None:
    """Unlike a normal topic's renewal (a new pop time, the renewal's length): the orderly
    renewal keeps the run's pop time, its invisible time running from it to the new end."""
    side = one_queue
    side.send("a0")
    m = side.receive(8)[0]
    popped, length = m.receipt_handle.split(" ")[1:3]
    side.pass_time(1.0)
    side.consumer.change_invisible_duration(m, 5)
    renewed_pop, renewed_length = m.receipt_handle.split(" ")[1:3]
    assert (renewed_pop, length) == (popped, "10000")
    # 1 s after the pop plus the 5 asked for; the real proxy's own calls take some ms more
    assert 6000 <= int(renewed_length) < 7000, renewed_length
    side.consumer.ack(m)


# -- PRIORITY topics (RocketMQ 5.5: +message.type=PRIORITY), what send_job(priority_levels=) relies on
class PrioritySide:
    """A PRIORITY topic of ``QUEUES`` queues, a normal topic and one group on either broker."""

    QUEUES = 4

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "embedded":
            broker = EmbeddedBroker(monotonic=Clock(), min_receive_invisible=1)
            self.topic, self.normal = "P", "N"
            broker.create_topic(self.topic, priority=True, queues=self.QUEUES)
            self.producer: Any = Producer(broker, [self.topic, self.normal])
            self.producer.startup()
            self.consumer: Any = SimpleConsumer(broker, "GP", {self.topic: None}, await_duration=0)
            self.consumer.startup()
            self.new_message: Any = Message
        else:
            import rmq_real

            rmq_real.ensure_broker()
            self.topic = rmq_real.fresh_topic("prio", priority=True, queues=self.QUEUES)
            self.normal = rmq_real.fresh_topic("prio-normal")
            self.producer = rmq_real.start_producer(self.topic)
            self.consumer = rmq_real.start_simple(rmq_real.fresh_group("prio"), self.topic, await_duration=1)
            self.new_message = rmq_real.client().Message

    def message(self, topic: str, body: str, priority: int | None = None, group: str | None = None) -> Any:
        m = self.new_message()
        m.topic, m.body = topic, body.encode()
        if group is not None:
            m.message_group = group
        if priority is not None:
            m.priority = priority
        return m

    def receive_all(self, n: int) -> list[Any]:
        out: list[Any] = []
        end = time.monotonic() + 30
        while len(out) < n and time.monotonic() < end:
            for m in self.consumer.receive(1, 30):  # one at a time: the order is the broker's
                out.append(m)
                self.consumer.ack(m)
        return out

    def close(self) -> None:
        for fn in (self.consumer.shutdown, self.producer.shutdown):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a failed shutdown must not hide the test's result
                pass


@pytest.fixture(params=KINDS)
def priority_side(request: pytest.FixtureRequest) -> Any:
    s = PrioritySide(request.param)
    yield s
    s.close()


def test_a_priority_topic_hands_out_its_highest_queue_first_each_in_send_order(priority_side: PrioritySide) -> None:
    """A message of priority p goes to queue min(p, queues - 1); every receive takes from the
    highest queue holding one, each queue in send order; a received message says its priority
    as sent (99, not the queue it landed in)."""
    side = priority_side
    sent = [("a", 0), ("b", 3), ("c", 1), ("d", 3), ("e", 99), ("f", 2), ("g", 0)]
    for body, p in sent:
        side.producer.send(side.message(side.topic, body, priority=p))
    got = side.receive_all(len(sent))
    assert [(m.body.decode(), m.priority) for m in got] == [
        ("b", 3), ("d", 3), ("e", 99), ("f", 2), ("c", 1), ("a", 0), ("g", 0)]
    assert [int(m.receipt_handle.split(" ")[6]) for m in got] == [3, 3, 3, 2, 1, 0, 0]  # the queue id


def test_a_message_s_type_must_be_its_topic_s(priority_side: PrioritySide) -> None:
    """Refused before the send: a priority message to a normal topic, a plain one to a PRIORITY
    topic, a FIFO one (with a message group) to either; a message with a priority takes no group."""
    side = priority_side
    for topic, priority, group in ((side.normal, 2, None), (side.topic, None, None), (side.topic, None, "g"),
                                   (side.normal, None, "g")):
        code, text = answer(side.producer.send, side.message(topic, "x", priority, group))
        assert "current message type not match" in text, (topic, priority, group, code, text)
    m = side.message(side.topic, "x", priority=1)
    with pytest.raises(Exception, match="message_group and priority should not"):
        m.message_group = "g"
    m = side.message(side.normal, "x", group="g")
    with pytest.raises(Exception, match="priority and message_group"):
        m.priority = 1
    with pytest.raises(Exception, match="greater than or equal to 0"):
        side.message(side.topic, "x").priority = -1


def test_priority_setters_and_sends_are_the_5x_client_s(priority_side: PrioritySide) -> None:
    """The 5.x client's setters compare and check truthiness, no more (review39 08): priority 0
    then a group is a FIFO message; True and 1.5 are taken, and refused by the send's protobuf."""
    side = priority_side
    m = side.message(side.normal, "x", priority=0)
    m.message_group = "g"  # 0 is falsy: accepted, and the message is FIFO
    code, text = answer(side.producer.send, m)
    assert "message_type:FIFO, queue access type:NORMAL" in text, (code, text)
    for junk in (True, 1.5):
        m = side.message(side.topic, "x")
        m.priority = junk
        assert answer(side.producer.send, m)[0] == "TypeError", junk
    with pytest.raises(TypeError):
        side.message(side.topic, "x").priority = None  # type: ignore[assignment]
