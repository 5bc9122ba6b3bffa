"""Promise (ChildExportStats, exportchild.py module doc): "Every span on_end accepted ends in exactly
one of: exported, failed, lost"; until then it is queued or unacknowledged — a snapshot accounts
for every accepted span (accepted = exported + failed + lost + queued + unacknowledged), and
accepted never goes down.

Steps: ChildExportProcessor (a child exporter that succeeds), a queue big enough to drop nothing;
one thread ends 20 000 spans while another takes statistics() snapshots as fast as it can.

Expected: every snapshot adds up, and accepted never decreases.
Actual: thousands of snapshots miss spans: those the writer has taken from the queue and is
encoding are neither queued nor unacknowledged (and while it pops them, outside the lock, accepted
= taken + len(queue) goes down) — a span "acknowledged as queued" that the counters cannot place.
"""
import os, sys, threading
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rig import child_env, provider, total
from tracer.telemetry.exportchild import ChildExportProcessor

proc = ChildExportProcessor("_rig:recording", {"path": os.devnull}, env=child_env(), max_queue_size=100_000)
prov = provider(proc)
tracer = prov.get_tracer("review35")
bad, seen, done = [], [0], threading.Event()


def watch() -> None:
    before = 0
    while not done.is_set():
        st = proc.statistics()
        seen[0] += 1
        if total(st) != st.accepted or st.accepted < before:
            bad.append(st)
        before = st.accepted


watcher = threading.Thread(target=watch)
watcher.start()
for i in range(20_000):
    with tracer.start_as_current_span("s") as span:
        span.set_attribute("i", i)
proc.force_flush(60_000)
done.set()
watcher.join()
prov.shutdown()
print(seen[0], "snapshots,", len(bad), "do not add up; first:", bad[:1])
assert not bad, f"{len(bad)} of {seen[0]} snapshots do not account for every accepted span: {bad[0]}"
