"""11 — the documented signal-safe stop deadlocks: install_signal_handlers()'s handler (and stop()
called from a user's handler) calls `self._stop.set()`, and threading.Event.set() takes the event's
internal lock. When the signal lands while the main thread itself is inside that event's lock —
its own `loop.stop()` call (Event.set), or run() on the main thread waiting out a failed receive
(`self._stop.wait(0.5)`'s bookkeeping) — the handler blocks for ever on a lock its own thread holds.

Promise broken: stop() "is safe from a signal handler: it never waits for the loop's lock, which
the interrupted thread may hold"; install_signal_handlers() is said to be safe (issue #30 item 8).
The loop's lock was fixed; the event's lock is the same class.
Steps (real signals, no internals): install_signal_handlers(); the same installed handler is also
bound to SIGALRM, fired 0.2 ms after the previous one returned (setitimer) (a burst of SIGTERMs, e.g. from a supervisor); the
main thread calls loop.stop() repeatedly (a legitimate public call) for up to 3 s.
Expected: the loop of stop() calls finishes. Actual: within milliseconds a signal lands inside
Event.set's `with self._cond:` and the handler's own Event.set() waits for ever (watchdog fires).
If the race is not hit in 3 s the script exits 0 (it is hit at once here, 5 of 5 runs).
"""
import signal, time
from _common import *
from tracer.clients.consume import ConsumeLoop

watchdog(8, "deadlock in the signal handler (Event lock)")
b = broker(); c = consumer(b)
loop = ConsumeLoop(c, lambda m: None, invisible_duration=1, workers=1)
loop.poll()  # a loop that has started (phase POLLED): stop() only asks
loop.install_signal_handlers()
installed = signal.getsignal(signal.SIGTERM)
done = False
def alarm(*a):  # one SIGTERM-equivalent at a time: the installed handler itself, re-armed after it returns
    installed(*a)
    if not done:  # a handler run after the loop below ended must not re-arm (a SIGALRM would kill the exit)
        signal.setitimer(signal.ITIMER_REAL, 0.0002)
signal.signal(signal.SIGALRM, alarm)
signal.setitimer(signal.ITIMER_REAL, 0.0002)
end = time.monotonic() + 3.0
n = 0
while time.monotonic() < end:
    loop.stop(); n += 1
done = True
signal.signal(signal.SIGALRM, signal.SIG_IGN)  # an alarm already pending is ignored, not fatal
signal.setitimer(signal.ITIMER_REAL, 0, 0)
print("stop() called", n, "times under signals without a deadlock")
print("OK")
