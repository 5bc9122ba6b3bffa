"""telemetry.metrics: the written-out gap count (_count_gaps_fast, what observe runs) against its
definition (_count_gaps, a loop over the one gap table tracer.path.stages.GAP_INDEX). Same
buckets, sums and exemplars for every pattern of present, missing and out-of-order stamps; a change
to the stage model that the written-out copy misses fails here."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.path.stages import GAP_INDEX, GAPS, STAGES
from tracer.telemetry.metrics import DEFAULT_BUCKETS, _count_gaps, _count_gaps_fast

_BOUNDS = list(DEFAULT_BUCKETS)
_STAMP = st.one_of(st.just(0), st.integers(1, 700 * 10**9))  # 0: not stamped; up to past the last bucket


def _state() -> tuple[list[list[int]], list[float], list[list[Any]], list[list[float]]]:
    n = len(_BOUNDS) + 1
    return ([[0] * n for _ in GAPS], [0.0] * len(GAPS), [[None] * n for _ in GAPS], [[0.0] * n for _ in GAPS])


def test_the_gap_table_is_derived_from_the_gaps() -> None:
    # invariant: one row per gap, in GAPS order, naming the gap's own stages
    assert GAP_INDEX == tuple((k, int(g.start), int(g.end)) for k, g in enumerate(GAPS))
    assert all(g.position == k for k, g in enumerate(GAPS))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.lists(_STAMP, min_size=len(STAGES), max_size=len(STAGES)), min_size=1, max_size=4),
       st.sampled_from([None, ({"trace_id": "ab"}, 1.5), (7, 2.5)]))
def test_the_written_out_count_is_the_loop(messages: list[list[int]], ref: tuple[Any, float] | None) -> None:
    plain, fast = _state(), _state()
    for times in messages:
        _count_gaps(plain[0], plain[1], _BOUNDS, times, plain[2], plain[3], ref)
        _count_gaps_fast(fast[0], fast[1], _BOUNDS, times, fast[2], fast[3], ref)
        # invariant: after every message, the same bucket counts, sums and exemplars
        assert fast == plain
