"""06 — a message whose key= raised (or returned a non-str) never runs, but is counted as a handler
that ran and failed: ConsumeStats.failed and retry_scheduled (not not_started / given_back), and
DispatchStats.failed.

Promise broken: ConsumeStats: "succeeded + failed count handlers that ran and ended";
"not_started counts messages given back or expired without running"; retry_scheduled is "nacked
after a handler failed", given_back "nacked without having run"; "a not-started copy is never a
failure". (RELIABILITY.md lists `key-error-counted-failed` as open; still open.)
Steps: key=lambda m: 1/0 (and a key= returning an int); 2 messages; the handler records runs.
Expected: handler runs 0, failed 0, not_started 2, given_back 2. Actual: failed 2, retry_scheduled
2, not_started 0 (dashboards show handler failures for code that never ran).
Real time: ~1 s.
"""
from _common import *
from tracer.clients.consume import ConsumeLoop
import logging; logging.disable(logging.CRITICAL)

watchdog(40)
bad = False
for name, kf in [("raises", lambda m: 1 / 0), ("returns int", lambda m: 5)]:
    b = broker(); send(b, 2); c = consumer(b)
    ran = []
    loop = ConsumeLoop(c, lambda m: ran.append(1), invisible_duration=1, workers=1, key=kf)
    t, box = run_in_thread(loop, until=lambda s: s.reported >= 2)
    t.join(15)
    s = loop.statistics()
    print(f"key= {name}: ran={len(ran)} failed={s.failed} retry_scheduled={s.retry_scheduled} "
          f"not_started={s.not_started} given_back={s.given_back} dispatcher.failed={loop.dispatcher.statistics().failed}")
    if not ran and (s.failed or s.retry_scheduled or loop.dispatcher.statistics().failed):
        bad = True
if bad:
    fail("messages that never ran are counted as handler failures")
print("OK")
