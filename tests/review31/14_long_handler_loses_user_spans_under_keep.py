"""Promise (keep.py/hold.py: a kept trace keeps the user's spans — "your spans are recorded and held
as usual" and reach the exporter when kept; RmqtraceSpansDropped means the exporter lost spans).
rmqtrace exists for consumers whose handlers run long (test-case groups; the loop renews leases
for as long as a handler runs).

Steps: keep policy on (ParentBased(ALWAYS_OFF) head, KeepPolicy(), HoldingSpanProcessor with its
default max_age_s=600), tracer and hold on one ManualClock; a push listener (TracedListener) whose
handler opens and ends a user span ("step-1"), then works for 11 minutes (the clock advances 660 s;
the hold's ticker runs meanwhile — here hold.expire() is called, as the ticker would), then fails.

Expected: the failed message is kept, with its handler's spans (step-1 under `handler`); nothing
is counted as an export loss.
Actual: the hold evicts the still-running message's trace at 600 s as "max_age" (the limit meant
for a message "handled but never acked"), step-1 is dropped and counted on_dropped (an export
loss: rmqtrace_spans_dropped_total, RmqtraceSpansDropped), and the kept failure is exported
without the user's spans.
"""
import sys, time
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from rocketmq import MessageListener
from _rig import Rig
from tracer.clients.official import TracedListener
from tracer.path.clock import ManualClock
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.tracer import MessageTracer

clock = ManualClock(time.time_ns())
lost = [0]
exp = InMemorySpanExporter()
hold = HoldingSpanProcessor([SimpleSpanProcessor(exp)], on_dropped=lambda n: lost.__setitem__(0, lost[0] + n),
                            ticker=False)
provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
provider.add_span_processor(hold)
rig = Rig()
tracer = MessageTracer(consumer_group="g", tracer_provider=provider, keep=KeepPolicy(), hold=hold, clock=clock)

class Listener(MessageListener):
    def consume(self, m):
        with provider.get_tracer("user").start_as_current_span("step-1"):
            clock.advance_s(1)
        clock.advance_s(660)      # the rest of a long test-case group
        hold.expire()             # what the hold's ticker does meanwhile
        raise ValueError("the group failed")

rig.send(b"x")
(m,) = rig.consumer.receive(1, 30)
m.decode_message_timestamp = clock.wall_ns() // 1_000_000
try:
    TracedListener(Listener(), tracer).consume(m)
except ValueError:
    pass
names = [s.name for s in exp.get_finished_spans()]
print("exported:", names, "| export losses counted:", lost[0], "| hold:", dict(hold.statistics().dropped_by_reason))
assert "process t" in names, "setup: the failed message was not kept"
assert "step-1" in names and lost[0] == 0, "a long handler's own spans were dropped (max_age) from its kept trace"
