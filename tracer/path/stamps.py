"""Stamps: one wall-clock time per stage for one message, and the gap arithmetic over them.

Pure data and pure functions: no telemetry, no clients. Cross-clock gaps (producer→broker,
broker→consumer, producer→consumer) include the clocks' offset; when that makes one negative it
is clamped to zero and reported, and :class:`SkewTracker` keeps, per clock pair, the smallest gap
ever seen — as in NTP, the true offset can be no larger than that, so it bounds how far any
cross-clock gap can be trusted.
"""

from __future__ import annotations

import threading
from typing import Iterable, NamedTuple

from .stages import GAPS, PATH_GAPS, STAGES, Gap, Stage

MISSING = 0
_N_STAGES = len(Stage)


class Stamps:
    """Times in ns since the epoch, indexed by :class:`Stage`; ``0`` means not stamped.

    A plain slotted class: one is made per message, and a dataclass with a default factory costs
    five times as much to build."""

    __slots__ = ("times",)

    def __init__(self, times: list[int] | None = None) -> None:
        self.times: list[int] = times if times is not None else [MISSING] * _N_STAGES

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stamps) and other.times == self.times

    def __repr__(self) -> str:
        return f"Stamps({self.as_dict()})"

    def set(self, stage: Stage, ns: int) -> None:
        self.times[stage] = ns

    def get(self, stage: Stage) -> int:
        return self.times[stage]

    def has(self, stage: Stage) -> bool:
        return self.times[stage] != MISSING

    def as_dict(self) -> dict[str, int]:
        return {s.name.lower(): self.times[s] for s in STAGES if self.times[s] != MISSING}


class GapValue(NamedTuple):  # a NamedTuple: built six times per message, far cheaper than a dataclass
    gap: Gap
    seconds: float  # clamped at zero
    raw_ns: int  # before clamping; negative only for cross-clock gaps under skew
    clamped: bool  # raw_ns < 0, reported as 0
    skewed: bool  # negative by more than the stamps' resolution: the clocks disagree


def compute_gaps(stamps: Stamps, gaps: Iterable[Gap] = GAPS) -> list[GapValue]:
    """Every gap whose two stamps are present. Negative gaps are clamped to 0 and flagged."""
    t = stamps.times
    out: list[GapValue] = []
    for gap in gaps:
        a, b = t[gap.start], t[gap.end]
        if a == MISSING or b == MISSING:
            continue
        raw = b - a
        if raw < 0:
            out.append(GapValue(gap, 0.0, raw, True, -raw > gap.tolerance_ns))
        else:
            out.append(GapValue(gap, raw / 1e9, raw, False, False))
    return out


def timeline(stamps: Stamps) -> list[tuple[Stage, int]]:
    """Present stamps in stage order, each moved forward to be no earlier than the one before.

    This is what spans are drawn from: children must nest inside their parent even when a
    cross-clock stamp is behind its predecessor.
    """
    out: list[tuple[Stage, int]] = []
    last = MISSING
    times = stamps.times
    for stage in STAGES:
        ns = times[stage]
        if ns == MISSING:
            continue
        if ns < last:
            ns = last
        out.append((stage, ns))
        last = ns
    return out


class SkewTracker:
    """Per clock pair, the smallest cross-clock gap observed (ns, may be negative).

    If the smallest producer→broker gap ever seen is -4 ms, the broker clock is at least 4 ms
    behind the producer's; if it is +2 ms, the offset is at most 2 ms the other way. Either way a
    single cross-clock gap is trustworthy only to about ``abs(bound)``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._min: dict[str, int] = {}

    def observe(self, peer: str, raw_ns: int) -> bool:
        """Record one gap; True when it lowered the bound (callers may then export it)."""
        cur = self._min.get(peer)
        if cur is not None and raw_ns >= cur:
            return False  # the common case, decided without the lock
        with self._lock:
            cur = self._min.get(peer)
            if cur is None or raw_ns < cur:
                self._min[peer] = raw_ns
                return True
            return False

    def bound_ns(self, peer: str) -> int | None:
        with self._lock:
            return self._min.get(peer)

    def bounds(self) -> dict[str, int]:
        with self._lock:
            return dict(self._min)


__all__ = ["MISSING", "Stamps", "GapValue", "compute_gaps", "timeline", "SkewTracker", "PATH_GAPS"]
