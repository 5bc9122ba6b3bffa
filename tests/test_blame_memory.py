"""Live blame lets go of finished messages: what a worker's run log and the pending marks hold is
only what a waiting message may still be blamed on (tracer.path.blocking), while the victims' wait
spans still name their blockers.

Reachability is checked with weak references and ``gc.collect()``; ``Entry`` and ``MessageTrace``
are slotted without ``__weakref__``, so the test follows objects they alone hold: the item (held by
its ``Entry``) and the ``MessageInfo`` (held by its ``MessageTrace``), both of weak-referenceable
subclasses here.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from typing import Any

import pytest

from tracer.dispatch import AsyncDispatcher, Dispatcher, RoundRobin
from tracer.path import names as n
from tracer.path.blocking import GRACE_NS, HEAD_OF_LINE, BlameTracker
from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer

SLOW = 0.25
FAST = 0.01
MS = 1_000_000


class Key:
    """A delivery key (or ref) that can be weakly referenced."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Info(MessageInfo):
    """A MessageInfo that can be weakly referenced: alive exactly as long as its MessageTrace."""


class Body:
    def __init__(self, name: str) -> None:
        self.name = name


# -- the tracker alone ------------------------------------------------------------------------
def test_a_blocker_is_named_and_then_let_go_once_nothing_waits_on_its_worker() -> None:
    t = BlameTracker(2)
    slow, victim, other = Key("slow"), Key("victim"), Key("other")
    slow_ref = Key("slow-span")
    gone = [weakref.ref(o) for o in (slow, slow_ref, other)]
    t.arrived(slow, 0)
    t.arrived(victim, 0)
    t.arrived(other, 0)
    t.started(slow, 0, 0, ref=slow_ref)
    t.bound(victim, 0, 0)  # behind slow, on worker 0
    t.started(other, 1, 0)
    t.ended(other, 1, 1 * MS)
    t.ended(slow, 0, 100 * MS)
    v = t.started(victim, 0, 100 * MS)
    assert v.reason == HEAD_OF_LINE and v.blocker is slow and v.blocker_ref is slow_ref
    t.ended(victim, 0, 101 * MS)
    del slow, slow_ref, other, v
    gc.collect()
    assert [r() for r in gone] == [None, None, None]
    s = t.statistics()
    assert s.head_of_line == 1 and s.avoidable_s == pytest.approx((100 - 1 - GRACE_NS / MS) / 1000)


def test_runs_a_waiting_message_may_be_blamed_on_are_kept_until_it_starts() -> None:
    t = BlameTracker(2)
    first, second, victim = Key("first"), Key("second"), Key("victim")
    t.arrived(victim, 0)
    t.started(first, 0, 0)  # not arrived: an unknown start, still a run on worker 0
    t.bound(victim, 0, 0)
    t.ended(first, 0, 50 * MS)
    t.started(second, 0, 50 * MS)  # another run on worker 0 while the victim waits there
    t.ended(second, 0, 60 * MS)
    refs = [weakref.ref(first), weakref.ref(second)]
    del first, second
    gc.collect()
    assert all(r() is not None for r in refs), "a waiting message may still be blamed on either run"
    v = t.started(victim, 0, 60 * MS)
    assert v.blocker is refs[0]()  # the longer part of the avoidable wait (worker 1 idle throughout)
    t.ended(victim, 0, 61 * MS)
    del v
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_a_bound_message_that_leaves_unrun_releases_its_workers_runs() -> None:
    """Given back (``forget``) or bound again elsewhere: it no longer waits on the worker."""
    t = BlameTracker(2)
    runs = [Key("r0"), Key("r1")]
    refs = [weakref.ref(k) for k in runs]
    given_back, moved = Key("given back"), Key("moved")
    for k in (given_back, moved):
        t.arrived(k, 0)
    t.started(runs[0], 0, 0)
    t.started(runs[1], 1, 0)
    t.bound(given_back, 0, 0)
    t.bound(moved, 1, 0)
    t.bound(moved, 0, 0)  # worker 1 holds nothing for it any more
    t.forget(given_back)
    t.ended(runs[1], 1, 10 * MS)
    del runs
    gc.collect()
    assert refs[1]() is None and refs[0]() is not None  # "moved" still waits on worker 0
    t.ended(refs[0](), 0, 20 * MS)
    v = t.started(moved, 0, 20 * MS)
    assert v.blocker is refs[0]()
    del v
    t.ended(moved, 0, 21 * MS)
    gc.collect()
    assert refs[0]() is None


def test_a_message_that_started_within_the_grace_leaves_nothing_behind() -> None:
    """Its ``pull + grace`` mark is still pending when traffic stops: the mark holds no key."""
    t = BlameTracker(1)
    k = Key("quick")
    ref = weakref.ref(k)
    t.arrived(k, 0)
    t.started(k, 0, GRACE_NS // 4)
    t.ended(k, 0, GRACE_NS // 2)  # the last event: the mark at GRACE_NS is never reached
    del k
    gc.collect()
    assert ref() is None
    assert t.statistics().started == 1 and t.statistics().waiting == 0


# -- both engines, end to end -------------------------------------------------------------------
def _assert_m2_named_m0(exporter: Any) -> None:
    finished = exporter.get_finished_spans()
    ids = {s.context.trace_id: s.attributes[n.MESSAGE_ID] for s in finished if s.name == "process T"}
    handlers = {ids[s.context.trace_id]: s for s in finished if s.name == n.HANDLER_SPAN}
    (victim,) = [s for s in finished if s.name == n.BLAME_SPAN and ids[s.context.trace_id] == "m2"]
    assert victim.attributes[n.BLAME_REASON] == HEAD_OF_LINE
    assert victim.attributes[n.BLAME_BLOCKER_MESSAGE_ID] == "m0"
    assert [link.context.span_id for link in victim.links] == [handlers["m0"].context.span_id]


def _submit_all(submit: Any, tracer: MessageTracer) -> list[weakref.ref[Any]]:
    """m0 slow then m1..m3 fast on two round-robin workers (m2 behind m0); weak refs to each
    message's item and trace info, the test holding nothing else of them."""
    refs: list[weakref.ref[Any]] = []
    for i, name in enumerate(["slow", "a", "b", "c"]):
        body, info = Body(name), Info(topic="T", message_id=f"m{i}")
        refs += [weakref.ref(body), weakref.ref(info)]
        submit(body, tracer.start_message(info))
        del body, info
    return refs


@pytest.fixture
def setup(spans: Any, registry: Any) -> tuple[ManualClock, MessageTracer, Any]:
    provider, exporter = spans
    clock = ManualClock()
    return clock, MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry),
                                clock=clock), exporter


def test_the_thread_engine_lets_go_of_a_named_blocker(setup: tuple[ManualClock, MessageTracer, Any]) -> None:
    clock, tracer, exporter = setup
    all_arrived, other_worker_done = threading.Event(), threading.Event()

    def handler(body: Body) -> None:
        assert all_arrived.wait(10)
        if body.name == "slow":
            assert other_worker_done.wait(10)
            clock.advance_s(SLOW)
        else:
            clock.advance_s(FAST)

    def on_done(body: Body, outcome: object, error: object) -> None:
        if body.name == "c":  # the last of worker 1: ended (blame saw it) before on_done
            other_worker_done.set()

    d = Dispatcher(handler, policy=RoundRobin(buffer=4), workers=2, clock=clock, on_done=on_done)
    refs = _submit_all(d.submit, tracer)
    all_arrived.set()
    assert d.close(timeout=10)
    _assert_m2_named_m0(exporter)
    gc.collect()
    # the dispatcher and its tracker live on; none of the four finished messages does
    assert [r() for r in refs] == [None] * len(refs)
    assert d.statistics().blame is not None and d.statistics().blame.head_of_line == 1


def test_the_asyncio_engine_lets_go_of_a_named_blocker(setup: tuple[ManualClock, MessageTracer, Any]) -> None:
    clock, tracer, exporter = setup

    async def main() -> tuple[AsyncDispatcher[Body], list[weakref.ref[Any]]]:
        all_arrived, other_worker_done = asyncio.Event(), asyncio.Event()

        async def handler(body: Body) -> None:
            await all_arrived.wait()
            if body.name == "slow":
                await other_worker_done.wait()
                clock.advance_s(SLOW)
            else:
                clock.advance_s(FAST)

        def on_done(body: Body, outcome: object, error: object) -> None:
            if body.name == "c":
                other_worker_done.set()

        d: AsyncDispatcher[Body] = AsyncDispatcher(handler, policy=RoundRobin(buffer=4), workers=2, clock=clock,
                                                   on_done=on_done)
        refs: list[weakref.ref[Any]] = []
        for i, name in enumerate(["slow", "a", "b", "c"]):
            body, info = Body(name), Info(topic="T", message_id=f"m{i}")
            refs += [weakref.ref(body), weakref.ref(info)]
            await d.submit(body, tracer.start_message(info))
            del body, info
        all_arrived.set()
        await d.close()
        return d, refs

    d, refs = asyncio.run(main())
    _assert_m2_named_m0(exporter)
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
    assert d.statistics().blame is not None and d.statistics().blame.head_of_line == 1
