"""05 — the embedded broker hands a FIFO message group out of order when a receive fills up
part-way through the messages it holds back for busy groups.

Promise broken: tracer/embedded.py answers "like the proxy wherever the loop relies on it"
(docs/consume.md); a FIFO topic hands a message group's messages out one at a time, in send order
(its `held` deque is commented "rotate: keep relative order per group"). Found through
DemandPushConsumer(receive_ahead=True) on a FIFO topic: 5 of 6 runs of 120 messages in 4 groups
ran some group out of order (each message once, attempt 1) — receive_ahead asks for one message
at a time, which is what makes the receive fill part-way.
Steps: FIFO topic, sent A1 A2 (group a), B1 B2 (group b), A3 (group a). receive(1) -> A1;
receive(1) -> B1 (A2 held back); receive(1) -> nothing (B2, A3 held back); ack B1; receive(1) -> B2;
ack A1 and B2; receive(1).
Expected: A2 (group a's next). Actual: A3 — the pass that found B2 stopped after popping A2 to the
back of the deque, so A3 now stands before A2.
"""
from _common import *
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer

watchdog(30)
b = EmbeddedBroker(min_receive_invisible=1)
b.create_topic("F", fifo=True)
p = Producer(b, ["F"])
p.startup()
for body, group in (("A1", "a"), ("A2", "a"), ("B1", "b"), ("B2", "b"), ("A3", "a")):
    m = Message()
    m.topic, m.body, m.message_group = "F", body.encode(), group
    p.send(m)
c = SimpleConsumer(b, "G", {"F": None}, await_duration=0)
c.startup()


def one():
    got = c.receive(1, 10)
    return got[0] if got else None


a1 = one()
b1 = one()
assert one() is None
c.ack(b1)
b2 = one()
c.ack(a1)
c.ack(b2)
nxt = one()
print("received in turn:", a1.body, b1.body, b2.body, nxt and nxt.body)
if nxt is None or nxt.body != b"A2":
    fail(f"group a's next message is {nxt and nxt.body!r}, not A2")
print("OK")
