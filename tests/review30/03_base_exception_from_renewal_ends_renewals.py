"""03 — one BaseException (SystemExit/KeyboardInterrupt) from a lease renewal ends lease renewal for
good, silently: the keeper pool's thread dies but stays counted (in _threads, and idle), so no
renewal call is ever made again while the loop keeps running; the running handler's lease runs
out and the broker hands the message to a peer while the handler still runs.

Promise broken: the loop "renews the lease of every message it holds (so a long handler is not
redelivered to another consumer while it runs)"; a BaseException from user-facing code either stops
the loop and is re-raised by run(), or is contained — here neither: it is swallowed and the loop
goes on without a keeper. (RELIABILITY.md's table lists `base-kills-the-keeper` as open; still open.)
Steps: renew_threads=1, invisible_duration=1; the client double's first change_invisible_duration
raises SystemExit; the handler runs 4 s.
Expected: later renewals still happen (leases_extended > 0) or run() ends re-raising SystemExit.
Actual: leases_extended stays 0, run() keeps going, a second consumer receives the message while
the first copy runs. Real time: ~5 s.
"""
import time
from _common import *
from tracer.clients.consume import ConsumeLoop

watchdog(40)
b = broker(); send(b, 1)
class C(Wrap):
    n = 0
    def change_invisible_duration(self, m, s):
        C.n += 1
        if C.n == 1: raise SystemExit("exit raised inside a renewal call")
        return self.inner.change_invisible_duration(m, s)
c = C(consumer(b))
running = []
def handler(m):
    running.append(1); time.sleep(4.0)  # real-time: a handler longer than the 1 s lease, so renewals must happen
loop = ConsumeLoop(c, handler, invisible_duration=1, workers=1, renew_threads=1)
t, box = run_in_thread(loop)
time.sleep(3.5)  # real-time: past the lease ends while the handler runs
peer = consumer(b, group="g")  # another consumer of the same group
stolen = peer.receive(1, 5)
s = loop.statistics()
alive = t.is_alive()
loop.stop(timeout=5); t.join(10)
print("renewal calls:", C.n, "stats:", s, "run alive:", alive, "peer got:", len(stolen), "run() exc:", repr(box.get("exc")))
if alive and (s.leases_extended == 0 or stolen):
    fail("after one BaseException from a renewal no lease is renewed any more; a peer got the running message")
print("OK")
