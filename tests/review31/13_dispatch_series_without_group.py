"""Promise (issue #31 item 8: "the dispatcher gauges sum every dispatcher of one policy into one
series ... Label by consumer group (and instance)"; docs: two consumers' dispatchers in one process
must not be summed into one).

Steps: two ConsumeLoops in one process, groups g1 and g2, same policy (aggressive), one shared
DispatchMetrics (one per registry, as documented). g1's messages all fail, g2's succeed.

Expected: every dispatcher series can be told apart by consumer_group, as the gauges and
worker-second counters now can — in particular rmqtrace_dispatch_messages_total (outcomes) and
rmqtrace_dispatch_slot_wait_seconds (the dashboard's "slot wait" panels).
Actual: those two families carry only `policy` (and `outcome`): g1's failures and g2's successes
land in one series {policy="aggressive"}; the dashboard's dispatch panels (sum by (policy, ...))
cannot show which group fails or waits.
"""
import sys, threading
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from _rig import Rig, wait_until
from tracer.clients.consume import ConsumeLoop
from tracer.dispatch import DispatchMetrics
from tracer.embedded import FilterExpression, SimpleConsumer
from tracer.telemetry.tracer import MessageTracer

rig = Rig()
dm = DispatchMetrics(rig.registry)
loops = []
for group, fail in (("g1", True), ("g2", False)):
    c = SimpleConsumer(rig.broker, group, {"t": FilterExpression()}, await_duration=0.05); c.startup()
    def handler(m, fail=fail):
        if fail:
            raise ValueError("g1 fails")
    tr = MessageTracer(consumer_group=group, tracer_provider=rig.provider, metrics=rig.metrics)
    loop = ConsumeLoop(c, handler, tracer=tr, workers=1, invisible_duration=30, dispatch_metrics=dm,
                       retry_backoff=lambda a: 60)
    threading.Thread(target=loop.run, daemon=True).start()
    loops.append(loop)
rig.send(b"x")
wait_until(lambda: all(l.statistics().reported >= 1 for l in loops))
for l in loops:
    l.stop()
rows = [(s.name, s.labels, s.value) for f in rig.registry.collect() for s in f.samples
        if s.name in ("rmqtrace_dispatch_messages_total", "rmqtrace_dispatch_slot_wait_seconds_count") and s.value]
for r in rows:
    print(r)
assert all("consumer_group" in labels for _, labels, _ in rows), \
    "dispatch outcome / slot-wait series of two consumer groups are summed into one (no consumer_group label)"
