"""Promise (docs/consume.md; tracer/dispatch/core.py "key="): a ``key=`` that raises or returns
junk means "that one message does not run: it is given back ... None of them stops the loop";
in the dispatcher "submit returns True (accepted), the message is counted in not_started".

A plain ``str`` key that cannot be UTF-8 encoded — a lone surrogate, what
``bytes.decode("utf-8", "surrogateescape")`` or ``os.fsdecode`` give for a non-UTF-8 byte — under
``round_robin`` / ``random`` (which route a key by ``crc32(key.encode())``).

Expected: only that message is not run (given back / NOT_STARTED); everything else flows.
Actual: the dispatcher's ``submit`` raises ``UnicodeEncodeError`` (round_robin, random). The
ConsumeLoop (round_robin) wedges: its feeder asks ``blocks(key)``, which encodes the key, so every
pass fails and is counted as a *receive* error (``receive_errors:UnicodeEncodeError``, ~2 a second),
nothing runs — the other messages of the batch included — while the leases are renewed; on
``stop()`` ``run()`` raises the UnicodeEncodeError out of its shutdown.
"""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _fifo import GROUP, TOPIC, fifo_broker  # noqa: E402

from tracer import ConsumeLoop  # noqa: E402
from tracer.dispatch import Dispatcher, Random, RoundRobin  # noqa: E402
from tracer.embedded import FilterExpression, SimpleConsumer  # noqa: E402

JUNK = b"a\xff".decode("utf-8", "surrogateescape")  # 'a\udcff'
problems = []

for policy in (RoundRobin(buffer=2), Random(buffer=2)):
    d = Dispatcher(lambda m: None, policy=policy, workers=2, successors_follow=True,
                   key=lambda m: JUNK if m == "x" else "k")
    try:
        d.submit("x", timeout=1)
    except Exception as exc:  # noqa: BLE001 - the finding
        problems.append(f"{type(policy).__name__}: submit raised {exc!r}")
    d.close(timeout=5)

lock, ok = threading.Lock(), set()


def key(m):
    if m.body == b"a1" and m.delivery_attempt == 1:
        return JUNK
    return m.message_group


def handler(m):
    with lock:
        ok.add(m.body)


consumer = SimpleConsumer(fifo_broker({"a": 4, "b": 3}), GROUP, {TOPIC: FilterExpression()}, await_duration=0.05)
consumer.startup()
loop = ConsumeLoop(consumer, handler, key=key, policy="round_robin", workers=2, invisible_duration=5,
                   retry_backoff=lambda a: 1)
box = {}


def go():
    try:
        box["stats"] = loop.run(until=lambda s: len(ok) >= 7 and s.held == 0)
    except BaseException as exc:  # noqa: BLE001 - the finding
        box["error"] = exc


t = threading.Thread(target=go, daemon=True)
t.start()
t.join(20)
if t.is_alive():
    problems.append(f"loop: only {sorted(ok)} handled in 20 s: {loop.statistics()}")
    loop.stop(timeout=5)
    t.join(10)
if "error" in box:
    problems.append(f"loop: run() raised {box['error']!r}")
consumer.shutdown()
print("\n".join(problems))
assert not problems, f"{len(problems)} problems with a key that cannot be encoded"
