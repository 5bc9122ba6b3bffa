import sys, threading, time
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", ".."))
from tracer.embedded import EmbeddedBroker, SimpleConsumer, Producer, Message, FilterExpression
from tracer import ConsumeLoop

def setup(n=5, group="g", topic="t", min_inv=1, **bk):
    b = EmbeddedBroker(min_receive_invisible=min_inv, **bk)
    b.create_topic(topic)
    c = SimpleConsumer(b, group, {topic: FilterExpression()}, await_duration=0.05)
    c.startup()
    p = Producer(b, [topic]); p.startup()
    for i in range(n):
        m = Message(); m.topic = topic; m.body = f"m{i}".encode()
        p.send(m)
    return b, c
