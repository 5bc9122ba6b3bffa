"""Promise (docs/consume.md; tracer/dispatch/core.py "key="): a ``key=`` that raises or returns
junk "means that one message does not run: it is given back ... None of them stops the loop"; in
the dispatcher "submit returns True (accepted), the message is counted in not_started".

Junk that passes the ``str`` check: ``key=`` returns a ``str`` subclass whose ``__hash__`` (and
``__eq__``) raise — for one message (a1) of a FIFO group, on its first delivery.

Expected: a1 is given back (not_started), the loop goes on and handles the group; the dispatcher's
``submit`` accepts it and reports NOT_STARTED.
Actual: the dispatcher's ``submit`` raises the key's ``RuntimeError`` (aggressive, cost_aware).
The ConsumeLoop wedges: its feeder hashes the key outside the key= guard, every pass fails and
is counted as a *receive* error (~2 a second), nothing runs — a0 included, a message of the same
group received before — while their leases are renewed for ever; ``stop()`` then makes ``run()``
raise that RuntimeError out of its shutdown (the messages are given back).
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _fifo import GROUP, TOPIC, fifo_broker  # noqa: E402

from tracer import ConsumeLoop  # noqa: E402
from tracer.dispatch import Dispatcher  # noqa: E402
from tracer.embedded import FilterExpression, SimpleConsumer  # noqa: E402


class BadKey(str):
    def __hash__(self):
        raise RuntimeError("__hash__ of a junk key")

    def __eq__(self, other):
        raise RuntimeError("__eq__ of a junk key")


problems = []

# the dispatcher alone
for policy in ("aggressive", "cost_aware", "round_robin"):
    d = Dispatcher(lambda m: None, policy=policy, workers=2, successors_follow=True,
                   key=lambda m: BadKey("a") if m == "a1" else m[0])
    try:
        d.submit("a0")
        d.submit("a1")
    except Exception as exc:  # noqa: BLE001 - the finding
        problems.append(f"{policy}: submit raised {exc!r}")
    d.wait_idle(timeout=5)
    d.close(timeout=5)

# the loop on a FIFO topic
lock, ok = threading.Lock(), set()


def key(m):
    if m.body == b"a1" and m.delivery_attempt == 1:
        return BadKey(m.message_group)
    return m.message_group


def handler(m):
    with lock:
        ok.add(m.body)


consumer = SimpleConsumer(fifo_broker({"a": 4}), GROUP, {TOPIC: FilterExpression()}, await_duration=0.05)
consumer.startup()
loop = ConsumeLoop(consumer, handler, key=key, workers=2, invisible_duration=5, retry_backoff=lambda a: 1)
box = {}


def go():
    try:
        box["stats"] = loop.run(until=lambda s: len(ok) >= 4 and s.held == 0)
    except BaseException as exc:  # noqa: BLE001 - the finding
        box["error"] = exc


t = threading.Thread(target=go, daemon=True)
t.start()
t.join(20)
if t.is_alive():
    problems.append(f"loop: nothing handled in 20 s besides {sorted(ok)}: {loop.statistics()}")
    loop.stop(timeout=5)
    t.join(10)
if "error" in box:
    problems.append(f"loop: run() raised {box['error']!r}")
consumer.shutdown()
time.sleep(0.1)  # real-time: the client's own threads end before the verdict prints
print("\n".join(problems))
assert not problems, f"{len(problems)} problems with a str-subclass junk key"
