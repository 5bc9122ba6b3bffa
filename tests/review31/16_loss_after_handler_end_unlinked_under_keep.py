"""Promise (semconv.md, rmqtrace.lease.lost row: "a loss between the handler's end and its ack is
counted and linked, not marked"; span-link row: the redelivery "links to the run whose lease was
lost (its process span, kept); the redelivery is kept too"; issue #31 item 5).

Steps: keep policy on (ParentBased(ALWAYS_OFF) head, KeepPolicy(), HoldingSpanProcessor);
ConsumeLoop driven by poll()/settle_ready() on a manual clock shared with the embedded broker.
Message A runs quickly and succeeds (the policy drops it: unremarkable); before its ack is sent the
process stalls past the 2 s lease, so settle_ready() finds the lease gone (expired, counted in
rmqtrace_consumer_leases_lost_total). The broker redelivers A (attempt 2), which runs again.

Expected: attempt 2 links to attempt 1 (kept for the link, as a blame-aware keep revives a dropped
blocker from the hold), and attempt 2 is kept (reason lease_lost) — the duplicate run is visible.
Actual: attempt 1 was dropped at its finish, so MessageTrace.lease_lost does not remember it; the
redelivery gets no link and no lease_lost flag, and the policy drops it as unremarkable: the
message ran twice and neither run is exported (only the counter moved).
"""
import sys, threading
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from _rig import Rig, wait_until
from tracer.clients.consume import ConsumeLoop
from tracer.embedded import EmbeddedBroker, FilterExpression, Producer, SimpleConsumer
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.tracer import MessageTracer

M = [1000.0]
mono = lambda: M[0]
rig = Rig()
provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
hold = HoldingSpanProcessor([SimpleSpanProcessor(rig.exporter)], ticker=False)
provider.add_span_processor(hold)
keep = KeepPolicy()
tracer = MessageTracer(consumer_group="g", tracer_provider=provider, metrics=rig.metrics, keep=keep, hold=hold)
broker = EmbeddedBroker(min_receive_invisible=1, monotonic=mono)
broker.create_topic("t")
rig.producer = Producer(broker, ["t"]); rig.producer.startup()
c = SimpleConsumer(broker, "g", {"t": FilterExpression()}, await_duration=0.01); c.startup()
runs = []
loop = ConsumeLoop(c, lambda m: runs.append(m.delivery_attempt), tracer=tracer, workers=1, invisible_duration=2,
                   monotonic=mono)
rig.send(b"A")
assert loop.poll() == 1
wait_until(lambda: loop.statistics().reported == 1, what="attempt 1 done")
M[0] += 10                                   # stall before the ack is sent
loop.settle_ready()
st = loop.statistics()
lost = rig.registry.get_sample_value("rmqtrace_consumer_leases_lost_total",
                                     {"topic": "t", "consumer_group": "g", "reason": "expired"})
print("loop: expired", st.expired, "acked", st.acked, "| leases_lost counter", lost)
for _ in range(20):
    loop.poll()
    if len(runs) >= 2:
        break
wait_until(lambda: loop.statistics().reported == 2, what="attempt 2 done")
loop.settle_ready()
loop.stop()
procs = {dict(s.attributes)["rmqtrace.delivery_attempt"]: s for s in rig.spans("process")}
print("runs:", runs, "| exported process spans by attempt:", sorted(procs), "|", keep.statistics().by_reason,
      keep.statistics().dropped_by_reason)
assert 2 in procs, "the redelivery of a message whose lease was lost after its handler ended is dropped: " \
                   "the duplicate run is exported nowhere"
assert any(l.attributes.get("rmqtrace.link.reason") == "lease_lost" for l in procs[2].links), "no lease_lost link"
