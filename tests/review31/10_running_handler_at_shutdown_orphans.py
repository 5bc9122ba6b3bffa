"""Promise (issue #31 item 9, semconv.md): a handler still running when it is let go — its
dispatcher's close (ConsumeLoop.stop(timeout=)) or the tracer provider's shutdown() (its atexit
too) — gets its handler span ended then (status ERROR, rmqtrace.abandoned=true) "so the user's
spans under it keep an exported parent".

Steps: ConsumeLoop *without* handler_timeout (the default). The handler opens and ends a child span
("step-1"), then keeps working. SIGTERM-style shutdown: loop.stop(timeout=0.2) (returns True: run()
returned, the handler goes on) and then provider.shutdown() (what atexit does).

Expected: step-1's parent (the handler span) and the process span are exported — ended as
abandoned — so step-1 is not an orphan.
Actual: only timed-out handlers are abandoned (MessageTracer._abandonable is filled only for a
TIMEOUT reported while the handler runs). Without handler_timeout nothing ends the handler span:
step-1 is exported with a parent span id that never reaches the backend (Jaeger: "invalid parent
span IDs"), and the message has no process span at all.
"""
import sys, threading
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from _rig import Rig, wait_until
from tracer.clients.consume import ConsumeLoop

rig = Rig()
go, stepped = threading.Event(), threading.Event()
def handler(m):
    with rig.provider.get_tracer("user").start_as_current_span("step-1"):
        pass
    stepped.set()
    go.wait(10)                      # still working at shutdown
loop = ConsumeLoop(rig.consumer, handler, tracer=rig.tracer, workers=1, invisible_duration=30)
t = threading.Thread(target=loop.run, daemon=True); t.start()
rig.send(b"x")
stepped.wait(5)
print("stop(timeout=0.2) ->", loop.stop(timeout=0.2))
rig.provider.shutdown()
spans = rig.spans()
ids = {s.context.span_id for s in spans}
for s in spans:
    print(s.name, "parent exported" if s.parent is None or s.parent.span_id in ids else "ORPHAN")
go.set()
orphans = [s.name for s in spans if s.parent is not None and s.parent.span_id not in ids]
assert not orphans, f"exported with a parent that is never exported: {orphans}"
