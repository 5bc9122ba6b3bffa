"""06 — a KeyboardInterrupt raised on run()'s own thread (inside `receive`, in `until=`) is not the
loop's interrupt: the drain then runs the backlog instead of giving it back.

Promise broken: docs/consume.md — a `KeyboardInterrupt`/`SystemExit` "stops the loop cleanly
(what it holds is given back; `run()` re-raises it after the drain)"; the broker-call rule: one
raised inside a broker call is re-raised by `run()` after its drain, like the rest (`_shutdown`:
"the program wants out: what has not started goes back"). A Ctrl-C without
install_signal_handlers() lands on run()'s thread, most often inside receive's long poll.
Steps: a broker double; ConsumeLoop(workers=2, key= one key, policy=Aggressive(max_parked=0)):
the first receive hands over m0 and m1 of one key — m0 runs (held open), m1 waits in the loop's
backlog; the next receive raises KeyboardInterrupt (the same with `until=` raising it). m0 is then
let end.
Expected: run() raises KeyboardInterrupt; m1 is given back unrun (given_back 1), as when key=,
cost= or retry_backoff= raise it on the loop's other threads.
Actual: m1 runs during the drain and is acked; the interrupt is counted nowhere.
"""
import threading
import time

from _common import *
from tracer.clients.consume import ConsumeLoop
from tracer.dispatch import Aggressive

watchdog(60)


class Interrupting(Double):
    def __init__(self, *a, where="receive", **k):
        super().__init__(*a, **k)
        self.calls, self.where = 0, where

    def receive(self, n, invisible):
        self.calls += 1
        if self.calls > 1 and self.where == "receive":
            time.sleep(0.05)  # real-time: the interrupt lands while the loop holds a backlog
            raise KeyboardInterrupt("Ctrl-C inside receive")
        return super().receive(n, invisible)


bad = []
for where in ("receive", "until"):
    c = Interrupting([msg(0, key="k"), msg(1, key="k")], where=where)
    gate = threading.Event()
    ran = []
    def handler(m):
        ran.append(m.message_id)
        if m.message_id == "m0":
            gate.wait(20)
    def until(s):
        if where == "until" and s.received >= 2:
            raise KeyboardInterrupt("Ctrl-C inside until=")
        return False
    loop = ConsumeLoop(c, handler, workers=2, key=lambda m: m.message_group, policy=Aggressive(max_parked=0),
                       invisible_duration=30)
    t, box = run_in_thread(loop, until=until)
    time.sleep(0.5)  # real-time: the interrupt from until= lands while the handler is held at its gate
    gate.set()
    t.join(20)
    s = loop.statistics()
    print(where, "run() raised:", repr(box.get("exc")), "ran:", ran, "acked", s.acked, "given_back", s.given_back,
          "held", s.held)
    if not isinstance(box.get("exc"), KeyboardInterrupt) or "m1" in ran:
        bad.append(where)
if bad:
    fail(f"an interrupt on run()'s thread ({', '.join(bad)}) ran the backlog instead of giving it back")
print("OK")
