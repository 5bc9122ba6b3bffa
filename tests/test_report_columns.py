"""The report's tables read the stamps' columns (model.GapColumns) instead of every record's gaps:
the same numbers as compute_gaps record by record, whatever the stamps (missing, skewed, negative
as rebuilt span times can be), and the tables built on them equal the record-by-record ones."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.path.stages import GAPS, PATH_GAPS, Stage
from tracer.path.stamps import Stamps
from tracer.report.model import PERCENTILES, GapColumns, MessageRecord, build_group, percentile, stage_stats

_NS = st.one_of(st.just(0), st.integers(-50, 400), st.integers(1, 400))


def _record(k: int, times: list[int]) -> MessageRecord:
    return MessageRecord(f"{k:032x}", f"{k:016x}", "g", "t", f"m{k}", "J", Stamps(list(times)), worker=k % 3)


records_st = st.lists(st.lists(_NS, min_size=len(Stage), max_size=len(Stage)).map(
    lambda t: t if any(t) else [1, *t[1:]]), min_size=1, max_size=30).map(
    lambda ts: [_record(k, t) for k, t in enumerate(ts)])
ordered_st = st.lists(st.lists(st.integers(1, 400), min_size=len(Stage), max_size=len(Stage)).map(sorted),
                      min_size=1, max_size=30).map(lambda ts: [_record(k, t) for k, t in enumerate(ts)])


@settings(max_examples=400, deadline=None)
@given(st.one_of(records_st, ordered_st))
def test_the_columns_are_compute_gaps_record_by_record(records: list[MessageRecord]) -> None:
    cols = GapColumns(records)
    for g in GAPS:
        # invariant: one value per record, None exactly where the record has no such gap, else its seconds
        assert cols.seconds[g.name] == [r.gaps[g.name].seconds if g.name in r.gaps else None for r in records]
        assert cols.clamped[g.name] == sum(1 for r in records if g.name in r.gaps and r.gaps[g.name].clamped)
    stats = stage_stats(records)
    path_total = sum(r.gaps[g.name].seconds for r in records for g in PATH_GAPS if g.name in r.gaps)
    for g in GAPS:
        mine = [r.gaps[g.name].seconds for r in records if g.name in r.gaps]
        st_ = stats[g.name]
        # invariant: the table is the record-by-record one, to the bit (same values summed in the same order)
        assert (st_.count, st_.total, st_.clamped) == (len(mine), sum(mine), sum(
            1 for r in records if g.name in r.gaps and r.gaps[g.name].clamped))
        assert [getattr(st_, p) for p, _ in PERCENTILES] == [percentile(mine, q) for _, q in PERCENTILES]
        if path_total and (g in PATH_GAPS or g.name == "consumer_wait"):
            assert st_.share == sum(mine) / path_total
    slow = build_group("g", records, top=5, workers=3).slowest
    # invariant: the slowest are sorted()[:top] by total_s, then start, ties in record order
    assert slow == sorted(records, key=lambda r: (-r.total_s, r.start_ns))[:5]
    assert all(not math.isnan(r.total_s) for r in slow)
