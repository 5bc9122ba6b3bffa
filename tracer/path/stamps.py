"""Stamps: one wall-clock time per stage for one message, and the gap arithmetic over them.

Pure data and pure functions: no telemetry, no clients. Cross-clock gaps (producer→broker,
broker→consumer, producer→consumer) include the clocks' offset; when that makes one negative it
is clamped to zero and reported, and :class:`SkewTracker` keeps, per clock pair, the smallest gap
of the recent messages — as in NTP, the true offset can be no larger than that, so it bounds how
far any cross-clock gap can be trusted now.

**One message's gaps are consistent** (no part exceeds the whole, the path gaps add up to
end_to_end): every number is computed on :func:`causal` stamps. The consumer's stamps are exact
and never moved; a stamp of another clock later than the stamp after it is moved back to it
(broker store to client pull, then produce to broker store), so skew shows as a zero gap, counted
as clamped, never as a part longer than the whole. The broker's store time has millisecond
resolution: :func:`store_stamp` places it within its millisecond at the earliest instant that is
not before the produce stamp and not after the pull (the floor of the millisecond when that
interval is empty), so rounding alone never makes ``send`` negative or ``broker_wait`` longer
than the message's whole path.
"""

from __future__ import annotations

import threading
from typing import Final, Iterable, NamedTuple, Sequence

from .clock import MonoNs
from .stages import CROSS_CLOCK_GAPS, GAPS, PATH_GAPS, STAGES, Gap, Stage

# Final: compiled (tracer.compiled), a literal is inlined and any other value read from a C static,
# not looked up in the module's dict on every use (docs/benchmarks-history.md, "Session 11").
MISSING: Final = 0
_N_STAGES: Final = len(Stage)
_PRODUCE: Final = int(Stage.PRODUCE)
_STORE: Final = int(Stage.BROKER_STORE)
_PULL: Final = int(Stage.CLIENT_PULL)
_MS: Final = 1_000_000


def store_stamp(store_ms: int, produce_ns: int = MISSING, pull_ns: int = MISSING) -> int:
    """The broker's millisecond store time as ns: the earliest instant of that millisecond not
    before ``produce_ns`` and not after ``pull_ns``; the millisecond's floor when none is."""
    lo = store_ms * _MS
    ns = produce_ns if produce_ns > lo else lo
    hi = lo + _MS - 1
    if ns > hi:
        ns = hi
    if pull_ns and ns > pull_ns:
        ns = pull_ns
    return ns if ns >= lo else lo


def first_stamp(times: Sequence[int]) -> int:
    """The first stamp present (produce when stamped), :data:`MISSING` when there is none."""
    for ns in times:
        if ns != MISSING:
            return ns
    return MISSING


def last_stamp(times: Sequence[int]) -> int:
    """The last stamp present (handler end when stamped), :data:`MISSING` when there is none."""
    for ns in reversed(times):
        if ns != MISSING:
            return ns
    return MISSING


def in_order(times: Sequence[int]) -> bool:
    """Whether the stamps present never go backwards (then :func:`causal` moves none)."""
    last = MISSING
    for ns in times:
        if ns != MISSING:
            if ns < last:
                return False
            last = ns
    return True


def causal(times: Sequence[int]) -> Sequence[int]:
    """The stamps every gap is computed on (see the module doc): ``times`` itself when already in
    order, else a corrected copy — stamps of other clocks moved back to the stamp after them,
    consumer stamps each moved forward to the one before."""
    last = MISSING
    for ns in times:  # in_order(times), inline: once a message
        if ns != MISSING:
            if ns < last:
                break
            last = ns
    else:
        return times
    produce, store, pull = times[_PRODUCE], times[_STORE], times[_PULL]
    out = list(times)
    if store and pull and store > pull:
        out[_STORE] = store = pull
    nxt = store or pull
    if produce and nxt and produce > nxt:
        out[_PRODUCE] = nxt
    last = MISSING
    for i in range(_PULL, _N_STAGES):
        ns = out[i]
        if ns == MISSING:
            continue
        if ns < last:
            out[i] = ns = last
        last = ns
    return out


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
    """Every gap whose two stamps are present, in seconds on the :func:`causal` stamps (so the
    parts fit the whole); a gap negative on the raw stamps is flagged clamped."""
    t = stamps.times
    c = causal(t)
    out: list[GapValue] = []
    for gap in gaps:
        a, b = t[gap.start], t[gap.end]
        if a == MISSING or b == MISSING:
            continue
        raw = b - a
        seconds = (c[gap.end] - c[gap.start]) / 1e9
        if raw < 0:
            out.append(GapValue(gap, max(0.0, seconds), raw, True, -raw > gap.tolerance_ns))
        else:
            out.append(GapValue(gap, seconds, raw, False, False))
    return out


def drawn(times: Sequence[int], c: Sequence[int] | None = None) -> Sequence[int]:
    """The stamps spans are drawn on: the :func:`causal` stamps ``c``, none before the produce
    stamp as the producer read it — the ``send`` span's start, so no span of ours starts before
    its ``send`` parent. Equal to ``c`` unless the producer's clock is ahead of a later stamp;
    then the stamps before it are moved up to it (their spans shorter or empty), while the gaps
    observed stay the causal ones."""
    if c is None:
        c = causal(times)
    produce = times[_PRODUCE]
    if c is times or not produce or produce == c[_PRODUCE]:
        return c  # in order: nothing moved, nothing to move
    out = list(c)
    out[_PRODUCE] = produce
    for i in range(_STORE, _N_STAGES):
        if out[i] and out[i] < produce:
            out[i] = produce
    return out


def timeline(stamps: Stamps) -> list[tuple[Stage, int]]:
    """Present :func:`causal` stamps in stage order, each no earlier than the one before.

    This is what spans are drawn from: children must nest inside their parent even when a
    cross-clock stamp is out of order.
    """
    out: list[tuple[Stage, int]] = []
    last = MISSING
    times = causal(stamps.times)
    for stage in STAGES:
        ns = times[stage]
        if ns == MISSING:
            continue
        if ns < last:
            ns = last
        out.append((stage, ns))
        last = ns
    return out


# The cross-clock gaps as (first stage, last stage, clock pair): what SkewTracker.observe_times reads.
_CROSS: Final[tuple[tuple[int, int, str], ...]] = tuple((int(g.start), int(g.end), g.peer) for g in CROSS_CLOCK_GAPS)

SKEW_WINDOW_MESSAGES = 64  # per clock pair, a bucket of the skew window holds at most this many gaps
SKEW_WINDOW_NS = 60 * 10**9  # and only gaps of one slot of this much monotonic time


class _SkewWindow:
    __slots__ = ("current", "count", "slot", "previous")

    def __init__(self, raw_ns: int, slot: int) -> None:
        self.current, self.count, self.slot = raw_ns, 1, slot
        self.previous: int | None = None

    def bound(self) -> int:
        prev = self.previous
        return self.current if prev is None or self.current <= prev else prev


def _window_size(name: str, value: object) -> int:
    """A :class:`SkewTracker` window bound, or the ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"SkewTracker({name}=) must be an int >= 1, not {value!r}")
    return value


class SkewTracker:
    """Per clock pair, the smallest cross-clock gap of the recent messages (ns, may be negative).

    If the smallest producer→broker gap is -4 ms, the broker clock is at least 4 ms behind the
    producer's; if it is +2 ms, the offset is at most 2 ms the other way. Either way a single
    cross-clock gap is trustworthy only to about ``abs(bound)``.

    "Recent", so that a skew that was fixed (NTP back) stops showing — a lifetime minimum read one
    bad message an hour ago as the accuracy of every gap since: the minimum of two buckets, the
    current one and the one before it. Monotonic time is cut into slots of ``bucket_ns``; a bucket
    holds gaps of one slot, at most ``bucket_messages`` of them; the previous bucket counts only if
    it is of this slot or the one before. So the bound is the smallest of at most
    ``2 * bucket_messages`` gaps, none measured more than ``2 * bucket_ns`` before the latest, and
    no larger than any of the last ``bucket_messages`` gaps of the current slot
    (``tests/test_skew_window.py`` checks these against a model).
    """

    # ``object``, not ``int``: compiled (tracer.compiled), an ``int`` parameter refuses a float with
    # mypyc's TypeError before the check below can name the argument.
    def __init__(self, bucket_messages: object = SKEW_WINDOW_MESSAGES, bucket_ns: object = SKEW_WINDOW_NS) -> None:
        self.bucket_messages = _window_size("bucket_messages", bucket_messages)
        self.bucket_ns = _window_size("bucket_ns", bucket_ns)
        self._lock = threading.Lock()
        self._windows: dict[str, _SkewWindow] = {}

    def observe(self, peer: str, raw_ns: int, mono_ns: MonoNs) -> int | None:
        """Record one gap, measured at ``mono_ns`` (monotonic); the pair's new bound when it
        changed (callers then export it), else ``None``."""
        slot = mono_ns // self.bucket_ns
        with self._lock:
            w = self._windows.get(peer)
            if w is None:
                self._windows[peer] = _SkewWindow(raw_ns, slot)
                return raw_ns
            old = w.bound()
            if slot != w.slot:  # a new slot: the bucket just ended is the previous one if adjacent
                w.previous = w.current if slot == w.slot + 1 else None
                w.current, w.count, w.slot = raw_ns, 1, slot
            elif w.count >= self.bucket_messages:  # a full bucket, of this slot
                w.previous = w.current
                w.current, w.count = raw_ns, 1
            else:
                w.count += 1
                if raw_ns < w.current:
                    w.current = raw_ns
            new = w.bound()
            return new if new != old else None

    def observe_times(self, times: Sequence[int], mono_ns: MonoNs) -> list[tuple[str, int]] | None:
        """:meth:`observe` for every cross-clock gap of one message's raw stamps (``times``, by
        :class:`Stage`) whose two stamps are present, in ``CROSS_CLOCK_GAPS`` order, under one
        lock: each pair whose bound changed with its new bound, in that order (None: none changed).
        One call a message instead of one a gap (docs/benchmarks-history.md, "Session 9"); the same windows."""
        slot = mono_ns // self.bucket_ns
        full = self.bucket_messages
        changed: list[tuple[str, int]] | None = None
        with self._lock:
            windows = self._windows
            for a, b, peer in _CROSS:
                ta, tb = times[a], times[b]
                if ta == MISSING or tb == MISSING:
                    continue
                raw = tb - ta
                w = windows.get(peer)
                if w is None:
                    windows[peer] = _SkewWindow(raw, slot)
                    new = raw
                else:
                    prev = w.previous  # w.bound() before and after, inline
                    cur = w.current
                    old = cur if prev is None or cur <= prev else prev
                    if slot != w.slot:  # a new slot: the bucket just ended is the previous one if adjacent
                        prev = w.previous = cur if slot == w.slot + 1 else None
                        cur = w.current = raw
                        w.count, w.slot = 1, slot
                    elif w.count >= full:  # a full bucket, of this slot
                        prev = w.previous = cur
                        cur = w.current = raw
                        w.count = 1
                    else:
                        w.count += 1
                        if raw < cur:
                            w.current = cur = raw
                    new = cur if prev is None or cur <= prev else prev
                    if new == old:
                        continue
                if changed is None:
                    changed = [(peer, new)]
                else:
                    changed.append((peer, new))
        return changed

    def bound_ns(self, peer: str) -> int | None:
        with self._lock:
            w = self._windows.get(peer)
            return None if w is None else w.bound()

    def bounds(self) -> dict[str, int]:
        with self._lock:
            return {peer: w.bound() for peer, w in self._windows.items()}


__all__ = [
    "MISSING", "PATH_GAPS", "SKEW_WINDOW_MESSAGES", "SKEW_WINDOW_NS", "GapValue", "SkewTracker", "Stamps",
    "causal", "compute_gaps", "drawn", "first_stamp", "in_order", "last_stamp", "store_stamp", "timeline",
]
