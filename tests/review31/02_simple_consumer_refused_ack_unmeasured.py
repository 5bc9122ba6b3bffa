"""Promise (issue #31 item 1 and 'Deliver': every settled delivery — acked, nacked, timed out, not
started, lease lost — is measured exactly once with its real outcome; "a consumer whose deliveries
all fail shows no failures" must not happen on the wrapper paths).

Steps: TracedSimpleConsumer over the embedded broker (broker and tracer on manual clocks). Receive
one message with a 1 s lease, run it inside `with consumer.processing(msg):` (it returns), the lease
runs out (a stall), then `consumer.ack(msg)` is refused by the broker (40013, handle expired: the
lease was lost and the message will run again). Then the tracked trace ages past the hold's
max age (600 s) and a later receive evicts it.

Expected: the run is measured once (rmqtrace_messages_total gets one count — as a lost lease or a
failure; the handler histogram an observation), or at least the loss is counted
(rmqtrace_consumer_leases_lost_total), as the ConsumeLoop does for the same event.
Actual: nothing. The refused ack raises before ReceivedTraces.acked runs, the trace stays tracked,
and eviction "forgets it unfinished": no count, no histogram entry, no span, no lease-lost count.
"""
import sys
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from _rig import Rig
from tracer.clients.official import TracedSimpleConsumer
from tracer.embedded import EmbeddedBroker, FilterExpression, Producer, SimpleConsumer
from tracer.path.clock import ManualClock

import time
clock = ManualClock(time.time_ns())
T = [1000.0]
rig = Rig(clock=clock)
broker = EmbeddedBroker(min_receive_invisible=1, monotonic=lambda: T[0])
broker.create_topic("t")
rig.broker = broker
rig.producer = Producer(broker, ["t"]); rig.producer.startup()
c = SimpleConsumer(broker, "g", {"t": FilterExpression()}, await_duration=0.01); c.startup()
tc = TracedSimpleConsumer(c, rig.tracer)
rig.send(b"a")
(msg,) = tc.receive(1, 1)
with tc.processing(msg):
    clock.advance_s(0.1)
T[0] += 5; clock.advance_s(5)            # the process stalls past its 1 s lease
try:
    tc.ack(msg)
    raise SystemExit("setup: the ack was not refused")
except Exception as exc:
    print("ack refused:", exc)
clock.advance_s(700); T[0] += 700        # past RMQTRACE_KEEP_HELD_AGE (600 s)
tc.receive(1, 1)                          # eviction runs on receive (the redelivery)
print("outcomes:", rig.outcomes(), "received traces:", tc.traces.statistics())
lost = rig.registry.get_sample_value("rmqtrace_consumer_leases_lost_total",
                                     {"topic": "t", "consumer_group": "g", "reason": "expired"}) or 0
handler_obs = rig.registry.get_sample_value("rmqtrace_stage_duration_seconds_count",
                                            {"stage": "handler", "topic": "t", "consumer_group": "g"}) or 0
print("leases_lost:", lost, "handler observations:", handler_obs)
assert sum(rig.outcomes().values()) >= 1 or lost >= 1, \
    "a handled delivery whose ack was refused (lease lost) left no count, no histogram entry, no span"
