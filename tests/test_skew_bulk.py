"""SkewTracker.observe_times (one call a message, the finish's path) against observe (one call a
gap, the reference): the same changed bounds in the same order, the same windows after every
message, whatever the stamps, gaps missing, and the monotonic times (new slots, full buckets)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.path.clock import MonoNs
from tracer.path.stages import CROSS_CLOCK_GAPS
from tracer.path.stamps import MISSING, SkewTracker

_STAMP = st.one_of(st.just(MISSING), st.integers(1, 60))
_MESSAGE = st.tuples(st.lists(_STAMP, min_size=6, max_size=6), st.integers(0, 3))  # stamps, slots to move on


def _reference(tracker: SkewTracker, times: list[int], mono: MonoNs) -> list[tuple[str, int]] | None:
    changed = []
    for gap in CROSS_CLOCK_GAPS:
        a, b = times[gap.start], times[gap.end]
        if a == MISSING or b == MISSING:
            continue
        bound = tracker.observe(gap.peer, b - a, mono)
        if bound is not None:
            changed.append((gap.peer, bound))
    return changed or None


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.lists(_MESSAGE, max_size=40))
def test_one_call_a_message_keeps_the_windows_one_call_a_gap_keeps(
        bucket_messages: int, bucket_ns: int, messages: list[tuple[list[int], int]]) -> None:
    bulk, ref = SkewTracker(bucket_messages, bucket_ns), SkewTracker(bucket_messages, bucket_ns)
    mono = 0
    for times, step in messages:
        mono += step * bucket_ns // 2  # same slot, the next one, or one further
        assert bulk.observe_times(times, MonoNs(mono)) == _reference(ref, times, MonoNs(mono))
        assert bulk.bounds() == ref.bounds()
        for peer in ref.bounds():
            w, r = bulk._windows[peer], ref._windows[peer]
            assert (w.current, w.count, w.slot, w.previous) == (r.current, r.count, r.slot, r.previous)
