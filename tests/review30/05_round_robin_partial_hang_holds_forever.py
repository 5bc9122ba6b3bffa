"""05 — round-robin (and random) with ONE of two workers hung: after its TIMEOUT, every message dealt
to the hung worker's buffer is received, held and lease-renewed for as long as the hang lasts, never
started, out of every peer's reach (issue #30 item 5's class, for a partial hang: the fix only
covers "every worker hung").

Promise broken: the loop "receives only as many messages as it has free workers"; "every held
message is settled or given back"; docs: a hung handler's worker is let go at handler_timeout so the
rest flows. A buffer behind a thread known to be hung is no room.
Steps: policy round_robin (buffer 10), workers=2, handler_timeout=0.3, invisible_duration=1; the first
message's handler hangs (until the end of the script); 20 more messages; 4 s of real time.
Expected: messages no worker can start are not kept (not received, or given back so a peer takes
them); nothing stays held and renewed behind the hung worker. Actual: about half of the later
messages sit in the hung worker's buffer, held with their leases renewed (leases_extended climbs),
none of them run; a peer consumer of the group gets nothing.
Real time: ~5 s, generous margins (the hang is 4 s vs a 0.3 s timeout, leases of 1 s).
"""
import time, threading
from _common import *
from tracer.clients.consume import ConsumeLoop

watchdog(60)
b = broker(); c = consumer(b)
release = threading.Event()
first = []
ran = []
def handler(m):
    if not first:
        first.append(m.message_id); release.wait(30); return
    ran.append(m.message_id)
send(b, 1)
loop = ConsumeLoop(c, handler, policy="round_robin", workers=2, handler_timeout=0.3, invisible_duration=1)
t, box = run_in_thread(loop)
time.sleep(1.0)  # real-time: the first message hangs past handler_timeout on the real watchdog (the first message is running (hung) and has timed out)
send(b, 20)
time.sleep(4.0)  # real-time: past several 1 s leases: what stays held is the finding
peer = consumer(b, group="g")
peer_got = peer.receive(32, 5)
s, st = loop.statistics(), loop.state()
print("held now:", st.held, "ran:", len(ran), "peer got:", len(peer_got), s)
release.set(); loop.stop(timeout=5); t.join(10)
stuck = st.held - 1  # minus the hung one itself
if stuck > 0:
    fail(f"{stuck} message(s) held unstarted behind the hung worker while the hang lasts, renewed, out of peers' reach")
print("OK")
