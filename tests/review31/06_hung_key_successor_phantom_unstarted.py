"""Promise (README/fleet alerts: "a demand-driven ConsumeLoop receives only what it can start, so a
wedged one holds nothing unstarted and stays quiet" on RmqtraceConsumerStalled; issue #31: every
settled delivery measured once). Same root as 01, on a *running* loop in normal operation.

Steps: ConsumeLoop (running), workers=2, Aggressive(max_parked=0), key= the message key,
handler_timeout=0.3 s, tracer with an Occupancy. A (key k) hangs; B (key k) waits in the loop's
backlog. At A's TIMEOUT the loop gives B back unrun with it (ConsumeLoop._give_back_key: loop
stats not_started=1, given_back=1). The loop keeps running, idle.

Expected: B is measured (rmqtrace_messages_total not_started/skipped) and leaves the occupancy
(unstarted back to 0).
Actual: B's trace is never finished: no count, and the occupancy counts B as received-not-started
for ever — rmqtrace_consumer_unstarted_messages stays 1, oldest_unstarted_age grows without end and
hol_idle_worker_seconds accrues with every idle second: RmqtraceConsumerStalled (age > 300 s) and
the head-of-line alert fire on a consumer that holds nothing.
"""
import sys, threading, time
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
                   key=lambda m: m.keys[0] if m.keys else None, invisible_duration=30, handler_timeout=0.3,
                   retry_backoff=lambda a: 60)
t = threading.Thread(target=loop.run, daemon=True); t.start()
try:
    rig.send(b"A", keys="k")
    started.wait(5)
    rig.send(b"B", keys="k")
    wait_until(lambda: loop.statistics().not_started == 1, what="B given back with the hung A")
    release.set()
    wait_until(lambda: rig.count("timeout") == 1, what="A's timeout measured")
    time.sleep(0.3)  # real-time: an idle loop's occupancy must not accrue while real time passes
    s1 = occupancy.snapshot(); time.sleep(0.5); s2 = occupancy.snapshot()  # real-time: as above
    st = loop.statistics()
    print("loop: not_started", st.not_started, "given_back", st.given_back, "| telemetry:", rig.outcomes())
    print(f"occupancy: unstarted={s2.unstarted} oldest_age={s2.oldest_unstarted_age_s:.2f}s "
          f"hol accrued in 0.5 s idle: {s2.hol_s - s1.hol_s:.2f} worker-s")
    assert s2.unstarted == 0, f"an idle loop holds nothing, occupancy says {s2.unstarted} unstarted"
    assert sum(rig.outcomes().values()) == st.succeeded + st.failed + st.not_started, "unmeasured delivery"
finally:
    release.set(); loop.stop(); t.join(5)
