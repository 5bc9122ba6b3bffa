"""Promise (docs/consume.md, ConsumeLoop docstring; goal of successors_follow): on a FIFO topic
with ``key=`` the message group, no message of a group starts before every earlier one of it has
succeeded, and after a message is given back "the group runs again in order, each later one once".
docs/consume.md: a ``key=`` that raises (or returns junk) "means that one message does not run: it
is given back" — i.e. it is handled as a message refused at the start, which takes its group's
later messages back with it.

Steps (embedded broker, FIFO topic, group a = a0 a1 a2 a3; aggressive and round_robin, both with
``key=`` raising, then returning 42, for a1 on its first delivery only):

Expected: a1 is given back and a2, a3 follow it unrun: handler starts a0 a1 a2 a3, each once.
Actual: a1 alone is given back; a2 (and with round_robin a3) run at once, before a1 has run at
all — then the broker hands the queue out again from a1 and a2 (a3) run a second time:
e.g. [a0, a2, a1, a2, a3]. The group's order is broken and a2 is handled twice.
"""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _fifo import fifo_broker, run_loop


def case(policy: str, junk: bool) -> list[str]:
    lock, starts, ok = threading.Lock(), [], set()

    def key(m):
        if m.body == b"a1" and m.delivery_attempt == 1:
            if junk:
                return 42
            raise RuntimeError("key= broke on a1")
        return m.message_group

    def handler(m):
        with lock:
            starts.append(m.body.decode())
            ok.add(m.body)

    run_loop(fifo_broker({"a": 4}), handler, lambda s: len(ok) >= 4 and s.held == 0,
             policy=policy, workers=2, key=key)
    return starts


bad = []
for policy in ("aggressive", "round_robin"):
    for junk in (False, True):
        starts = case(policy, junk)
        print(policy, "junk" if junk else "raise", starts)
        if starts != ["a0", "a1", "a2", "a3"]:
            bad.append((policy, junk, starts))
assert not bad, f"a key= error on a1 lets its successors run before it (and twice): {bad}"
