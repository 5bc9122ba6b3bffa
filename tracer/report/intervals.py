"""Sets of time intervals: the covered length of any window in O(log n), intersections, lanes.

What avoidable wait is computed on (:mod:`tracer.report.blame`): when every worker was busy is the
intersection of each worker's busy intervals. Integer times (ns), half-open intervals.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from typing import Iterable, Sequence

__all__ = ["IntervalSet", "intersection", "pack_lanes"]

_first = operator.itemgetter(0)


class IntervalSet:
    """Sorted disjoint half-open intervals, with the covered length of any window in O(log n)."""

    __slots__ = ("_starts", "_ends", "_before")

    def __init__(self, intervals: Iterable[tuple[int, int]]) -> None:
        starts: list[int] = []
        ends: list[int] = []
        # by start alone (ints compared in C, not pairs): intervals starting together merge either way
        for a, b in sorted((iv for iv in intervals if iv[1] > iv[0]), key=_first):
            if starts and a <= ends[-1]:
                if b > ends[-1]:
                    ends[-1] = b
            else:
                starts.append(a)
                ends.append(b)
        self._starts, self._ends = starts, ends
        self._before = [0, *itertools.accumulate(b - a for a, b in zip(starts, ends))]  # covered before interval i

    @property
    def intervals(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends))

    def _upto(self, x: int) -> int:
        i = bisect.bisect_right(self._starts, x) - 1
        if i < 0:
            return 0
        return self._before[i] + min(x, self._ends[i]) - self._starts[i]

    def covered(self, a: int, b: int) -> int:
        """Length of ``[a, b)`` inside the set."""
        if b <= a:
            return 0
        starts, ends, before = self._starts, self._ends, self._before  # _upto(b) - _upto(a), inlined: once
        i = bisect.bisect_right(starts, b) - 1  # per run and per overlap step
        if i < 0:
            return 0
        hi = before[i] + (b if b < ends[i] else ends[i]) - starts[i]
        i = bisect.bisect_right(starts, a, 0, i + 1) - 1
        return hi if i < 0 else hi - (before[i] + (a if a < ends[i] else ends[i]) - starts[i])


def intersection(sets: Sequence[IntervalSet]) -> IntervalSet:
    """Where every set covers (a sweep over all their edges)."""
    if not sets:
        return IntervalSet(())
    # each edge one int, 2·t + 1 for a start, 2·t for an end: sorted as ints, by time with an end
    # before a start at one instant (half-open)
    events: list[int] = []
    for s in sets:
        events += [2 * a + 1 for a in s._starts]
        events += [2 * b for b in s._ends]
    events.sort()
    out: list[tuple[int, int]] = []
    depth, since, n = 0, 0, len(sets)
    for x in events:
        t = x >> 1  # floor: 2·t + 1 >> 1 is t, negative t too
        if x & 1:
            depth += 1
            if depth == n:
                since = t
        else:
            if depth == n:
                out.append((since, t))
            depth -= 1
    return IntervalSet(out)


def pack_lanes(spans: Sequence[tuple[int, int]]) -> list[int]:
    """Greedy lanes for handler intervals without worker ids: by start, each into the lowest lane
    free at that moment (the report's inference, so both agree)."""
    order = sorted(range(len(spans)), key=lambda k: spans[k])
    free: list[int] = []
    lane = [0] * len(spans)
    for k in order:
        s, e = spans[k]
        pick = next((i for i, f in enumerate(free) if f <= s), len(free))
        if pick == len(free):
            free.append(e)
        else:
            free[pick] = e
        lane[k] = pick
    return lane
