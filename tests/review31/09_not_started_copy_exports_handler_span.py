"""Promise (issue #31 item 3, semconv.md rmqtrace.outcome=not_started): a copy the loop refuses to
start is "given back unrun ... no handler or end-to-end observation" — its handler never ran, so
nothing should say it did.

Steps: ConsumeLoop, workers=2; message A's handler hangs; a copy of A (its redelivery after a lost
lease, as in 04) is refused by the start gate because the first copy still runs (outcome
not_started). Look at the spans of the not-started copy's trace.

Expected: process (outcome not_started) and its broker/buffer gaps, but no `handler` span.
Actual: a `handler` span is exported (status UNSET, ~0.2 ms), because the refusal happens inside
the handler scope and MessageTrace._write_spans ends the handler span it opened at __enter__. In
Jaeger the refused copy reads as a handler run that succeeded; span-based tools count it.
"""
import sys, threading
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
def handler(m):
    if m.delivery_attempt == 1:
        go.wait(10)
loop = ConsumeLoop(c, handler, tracer=rig.tracer, workers=2, invisible_duration=2, monotonic=mono)
try:
    rig.send(b"A")
    assert loop.poll() == 1
    wait_until(lambda: loop.dispatcher.statistics().in_flight == 1, what="A running")
    M[0] += 10
    loop.renew_leases()
    assert loop.poll() == 1
    wait_until(lambda: rig.count("not_started") == 1, what="the copy refused")
    loop.settle_ready()
finally:
    go.set()
    loop.stop()
procs = [s for s in rig.spans("process") if dict(s.attributes).get("rmqtrace.outcome") == "not_started"]
assert len(procs) == 1
tid = procs[0].context.trace_id
names = sorted(s.name for s in rig.spans() if s.context.trace_id == tid)
print("spans of the not-started copy:", names)
assert "handler" not in names, "a copy whose handler never ran exports a `handler` span"
