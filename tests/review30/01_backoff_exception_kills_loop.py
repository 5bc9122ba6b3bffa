"""01 — a retry_backoff= that raises an ordinary Exception stops the whole loop and run() re-raises it.

Promise broken: user callables raising are contained per message (docs/consume.md: key=/cost= failures
"neither stops the loop"; RELIABILITY.md's fault table row for `retry_backoff=` "raising": "the nack
fails (counted an ack error), the message waits out its lease"); only a KeyboardInterrupt/SystemExit
from user code is documented to stop the loop (RELIABILITY.md "KeyboardInterrupt / SystemExit from
key=, cost=, retry_backoff= ...").
Steps: a handler that fails once; retry_backoff raises ValueError; the loop runs on a thread.
Expected: the loop keeps consuming (message retried/given back, counted an error); run() does not
raise a ValueError. Actual: ConsumeLoop._settle catches `BaseException` around retry_backoff and
re-raises it as an "interrupt": the loop stops and run() raises ValueError.
Real time: < 3 s (generous margins).
"""
import time
from _common import *
from tracer.clients.consume import ConsumeLoop

watchdog(30)
b = broker(); send(b, 3); c = consumer(b)
def backoff(attempt): raise ValueError("my backoff bug")
ran = []
def handler(m):
    ran.append(m.message_id)
    if len(ran) == 1: raise RuntimeError("first fails")
loop = ConsumeLoop(c, handler, invisible_duration=1, workers=2, retry_backoff=backoff)
t, box = run_in_thread(loop)
time.sleep(2.0)  # real-time: the failed message's nack and the next receives happen: whether run() lives on is the finding
alive = t.is_alive()
loop.stop(timeout=5); t.join(6)
print("run thread alive after 2 s:", alive, "run() raised:", repr(box.get("exc")), loop.statistics())
if not alive or isinstance(box.get("exc"), ValueError):
    fail("a plain Exception from retry_backoff= stopped the loop / was re-raised by run()")
print("OK")
