"""create_topic(priority=True) on an existing topic of another kind does nothing, silently.

Promise (brief: loud early errors for arguments that cannot work; EmbeddedBroker.create_topic
raises ValueError for "a topic both FIFO and PRIORITY"). A topic is auto-created as a NORMAL topic
by whatever touches it first (a SimpleConsumer's startup, a Producer's startup, a receive), and a
later ``create_topic("jobs", priority=True, queues=8)`` returns None and leaves it normal (the same
for fifo=True, or a FIFO topic asked to be PRIORITY). The README's order (create, then start) is
easy to invert; the mistake then surfaces only at ``send_job``'s first send ("message_type:PRIORITY,
queue access type:NORMAL"), far from its cause. Severity: low.
"""
from __future__ import annotations

from tracer.embedded import EmbeddedBroker, FilterExpression, SimpleConsumer

silent = []
broker = EmbeddedBroker()
SimpleConsumer(broker, "g", {"jobs": FilterExpression()}).startup()  # creates "jobs", normal
try:
    broker.create_topic("jobs", priority=True, queues=8)
    silent.append("create_topic('jobs', priority=True) on a normal topic: accepted, the topic stays normal")
except ValueError:
    pass
broker.create_topic("f", fifo=True)
try:
    broker.create_topic("f", priority=True)
    silent.append("create_topic('f', priority=True) on a FIFO topic: accepted, the topic stays FIFO")
except ValueError:
    pass
assert not silent, "\n  ".join(silent)
print("held")
