"""keep_consumed=False: a group that subscribes after records were dropped crashes or reads junk.

Promise (EmbeddedBroker docstring): ``keep_consumed=False`` drops stored records once every
subscribed group has read past them, "a group subscribing later starts after them"; the brief:
``backlog()``/``stored()`` right, nothing lost or duplicated. A new subscription starts at offset 0
while the topic's log now starts at ``base``: ``topic.log[offset - base]`` is a NEGATIVE index.
On a PRIORITY topic one receive of ONE message by group g reads the whole topic into g's levels, so
the log (3000 records) is dropped at once; group g2 subscribing then: its receive raises
IndexError (the broker's receive crashes). After a larger log (the second case, every kind) the
negative index silently reads from the log's END: g2 gets 4976… on a normal topic, the same message
twice in one receive on a FIFO topic, and backlog() counts records that are gone (6000 where
4000-4976 are stored). Root: ``subscribe``/``receive`` create ``_Subscription()`` at offset 0, not ``topic.base``.
Severity: medium (a crash, duplicates, wrong backlog for any group that starts late).
"""
from __future__ import annotations

from tracer.embedded import EmbeddedBroker, FilterExpression, Message, Producer, SimpleConsumer

problems: list[str] = []


def topic_of(kind: str) -> tuple[EmbeddedBroker, Producer]:
    broker = EmbeddedBroker(keep_consumed=False)
    broker.create_topic("t", fifo=kind == "fifo", priority=kind == "priority")
    producer = Producer(broker, ["t"])
    producer.startup()
    return broker, producer


def send(producer: Producer, kind: str, lo: int, hi: int) -> None:
    for i in range(lo, hi):
        m = Message()
        m.topic, m.body = "t", str(i).encode()
        if kind == "priority":
            m.priority = 0
        if kind == "fifo":
            m.message_group = f"g{i}"
        producer.send(m)


def consumer(broker: EmbeddedBroker, group: str) -> SimpleConsumer:
    c = SimpleConsumer(broker, group, {"t": FilterExpression()}, await_duration=0)
    c.startup()
    return c


# 1. PRIORITY topic: group g receives one message of 3000; g2 starts afterwards
broker, producer = topic_of("priority")
send(producer, "priority", 0, 3000)
consumer(broker, "g").receive(1, 10)
late = consumer(broker, "g2")
try:
    late.receive(5, 10)
except Exception as exc:  # noqa: BLE001
    problems.append(f"priority: the late group's receive raised {type(exc).__name__}: {exc}")

# 2. every kind: 2000 consumed and acked by g, 4000 more sent, then g2 starts: it must start at 2000
for kind in ("normal", "fifo", "priority"):
    broker, producer = topic_of(kind)
    send(producer, kind, 0, 2000)
    c = consumer(broker, "g")
    n = 0
    while n < 2000:
        batch = c.receive(32, 10)
        n += len(batch)
        for m in batch:
            c.ack(m)
    send(producer, kind, 2000, 6000)
    late = consumer(broker, "g2")
    try:
        bodies = [m.body.decode() for m in late.receive(3, 10)]
    except Exception as exc:  # noqa: BLE001
        problems.append(f"{kind}: the late group's receive raised {type(exc).__name__}: {exc}")
        continue
    first = 6000 - broker.stored("t")  # the oldest record still stored: where a late group starts
    if len(set(bodies)) != len(bodies) or not all(first <= int(b) < first + 100 for b in bodies):
        problems.append(f"{kind}: the late group got {bodies}, the oldest stored record is {first}")
    if broker.backlog("g2", "t") > broker.stored("t"):
        problems.append(f"{kind}: backlog of the late group {broker.backlog('g2', 't')}, "
                        f"only {broker.stored('t')} messages stored")
assert not problems, "\n  ".join(["a group subscribing after a drop:", *problems])
print("held")
