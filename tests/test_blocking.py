"""Live blame (BlameTracker) against the offline blame of the same schedule, and as a state machine."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_blame import schedules

from tracer.path.blocking import CAPACITY, HEAD_OF_LINE, NO_WAIT, BlameTracker, Verdict
from tracer.report.blame import Run, blame


def _replay(runs: list[Run], workers: int, grace: int, bound: list[bool]) -> list[Verdict]:
    """Feed the schedule's events in time order: ends, then arrivals, binds, starts."""
    events: list[tuple[int, int, int]] = []
    for k, r in enumerate(runs):
        events += [(r.wait_start_ns, 1, k), (r.start_ns, 3, k), (r.end_ns, 0, k)]
        if bound[k]:
            events.append((r.wait_start_ns if r.bound_ns is None else r.bound_ns, 2, k))
    events.sort()
    tracker = BlameTracker(workers, grace_ns=grace)
    verdicts: dict[int, Verdict] = {}
    for t, kind, k in events:
        r = runs[k]
        if kind == 1:
            tracker.arrived(r.message_id, t)
        elif kind == 2:
            tracker.bound(r.message_id, r.worker, t)
        elif kind == 3:
            verdicts[k] = tracker.started(r.message_id, r.worker, t, ref=("span", k))
        else:
            tracker.ended(r.message_id, r.worker, t)
    s = tracker.statistics()
    assert (s.out_of_order, s.unknown, s.waiting, s.started) == (0, 0, 0, len(runs))
    return [verdicts[k] for k in range(len(runs))]


@settings(max_examples=300, deadline=None)
@given(schedules(), st.data())
def test_live_verdicts_equal_the_offline_blame(case: tuple[list[Run], int, int], data: Any) -> None:
    runs, workers, grace = case
    bound = data.draw(st.lists(st.booleans(), min_size=len(runs), max_size=len(runs)))
    live = _replay(runs, workers, grace, bound)
    offline = blame(runs, workers, grace_ns=grace)
    for v, m, b, r in zip(live, offline.messages, bound, runs):
        # invariant: the same avoidable wait and reason, live as from the span file
        assert round(v.avoidable_s * 1e9) == round(m.avoidable_s * 1e9)
        assert v.reason == m.reason
        assert round(v.wait_s * 1e9) == round(m.wait_s * 1e9)
        # invariant: a bound message names the offline blocker; an unbound one (aggressive) none.
        # (Offline also blames the backlog's head for time spent before the bind, which live cannot
        # know: the dispatcher would have to say which worker its feeder waits for. Compared where
        # there is no such time.)
        if not b:
            assert v.blocker is None
        elif r.bound_ns is None or r.bound_ns <= r.wait_start_ns + grace:
            assert v.blocker == m.blocker_id
        # invariant: the blocker's ref is the one passed with the blocker's own start (for the span link)
        assert v.blocker_ref == (("span", int(str(v.blocker)[1:])) if v.blocker is not None else None)


class TrackerMachine(RuleBasedStateMachine):
    """Arbitrary interleavings of a 3-worker consumer, time moving forward; promises checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = BlameTracker(3, grace_ns=2)
        self.t = 0
        self.n = 0
        self.waiting: dict[str, int] = {}  # message -> bound worker (-1: not bound)
        self.running: dict[int, str] = {}
        self.ran_on: dict[str, int] = {}
        self.pulled: dict[str, int] = {}
        self.verdicts: list[tuple[str, Verdict, int]] = []

    @rule(dt=st.integers(0, 5))
    def arrive(self, dt: int) -> None:
        self.t += dt
        m = f"m{self.n}"
        self.n += 1
        self.tracker.arrived(m, self.t)
        self.waiting[m] = -1
        self.pulled[m] = self.t

    @precondition(lambda self: any(w < 0 for w in self.waiting.values()))
    @rule(worker=st.integers(0, 2), dt=st.integers(0, 3))
    def bind(self, worker: int, dt: int) -> None:
        self.t += dt
        m = next(m for m, w in self.waiting.items() if w < 0)
        self.tracker.bound(m, worker, self.t)
        self.waiting[m] = worker

    @precondition(lambda self: self.waiting and len(self.running) < 3)
    @rule(dt=st.integers(0, 5))
    def start(self, dt: int) -> None:
        self.t += dt
        free = [w for w in range(3) if w not in self.running]
        m, bound = next(((m, w) for m, w in self.waiting.items() if w in free),
                        next(((m, w) for m, w in self.waiting.items() if w < 0), (None, None)))
        if m is None or bound is None:
            return
        worker = bound if bound >= 0 else free[0]
        del self.waiting[m]
        self.running[worker] = m
        self.ran_on[m] = worker
        self.verdicts.append((m, self.tracker.started(m, worker, self.t), bound))

    @precondition(lambda self: self.running)
    @rule(dt=st.integers(0, 9), pick=st.integers(0, 2))
    def end(self, dt: int, pick: int) -> None:
        self.t += dt
        worker = sorted(self.running)[pick % len(self.running)]
        self.tracker.ended(self.running.pop(worker), worker, self.t)

    @invariant()
    def counts_agree(self) -> None:
        s = self.tracker.statistics()
        assert s.waiting == len(self.waiting) and s.started == len(self.verdicts)
        assert (s.out_of_order, s.unknown) == (0, 0)
        assert s.head_of_line + s.capacity <= s.started
        assert 0 <= s.avoidable_s <= s.wait_s + 1e-12

    @invariant()
    def each_verdict_is_possible(self) -> None:
        for _m, v, bound in self.verdicts:
            assert 0 <= v.avoidable_s <= max(0.0, v.wait_s - 2e-9) + 1e-15
            assert v.reason in (HEAD_OF_LINE, CAPACITY, NO_WAIT)
            assert (v.reason == NO_WAIT) == (v.wait_s <= 2e-9)
            if v.blocker is not None:
                # the blocker ran on the worker the message was bound to, before it started
                assert bound >= 0 and self.ran_on[str(v.blocker)] == bound and v.avoidable_s > 0


TestTrackerMachine = TrackerMachine.TestCase
TestTrackerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_a_clock_that_steps_back_is_counted_not_believed() -> None:
    t = BlameTracker(1, grace_ns=0)
    t.arrived("a", 100)
    t.started("a", 0, 100)
    t.arrived("b", 90)  # stamped before the last event: taken as at 100
    t.ended("a", 0, 200)
    v = t.started("b", 0, 200)
    assert t.statistics().out_of_order == 1
    assert v.wait_s == pytest.approx(100e-9) and v.reason == CAPACITY


def test_unknown_messages_and_bad_workers() -> None:
    t = BlameTracker(2)
    assert t.started("never-arrived", 0, 5) == Verdict(NO_WAIT, 0.0, 0.0, None, None)
    t.ended("someone-else", 0, 6)
    assert t.statistics().unknown == 2
    with pytest.raises(ValueError, match="worker 2"):
        t.started("x", 2, 7)
    with pytest.raises(ValueError, match="workers"):
        BlameTracker(0)
