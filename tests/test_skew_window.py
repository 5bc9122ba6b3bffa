"""rmqtrace_clock_skew_bound_seconds is a recent minimum: a skew that was fixed stops showing.

Review #31 finding 16: the gauge was the smallest gap since the process started, so one message
from a producer an hour ahead kept it at -3600 s for the life of the consumer, while the alert text
and runbook read it as the current accuracy. The scenario through the public API, then the window's
rules as named invariants of a model.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from prometheus_client import CollectorRegistry

from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.path.propagation import PRODUCE_NS
from tracer.path.stages import Outcome
from tracer.path.stamps import SKEW_WINDOW_MESSAGES, SKEW_WINDOW_NS, SkewTracker
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer

MS = 1_000_000
PEER = "producer->broker"


def _one(mt: MessageTracer, clock: ManualClock, ahead_ns: int) -> None:
    info = MessageInfo(topic="T", message_id="M", properties={PRODUCE_NS: str(clock.wall_ns() - 3 * MS + ahead_ns)},
                       store_ms=clock.wall_ns() // MS - 1, delivery_attempt=1)
    t = mt.start_message(info)
    with t.handler_scope():
        clock.advance(MS)
    t.finish(Outcome.SUCCESS)


def _bound(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("rmqtrace_clock_skew_bound_seconds", {"peer": PEER})


def _rig() -> tuple[MessageTracer, ManualClock, CollectorRegistry]:
    clock, registry = ManualClock(), CollectorRegistry()
    return MessageTracer(consumer_group="G", metrics=TracerMetrics(registry), clock=clock), clock, registry


def test_one_hour_ahead_then_good_clocks_recovers_after_the_window_of_messages() -> None:
    mt, clock, registry = _rig()
    _one(mt, clock, 3600 * 10**9)
    bound = _bound(registry)
    assert bound is not None and -3600 < bound < -3599.99  # produce 1 h ahead of the store
    for _ in range(2 * SKEW_WINDOW_MESSAGES):  # no time passes: the message count alone ends it
        _one(mt, clock, 0)
    bound = _bound(registry)
    assert bound is not None and 0 <= bound < 0.01
    assert abs(mt.statistics().skew_bounds_ns[PEER]) < 10 * MS


def test_one_hour_ahead_then_a_quiet_spell_recovers_at_the_next_message() -> None:
    mt, clock, registry = _rig()
    _one(mt, clock, 3600 * 10**9)
    clock.advance(2 * SKEW_WINDOW_NS)
    _one(mt, clock, 0)
    bound = _bound(registry)
    assert bound is not None and 0 <= bound < 0.01


def test_a_skew_that_lasts_keeps_showing() -> None:
    mt, clock, registry = _rig()
    for _ in range(5 * SKEW_WINDOW_MESSAGES):
        _one(mt, clock, 50 * MS)
        clock.advance(SKEW_WINDOW_NS // 40)
        bound = _bound(registry)
        assert bound is not None and -0.052 < bound < -0.045


class SkewWindowModel(RuleBasedStateMachine):
    """One clock pair; the model keeps every gap with its time and order."""

    K, B = 4, 100  # small buckets, so the rules meet every rotation

    def __init__(self) -> None:
        super().__init__()
        self.tracker = SkewTracker(bucket_messages=self.K, bucket_ns=self.B)
        self.seen: list[tuple[int, int]] = []  # (mono_ns, gap)
        self.now = 0
        self.reported: int | None = None  # what the gauge would hold: the last changed bound

    @rule(gap=st.integers(-1000, 1000), wait=st.sampled_from([0, 0, 1, 30, 99, 100, 150, 250]))
    def observe(self, gap: int, wait: int) -> None:
        self.now += wait
        before = self.tracker.bound_ns(PEER)
        changed = self.tracker.observe(PEER, gap, self.now)
        self.seen.append((self.now, gap))
        after = self.tracker.bound_ns(PEER)
        assert changed == (after if after != before else None), "observe returns the bound exactly when it changed"
        if changed is not None:
            self.reported = changed

    @invariant()
    def the_gauge_holds_the_current_bound(self) -> None:
        assert self.reported == self.tracker.bound_ns(PEER)

    @invariant()
    def the_bound_is_one_of_the_last_2k_gaps(self) -> None:
        if self.seen:
            assert self.tracker.bound_ns(PEER) in [g for _, g in self.seen[-2 * self.K:]]

    @invariant()
    def the_bound_is_no_older_than_two_slots(self) -> None:
        if self.seen:
            bound = self.tracker.bound_ns(PEER)
            oldest_allowed = (self.now // self.B - 1) * self.B
            assert any(g == bound and t >= oldest_allowed for t, g in self.seen[-2 * self.K:])

    @invariant()
    def the_bound_is_below_the_last_k_gaps_of_this_slot(self) -> None:
        slot = self.now // self.B
        recent = [g for t, g in self.seen[-self.K:] if t // self.B == slot]
        if recent:
            bound = self.tracker.bound_ns(PEER)
            assert bound is not None and bound <= min(recent)


SkewWindowModel.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestSkewWindowModel = SkewWindowModel.TestCase


def test_a_window_that_cannot_work_is_refused() -> None:
    import pytest
    for kw in ({"bucket_messages": 0}, {"bucket_ns": 0}, {"bucket_messages": 1.5}, {"bucket_ns": True}):
        with pytest.raises(ValueError, match="SkewTracker"):
            SkewTracker(**kw)
