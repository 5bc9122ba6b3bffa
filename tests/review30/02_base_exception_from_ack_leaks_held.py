"""02 — a BaseException (KeyboardInterrupt) raised by the client's ack leaves the message held for
ever: statistics().held stays 1 after run() returned, the counters never add up, and
loop.wait(predicate) (no timeout) then blocks for ever.

Promises broken: "every held message is settled or given back"; counters add up once idle
(received == acked + retry_scheduled + given_back + ack_errors + expired + held, with held 0 when
run() has returned); wait(): "returns False once the loop has finished holding nothing".
Steps: a client double whose ack raises KeyboardInterrupt once; one message; run() on a thread.
Expected: run() re-raises the KeyboardInterrupt (fine) and the message is settled (ack error /
expired), held == 0; wait() returns. Actual: ConsumeLoop._settle only catches Exception from the
ack, so its bookkeeping (pop from _leases, _settling -= 1) is skipped: held stays 1, and
wait(lambda s: False) never returns (watchdog).
Real time: ~2 s.
"""
import time, threading
from _common import *
from tracer.clients.consume import ConsumeLoop

watchdog(40, "loop.wait() after run() returned")
b = broker(); send(b, 1)
class C(Wrap):
    n = 0
    def ack(self, m):
        C.n += 1
        if C.n == 1: raise KeyboardInterrupt("Ctrl-C inside ack")
        return self.inner.ack(m)
c = C(consumer(b))
loop = ConsumeLoop(c, lambda m: None, invisible_duration=1, workers=1)
t, box = run_in_thread(loop, until=lambda s: s.reported >= 1)
t.join(20)
if t.is_alive(): fail("run() did not return")
s = loop.statistics()
print("run() raised:", repr(box.get("exc")), s)
if s.held != 0:
    print("held after run() returned:", s.held, "- now calling loop.wait(lambda s: False, timeout=None)")
    # wait() must return False once finished and nothing held; give it 5 s on a side thread
    done = threading.Event()
    threading.Thread(target=lambda: (loop.wait(lambda s: False), done.set()), daemon=True).start()
    if not done.wait(5): fail("held stays 1 for ever and loop.wait() blocks for ever")
    fail(f"held={s.held} after run() returned")
print("OK")
