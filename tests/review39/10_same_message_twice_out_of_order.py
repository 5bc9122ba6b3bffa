"""A message object given twice in one job goes out with one priority for both sends.

Promise (TracedProducer.send_job; docs/dispatch.md): with ``priority_levels`` each message gets
"a priority falling with the send order", and "the broker then hands the job out in exactly that
order". ``prioritize`` sets every priority before the first send, on the message OBJECT: a message
given twice (the 5.x client sends one object as many times as asked, a new message id each time)
keeps only the priority of its LAST position, so its first send carries the lowest level and comes
out behind messages sent after it. Here ``[A, B, A]`` with ``order="arrival"``, all of cost 1:
sent A, B, A; handed out B, A, A. Either refuse a job that holds one object twice (it is "checked
before any is sent") or set each priority right before its own send. Severity: low (contrived).
"""
from __future__ import annotations

import sys
from pathlib import Path

from tracer.embedded import FilterExpression, SimpleConsumer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _job import PRIORITY_TOPIC, job, rig  # noqa: E402

broker, producer = rig()
a, b = job(2)  # bodies "0" and "1"
try:
    receipts = producer.send_job([a, b, a], cost=lambda m: 1.0, order="arrival", priority_levels=8)
except ValueError:
    print("held (refused)")
    raise SystemExit(0) from None
sent = [r.message_id for r in receipts]
consumer = SimpleConsumer(broker, "g", {PRIORITY_TOPIC: FilterExpression()}, await_duration=0)
consumer.startup()
handed = [m.message_id for m in consumer.receive(3, 10)]
assert handed == sent, (f"sent A, B, A as {sent}, handed out {handed} "
                        f"({['AB'[sent.index(h) % 2] for h in handed]})")
print("held")
