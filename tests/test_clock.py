"""The two timelines (tracer/path/clock.py): wall time for stamps, monotonic time for durations,
and the per-message anchor that joins them. An anchor for the whole process drifted 0.5-0.8 s from
the wall clock in ten minutes on a CI machine whose wall clock was being stepped; a wall clock held
where it stepped back read one value for S seconds after a step of S, so every gap then was 0."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracer.dispatch import Dispatcher
from tracer.path.clock import Anchor, ManualClock, SystemClock, default_clock, require_clock
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.tracer import MessageTracer

S = 1_000_000_000


@given(st.lists(st.tuples(st.integers(0, 10 * S), st.integers(-10 * S, 10 * S)), max_size=60))
def test_an_anchored_timeline_moves_by_the_monotonic_clock_alone(moves: list[tuple[int, int]]) -> None:
    clock = ManualClock()
    anchor = Anchor(clock)
    assert anchor.now() == anchor.wall_ns == clock.wall_ns()  # anchored at the wall clock
    last, mono = anchor.now(), clock.monotonic_ns()
    for passes, step in moves:
        clock.advance(passes)
        clock.step_wall(step)
        now = anchor.now()
        assert now - last == clock.monotonic_ns() - mono == passes  # whatever the wall clock did
        assert anchor.mono_of(now) == clock.monotonic_ns()
        last, mono = now, clock.monotonic_ns()


def test_a_new_anchor_follows_a_step_of_the_wall_clock() -> None:
    # the next message is anchored afresh: a step moves it as a whole, so cross-clock gaps stay right
    clock = ManualClock()
    clock.step_wall(700_000_000)  # the CI machine's step: the broker's next store time is 0.7 s later
    assert Anchor(clock).now() == clock.wall_ns()
    clock.step_wall(-5 * S)
    assert Anchor(clock).now() == clock.wall_ns()


def test_the_default_clock_is_the_system_wall_and_monotonic_clocks() -> None:
    clock = default_clock()
    assert isinstance(clock, SystemClock)
    before, mono_before = time.time_ns(), time.monotonic_ns()
    wall, mono = clock.wall_ns(), clock.monotonic_ns()
    assert before <= wall <= time.time_ns() and mono_before <= mono <= time.monotonic_ns()


def test_time_passes_forward_only_on_the_manual_clock() -> None:
    with pytest.raises(ValueError, match="step_wall"):
        ManualClock().advance(-1)


class _WallOnly:
    def wall_ns(self) -> int:
        return 0


class _OldClock:
    def now_ns(self) -> int:  # the one-timeline clock of earlier versions
        return 0


@pytest.mark.parametrize("build", [
    lambda c: MessageTracer(clock=c),
    lambda c: HoldingSpanProcessor([object()], clock=c, ticker=False),  # type: ignore[list-item]
    lambda c: KeepPolicy(clock=c),
    lambda c: Dispatcher(lambda m: None, workers=1, clock=c),
], ids=["tracer", "hold", "keep", "dispatcher"])
@pytest.mark.parametrize("clock", [_WallOnly(), _OldClock()], ids=["wall-only", "now_ns-only"])
def test_a_clock_without_the_timeline_it_needs_is_refused_at_construction(build, clock) -> None:
    with pytest.raises(TypeError, match="monotonic_ns"):
        build(clock)


def test_require_clock_names_what_is_missing() -> None:
    with pytest.raises(TypeError, match=r"wall_ns\(\)"):
        require_clock(object(), "x", wall=True)
    require_clock(ManualClock(), "x", wall=True, monotonic=True)


_MIXED = '''
from tracer.dispatch import Dispatcher
from tracer.path.clock import Anchor, MonoNs, SystemClock, WallNs
from tracer.path.stages import Outcome
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.occupancy import Occupancy
from tracer.telemetry.tracer import MessageTracer


class Wall:
    def wall_ns(self) -> WallNs:
        return WallNs(0)


class Mono:
    def monotonic_ns(self) -> MonoNs:
        return MonoNs(0)


Dispatcher(lambda m: None, workers=1, clock=Wall())  # mixed
HoldingSpanProcessor([], clock=Wall())  # mixed
Occupancy(1, clock=Wall())  # mixed
MessageTracer(clock=Mono())  # mixed
stamp: WallNs = SystemClock().monotonic_ns()  # mixed
HoldingSpanProcessor([]).tick(SystemClock().wall_ns())  # mixed
KeepPolicy().decide([], Outcome.SUCCESS, end_mono=stamp)  # mixed
Anchor(SystemClock()).mono_of(SystemClock().monotonic_ns())  # mixed
KeepPolicy().tick(SystemClock().monotonic_ns())
'''


def test_mypy_refuses_one_timeline_where_the_other_is_asked_for(tmp_path) -> None:
    pytest.importorskip("mypy")
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "mixed.py").write_text(_MIXED)
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "mixed.py"], cwd=tmp_path,
                         env={**os.environ, "MYPYPATH": str(root)}, capture_output=True, text=True, timeout=300)
    errors = [line for line in run.stdout.splitlines() if line.startswith("mixed.py:") and ": error:" in line]
    mixed = [k for k, line in enumerate(_MIXED.splitlines(), 1) if line.endswith("# mixed")]
    assert [int(line.split(":")[1]) for line in errors] == mixed and len(mixed) == 8, run.stdout
