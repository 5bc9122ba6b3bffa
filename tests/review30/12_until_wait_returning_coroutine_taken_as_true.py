"""12 — `run(until=)` and `wait(predicate)` that *return* a coroutine or generator (a plain lambda
around an async check, `lambda s: check(s)`, or a decorator without functools.wraps) are taken as
True: run() ends at once without receiving anything, and wait() returns True at once, with Python's
"coroutine ... was never awaited" warning. key=, cost= and retry_backoff= returning a coroutine are
contained, but the coroutine is not closed either (the same warning from consume.py / engine.py).

Promise broken (docs/consume.md): "A plain function that *returns* a coroutine, another awaitable or
a generator ... passes that check, so every seam also looks at the result ... (a coroutine or
generator is closed, so Python does not warn 'never awaited')"; and for until=/wait(): "a
coroutine is truthy: run() would end at once" is exactly why the async def is refused.
Steps: 3 messages; run(until=lambda s: acheck(s)) with `async def acheck(s): return False`;
likewise a generator; wait(lambda s: acheck(s), timeout=2) while a loop runs.
Expected: a TypeError (or HandlerNeverRan) from run()/wait(), as for the async def itself — not a
silent "done". Actual: run() returns received=0; wait() returns True.
Real time: ~2 s.
"""
import warnings, logging
from _common import *
from tracer.clients.consume import ConsumeLoop
logging.disable(logging.CRITICAL)
warnings.simplefilter("ignore")

watchdog(40)
async def acheck(s): return False
def gen(s):
    yield False
bad = []
for name, until in [("until -> coroutine", lambda s: acheck(s)), ("until -> generator", lambda s: gen(s))]:
    b = broker(); send(b, 3); c = consumer(b)
    loop = ConsumeLoop(c, lambda m: None, invisible_duration=1, workers=1)
    try:
        s = loop.run(until=until)
        print(f"{name}: run() returned, received={s.received}")
        if s.received == 0: bad.append(name)
    except (TypeError, ValueError) as e:
        print(f"{name}: refused: {e!r}")
b = broker(); send(b, 3); c = consumer(b)
loop = ConsumeLoop(c, lambda m: None, invisible_duration=1, workers=1)
t, box = run_in_thread(loop)
try:
    r = loop.wait(lambda s: acheck(s), timeout=2)
    print("wait -> coroutine:", r)
    if r is True: bad.append("wait predicate -> coroutine")
except (TypeError, ValueError) as e:
    print("wait: refused:", repr(e))
loop.stop(timeout=2); t.join(3)
if bad:
    fail(f"a returned coroutine/generator was taken as True: {bad}")
print("OK")
