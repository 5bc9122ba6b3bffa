"""Promise (issue #31 item 5, semconv.md "span link → lost run's process"): "the redelivery of a
message whose lease this tracer saw lost links to the run whose lease was lost (its process span,
kept); the redelivery is kept too" — the duplicate run must be traceable to the run that lost it.

Steps (ConsumeLoop driven by poll()/renew_leases()/settle_ready() on a manual clock shared with the
embedded broker; workers=2):
 1. message A is received, its handler starts and hangs;
 2. the process "stalls" past the 2 s lease: renew_leases() finds it lost (leases_lost=1,
    rmqtrace.lease.lost=expired, the run is remembered for the link);
 3. the broker redelivers A (attempt 2) while the first call still runs: the loop refuses to start
    it beside the hung copy (not_started) and gives it back for one lease;
 4. the hung call returns (expired, not acked); A comes back (attempt 3) and really runs again —
    this is the duplicate run.

Expected: the run that actually ran twice — attempt 3 — links to attempt 1's process span
(rmqtrace.link.reason=lease_lost), and under a keep policy it is kept (reason lease_lost).
Actual: the not-started copy (attempt 2) consumed the remembered run (MessageTracer.start_message
pops _lost_runs), so the real duplicate (attempt 3) has no link and no lease_lost flag. With a keep
policy the not-started copy is dropped as not_handled before the flag is looked at, so the link
is exported nowhere at all.
"""
import sys, threading, time
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from _rig import Rig, wait_until
from tracer.clients.consume import ConsumeLoop
from tracer.embedded import EmbeddedBroker, FilterExpression, Producer, SimpleConsumer

M = [1000.0]
mono = lambda: M[0]
rig = Rig()
broker = EmbeddedBroker(min_receive_invisible=1, monotonic=mono)
broker.create_topic("t")
rig.producer = Producer(broker, ["t"]); rig.producer.startup()
c = SimpleConsumer(broker, "g", {"t": FilterExpression()}, await_duration=0.01); c.startup()
go = threading.Event()
runs = []
def handler(m):
    runs.append(m.delivery_attempt)
    if m.delivery_attempt == 1:
        go.wait(10)
loop = ConsumeLoop(c, handler, tracer=rig.tracer, workers=2, invisible_duration=2, monotonic=mono,
                   retry_backoff=lambda a: 1)
rig.send(b"A")
assert loop.poll() == 1
wait_until(lambda: runs == [1], what="attempt 1 running")
M[0] += 10                                     # a stall past the lease
loop.renew_leases()
assert loop.statistics().leases_lost == 1, loop.statistics()
assert loop.poll() == 1                        # attempt 2, beside the hung attempt 1
wait_until(lambda: loop.statistics().not_started == 1, what="attempt 2 refused")
loop.settle_ready()
go.set()
wait_until(lambda: loop.statistics().succeeded == 1, what="attempt 1 returned")
loop.settle_ready()
M[0] += 5
for _ in range(20):                            # attempt 3: the real second run
    loop.poll()
    if 3 in runs:
        break
wait_until(lambda: loop.statistics().succeeded == 2, what="attempt 3 ran")
loop.settle_ready()
loop.stop()
procs = {dict(s.attributes)["rmqtrace.delivery_attempt"]: s for s in rig.spans("process")}
for a, s in sorted(procs.items()):
    print("attempt", a, dict(s.attributes).get("rmqtrace.outcome"), "lease.lost=", dict(s.attributes).get("rmqtrace.lease.lost"),
          "links:", [dict(l.attributes) for l in s.links])
first = procs[1].context.span_id
rerun_links = [l for l in procs[3].links if l.context.span_id == first]
assert rerun_links, "the duplicate run (attempt 3) carries no link to the run whose lease was lost"
