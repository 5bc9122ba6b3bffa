import pytest

from tracer.embedded import (
    ILLEGAL_INVISIBLE_TIME,
    INVALID_RECEIPT_HANDLE,
    EmbeddedBroker,
    EmbeddedBrokerError,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def setup(fifo: bool = False, clock: Clock | None = None):
    broker = EmbeddedBroker(monotonic=clock or Clock(), min_receive_invisible=1)
    broker.create_topic("T", fifo=fifo)
    p = Producer(broker, ["T"])
    p.startup()
    c = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    c.startup()
    return broker, p, c


def msg(body: str, group: str | None = None, tag: str | None = None) -> Message:
    m = Message()
    m.topic, m.body, m.message_group, m.tag = "T", body.encode(), group, tag
    m.add_property("k", "v")
    return m


def test_send_receive_ack_round_trip():
    broker, p, c = setup()
    ids = [p.send(msg(f"m{i}")).message_id for i in range(5)]
    got = c.receive(10, 30)
    assert [m.message_id for m in got] == ids
    assert all(m.delivery_attempt == 1 and m.properties == {"k": "v"} and m.store_timestamp for m in got)
    for m in got:
        c.ack(m)
    assert broker.backlog("G", "T") == 0
    assert c.receive(10, 30) == []


def test_unacked_message_comes_back_with_next_attempt_after_invisibility():
    clock = Clock()
    broker, p, c = setup(clock=clock)
    p.send(msg("a"))
    first = c.receive(1, 5)[0]
    clock.t += 4.9
    assert c.receive(1, 5) == []
    clock.t += 0.2
    again = c.receive(1, 5)[0]
    assert again.message_id == first.message_id and again.delivery_attempt == 2
    with pytest.raises(EmbeddedBrokerError):
        c.ack(first)  # its receipt handle is stale
    c.ack(again)


def test_change_invisible_duration_renews_the_lease_and_the_handle():
    clock = Clock()
    broker, p, c = setup(clock=clock)
    p.send(msg("a"))
    m = c.receive(1, 5)[0]
    old = m.receipt_handle
    clock.t += 4
    c.change_invisible_duration(m, 10)
    assert m.receipt_handle != old
    clock.t += 6  # past the first lease, inside the renewed one
    assert c.receive(1, 5) == []
    c.ack(m)


def test_fifo_group_is_held_while_an_earlier_message_is_unacked():
    """A group's queue hands out its run and then nothing until the whole run is acked (the
    rules against the real proxy: tests/test_broker_rules_real.py)."""
    broker, p, c = setup(fifo=True)
    for body, g in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("a3", "A")]:
        p.send(msg(body, group=g))
    first = c.receive(10, 30)
    assert sorted(m.body for m in first) == [b"a1", b"a2", b"a3", b"b1"]
    assert [m.body for m in first if m.message_group == "A"] == [b"a1", b"a2", b"a3"]
    p.send(msg("a4", group="A"))
    c.ack(first[0])
    assert c.receive(10, 30) == []
    for m in first[1:]:
        c.ack(m)
    assert [m.body for m in c.receive(10, 30)] == [b"a4"]
    with pytest.raises(EmbeddedBrokerError):
        p.send(msg("no-group"))


def test_tag_filter():
    broker = EmbeddedBroker()
    p = Producer(broker, ["T"])
    p.startup()
    c = SimpleConsumer(broker, "G", {"T": FilterExpression("x || y")}, await_duration=0)
    c.startup()
    for tag in ("x", "z", "y"):
        p.send(msg(tag, tag=tag))
    assert [m.tag for m in c.receive(10, 30)] == ["x", "y"]


def test_bad_calls_raise_clear_errors():
    broker, p, c = setup()
    with pytest.raises(EmbeddedBrokerError):
        c.receive(0, 30)
    with pytest.raises(EmbeddedBrokerError):
        c.receive(1, 0)
    m = Message()
    with pytest.raises(EmbeddedBrokerError):
        p.send(m)  # no topic
    with pytest.raises(EmbeddedBrokerError):
        m.add_property("k", 1)  # type: ignore[arg-type]


def test_send_async_returns_a_future():
    broker, p, c = setup()
    assert p.send_async(msg("a")).result().message_id


def test_ack_and_renewal_after_the_lease_ran_out_are_refused_like_the_proxy():
    # before: accepted until somebody received the message again
    clock = Clock()
    broker, p, c = setup(clock=clock)
    p.send(msg("a"))
    m = c.receive(1, 5)[0]
    clock.t += 5
    for call in (lambda: c.ack(m), lambda: c.change_invisible_duration(m, 10)):
        with pytest.raises(EmbeddedBrokerError, match="receipt handle is expired") as err:
            call()
        assert err.value.code == INVALID_RECEIPT_HANDLE
    assert c.receive(1, 5)[0].delivery_attempt == 2


def test_invisible_time_limits_are_the_proxys():
    broker = EmbeddedBroker()
    assert (broker.min_receive_invisible, broker.max_invisible) == (10.0, 43200.0)
    p = Producer(broker, ["T"])
    p.startup()
    c = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    c.startup()
    with pytest.raises(EmbeddedBrokerError, match="the invisibleTime is too small. min is 10000") as err:
        c.receive(1, 9)
    assert err.value.code == ILLEGAL_INVISIBLE_TIME
    with pytest.raises(EmbeddedBrokerError, match="the invisibleTime is too large. max is 43200000"):
        c.receive(1, 43201)
    with pytest.raises(TypeError):
        c.receive(1, 10.0)  # type: ignore[arg-type]
    p.send(msg("a"))
    m = c.receive(1, 10)[0]
    with pytest.raises(EmbeddedBrokerError, match="too large"):
        c.change_invisible_duration(m, 43201)
    c.change_invisible_duration(m, 0)  # allowed: visible again at once
    assert c.receive(1, 10)[0].delivery_attempt == 2


def test_a_renewal_after_the_ack_brings_the_message_back_as_on_the_proxy():
    clock = Clock()
    broker, p, c = setup(clock=clock)
    p.send(msg("a"))
    m = c.receive(1, 10)[0]
    c.ack(m)
    c.ack(m)  # a second ack is accepted
    c.change_invisible_duration(m, 1)
    clock.t += 1
    assert c.receive(1, 10)[0].delivery_attempt == 2


def test_the_broker_public_surface_is_what_the_clients_call():
    clock = Clock()
    broker = EmbeddedBroker(monotonic=clock, min_receive_invisible=1)
    broker.subscribe("G", "T")
    mid = broker.store(msg("a"))
    (m,) = broker.receive("G", {"T": FilterExpression()}, 1, 5, 0)
    handle = broker.change_invisible("G", "T", mid, m.receipt_handle, 5)
    broker.ack("G", "T", mid, handle)
    assert broker.backlog("G", "T") == 0 and broker.stored("T") == 1


@pytest.mark.parametrize("fifo, queues", [(False, 4), (True, 0), (True, -1), (True, True), (True, 2.0)])
def test_create_topic_refuses_queues_that_cannot_work(fifo: bool, queues: object) -> None:
    with pytest.raises(ValueError, match="queues"):
        EmbeddedBroker().create_topic("T", fifo=fifo, queues=queues)  # type: ignore[arg-type]


def test_a_fifo_topic_with_keep_consumed_false_keeps_only_what_is_pending() -> None:
    """The FIFO queues hold the records from their commit offsets on; the log drops the rest."""
    broker = EmbeddedBroker(min_receive_invisible=1, keep_consumed=False)
    broker.create_topic("T", fifo=True)
    p = Producer(broker, ["T"])
    p.startup()
    c = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    c.startup()
    for i in range(3000):
        p.send(msg(f"m{i}", group=f"g{i % 50}"))
    handed = 0
    while (got := c.receive(32, 10)):
        handed += len(got)
        for m in got:
            c.ack(m)
    assert handed == 3000 and broker.backlog("G", "T") == 0
    assert broker.stored("T") < 1024
