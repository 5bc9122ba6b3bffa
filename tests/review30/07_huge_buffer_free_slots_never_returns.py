"""07 — RoundRobin(buffer=)/Random(buffer=) accept any int (10**400, or just 10**7): free_slots()
then counts the room one slot at a time (BufferedScheduler.free_slots draws a target per free slot
and appends it to `_upcoming`), so it takes O(workers x buffer) time and memory — for ever with
10**400. The consume loop calls it on every poll: run() never gets past its first _room(), the
loop never receives, stop(timeout=1) returns False and run() never returns.

Promises broken: "loud early errors for arguments that cannot work" (bounds.count: "a number past
what one process can run" is refused — workers have MAX_THREADS, buffer has no maximum);
stop(timeout=t) returns True within its bound once run() drained; run() returns after stop().
Steps: ConsumeLoop(policy=RoundRobin(buffer=10**400), workers=2) on the embedded broker with one
message; run() on a thread; stop(timeout=1).
Expected: a ValueError at construction, or a loop that runs and stops within ~1.5 s.
Actual: nothing is received, stop(timeout=1) -> False, the run thread is still alive (spinning,
memory growing). Also shown: Dispatcher(policy=RoundRobin(buffer=10**6), workers=4).free_slots()
takes over a second and leaves 4 million entries in the scheduler.
Real time: ~4 s.
"""
import time
from _common import *
from tracer.clients.consume import ConsumeLoop
from tracer.dispatch import RoundRobin

watchdog(60)
try:
    pol = RoundRobin(buffer=10**400)
    b = broker(); send(b, 1); c = consumer(b)
    ran = []
    loop = ConsumeLoop(c, lambda m: ran.append(1), policy=pol, workers=2, invisible_duration=1)
except (ValueError, TypeError) as e:
    print("refused early:", e); print("OK"); raise SystemExit(0)
t, box = run_in_thread(loop)
time.sleep(1.0)  # real-time: the loop is running (and may be wedged) when stop() comes
t0 = time.monotonic(); ok = loop.stop(timeout=1); took = time.monotonic() - t0
t.join(2)
print("ran:", len(ran), "stop(timeout=1) ->", ok, f"after {took:.2f}s; run thread alive:", t.is_alive())
if not ok or t.is_alive() or not ran:
    fail("a huge round-robin buffer is accepted and the loop never gets past free_slots()")
print("OK")
