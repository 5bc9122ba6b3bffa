"""Statistics of a group's records: per-gap percentiles, worker occupancy over time, wait heatmaps.

Column-wise over the records (:class:`GapColumns`), so a report of 10⁵ messages makes no object
per message and gap. Definitions in :mod:`tracer.report.model`; pure functions, no I/O.
"""

from __future__ import annotations

import bisect
import math
import operator
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..path.stages import GAP_BY_NAME, GAP_INDEX, GAPS, HEADLINE_GAP, PATH_GAPS, Stage
from ..path.stamps import MISSING, causal
from .records import MessageRecord

PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))

_HANDLER_START, _HANDLER_END = int(Stage.HANDLER_START), int(Stage.HANDLER_END)

_STAGE_GETTERS = tuple(operator.itemgetter(int(stage)) for stage in Stage)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q·n`` of the values at or below it."""
    return _ranked(sorted(values), q)


def _ranked(ordered: Sequence[float], q: float) -> float:
    """:func:`percentile` of values already sorted."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q * len(ordered) - 1e-9))
    return ordered[min(len(ordered), rank) - 1]


@dataclass
class StageStats:
    gap: str
    count: int
    p50: float
    p95: float
    p99: float
    max: float
    mean: float
    total: float
    share: float  # of all path time (send … handler) in the group; path gaps and the headline only
    clamped: int  # gaps that came out negative (clock skew) and were reported as 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class GapColumns:
    """Per gap, its seconds for every record, in record order (None where a stamp is missing), and
    how many came out negative: what :func:`~tracer.path.stamps.compute_gaps` gives record by
    record, computed from the stamps' columns — no GapValue per message (the tables need only these)."""

    __slots__ = ("seconds", "clamped")

    def __init__(self, records: Sequence[MessageRecord]) -> None:
        raw = [r.stamps.times for r in records]
        # column by column (zip(*raw) takes twice as long: an iterator per record, interleaved)
        tcols = [list(map(getter, raw)) for getter in _STAGE_GETTERS]
        # every stamp present and each column at or below the next (map over the columns, in C):
        # in_order for all, so causal() is the stamps themselves; else record by record
        ordered = all(all(col) for col in tcols) and all(all(map(operator.le, a, b)) for a, b in zip(tcols, tcols[1:]))
        if not ordered:
            fixed = [causal(t) for t in raw]  # t itself when in stage order
            ordered = all(c is t for c, t in zip(fixed, raw))
        ccols = tcols if ordered else [list(map(getter, fixed)) for getter in _STAGE_GETTERS]
        self.seconds: dict[str, list[float | None]] = {}
        self.clamped: dict[str, int] = {}
        for gi, a, b in GAP_INDEX:
            name = GAPS[gi].name
            ta, tb = tcols[a], tcols[b]
            if ordered:  # no gap is negative: compute_gaps' seconds are (b - a) / 1e9
                self.seconds[name] = [(y - x) / 1e9 if x and y else None for x, y in zip(ta, tb)]
                self.clamped[name] = 0
                continue
            self.seconds[name] = [
                None if not (x and y) else (cy - cx) / 1e9 if y >= x else max(0.0, (cy - cx) / 1e9)
                for x, y, cx, cy in zip(ta, tb, ccols[a], ccols[b])]
            self.clamped[name] = sum(1 for x, y in zip(ta, tb) if x and y and y < x)

    def present(self, gap: str) -> list[float]:
        """The gap's seconds where both its stamps are, in record order."""
        return [v for v in self.seconds[gap] if v is not None]

    def or_zero(self, gap: str) -> list[float]:
        """The gap's seconds per record, 0.0 where a stamp is missing (:meth:`MessageRecord.gap_s`)."""
        return [0.0 if v is None else v for v in self.seconds[gap]]


def stage_stats(records: Sequence[MessageRecord], columns: GapColumns | None = None) -> dict[str, StageStats]:
    # each gap's values in record order (the sums do not depend on how they were gathered, only on
    # that order), each gap's values sorted once for all its percentiles
    cols = columns if columns is not None else GapColumns(records)
    # the path gaps' seconds in the order record by record, gap by gap
    path_total = sum(v for row in zip(*(cols.seconds[g.name] for g in PATH_GAPS)) for v in row if v is not None)
    out: dict[str, StageStats] = {}
    for g in GAPS:
        mine = cols.present(g.name)
        total = sum(mine)
        ordered = sorted(mine)
        p50, p95, p99, top = (_ranked(ordered, q) for _, q in PERCENTILES)
        out[g.name] = StageStats(
            g.name, len(mine), p50, p95, p99, top, mean=total / len(mine) if mine else 0.0, total=total,
            share=total / path_total if path_total and (g in PATH_GAPS or g is HEADLINE_GAP) else 0.0,
            clamped=cols.clamped[g.name])
    return out


def busy_intervals(records: Iterable[MessageRecord]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for r in records:  # r.handled and r.t() inlined: twice per group over every record
        times = r.stamps.times
        start, end = times[_HANDLER_START], times[_HANDLER_END]
        if start != MISSING and end != MISSING:
            out.append((start, end))
    return out


def mean_busy(intervals: Sequence[tuple[int, int]], a_ns: int, b_ns: int) -> float | None:
    """Average number of handlers running over ``[a, b)``; None for an empty window."""
    if b_ns <= a_ns:
        return None
    covered = 0
    for s, e in intervals:  # comparisons, not min/max calls: this runs over every handler, twice per job
        lo = s if s > a_ns else a_ns
        hi = e if e < b_ns else b_ns
        if hi > lo:
            covered += hi - lo
    return covered / (b_ns - a_ns)


@dataclass
class Occupancy:
    """Busy workers over time, relative to the group's start (seconds)."""

    workers: int
    steps: list[tuple[float, int]]  # (t_s, busy from t on), starting at (0, 0)
    bucket_s: float
    mean_busy: list[float]  # per bucket of ``bucket_s``

    def as_dict(self) -> dict[str, Any]:
        return {"workers": self.workers, "bucket_s": self.bucket_s, "mean_busy": self.mean_busy}


def occupancy(records: Sequence[MessageRecord], t0_ns: int, axis_s: float, buckets: int, workers: int,
              intervals: Sequence[tuple[int, int]] | None = None) -> Occupancy:
    """Busy workers over time; ``intervals`` are the records' :func:`busy_intervals` when the caller has them."""
    if intervals is None:
        intervals = busy_intervals(records)
    # each event one int, 2·ns + 1 for a start, 2·ns for an end: sorted as ints (not pairs), they
    # come by time with ends before starts at the same instant
    events = [2 * s + 1 for s, _ in intervals] + [2 * e for _, e in intervals]
    events.sort()
    steps: list[tuple[float, int]] = [(0.0, 0)]
    busy = 0
    last_t = 0.0
    for x in events:
        ns = x >> 1  # floor: 2·ns + 1 >> 1 is ns, negative ns too
        busy += 1 if x & 1 else -1
        t = (ns - t0_ns) / 1e9
        if last_t == t:
            steps[-1] = (t, busy)
        else:
            steps.append((t, busy))
            last_t = t
    width = axis_s / buckets if buckets and axis_s > 0 else 0.0
    return Occupancy(workers, steps, width, step_means(steps, axis_s, buckets) if width > 0 else [])


def step_means(steps: Sequence[tuple[float, int]], axis_s: float, buckets: int) -> list[float]:
    """The mean of a step function (``(t, level from t on)``, sorted) over ``buckets`` equal
    slices of ``[0, axis_s)``; one sweep, so it stays cheap for any number of steps."""
    width = axis_s / buckets
    means: list[float] = []
    k, n = 0, len(steps)
    for i in range(buckets):
        a, b = i * width, (i + 1) * width
        while k + 1 < n and steps[k + 1][0] <= a:
            k += 1
        area, cur, j = 0.0, a, k
        while True:
            level = steps[j][1] if steps[j][0] <= cur else 0
            nxt = steps[j + 1][0] if j + 1 < n else math.inf
            end = min(b, nxt)
            area += level * (end - cur)
            if nxt >= b:
                break
            cur, j = nxt, j + 1
        means.append(area / width)
    return means


def wait_edges(max_s: float, floor_s: float = 1e-4) -> list[float]:
    """Log-scale wait bucket edges: 0, then 0.1 ms and 1-2-5 steps from 1 ms up past ``max_s``."""
    edges = [0.0, floor_s]
    decade = 1e-3
    while edges[-1] <= max_s:
        for m in (1, 2, 5):
            edges.append(round(m * decade, 9))
            if edges[-1] > max_s:
                break
        decade *= 10
    return edges


def bucket_index(edges: Sequence[float], value: float) -> int:
    """Index i with ``edges[i] <= value < edges[i+1]`` (the last bucket is open-ended)."""
    return min(max(bisect.bisect_right(edges, value) - 1, 0), max(len(edges) - 1, 0))


@dataclass
class Heatmap:
    """Counts of messages by when their wait ended (x) and how long it lasted (y, log buckets).

    x is the gap's end (handler start for consumer_wait), not its start: a prefetching consumer takes
    every message in at once, and by its start the map would be one column at x=0."""

    gap: str
    bucket_s: float  # time bucket width; bucket i covers [i·w, (i+1)·w) after the group start
    wait_edges_s: list[float]  # wait bucket j covers [edges[j], edges[j+1]); the last is open
    counts: list[list[int]]  # counts[j][i]

    @property
    def total(self) -> int:
        return sum(map(sum, self.counts))

    def as_dict(self) -> dict[str, Any]:
        return {"gap": self.gap, "bucket_s": self.bucket_s, "wait_edges_s": self.wait_edges_s, "counts": self.counts}


def heatmap(records: Sequence[MessageRecord], gap: str, t0_ns: int, axis_s: float, buckets: int,
            edges: Sequence[float], columns: GapColumns | None = None) -> Heatmap:
    end_stage = int(GAP_BY_NAME[gap].end)
    counts = [[0] * buckets for _ in edges]
    width = axis_s / buckets if buckets and axis_s > 0 else 1.0
    last, top = buckets - 1, max(len(edges) - 1, 0)
    seconds = (columns if columns is not None else GapColumns(records)).seconds[gap]
    right = bisect.bisect_right
    for r, v in zip(records, seconds):  # bucket_index and the clamps inlined: once per record
        if v is None:
            continue
        i = int((r.stamps.times[end_stage] - t0_ns) / 1e9 / width)
        i = last if i > last else 0 if i < 0 else i
        j = right(edges, v) - 1
        counts[top if j > top else 0 if j < 0 else j][i] += 1
    return Heatmap(gap, width, list(edges), counts)


__all__ = [
    "GapColumns", "Heatmap", "Occupancy", "PERCENTILES", "StageStats", "bucket_index", "busy_intervals",
    "heatmap", "mean_busy", "occupancy", "percentile", "stage_stats", "step_means", "wait_edges"
]
