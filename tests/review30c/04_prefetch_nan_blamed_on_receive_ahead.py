"""04 — receive_ahead=True with prefetch=nan (or 1.5) is refused for the wrong reason.

Promise broken: docs/consume.md ("a count that is not an int (`prefetch=nan` ...) is a ValueError
at construction", one clear error naming what is wrong) — the STYLE rule of loud errors that say
what cannot work.
Steps: ConsumeLoop(c, h, receive_ahead=True, prefetch=nan); the same with prefetch=1.5.
Expected: the error says prefetch must be an int (as without receive_ahead).
Actual: "receive_ahead cannot work with prefetch=nan: a prefetch buffer already receives ahead"
— the user is told to drop receive_ahead, which would not fix it.
"""
import math
from _common import *
from tracer.clients.consume import ConsumeLoop

watchdog(30)
for bad in (math.nan, 1.5):
    try:
        ConsumeLoop(Double([]), print, receive_ahead=True, prefetch=bad)
    except (ValueError, TypeError) as exc:
        print(repr(bad), "->", exc)
        if "receive_ahead" in str(exc):
            fail(f"prefetch={bad!r} is blamed on receive_ahead")
    else:
        fail(f"prefetch={bad!r} accepted")
print("OK")
