"""Promise (issue #31 'Deliver', semconv.md rmqtrace.outcome): every settled delivery (acked,
nacked, timed out, not started, lease lost) is measured exactly once with its real outcome; a copy
the loop gives back unrun is `not_started` (or the dispatcher's `skipped`) in rmqtrace_messages_total.

Steps: ConsumeLoop, workers=2, Aggressive(max_parked=0), key= the message key. Message A (key k)
hangs in its handler; message B (key k) is received and waits in the loop's own backlog (the
dispatcher refuses it: key busy, no parking). loop.stop(timeout=0.2): the backlog is given back
unrun (loop stats: not_started=1, given_back=1). Release A.

Expected: B's delivery appears in rmqtrace_messages_total (not_started or skipped) — one count per
settled delivery, the same as when the dispatcher gives back what it queued.
Actual: B is never measured: its MessageTrace is never finished (ConsumeLoop._report does not
finish h.trace), so the loop says 2 settled and telemetry says 1. Knock-on: with an Occupancy on the
tracer, B is never `discarded`, so rmqtrace_consumer_unstarted_messages stays 1 for ever after the
loop has stopped, its oldest-unstarted age grows without end and hol_idle_worker_seconds accrues
for ever — phantom head-of-line blocking. The same hole: successors of a hung key given back by
ConsumeLoop._give_back_key, a submit refused by the dispatcher (_offer: FAILURE, ran=False), and a
Ctrl-C from key= in _own.
"""
import sys, threading
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from _rig import Rig, wait_until
from tracer.clients.consume import ConsumeLoop
from tracer.dispatch.policy import Aggressive

from tracer.telemetry.occupancy import Occupancy
occupancy = Occupancy(2)
rig = Rig(occupancy=occupancy)
release, started = threading.Event(), threading.Event()

def handler(m):
    if m.body == b"A":
        started.set()
        release.wait(10)

loop = ConsumeLoop(rig.consumer, handler, tracer=rig.tracer, policy=Aggressive(max_parked=0), workers=2,
                   key=lambda m: m.keys[0] if m.keys else None, invisible_duration=30)
t = threading.Thread(target=loop.run, daemon=True)
t.start()
rig.send(b"A", keys="k")
started.wait(5)
rig.send(b"B", keys="k")
wait_until(lambda: loop.state().waiting == 1, what="B in the loop backlog")
loop.stop(timeout=0.2)
release.set()
t.join(5)
wait_until(lambda: loop.statistics().acked == 1 and rig.count('success') == 1, what="A settled")
st = loop.statistics()
print("loop:", "succeeded", st.succeeded, "not_started", st.not_started, "given_back", st.given_back, "acked", st.acked)
print("telemetry outcomes:", rig.outcomes())
settled = st.succeeded + st.failed + st.not_started
measured = sum(rig.outcomes().values())
assert st.not_started == 1, st
assert measured == settled, f"loop settled {settled} deliveries, rmqtrace_messages_total has {measured}"
snap = occupancy.snapshot()
print("occupancy after stop:", snap.unstarted, "unstarted, busy", snap.busy)
assert snap.unstarted == 0, f"occupancy still counts {snap.unstarted} unstarted message(s) after the loop stopped"
