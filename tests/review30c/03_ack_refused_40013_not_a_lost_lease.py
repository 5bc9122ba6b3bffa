"""03 — an ack or nack the broker refuses with 40013 (the lease already gone) is not counted a
lost lease by the loop, while a renewal refused the same way is.

Promise broken: RELIABILITY.md ("a refusal for an expired handle is a lost lease on every seam,
the loop's too"; "The lease keeper reads a renewal refused with 40013 as a lost lease too, as the
settle does"); ConsumeStats.leases_lost is the loop's count of them.
Steps: embedded broker on its own manual clock; a ConsumeLoop (no tracer) receives one message,
its handler runs while the broker's clock jumps 100 s (a stall the loop's clock missed), then the
loop settles it: the broker refuses the ack with 40013. Then the same with a handler that fails
(the nack is refused the same way).
Expected: statistics().leases_lost == 1 in both (as for a refused renewal), ack_errors 1.
Actual: leases_lost stays 0 — the loop counts only an ack error (a tracer would mark the trace).
"""
import threading
from _common import *
from tracer.clients.consume import ConsumeLoop
from tracer.embedded import EmbeddedBroker, Message, Producer

watchdog(60)


def one(handler_fails):
    clock = Clock(0.0)
    b = EmbeddedBroker(min_receive_invisible=1, monotonic=clock)
    p = Producer(b); p.startup()
    m = Message(); m.topic, m.body = "t30c", b"x"; p.send(m)
    c = consumer_of(b, await_duration=0)
    def handler(msg):
        clock.advance(100.0)  # the broker's time passes the lease; the loop's does not see it
        if handler_fails:
            raise RuntimeError("fails")
    loop = ConsumeLoop(c, handler, workers=1, invisible_duration=10)
    loop.poll()
    if not until(lambda: loop.state().settling == 1, 5):
        fail("the handler did not end")
    loop.settle_ready()
    s = loop.statistics()
    print("handler fails:", handler_fails, "ack_errors", s.ack_errors, "leases_lost", s.leases_lost,
          dict(s.errors_by_kind))
    loop.stop(timeout=1)
    return s


bad = [s for s in (one(False), one(True)) if s.leases_lost != 1]
if bad:
    fail("a settle refused with 40013 (lease gone) is not counted leases_lost")
print("OK")
