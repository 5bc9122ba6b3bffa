"""Promise (alert RmqtraceClockSkew's text and runbook: "send, broker_wait and end_to_end are only
accurate to about rmqtrace_clock_skew_bound_seconds ... read the skew panel"): the skew gauge is how
an operator judges the cross-clock gaps *now*.

Steps: one consumer tracer. A producer whose clock was 1 h ahead sends one message (an NTP
outage, then a fix); then 200 messages from a correct clock, all measured normally.

Expected: once the clocks agree, rmqtrace_clock_skew_bound_seconds{peer="producer->broker"} tells
so (a windowed or decaying bound), so the panel and the runbook do not send the operator after a
skew that is gone.
Actual: the gauge is the smallest gap since the process started (SkewTracker keeps a lifetime
minimum and the gauge is only ever set lower): it reads -3600 s for the life of the consumer, one
bad message after the fact. (Documented as "smallest gap seen"; the alert text reads it as current.)
"""
import sys, time
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from _rig import Rig
from tracer.path.message import describe
from tracer.path.propagation import PRODUCE_NS
from tracer.path.stages import Outcome

rig = Rig()
def one(ahead_s):
    rig.send(b"x", props={PRODUCE_NS: str(time.time_ns() + int(ahead_s * 1e9))})
    (m,) = rig.consumer.receive(1, 30)
    t = rig.tracer.start_message(describe(m))
    with t.handler_scope():
        pass
    t.finish(Outcome.SUCCESS)
    rig.consumer.ack(m)
one(3600)
for _ in range(200):
    one(0)
v = {s.labels["peer"]: s.value for f in rig.registry.collect() for s in f.samples if s.name == "rmqtrace_clock_skew_bound_seconds"}
print("skew bound after 200 good messages:", v)
assert all(abs(x) < 60 for x in v.values()), f"the skew gauge still reports the old hour of skew: {v}"
