"""The consumer's clock: the system wall clock (what the broker and the SDK stamp with), held where
it steps back. An anchored clock drifted 0.5-0.8 s from the wall clock in ten minutes on a CI
machine whose wall clock was being stepped, and every cross-clock gap carried it."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracer.path.clock import MonotonicWallClock, default_clock

S = 1_000_000_000


class SteppingWall:
    """A wall clock moved by hand, stepped either way."""

    def __init__(self, t: int = 1_800_000_000 * S) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


@given(st.lists(st.integers(-10 * S, 10 * S), max_size=60))
def test_each_reading_is_the_latest_wall_time_read_so_far(steps: list[int]) -> None:
    wall = SteppingWall()
    clock = MonotonicWallClock(source=wall)
    seen = [wall.t]
    for step in steps:
        wall.t += step
        seen.append(wall.t)
        assert clock.now_ns() == max(seen)  # never back; never behind the wall clock's latest


def test_a_step_forward_is_followed_at_once() -> None:
    wall = SteppingWall()
    clock = MonotonicWallClock(source=wall)
    wall.t += 700_000_000  # the CI machine's step: the broker's next store time is 0.7 s later
    assert clock.now_ns() == wall.t


def test_a_step_back_holds_until_the_wall_clock_passes_it() -> None:
    wall = SteppingWall()
    clock = MonotonicWallClock(source=wall)
    wall.t += 5 * S
    held = clock.now_ns()
    wall.t -= 3 * S
    assert clock.now_ns() == held
    wall.t += 4 * S
    assert clock.now_ns() == wall.t > held


def test_the_default_clock_is_the_system_wall_clock() -> None:
    before = time.time_ns()
    now = default_clock().now_ns()
    assert before <= now <= time.time_ns()


def test_a_reading_handed_to_another_thread_is_never_later_than_its_next_reading() -> None:
    # a message's stamps are read on the pull thread, then on a worker: the worker's must not be
    # earlier, even while the wall clock steps back and forth and other threads read the clock too
    wall = SteppingWall()
    clock = MonotonicWallClock(source=wall)
    stop = threading.Event()

    def stepper() -> None:
        k = 0
        while not stop.is_set():
            wall.t += (-1) ** k * 1_000_003 + 7
            k += 1

    def noise() -> None:
        while not stop.is_set():
            clock.now_ns()

    hops: queue.Queue[int | None] = queue.Queue()
    bad: list[tuple[int, int]] = []

    def relay() -> None:
        while (v := hops.get()) is not None:
            w = clock.now_ns()
            if w < v:
                bad.append((v, w))

    threads = [threading.Thread(target=f, daemon=True) for f in (stepper, noise, noise, relay)]
    for th in threads:
        th.start()
    for _ in range(20_000):
        hops.put(clock.now_ns())
    hops.put(None)
    threads[-1].join()
    stop.set()
    for th in threads:
        th.join()
    assert bad == []


@pytest.mark.parametrize("source", [time.time, lambda: None, "now"], ids=["float", "none", "not-callable"])
def test_a_source_that_is_not_an_ns_clock_fails_at_construction(source: object) -> None:
    with pytest.raises(TypeError):
        MonotonicWallClock(source=source)  # type: ignore[arg-type]
