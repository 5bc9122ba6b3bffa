"""01 — receive_ahead keeps receiving for one ending handler while its messages park behind its key.

Promise broken: docs/consume.md and tracer/clients/ahead.py: "At most one message is received
ahead per such handler" (a running handler within one round trip of its expected end).
Steps: ConsumeLoop(workers=1, key= one key for all, receive_ahead=True) over a broker double on a
manual clock (each receive is a 10 ms round trip, so the lead is 10 ms); message 1 (cost 1 s) runs
and hangs; the clock is put 10 ms before its expected end; poll() is called as run() would.
Expected: one message received ahead of it (1 running + 1 ahead = 2 received).
Actual: each poll receives one more: the one received ahead is parked in the dispatcher behind its
busy key (accepted, so it no longer counts as waiting in the backlog) and the ending handler counts
as room again — 2 received ahead (each poll moves the clock one trip) for one handler here, up to Aggressive.max_parked (64) while the
lead lasts. DemandPushConsumer(receive_ahead=True) keys by message group: every FIFO topic.
"""
import threading
from _common import *
from tracer.clients.consume import ConsumeLoop

watchdog(60)
clock = Clock()
c = Double([msg(i, key="k", cost="1.0") for i in range(20)], clock, trip=0.01)
release = threading.Event()
loop = ConsumeLoop(c, lambda m: release.wait(20), workers=1, key=lambda m: m.message_group,
                   receive_ahead=True, invisible_duration=30, monotonic=clock)
try:
    loop.poll()  # message 0 starts
    if not until(lambda: len(loop.dispatcher.running()) == 1):
        fail("the first message did not start")
    start = clock() - loop.dispatcher.running()[0][1]
    clock.t = start + 1.0 - 0.005  # within one lead (10 ms) of its expected end
    for _ in range(5):
        loop.poll()
    n = len(c.received)
    print("received:", n, "(1 running; expected at most 1 ahead)", loop.state())
    if n > 2:
        fail(f"{n - 1} messages received ahead for one ending handler")
    print("OK")
finally:
    release.set()
    loop.stop(timeout=2)
