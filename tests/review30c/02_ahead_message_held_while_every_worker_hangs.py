"""02 — with receive_ahead, the message received for a handler that then hangs is renewed for as
long as the hang lasts, out of every peer's reach, although every worker hangs.

Promise broken: docs/consume.md ("With every worker hung the loop receives nothing, and what waits
in the dispatcher for a worker is not renewed (`let_go`): a peer takes it once its lease ends";
RELIABILITY.md's fault class "every policy with all workers hung": no message held where no
worker can start it).
Steps: embedded broker, 3 messages with rmqtrace_cost 0.1; ConsumeLoop(workers=1,
receive_ahead=True, handler_timeout=0.5, invisible_duration=1) over a receive that takes 30 ms
(so the lead is 30 ms); the first handler hangs. A peer consumer of the same group receives for 4 s.
Expected: once its only worker hangs (TIMEOUT), the message received ahead for it is let go or
given back: the peer gets it within a few leases.
Actual: it waits in the loop's backlog (not "in the dispatcher": let_go skips it) and the keeper
renews its lease every margin for the whole hang; the peer never sees it.
"""
import threading
import time
from _common import *
from tracer.clients.consume import ConsumeLoop

watchdog(60)
b, inner = embedded(3, cost="0.1")
hang = threading.Event()
ran = []
def handler(m):
    ran.append(m.message_id)
    if len(ran) == 1:
        hang.wait(30)
loop = ConsumeLoop(Slow(inner, 0.03), handler, workers=1, receive_ahead=True, handler_timeout=0.5,
                   invisible_duration=1)
t, box = run_in_thread(loop)
try:
    if not until(lambda: loop.statistics().received >= 2, 5):
        fail(f"nothing was received ahead (the premise): {loop.statistics()}")
    ahead = [h.message.message_id for h in list(loop._backlog)]
    print("received ahead, waiting in the loop:", ahead)
    peer = consumer_of(b, await_duration=0.2)
    got = set()
    end = time.monotonic() + 4.0
    while time.monotonic() < end:
        for m in peer.receive(8, 1):
            got.add(m.message_id)
            peer.ack(m)
    s = loop.statistics()
    print("peer got:", sorted(got), "loop:", s.received, "received, held", s.held, "let_go", s.let_go,
          "leases_extended", s.leases_extended, "state", loop.state())
    if ahead and ahead[0] not in got:
        fail("the message received ahead stayed held (renewed) while every worker hung")
    print("OK")
finally:
    hang.set()
    loop.stop(timeout=3)
