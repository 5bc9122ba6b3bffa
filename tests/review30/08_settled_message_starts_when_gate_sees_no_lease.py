"""08 — a message the loop has already reported TIMEOUT and settled (its lease gone, given back to
the broker) still starts: the start gate treats "the loop holds no lease for it" (h is None) as
"go ahead" instead of "do not start".

Promises broken: "a message whose broker lease is gone never starts"; "no outcome of it was
reported yet (a TIMEOUT while it waited here: it was given back); else it does not start"
(ConsumeLoop._start_handler's docstring); no two copies at once (the broker's redelivery may run at
a peer meanwhile).
Steps (deterministic: manual clock, loop driven by poll()/settle_ready(), dispatcher.check_timeouts()
as the docs say to call after moving a manual clock): handler_timeout=1, invisible_duration=2. A
worker takes the message and stalls just before the start gate's first look at the loop's leases
(simulated: the message double's `message_id` read on the worker thread blocks — the worker thread
descheduled there, as in a process stall where the watchdog and ack threads wake first). Meanwhile
the clock passes handler_timeout and the lease; the watchdog reports TIMEOUT, the loop settles the
message (lease gone: expired) and drops its lease. Then the worker resumes.
Expected: the handler never runs. Actual: it runs (its outcome is then ignored: h is None).
Real time: ~1 s.
"""
import threading, time
from _common import *
from tracer.clients.consume import ConsumeLoop
from tracer.embedded import Message

watchdog(30)
class Clock: t = 1000.0
clk = Clock(); mono = lambda: clk.t
b = broker(monotonic=mono); send(b, 1)
gate = threading.Event(); at_gate = threading.Event()
class StallMsg(Message):
    @property
    def message_id(self):
        if threading.current_thread().name.startswith("consume-dispatch") and not gate.is_set():
            at_gate.set(); gate.wait(10)
        return self.__dict__["message_id"]
    @message_id.setter
    def message_id(self, v): self.__dict__["message_id"] = v
class C(Wrap):
    def receive(self, n, inv):
        got = self.inner.receive(n, inv)
        for m in got: m.__class__ = StallMsg
        return got
ran = []
loop = ConsumeLoop(C(consumer(b)), lambda m: ran.append(1), invisible_duration=2, workers=1,
                   handler_timeout=1, monotonic=mono, wall=lambda: 1.7e9 + clk.t)
loop.poll()
if not at_gate.wait(5): fail("setup: the worker never reached the gate")
clk.t += 3.0                      # the stall: past handler_timeout and past the lease
loop.dispatcher.check_timeouts()  # the watchdog wakes first: TIMEOUT reported
loop.settle_ready()               # the ack side settles it: lease gone -> expired, lease dropped
s_before = loop.statistics()
gate.set(); time.sleep(0.5)  # real-time: the released worker runs its start gate (no public event for it) (the worker resumes)
print("before resume:", s_before)
print("handler ran:", len(ran))
loop.stop()
if ran:
    fail("the handler of a message already reported TIMEOUT and settled (lease gone) was started")
print("OK")
