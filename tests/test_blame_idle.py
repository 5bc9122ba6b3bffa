"""Live blame's memory is bounded by the workers, not by the messages (#30 item 2).

At low load (more workers than concurrent messages: 8 workers, 2 busy, a quiet hour) a worker
that never runs again used to pin the front of the tracker's idle list, and every handled message
left one entry behind it for good. ``BlameStats.entries`` counts what the tracker holds.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from tracer.dispatch import Dispatcher, DispatchMetrics
from tracer.path.blocking import GRACE_NS, BlameTracker
from tracer.path.clock import ManualClock

WORKERS = 8
MS = 1_000_000


def _bound(workers: int) -> int:
    """What a tracker with nothing waiting and its clock past every grace may hold: its idle
    marks (at most two per worker, with the stale ones) and the current run of each worker."""
    return 2 * workers + 1 + workers


def test_ten_thousand_messages_on_two_of_eight_workers_hold_entries_bounded_by_workers() -> None:
    t = BlameTracker(WORKERS)
    now = 0
    for i in range(10_000):
        worker = i % 2  # workers 2..7 never run: the old front of the idle list
        t.arrived(i, now)
        t.started(i, worker, now + MS)
        t.ended(i, worker, now + 2 * MS)
        now += 3 * MS
    s = t.statistics()
    assert s.started == 10_000 and s.waiting == 0
    # fails before: 10 008 entries (one idle mark per handled message)
    assert s.entries <= _bound(WORKERS), s


def test_a_bare_dispatcher_with_metrics_holds_blame_entries_bounded_by_workers() -> None:
    clock = ManualClock()
    d = Dispatcher(lambda m: clock.advance(MS), workers=WORKERS, metrics=DispatchMetrics(CollectorRegistry()),
                   clock=clock)
    try:
        for i in range(2_000):  # one at a time: at most one busy, seven idle for good
            d.submit(i)
            assert d.wait_idle(timeout=None)
    finally:
        assert d.close()
    blame = d.statistics().blame
    assert blame is not None and blame.started == 2_000
    assert blame.entries <= _bound(WORKERS), blame  # fails before: ~2 000


class BlameMemory(RuleBasedStateMachine):
    """Any schedule of arrivals, binds, starts, ends and give-backs on a few workers."""

    def __init__(self) -> None:
        super().__init__()
        self.t = BlameTracker(4)
        self.now = 0
        self.n = 0
        self.waiting: list[int] = []
        self.running: dict[int, int] = {}  # worker -> message

    def _tick(self, ms: int) -> int:
        self.now += ms * MS // 2
        return self.now

    @rule(ms=st.integers(0, 8))
    def arrive(self, ms: int) -> None:
        self.t.arrived(self.n, self._tick(ms))
        self.waiting.append(self.n)
        self.n += 1

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 50), worker=st.integers(0, 3))
    def bind(self, i: int, worker: int) -> None:
        self.t.bound(self.waiting[i % len(self.waiting)], worker, self.now)

    @precondition(lambda self: self.waiting and len(self.running) < 4)
    @rule(i=st.integers(0, 50), ms=st.integers(0, 8), low=st.booleans())
    def start(self, i: int, ms: int, low: bool) -> None:
        free = [w for w in range(4) if w not in self.running]
        worker = free[0] if low else free[-1]  # low: the same few workers run, the others idle
        m = self.waiting.pop(i % len(self.waiting))
        self.t.started(m, worker, self._tick(ms))
        self.running[worker] = m

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 3), ms=st.integers(0, 8))
    def end(self, i: int, ms: int) -> None:
        worker = sorted(self.running)[i % len(self.running)]
        self.t.ended(self.running.pop(worker), worker, self._tick(ms))

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 50))
    def give_back(self, i: int) -> None:
        self.t.forget(self.waiting.pop(i % len(self.waiting)))

    @invariant()
    def idle_marks_bounded_by_workers(self) -> None:
        s = self.t.statistics()
        assert s.waiting == len(self.waiting)
        # fails before: one mark per ended run while an idle worker pins the front
        assert s.idle_marks <= 2 * 4 + 1, ("idle_marks_bounded_by_workers", s)

    def teardown(self) -> None:
        # everything ends, then time passes every grace: nothing of a message is left
        for worker, m in sorted(self.running.items()):
            self.t.ended(m, worker, self._tick(1))
        for m in self.waiting:
            self.t.forget(m)
        self.t.arrived("late", self._tick(2 * GRACE_NS // MS + 2))
        self.t.forget("late")
        s = self.t.statistics()
        assert s.entries <= _bound(4) + 1, ("memory_bounded_by_workers", s)  # + the late one's mark


TestBlameMemory = BlameMemory.TestCase
TestBlameMemory.settings = settings(max_examples=30, stateful_step_count=100, deadline=None)
