"""04 — a stall while receive is in flight still starts a dead lease when the broker's clock runs
ahead of the consumer's (issue #30 item 3, as a class: the fix holds only for synchronised clocks).

Promise broken: "a message whose lease is gone before a worker starts it (a process stall longer
than the lease) never starts"; ConsumeLoop's docstring: the lease is dated from the pop time in the
receipt handle, "kept within the call (a skewed broker clock never dates it before the call began
nor after it returned)" — i.e. skew is claimed to be handled.
Steps (deterministic, manual clocks): the broker's wall clock is 3 s ahead of the consumer's (hosts
are rarely synced to the second); invisible_duration=2; the process stalls 3 s while receive is in
flight, after the broker popped the message (clock jump inside the client double); then poll().
Expected: the handler does not start (the broker's lease ended 1 s before receive returned; the
loop gives it back or lets it expire). Actual: `ago` = returned_wall - pop_wall = 0 (the skew hides
the stall), the lease is dated from when receive returned, and the handler runs on a dead lease
(beside a peer's copy on a real broker; its ack is refused).
"""
import time
from _common import *
from tracer.clients.consume import ConsumeLoop

watchdog(30)
class Clock:
    t = 1000.0
clk = Clock()
mono = lambda: clk.t
wall = lambda: 1_700_000_000.0 + clk.t            # the consumer's wall clock
b = broker(monotonic=mono, wall_ms=lambda: int((wall() + 3.0) * 1000))  # broker 3 s ahead
send(b, 1)
class Stall(Wrap):
    def receive(self, n, inv):
        got = self.inner.receive(n, inv)
        if got: clk.t += 3.0   # the process stalls after the broker popped, before receive returns
        return got
c = Stall(consumer(b))
ran = []
loop = ConsumeLoop(c, lambda m: ran.append(m.message_id), invisible_duration=2, workers=1,
                   monotonic=mono, wall=wall)
loop.poll()
time.sleep(1.0)  # real-time: the worker thread starts the message or refuses it (real time for the worker thread to start it or refuse it)
loop.settle_ready()
print("handler ran:", ran, loop.statistics())
loop.stop()
if ran:
    fail("a message whose broker lease had ended before receive returned was started")
print("OK")
