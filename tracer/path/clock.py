"""Two timelines, two types: the wall clock for stamps, the monotonic clock for durations.

Stamps are compared with other clocks' stamps: the broker's store time, the producer's send
stamp, the SDK's own span times (``time.time_ns``) for the spans your handler opens. So a
message's first consumer stamp is the system wall clock (:data:`WallNs`). Ages, leases, deadlines,
the hold's and the keep policy's timers and the dispatcher's blame are durations: they run on the
monotonic clock (:data:`MonoNs`). ``mypy --strict`` refuses one where the other is asked for.

**The rule** (OpenTelemetry Java's ``AnchoredClock``, which does this per trace): the
same-process stamps of one message are durations on the monotonic clock, anchored *once per
message* to the wall clock (:class:`Anchor`); gaps that cross processes compare wall clocks.

Two earlier clocks each broke one half of it. One read the wall clock once per process and
advanced it by the monotonic clock: every wall-clock step after that stayed in every later
cross-clock gap (0.5–0.8 s after ten minutes on a CI machine whose clock was being stepped).
The next one followed the wall clock and held it where it stepped back: after a step back of S
every reading for S seconds was the same value, so every consumer gap in that window read 0 and
the keep policy dropped the slow messages it should keep. Anchored per message, a step moves at
most the one message it lands in, as a whole; its own gaps stay exact.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import NewType, Protocol

from ..bounds import seconds as finite_seconds

__all__ = ["Anchor", "Clock", "ManualClock", "MonoNs", "MonotonicClock", "SystemClock", "WallClock", "WallNs",
           "default_clock", "require_clock", "shared_clock"]

WallNs = NewType("WallNs", int)  # ns since the Unix epoch (the stamps' timeline)
MonoNs = NewType("MonoNs", int)  # ns on a monotonic clock: meaningful only as a difference


class WallClock(Protocol):
    def wall_ns(self) -> WallNs:
        """Wall-clock time in ns since the Unix epoch; it may step either way."""
        ...


class MonotonicClock(Protocol):
    def monotonic_ns(self) -> MonoNs:
        """A clock that never goes back, in ns from an arbitrary origin."""
        ...


class Clock(WallClock, MonotonicClock, Protocol):
    """Both timelines of one process: what a tracer stamps messages with (see :class:`Anchor`)."""


class SystemClock:
    """``time.time_ns`` and ``time.monotonic_ns``."""

    __slots__ = ()

    # The functions themselves, not wrappers: a message reads this clock four times, and a
    # wrapper (a NewType call is one too) costs as much as the reading.
    wall_ns: Callable[[], WallNs] = staticmethod(time.time_ns)  # type: ignore[assignment]
    monotonic_ns: Callable[[], MonoNs] = staticmethod(time.monotonic_ns)  # type: ignore[assignment]


class Anchor:
    """One message's timeline: the wall clock read once, then advanced by the monotonic clock.

    ``wall_ns`` and ``mono_ns`` are the same instant on the two clocks (the anchor). Every later
    :meth:`now` is ``wall_ns`` plus the monotonic time since, so two stamps of one message differ
    by exactly their monotonic distance, whatever the wall clock does in between."""

    __slots__ = ("_read", "wall_ns", "mono_ns")

    def __init__(self, clock: Clock, wall_ns: WallNs | None = None, mono_ns: MonoNs | None = None) -> None:
        self._read = clock.monotonic_ns
        self.mono_ns: MonoNs = clock.monotonic_ns() if mono_ns is None else mono_ns
        self.wall_ns: WallNs = clock.wall_ns() if wall_ns is None else wall_ns

    def now(self) -> WallNs:
        """The wall time of this instant on the message's timeline."""
        return self.wall_ns + (self._read() - self.mono_ns)  # type: ignore[return-value]  # no NewType call: hot

    def read_on(self, clock: MonotonicClock) -> bool:
        """Whether this anchor's monotonic time is ``clock``'s (its partner means nothing on another)."""
        return bool(self._read == clock.monotonic_ns)

    def mono_of(self, wall_ns: WallNs) -> MonoNs:
        """The monotonic time of a stamp taken on this timeline."""
        return MonoNs(self.mono_ns + (wall_ns - self.wall_ns))


class ManualClock:
    """Both timelines moved by hand, for tests: :meth:`advance` moves both, :meth:`step_wall` the
    wall clock alone (NTP stepping it)."""

    def __init__(self, start_ns: int = 1_700_000_000_000_000_000) -> None:
        self._wall = start_ns
        self._mono = 1_000_000_000_000
        self._lock = threading.Lock()

    def wall_ns(self) -> WallNs:
        with self._lock:
            return WallNs(self._wall)

    def monotonic_ns(self) -> MonoNs:
        with self._lock:
            return MonoNs(self._mono)

    def now_ns(self) -> int:
        """The wall clock's reading (what a producer in the same test stamps with)."""
        return self.wall_ns()

    def advance(self, ns: int) -> int:
        """Time passes: both clocks move by ``ns``; the wall clock's new reading.

        Raises:
            ValueError: ``ns`` is negative (the monotonic clock never goes back; use :meth:`step_wall`).
        """
        if ns < 0:
            raise ValueError(f"time passes forward only, got {ns} ns; step_wall() steps the wall clock back")
        with self._lock:
            self._wall += ns
            self._mono += ns
            return self._wall

    def advance_s(self, seconds: float | int) -> int:
        """:meth:`advance` by ``seconds`` (a finite number: an infinite step has no reading after it;
        ``| int``: compiled, a ``float`` parameter refuses a huge int before the check can name it)."""
        return self.advance(int(finite_seconds(seconds, "seconds", minimum=-math.inf) * 1e9))

    def step_wall(self, ns: int) -> int:
        """The wall clock alone jumps by ``ns`` (either way); the monotonic clock does not move."""
        with self._lock:
            self._wall += ns
            return self._wall


def require_clock(clock: object, what: str, *, wall: bool = False, monotonic: bool = False) -> None:
    """Refuse, at construction, a clock without the readings ``what`` takes from it.

    Raises:
        TypeError: ``clock`` lacks ``wall_ns()`` (``wall``) or ``monotonic_ns()`` (``monotonic``);
            a clock with only ``now_ns()`` is the one-timeline clock of earlier versions.
    """
    missing = [m for m, needed in (("wall_ns", wall), ("monotonic_ns", monotonic))
               if needed and not callable(getattr(clock, m, None))]
    if missing:
        raise TypeError(f"{what} needs a clock with {' and '.join(m + '()' for m in missing)} "
                        f"(tracer.path.clock: stamps are wall time, durations monotonic), got {type(clock).__name__}")


def shared_clock(own: MonotonicClock, pinned: bool, offered: MonotonicClock, what: str) -> MonotonicClock:
    """The clock a timer of ``what`` runs on once a tracer offers it its own: ``offered``
    unless ``own`` was pinned (given at construction, or taken from a tracer already).

    Raises:
        ValueError: ``own`` is pinned and reads another timeline than ``offered`` (the times a
            tracer hands it would be compared with readings of another clock).
    """
    if not pinned:
        return offered
    if own is offered or (isinstance(own, SystemClock) and isinstance(offered, SystemClock)):
        return own
    raise ValueError(f"{what} runs on another clock than the tracer's clock=: give both the same one")


_default = SystemClock()


def default_clock() -> SystemClock:
    return _default
