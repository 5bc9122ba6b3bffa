"""Promise (issue #31 item 1: "a delivery that the user gives back with change_invisible_duration
(the 5.x way to nack) ... no failure count, no histogram entry, no span. A consumer whose
deliveries all fail shows no failures" — reported fixed).

Steps: TracedSimpleConsumer; the usual 5.x pull pattern with the handler's own try/except:

    with consumer.processing(msg):
        try:
            handle(msg)            # raises
            consumer.ack(msg)
        except Exception:
            consumer.change_invisible_duration(msg, 5)   # the nack

The processing() block itself exits normally (the user caught the exception). Then time passes
beyond the trace's max age (RMQTRACE_KEEP_HELD_AGE, 600 s) and the next receive evicts it.

Expected: the nacked delivery is measured once as a failure (rmqtrace_messages_total{outcome=failure}).
Actual: the nack inside processing() is taken for a lease renewal, the trace waits for an ack that
never comes and is then "forgotten unfinished": 3 nacked deliveries, 0 failures, 0 of anything.
(semconv.md documents the renewal reading; the result is still item 1's symptom for this pattern.)
"""
import sys, time
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from _rig import Rig
from tracer.clients.official import TracedSimpleConsumer
from tracer.path.clock import ManualClock

clock = ManualClock(time.time_ns())
rig = Rig(clock=clock)
tc = TracedSimpleConsumer(rig.consumer, rig.tracer)
for i in range(3):
    rig.send(b"m%d" % i)
for msg in tc.receive(3, 30):
    with tc.processing(msg):
        try:
            raise ValueError("handler failed")
        except Exception:
            tc.change_invisible_duration(msg, 5)
clock.advance_s(700)
tc.receive(1, 30)
print("outcomes:", rig.outcomes(), "received traces:", tc.traces.statistics())
assert rig.count("failure") == 3, f"3 nacked deliveries, rmqtrace_messages_total: {rig.outcomes()}"
