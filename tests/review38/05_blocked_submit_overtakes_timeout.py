"""Sibling of 01 for the watchdog TIMEOUT (docs/dispatch.md "A key whose message hung": "every
message parked behind it is taken out and given back at once ... So the key's successors follow
the message given back to the broker rather than wait for a thread that may never return, or
overtake it locally").

Steps, each policy (aggressive max_parked=2, cost_aware window=2, round_robin buffer=2), both
engines, ``successors_follow=True``, ``handler_timeout=0.3``: a0 hangs; a1, a2 of its key fill the
parking room; a3 of the same key blocks in submit() (the docs' own receive loop submits blocking).

Expected: a3, waiting behind the hung a0 as much as a1 and a2, does not run before a0 succeeded.
Actual (aggressive and cost_aware, both engines; round_robin on asyncio, whose hung task is
cancelled): at the deadline a0 is TIMEOUT, a1 and a2 SKIPPED, and the blocked a3 is admitted and
runs locally while a0 (and a1, a2) go back to the broker: it overtakes them. round_robin on
threads refuses a3 (the key's worker is still hung) — that one holds.
"""
import asyncio
import os
import sys
import threading
import time

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

    d = Dispatcher(h, policy=pol, workers=2, key=lambda m: m[0], handler_timeout=0.3,
                   on_done=lambda m, o, e: log.append((o.name, m)), successors_follow=True)
    d.submit("a0")
    wait_until(lambda: bool(d.running()), what="a0 to start")
    d.submit("a1")
    d.submit("a2")
    t = threading.Thread(target=lambda: log.append(("accepted", d.submit("a3", timeout=1.0))))
    t.start()
    t.join()
    time.sleep(0.2)  # real-time: past a0's 0.3 s handler_timeout, so the watchdog reports it
    gate.set()
    d.wait_idle(timeout=2)
    d.close(timeout=2)
    return log


async def aio_run(pol):
    log = []

    async def h(m):
        log.append(("start", m))
        if m == "a0":
            await asyncio.sleep(0.8)

    d = AsyncDispatcher(h, policy=pol, workers=2, key=lambda m: m[0], handler_timeout=0.3,
                        on_done=lambda m, o, e: log.append((o.name, m)), successors_follow=True)
    await d.submit("a0")
    while not d.running():
        await asyncio.sleep(0.01)
    await d.submit("a1")
    await d.submit("a2")
    log.append(("accepted", await d.submit("a3", timeout=1.0)))
    await asyncio.sleep(0.2)
    await d.wait_idle(timeout=2)
    await d.close(timeout=2)
    return log


bad = []
for name in policies():
    for engine, run in (("thread", thread_run), ("asyncio", lambda p: asyncio.run(aio_run(p)))):
        log = run(policies()[name])
        print(name, engine, log)
        if ("start", "a3") in log:
            bad.append((name, engine, log))
assert not bad, f"a blocked submitter of the hung key ran locally past it: {bad[0]}"
