"""Occupancy: exact worker-second integrals under a manual clock, the collector's series, and a
model test (hypothesis) of the integrals against a brute-force replay of the same events."""

from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from tracer.path.clock import ManualClock
from tracer.telemetry.occupancy import Occupancy, OccupancyMetrics, OccupancySnapshot, OccupancyStats

S = 1_000_000_000


def test_integrals_are_exact_over_a_scripted_run() -> None:
    clock = ManualClock()
    occ = Occupancy(2, clock=clock)
    t0 = occ.received()
    t1 = occ.received()
    clock.advance_s(1)  # 2 idle, 2 waiting: 2 HOL worker-seconds
    occ.started(t0)
    clock.advance_s(2)  # 1 busy, 1 idle, 1 waiting: 2 HOL
    occ.started(t1)
    clock.advance_s(3)  # 2 busy, nothing waits
    occ.ended()
    clock.advance_s(4)  # 1 busy, 1 idle, nothing waits: idle but not blocked
    s = occ.statistics()
    assert (s.busy, s.unstarted, s.workers, s.idle) == (1, 0, 2, 1)
    assert s.busy_s == pytest.approx(0 + 2 + 6 + 4)
    assert s.idle_s == pytest.approx(2 + 2 + 0 + 4)
    assert s.hol_s == pytest.approx(2 + 2)
    assert s.holding_s == pytest.approx(3)
    assert s.oldest_unstarted_ns is None and s.oldest_unstarted_age_s == 0.0


def test_hol_counts_only_the_idle_workers_waiting_messages_could_use() -> None:
    clock = ManualClock()
    occ = Occupancy(8, clock=clock)
    occ.received()
    clock.advance_s(5)  # 8 idle but one message waits: 1 worker is blocked, 7 just idle
    s = occ.statistics()
    assert s.hol_s == pytest.approx(5) and s.idle_s == pytest.approx(40)


def test_oldest_age_follows_the_message_that_started() -> None:
    clock = ManualClock()
    occ = Occupancy(1, clock=clock)
    first = occ.received()
    clock.advance_s(1)
    second = occ.received()
    clock.advance_s(1)
    assert occ.statistics().oldest_unstarted_age_s == pytest.approx(2)
    occ.started(first)
    assert occ.statistics().oldest_unstarted_ns == second
    assert occ.statistics().oldest_unstarted_age_s == pytest.approx(1)
    occ.discarded(second)
    assert occ.statistics().unstarted == 0


def test_unknown_receive_time_takes_the_oldest() -> None:
    clock = ManualClock()
    occ = Occupancy(1, clock=clock)
    first = occ.received()
    clock.advance_s(1)
    occ.received()
    occ.started()  # a FIFO pool: the oldest
    assert occ.statistics().oldest_unstarted_ns == first + S


def test_announced_receipts_are_not_counted_twice() -> None:
    clock = ManualClock()
    occ = Occupancy(1, clock=clock)
    occ.announce(3)
    clock.advance_s(1)
    occ.received()  # the listener traces the first of them at its start
    occ.started()
    s = occ.statistics()
    assert s.unstarted == 2 and s.busy == 1
    assert s.hol_s == pytest.approx(1)  # 1 idle worker, 3 waiting, for 1 s


def test_a_past_receive_time_dates_the_age() -> None:
    clock = ManualClock()
    occ = Occupancy(1, clock=clock)
    occ.received(at_ns=clock.monotonic_ns() - 2 * S)
    assert occ.statistics().oldest_unstarted_age_s == pytest.approx(2)


def test_a_start_nobody_announced_leaves_the_counts_sane() -> None:
    occ = Occupancy(1, clock=ManualClock())
    occ.started()
    occ.ended()
    occ.ended()
    s = occ.statistics()
    assert (s.busy, s.unstarted) == (0, 0)


def test_a_wall_clock_step_adds_no_worker_seconds() -> None:
    # worker-seconds are durations: on the monotonic clock (a step forward of the wall clock
    # added its length to every integral, a step back held them for as long)
    clock = ManualClock()
    occ = Occupancy(1, clock=clock)
    clock.advance_s(1)
    before = occ.statistics().idle_s
    clock.step_wall(5 * S)
    assert occ.statistics().idle_s == before
    clock.step_wall(-10 * S)
    clock.advance_s(1)
    assert occ.statistics().idle_s == pytest.approx(before + 1)


def test_close_stops_accrual_and_keeps_totals() -> None:
    clock = ManualClock()
    occ = Occupancy(2, clock=clock)
    clock.advance_s(1)
    occ.close()
    clock.advance_s(10)
    s = occ.statistics()
    assert s.idle_s == pytest.approx(2) and s.workers == 0


def test_set_workers_changes_the_rate() -> None:
    clock = ManualClock()
    occ = Occupancy(1, clock=clock)
    clock.advance_s(1)
    occ.set_workers(3)
    clock.advance_s(1)
    assert occ.statistics().idle_s == pytest.approx(4)


@pytest.mark.parametrize("bad", [-1, 1.5, "4", True, None])
def test_bad_worker_counts_fail_loudly(bad: object) -> None:
    with pytest.raises(ValueError, match="workers"):
        Occupancy(bad)  # type: ignore[arg-type]
    occ = Occupancy(1)
    with pytest.raises(ValueError, match="workers"):
        occ.set_workers(bad)  # type: ignore[arg-type]


def test_collector_exports_every_series_per_group() -> None:
    reg = CollectorRegistry()
    m = OccupancyMetrics(registry=reg)
    clock = ManualClock()
    a = m.track("g", 2, clock=clock)
    b = m.track("g", 3, clock=clock)
    m.track("other", 1, clock=clock)
    a.received()
    b.received()
    b.started()
    clock.advance_s(2)

    def value(name: str, group: str = "g") -> float | None:
        return reg.get_sample_value(name, {"consumer_group": group})

    assert value("rmqtrace_consumer_workers") == 5
    assert value("rmqtrace_consumer_busy_workers") == 1
    assert value("rmqtrace_consumer_unstarted_messages") == 1
    assert value("rmqtrace_consumer_oldest_unstarted_age_seconds") == pytest.approx(2)
    assert value("rmqtrace_consumer_busy_worker_seconds_total") == pytest.approx(2)
    assert value("rmqtrace_consumer_idle_worker_seconds_total") == pytest.approx(8)
    assert value("rmqtrace_consumer_hol_idle_worker_seconds_total") == pytest.approx(2)  # a's, not b's
    assert value("rmqtrace_consumer_holding_seconds_total") == pytest.approx(2)
    assert value("rmqtrace_consumer_workers", "other") == 1


def test_collector_bounds_the_group_label() -> None:
    reg = CollectorRegistry()
    m = OccupancyMetrics(registry=reg, label_limit=1)
    m.track("a", 1, clock=ManualClock())
    m.track("b", 1, clock=ManualClock())
    assert reg.get_sample_value("rmqtrace_consumer_workers", {"consumer_group": "other"}) == 1


class OccupancyModel(RuleBasedStateMachine):
    """Random events and clock steps; the integrals must equal a replay of the piecewise counts."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.workers = 3
        self.occ = Occupancy(self.workers, clock=self.clock)
        self.busy = 0
        self.waiting: list[int] = []
        self.announced = 0
        self.expect = {"busy_s": 0.0, "idle_s": 0.0, "hol_s": 0.0, "holding_s": 0.0}

    @rule(ms=st.integers(0, 5000))
    def advance(self, ms: int) -> None:
        dt = ms / 1000
        idle = max(0, self.workers - self.busy)
        self.expect["busy_s"] += self.busy * dt
        self.expect["idle_s"] += idle * dt
        if self.waiting:
            self.expect["hol_s"] += min(idle, len(self.waiting)) * dt
            self.expect["holding_s"] += dt
        self.clock.advance(ms * 1_000_000)

    @rule()
    def receive(self) -> None:
        t = self.occ.received()
        if self.announced:  # a receipt announced earlier: already waiting
            self.announced -= 1
        else:
            self.waiting.append(t)

    @rule(n=st.integers(1, 4))
    def announce(self, n: int) -> None:
        self.occ.announce(n)
        self.waiting += [self.clock.monotonic_ns()] * n
        self.announced += n

    @precondition(lambda self: self.waiting and self.busy < self.workers)
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        t = self.waiting.pop(data.draw(st.integers(0, len(self.waiting) - 1)))
        self.occ.started(t)
        self.busy += 1

    @precondition(lambda self: self.busy > 0)
    @rule()
    def end(self) -> None:
        self.occ.ended()
        self.busy -= 1

    @precondition(lambda self: self.waiting)
    @rule()
    def discard(self) -> None:
        self.occ.discarded(self.waiting.pop())

    @invariant()
    def integrals_match(self) -> None:
        s = self.occ.statistics()
        assert (s.busy, s.unstarted) == (self.busy, len(self.waiting))
        assert s.oldest_unstarted_ns == (min(self.waiting) if self.waiting else None)
        for key, want in self.expect.items():
            assert getattr(s, key) == pytest.approx(want, abs=1e-6), key


OccupancyModel.TestCase.settings = settings(
    max_examples=400 if os.environ.get("RMQTRACE_LONG") == "1" else 40, stateful_step_count=30, deadline=None)
TestOccupancyModel = OccupancyModel.TestCase


def test_the_message_tracer_feeds_it_from_its_stamps() -> None:
    from tracer.path.message import MessageInfo
    from tracer.path.stages import Outcome
    from tracer.telemetry.tracer import MessageTracer

    clock = ManualClock()
    occ = Occupancy(2, clock=clock)
    mt = MessageTracer(consumer_group="g", clock=clock, occupancy=occ)
    run, drop = (mt.start_message(MessageInfo(topic="T")) for _ in range(2))
    assert occ.statistics().unstarted == 2
    clock.advance_s(1)
    with run.handler_scope():
        assert (occ.statistics().busy, occ.statistics().unstarted) == (1, 1)
        clock.advance_s(2)
    run.finish(Outcome.SUCCESS)
    drop.finish(Outcome.FAILURE)  # never started: it leaves the consumer unstarted
    s = occ.statistics()
    assert (s.busy, s.unstarted) == (0, 0)
    # 0-1 s: 2 idle, 2 waiting; 1-3 s: 1 idle, the dropped one still waiting
    assert s.busy_s == pytest.approx(2) and s.hol_s == pytest.approx(2 + 2)


def test_the_readme_snippet_for_two_consumers_on_one_registry_keeps_the_scrape_sound() -> None:
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from tracer.telemetry.tracer import MessageTracer

    reg = CollectorRegistry()
    tracers = [MessageTracer(consumer_group="g", occupancy=OccupancyMetrics.shared(reg).track("g", 2))
               for _ in range(2)]  # the README's per-tracer line, once per consumer
    with pytest.raises(ValueError, match="OccupancyMetrics.shared"):
        OccupancyMetrics(reg)  # before: accepted, and every scrape failed "Clashing name"
    list(text_string_to_metric_families(openmetrics(reg).decode()))
    assert reg.get_sample_value("rmqtrace_consumer_workers", {"consumer_group": "g"}) == 4
    assert all(t.occupancy is not None for t in tracers)


def test_snapshot_is_a_deprecated_name_of_statistics() -> None:
    # one snapshot verb (statistics) and one kind of snapshot (a frozen slots *Stats); the old
    # names still work, the method with a warning
    clock = ManualClock()
    occ = Occupancy(2, clock=clock)
    occ.received()
    with pytest.warns(DeprecationWarning, match="statistics"):
        old = occ.snapshot()
    assert old == occ.statistics() and OccupancySnapshot is OccupancyStats
    assert dataclasses.fields(old) and not hasattr(old, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        old.busy = 3  # type: ignore[misc]
