"""09 — a retry_backoff= that returns junk (NaN, inf, 10**400, a str, 1e9 past the broker's 12 h
limit) makes the nack itself fail: the failed message is counted an ack error and is not given
back; it waits out its whole lease (with a long lease, minutes), unlike a retry_backoff= that
raises a KeyboardInterrupt, which falls back to the default backoff.

Promise broken: "every held message is settled or given back" / on failure the loop "shortens the
invisibility to a backoff so the message comes back"; user callables returning junk are contained
(cost= junk -> cost 0; key= junk -> that message fails). RELIABILITY.md lists `junk-backoff` as
open; still open.
Steps: each junk value in turn; handler raises; invisible_duration=5.
Expected: retry_scheduled == 1, ack_errors == 0 (the default backoff used, as for a Ctrl-C).
Actual: ack_errors == 1, retry_scheduled == 0 for every junk value.
Real time: ~3 s.
"""
import math, logging
from _common import *
from tracer.clients.consume import ConsumeLoop
logging.disable(logging.CRITICAL)

watchdog(60)
bad = []
for name, value in [("nan", math.nan), ("inf", math.inf), ("10**400", 10**400), ("str", "2"), ("1e9", 1e9)]:
    b = broker(); send(b, 1); c = consumer(b)
    def handler(m): raise RuntimeError("fails")
    loop = ConsumeLoop(c, handler, invisible_duration=5, workers=1, retry_backoff=lambda a, v=value: v)
    t, box = run_in_thread(loop, until=lambda s: s.reported >= 1 and s.held == 0)
    t.join(10)
    s = loop.statistics()
    print(f"retry_backoff -> {name}: retry_scheduled={s.retry_scheduled} ack_errors={s.ack_errors} exc={box.get('exc')!r}")
    if s.retry_scheduled != 1 or s.ack_errors:
        bad.append(name)
if bad:
    fail(f"the nack failed for retry_backoff returning {bad}: not given back, waits out its lease")
print("OK")
