"""Promise (Dispatcher docstring, docs/dispatch.md "successors_follow"): with successors_follow a
keyed message that ends without success takes the messages of its key waiting behind it with it,
"so none runs before the failed one has succeeded".

Steps, each policy (aggressive max_parked=2, cost_aware window=2, round_robin buffer=2), both
engines: a0 runs and is held; a1, a2 of its key fill the parking room; a3 of the same key is
submitted next and blocks in submit() (the room is full) — exactly the docs' own receive loop,
which calls the blocking ``d.submit(msg, trace)``. a0 then fails.

Expected: a3 waits behind a0 as much as a1 and a2 do: it is not run before a0 has succeeded
(given back / SKIPPED like them, or refused).
Actual: a1 and a2 are SKIPPED, then the blocked a3 is admitted into the freed room and runs —
a3 runs while a0, a1, a2 have never succeeded: on a FIFO topic the group's order is broken
(a0 fails, a3 runs, then the broker brings a0 a1 a2 a3 back: a3 runs twice, once out of order).
"""
import asyncio
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from waiting import wait_until  # noqa: E402

from tracer.dispatch import Aggressive, AsyncDispatcher, CostAware, Dispatcher, RoundRobin


def policies():
    return {"aggressive": Aggressive(max_parked=2), "cost_aware": CostAware(window=2),
            "round_robin": RoundRobin(buffer=2)}


def thread_run(pol):
    log, gate = [], threading.Event()

    def h(m):
        log.append(("start", m))
        if m == "a0":
            gate.wait()
            raise RuntimeError("a0 fails")

    d = Dispatcher(h, policy=pol, workers=2, key=lambda m: m[0],
                   on_done=lambda m, o, e: log.append((o.name, m)), successors_follow=True)
    d.submit("a0")
    wait_until(lambda: bool(d.running()), what="a0 to start")
    d.submit("a1")
    d.submit("a2")
    t = threading.Thread(target=d.submit, args=("a3",))
    t.start()
    wait_until(lambda: d.statistics().waiters > 0, what="a3's submit to block")
    gate.set()
    t.join()
    d.wait_idle()
    d.close()
    return log


async def aio_run(pol):
    log, gate = [], asyncio.Event()

    async def h(m):
        log.append(("start", m))
        if m == "a0":
            await gate.wait()
            raise RuntimeError("a0 fails")

    d = AsyncDispatcher(h, policy=pol, workers=2, key=lambda m: m[0],
                        on_done=lambda m, o, e: log.append((o.name, m)), successors_follow=True)
    await d.submit("a0")
    while not d.running():
        await asyncio.sleep(0.01)
    await d.submit("a1")
    await d.submit("a2")
    t = asyncio.ensure_future(d.submit("a3"))
    while d.statistics().waiters == 0:
        await asyncio.sleep(0.01)
    gate.set()
    await t
    await d.wait_idle()
    await d.close()
    return log


bad = []
for name in policies():
    for engine, run in (("thread", lambda p: thread_run(p)), ("asyncio", lambda p: asyncio.run(aio_run(p)))):
        log = run(policies()[name])
        if ("start", "a3") in log:
            bad.append((name, engine, log))
        print(name, engine, log)
assert not bad, f"a blocked submitter of the failed key ran before it succeeded: {bad[0]}"
