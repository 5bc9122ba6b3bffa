"""The thread engine, driven by events: slots, back-pressure, ordering, cost, life cycle, stamps."""

from __future__ import annotations

import collections
import logging
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from waiting import wait_until

from tracer.dispatch import (
    Aggressive,
    CostAware,
    Dispatcher,
    DispatcherClosed,
    HandlerTimeout,
    RoundRobin,
)
from tracer.path.clock import ManualClock
from tracer.path.stages import Outcome, Stage

WAIT = 10.0  # generous upper bound for anything that should happen "now"


def submitter_blocked(d: Dispatcher[Any]) -> bool:
    """Someone waits inside the dispatcher: a blocked submitter, or a caller of wait_*/close."""
    s = d.statistics()
    return s.waiters > 0 or s.watchers > 0


class Gates:
    """Per-item events: the handler for item x reports `started[x]` and waits for `release[x]`."""

    def __init__(self) -> None:
        self.started: dict[Any, threading.Event] = collections.defaultdict(threading.Event)
        self.release: dict[Any, threading.Event] = collections.defaultdict(threading.Event)
        self.lock = threading.Lock()
        self.order: list[Any] = []
        self.threads: dict[Any, int] = {}

    def handler(self, item: Any) -> None:
        with self.lock:
            self.order.append(item)
            self.threads[item] = threading.get_ident()
            started, release = self.started[item], self.release[item]
        started.set()
        assert release.wait(WAIT), f"item {item!r} never released"

    def open(self, *items: Any) -> None:
        with self.lock:
            evs = [self.release[i] for i in items]
        for e in evs:
            e.set()

    def wait_started(self, *items: Any) -> None:
        with self.lock:
            evs = [self.started[i] for i in items]
        for e in evs:
            assert e.wait(WAIT), "handler did not start"

    def is_started(self, item: Any) -> bool:
        with self.lock:
            return item in self.order


class FakeTrace:
    """Records the dispatcher's calls, in order, into a shared log."""

    def __init__(self, name: str, log: list[tuple[Any, ...]]) -> None:
        self.name = name
        self.log = log

    def mark(self, stage: Stage) -> None:
        self.log.append((self.name, "mark", stage))

    @contextmanager
    def handler_scope(self) -> Iterator[object]:
        self.log.append((self.name, "start"))
        try:
            yield self
        except BaseException as exc:
            self.log.append((self.name, "end", exc))
            raise
        self.log.append((self.name, "end", None))

    def finish(self, outcome: Outcome, error: BaseException | None) -> None:
        self.log.append((self.name, "finish", outcome, error))


# --------------------------------------------------------------------------------------- slots
def test_aggressive_at_most_one_message_per_worker() -> None:
    lock = threading.Lock()
    per_thread: collections.Counter[int] = collections.Counter()
    worst_thread = worst_total = 0
    total = 0

    def handler(_: int) -> None:
        nonlocal worst_thread, worst_total, total
        me = threading.get_ident()
        with lock:
            per_thread[me] += 1
            total += 1
            worst_thread = max(worst_thread, per_thread[me])
            worst_total = max(worst_total, total)
        with lock:
            per_thread[me] -= 1
            total -= 1

    with Dispatcher(handler, workers=4) as d:
        for i in range(500):
            d.submit(i)
            assert d.statistics().in_flight + d.statistics().queued <= 4
    assert worst_thread == 1
    assert worst_total <= 4
    assert d.statistics().handled == 500 and d.statistics().queued == 0


def test_submit_blocks_when_all_slots_full_and_unblocks_when_one_frees() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=2)
    d.submit("a")
    d.submit("b")
    g.wait_started("a", "b")
    assert d.free_slots() == 0
    assert d.wait_for_free_slot(timeout=0) is False
    assert d.submit("x", timeout=0) is False  # would block: refused at once
    accepted = threading.Event()
    t = threading.Thread(target=lambda: (d.submit("c"), accepted.set()))
    t.start()
    wait_until(lambda: submitter_blocked(d))
    assert not accepted.is_set()
    assert not g.is_started("c")
    g.open("b")  # one slot frees
    assert accepted.wait(WAIT)
    g.wait_started("c")
    assert g.threads["c"] == g.threads["b"]  # the freed worker took it
    assert not g.is_started("x")
    g.open("a", "c")
    d.close()
    assert d.statistics().submitted == 3 and d.statistics().handled == 3
    t.join()


def test_next_message_goes_to_whichever_worker_frees_first() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=2)
    d.submit("slow")
    d.submit("m1")
    g.wait_started("slow", "m1")
    g.open("m1")
    for i in range(2, 6):  # each waits only for the fast worker, never behind "slow"
        d.submit(f"m{i}")
        g.wait_started(f"m{i}")
        g.open(f"m{i}")
    assert not g.release["slow"].is_set()
    assert {g.threads[f"m{i}"] for i in range(1, 6)} == {g.threads["m1"]}
    g.open("slow")
    d.close()


def test_blocked_submit_times_out_and_its_item_never_runs() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=1)
    d.submit(0)
    g.wait_started(0)
    assert d.submit(1, timeout=0.02) is False  # real 20 ms: a bounded wait that must expire
    g.open(0, 1)
    assert d.wait_idle(WAIT)
    d.submit(2)
    g.open(2)
    d.close()
    assert g.order == [0, 2]
    assert d.statistics().submitted == 2 == d.statistics().handled


def test_several_blocked_submitters_each_get_in_exactly_once() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=1)
    d.submit("first")
    g.wait_started("first")
    accepted: list[str] = []
    threads = [threading.Thread(target=lambda n=n: (d.submit(n), accepted.append(n))) for n in ("a", "b", "c")]
    for t in threads:
        t.start()
    wait_until(lambda: d.statistics().waiters == 3)
    g.open("first", "a", "b", "c")
    for t in threads:
        t.join(WAIT)
    d.close()
    assert sorted(accepted) == ["a", "b", "c"]
    assert sorted(g.order) == ["a", "b", "c", "first"]
    assert d.statistics().submitted == 4 == d.statistics().handled


@pytest.mark.parametrize("policy", [Aggressive(max_parked=2), CostAware(window=3), RoundRobin(buffer=1)])
def test_concurrent_submitters_nothing_lost_or_run_twice(policy: Any) -> None:
    lock = threading.Lock()
    ran: collections.Counter[tuple[int, int]] = collections.Counter()

    def handler(it: tuple[int, int]) -> None:
        with lock:
            ran[it] += 1

    d = Dispatcher(handler, workers=3, policy=policy, key=lambda it: f"k{it[1] % 5}", cost=lambda it: it[1] % 4)

    def feed(t: int) -> None:
        for i in range(300):
            d.submit((t, i))

    threads = [threading.Thread(target=feed, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    d.close()
    assert len(ran) == 1200 and set(ran.values()) == {1}
    assert d.statistics().submitted == 1200 == d.statistics().handled


def test_wait_for_free_slot_returns_when_a_worker_frees() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=1)
    d.submit(1)
    g.wait_started(1)
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(d.wait_for_free_slot(WAIT)))
    t.start()
    wait_until(lambda: submitter_blocked(d))
    g.open(1)
    t.join()
    assert got == [True] and d.free_slots() == 1
    d.close()
    assert d.wait_for_free_slot(0) is False and d.free_slots() == 0


# ------------------------------------------------------------------------------------ ordering
def test_same_key_never_concurrent_and_in_order_while_other_keys_pass() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=3, key=lambda s: s.split("-")[0])
    for item in ("A-1", "A-2", "A-3", "B-1", "B-2"):
        assert d.submit(item, timeout=WAIT)
    g.wait_started("A-1", "B-1")
    assert d.statistics().queued == 3  # behind A-1; B-2 behind B-1; none holds a worker
    assert d.free_slots() == 1
    g.open("B-1", "B-2")  # key B flows past the slow key A
    g.wait_started("B-2")
    assert not g.is_started("A-2")
    d.submit("C-1")  # a new key still gets the free worker
    g.wait_started("C-1")
    g.open("C-1")
    g.open("A-1")
    g.wait_started("A-2")
    assert not g.is_started("A-3")
    g.open("A-2", "A-3")
    d.close()
    a_order = [x for x in g.order if x.startswith("A")]
    assert a_order == ["A-1", "A-2", "A-3"]
    assert d.statistics().handled == 6


@pytest.mark.parametrize("policy", [Aggressive(), CostAware(window=8), RoundRobin(buffer=3)])
def test_key_exclusion_and_order_under_load(policy: Any) -> None:
    rng = random.Random(1)
    items = [(f"k{rng.randrange(6)}", i) for i in range(400)]
    lock = threading.Lock()
    running: set[str] = set()
    clashes = 0
    started: dict[str, list[int]] = collections.defaultdict(list)

    def handler(item: tuple[str, int]) -> None:
        nonlocal clashes
        k, i = item
        with lock:
            clashes += k in running
            running.add(k)
            started[k].append(i)
        with lock:
            running.discard(k)

    with Dispatcher(handler, workers=4, policy=policy, key=lambda it: it[0], cost=lambda it: it[1] % 7) as d:
        for it in items:
            d.submit(it)
    assert clashes == 0
    for k, seq in started.items():
        assert seq == sorted(seq), f"key {k} out of order"
    assert d.statistics().handled == 400


def test_none_key_means_unordered() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=2, key=lambda s: None)
    d.submit("a")
    d.submit("b")
    g.wait_started("a", "b")  # both run at once: no key, no exclusion
    g.open("a", "b")
    d.close()


# --------------------------------------------------------------------------------- cost-aware
def test_cost_aware_starts_most_expensive_waiting_first() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=1, policy=CostAware(window=10), cost=lambda it: it[1])
    d.submit(("first", 1))
    g.wait_started(("first", 1))
    waiting = [("a", 1), ("b", 5), ("c", 3), ("d", 9), ("e", 2), ("f", 5)]
    for it in waiting:
        assert d.submit(it, timeout=0)
    assert d.statistics().queued == 6 and d.free_slots() == 4
    for it in waiting:
        g.open(it)
    g.open(("first", 1))
    d.close()
    assert [name for name, _ in g.order] == ["first", "d", "b", "f", "c", "e", "a"]


def test_cost_aware_window_full_blocks() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=1, policy=CostAware(window=2), cost=float)
    d.submit(0)
    g.wait_started(0)
    assert d.submit(1, timeout=0) and d.submit(2, timeout=0)
    assert d.submit(3, timeout=0) is False
    t = threading.Thread(target=d.submit, args=(3,))
    t.start()
    wait_until(lambda: submitter_blocked(d))
    g.open(0, 1, 2, 3)
    t.join(WAIT)
    d.close()
    # When 0 ends, 2 (the costliest waiting) starts and 3 enters the window at once; 3 then beats 1.
    assert g.order == [0, 2, 3, 1]


def test_round_robin_keeps_the_incident_behaviour() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=2, policy=RoundRobin(buffer=2))
    for i in range(6):  # 0,2,4 -> worker 0; 1,3,5 -> worker 1
        assert d.submit(i, timeout=0)
    assert d.submit(6, timeout=0) is False  # worker 0's buffer is full
    g.wait_started(0, 1)
    g.open(1, 3, 5)
    d.wait_for_free_slot(0)
    wait_until(lambda: d.statistics().in_flight == 1)  # worker 1 went idle...
    assert not g.is_started(2)  # ...while 2 and 4 still wait behind 0 on worker 0
    assert d.submit(6, timeout=0) is False  # and the next target is worker 0 again
    g.open(0, 2, 4, 6)
    assert d.submit(6, timeout=WAIT)
    d.close()
    assert d.statistics().handled == 7


# ---------------------------------------------------------------------------------- life cycle
def test_exact_counts_with_failures_and_timeouts() -> None:
    clock = ManualClock()
    outcomes: dict[int, Outcome] = {}
    lock = threading.Lock()

    def handler(i: int) -> None:
        if i % 5 == 0:
            raise ValueError(i)
        if i % 7 == 0:
            clock.advance_s(2.0)  # "runs" 2 s against a 1 s timeout

    def on_done(i: int, outcome: Outcome, error: BaseException | None) -> None:
        with lock:
            assert i not in outcomes, "reported twice"
            outcomes[i] = outcome

    with Dispatcher(handler, workers=3, on_done=on_done, handler_timeout=1.0, clock=clock) as d:
        for i in range(1, 141):
            d.submit(i)
    s = d.statistics()
    failed = sum(1 for i in range(1, 141) if i % 5 == 0)
    assert s.submitted == 140 == s.handled + s.failed + s.timed_out
    assert s.failed == failed and s.timed_out > 0
    assert len(outcomes) == 140
    assert sum(o is Outcome.SUCCESS for o in outcomes.values()) == s.handled
    assert s.in_flight == s.queued == 0


def test_failing_handler_leaves_the_worker_alive() -> None:
    seen: list[tuple[int, Outcome, type[BaseException] | None, int]] = []
    threads: dict[int, int] = {}

    def handler(i: int) -> None:
        threads[i] = threading.get_ident()
        if i == 0:
            raise RuntimeError("boom")
        if i == 1:
            raise SystemExit(3)  # would end a bare thread

    def on_done(i: int, o: Outcome, e: BaseException | None) -> None:
        seen.append((i, o, type(e) if e else None, threading.get_ident()))

    with Dispatcher(handler, workers=1, on_done=on_done) as d:
        for i in range(3):
            d.submit(i)
    assert [(i, o, e) for i, o, e, _ in seen] == [
        (0, Outcome.FAILURE, RuntimeError),
        (1, Outcome.FAILURE, SystemExit),
        (2, Outcome.SUCCESS, None),
    ]
    assert len(set(threads.values())) == 1
    assert d.statistics().failed == 2 and d.statistics().handled == 1


def test_handler_timeout_marks_timeout_once_and_never_reruns() -> None:
    clock = ManualClock()
    calls: list[int] = []
    got: list[tuple[Outcome, BaseException | None]] = []

    def handler(i: int) -> str:
        calls.append(i)
        clock.advance_s(5.0)
        if i == 2:
            raise KeyError(i)
        return "late result"

    d = Dispatcher(handler, workers=1, handler_timeout=1.5, clock=clock, on_done=lambda i, o, e: got.append((o, e)))
    d.submit(1)
    d.submit(2)
    d.close()
    assert calls == [1, 2]
    assert [o for o, _ in got] == [Outcome.TIMEOUT, Outcome.TIMEOUT]
    err1, err2 = got[0][1], got[1][1]
    assert isinstance(err1, HandlerTimeout) and err1.elapsed_s == pytest.approx(5.0) and err1.timeout_s == 1.5
    assert isinstance(err2, HandlerTimeout) and isinstance(err2.__cause__, KeyError)
    assert d.statistics().timed_out == 2 and d.statistics().failed == 0


def test_close_drains_queued_and_in_flight() -> None:
    g = Gates()
    done: list[int] = []
    d = Dispatcher(g.handler, workers=1, policy=CostAware(window=10), on_done=lambda i, o, e: done.append(i))
    for i in range(6):
        d.submit(i)
    g.wait_started(0)
    closer = threading.Thread(target=d.close)
    closer.start()
    wait_until(lambda: d.closed)
    with pytest.raises(DispatcherClosed):
        d.submit(99)
    g.open(*range(6))
    closer.join(WAIT)
    assert not closer.is_alive()
    assert sorted(done) == list(range(6))
    s = d.statistics()
    assert s.handled == 6 and s.skipped == 0 and s.in_flight == s.queued == 0
    d.close()  # idempotent


def test_close_without_drain_skips_queued_and_finishes_in_flight() -> None:
    g = Gates()
    log: list[tuple[Any, ...]] = []
    got: list[tuple[int, Outcome]] = []
    d = Dispatcher(g.handler, workers=1, policy=RoundRobin(buffer=5), on_done=lambda i, o, e: got.append((i, o)))
    for i in range(4):
        d.submit(i, FakeTrace(str(i), log))
    g.wait_started(0)
    closer = threading.Thread(target=lambda: d.close(drain=False))
    closer.start()
    wait_until(lambda: len(got) == 3)  # 1, 2, 3 reported SKIPPED before the in-flight one finishes
    assert got == [(1, Outcome.SKIPPED), (2, Outcome.SKIPPED), (3, Outcome.SKIPPED)]
    g.open(0)
    closer.join(WAIT)
    assert got[-1] == (0, Outcome.SUCCESS)
    assert g.order == [0]
    assert ("1", "finish", Outcome.SKIPPED, None) in log
    assert not any(e[0] == "1" and e[1] == "start" for e in log)
    s = d.statistics()
    assert s.submitted == 4 and s.handled == 1 and s.skipped == 3


def test_close_wakes_a_blocked_submitter_with_dispatcher_closed() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=1)
    d.submit(0)
    g.wait_started(0)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            d.submit(1)
        except DispatcherClosed as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    wait_until(lambda: submitter_blocked(d))
    closer = threading.Thread(target=d.close)
    closer.start()
    t.join(WAIT)
    assert len(errors) == 1
    g.open(0)
    closer.join(WAIT)
    assert d.statistics().submitted == 1 and d.statistics().handled == 1


def test_close_timeout_returns_and_work_still_finishes() -> None:
    g = Gates()
    got: list[Outcome] = []
    d = Dispatcher(g.handler, workers=1, on_done=lambda i, o, e: got.append(o))
    d.submit(0)
    g.wait_started(0)
    d.close(timeout=0.01)  # returns although the handler is still running
    assert d.statistics().in_flight == 1
    g.open(0)
    assert d.wait_idle(WAIT)
    assert got == [Outcome.SUCCESS]


def test_close_from_a_handler_is_refused() -> None:
    errors: list[BaseException | None] = []
    holder: list[Dispatcher[int]] = []
    d: Dispatcher[int] = Dispatcher(lambda i: holder[0].close(), workers=1, on_done=lambda i, o, e: errors.append(e))
    holder.append(d)
    d.submit(1)
    d.close()
    assert isinstance(errors[0], RuntimeError)


def test_running_lists_in_flight_items_with_their_age() -> None:
    g = Gates()
    clock = ManualClock()
    d = Dispatcher(g.handler, workers=2, clock=clock)
    d.submit("a")
    g.wait_started("a")
    clock.advance_s(3.0)
    assert d.running() == [("a", pytest.approx(3.0))]
    g.open("a")
    d.close()
    assert d.running() == []


# ------------------------------------------------------------------------------------- tracing
def test_trace_stamp_order_success_and_failure() -> None:
    log: list[tuple[Any, ...]] = []

    def handler(i: int) -> None:
        log.append((str(i), "handler"))
        if i == 2:
            raise ValueError("bad")

    def on_done(i: int, o: Outcome, e: BaseException | None) -> None:
        log.append((str(i), "on_done", o))

    with Dispatcher(handler, workers=1, on_done=on_done) as d:
        d.submit(1, FakeTrace("1", log))
        d.submit(2, FakeTrace("2", log))
        d.submit(3)  # no trace: no stamps
    one = [e for e in log if e[0] == "1"]
    assert one == [
        ("1", "mark", Stage.DISPATCH_ENQUEUE),
        ("1", "start"),
        ("1", "handler"),
        ("1", "end", None),
        ("1", "finish", Outcome.SUCCESS, None),
        ("1", "on_done", Outcome.SUCCESS),
    ]
    two = [e for e in log if e[0] == "2"]
    assert [e[1] for e in two] == ["mark", "start", "handler", "end", "finish", "on_done"]
    assert isinstance(two[3][2], ValueError) and two[4][2] is Outcome.FAILURE and two[4][3] is two[3][2]
    assert [e for e in log if e[0] == "3"] == [("3", "handler"), ("3", "on_done", Outcome.SUCCESS)]


class BrokenTrace:
    def mark(self, stage: Stage) -> None:
        raise RuntimeError("mark")

    def handler_scope(self) -> Any:
        raise RuntimeError("scope")

    def finish(self, outcome: Outcome, error: BaseException | None) -> None:
        raise RuntimeError("finish")


def test_trace_and_on_done_errors_are_logged_once_and_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[int] = []

    def on_done(i: int, o: Outcome, e: BaseException | None) -> None:
        raise RuntimeError("on_done")

    with caplog.at_level(logging.ERROR, logger="tracer.dispatch"):
        with Dispatcher(ran.append, workers=2, on_done=on_done) as d:
            for i in range(10):
                d.submit(i, BrokenTrace())
    assert sorted(ran) == list(range(10))
    assert d.statistics().handled == 10
    kinds = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(kinds) == 4  # mark, handler_scope enter, finish, on_done: once each
    assert all("failed" in k for k in kinds)


def test_validation() -> None:
    with pytest.raises(ValueError):
        Dispatcher(print, workers=0)
    with pytest.raises(ValueError):
        Dispatcher(print, handler_timeout=0)
    with pytest.raises(ValueError):
        Dispatcher(print, policy="nope")


def test_a_blocked_submit_is_stamped_when_a_worker_accepts_it() -> None:
    g = Gates()
    log: list[tuple[Any, ...]] = []
    d = Dispatcher(g.handler, workers=1)
    d.submit("first")
    g.wait_started("first")
    t = threading.Thread(target=d.submit, args=("second", FakeTrace("second", log)))
    t.start()
    wait_until(lambda: submitter_blocked(d))
    assert log == []  # not accepted yet: no enqueue stamp while the submitter is blocked
    g.open("first", "second")
    t.join(WAIT)
    d.close()
    assert [e[1] for e in log] == ["mark", "start", "end", "finish"]
    assert g.order == ["first", "second"]


# ------------------------------------------------------------------------- edges (issue 11)
def test_raising_or_non_str_key_fails_that_message_only(caplog: pytest.LogCaptureFixture) -> None:
    got: list[tuple[Any, Outcome, BaseException | None]] = []
    ran: list[Any] = []

    def key(it: Any) -> Any:
        if it == "boom":
            raise KeyError("no group")
        if it == "int":
            return 5
        return "k"

    with caplog.at_level(logging.ERROR, logger="tracer.dispatch"):
        with Dispatcher(ran.append, workers=2, key=key, on_done=lambda i, o, e: got.append((i, o, e))) as d:
            for it in ("a", "boom", "b", "int", "boom"):
                assert d.submit(it) is True  # never raises out of submit
    outcomes = {i: o for i, o, _ in got}
    # never run, so never a failure (#30 finding 06): not started
    assert outcomes == {"a": Outcome.SUCCESS, "b": Outcome.SUCCESS, "boom": Outcome.NOT_STARTED,
                        "int": Outcome.NOT_STARTED}
    assert len(got) == 5 and sorted(ran) == ["a", "b"]
    assert isinstance(next(e for i, _, e in got if i == "boom"), KeyError)
    assert isinstance(next(e for i, _, e in got if i == "int"), TypeError)
    s = d.statistics()
    assert s.submitted == 5 and s.not_started == 3 and s.failed == 0 and s.handled == 2 and s.live_workers == 0
    assert sum("key= callable" in r.getMessage() for r in caplog.records) == 1  # logged once


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, "9", None, "raise"])
def test_bad_cost_takes_zero_and_keeps_cost_aware_order(bad: Any) -> None:
    g = Gates()

    def cost(it: tuple[str, Any]) -> Any:
        if it[1] == "raise":
            raise ValueError("no cost")
        return it[1]

    d = Dispatcher(g.handler, workers=1, policy=CostAware(window=10), cost=cost)
    d.submit(("first", 1))
    g.wait_started(("first", 1))
    waiting = [("a", 3), ("bad", bad), ("b", 5), ("c", 1), ("d", 4)]
    for it in waiting:
        assert d.submit(it, timeout=0)
    assert d.statistics().cost_errors == 1
    for it in [("first", 1), *waiting]:
        g.open(it)
    d.close()
    assert [n for n, _ in g.order] == ["first", "b", "d", "a", "c", "bad"]  # the bad one costs 0


class WorkerSetterRaises:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    @property
    def worker(self) -> int:
        return 0

    @worker.setter
    def worker(self, value: int) -> None:
        raise RuntimeError("read-only lane")

    def mark(self, stage: Stage) -> None:
        self.log.append("mark")

    @contextmanager
    def handler_scope(self) -> Iterator[object]:
        yield None

    def finish(self, outcome: Outcome, error: BaseException | None) -> None:
        self.log.append(f"finish {outcome.value}")


def test_trace_whose_worker_setter_raises_does_not_lose_the_message() -> None:
    log: list[str] = []
    got: list[Outcome] = []
    with Dispatcher(lambda i: log.append("handler"), workers=1, on_done=lambda i, o, e: got.append(o)) as d:
        d.submit(1, WorkerSetterRaises(log))
    assert log == ["mark", "handler", "finish success"]
    assert got == [Outcome.SUCCESS]


def test_hung_handler_is_reported_timeout_at_the_deadline_and_keeps_its_worker() -> None:
    clock = ManualClock()
    g = Gates()
    got: list[tuple[Any, Outcome, BaseException | None]] = []
    d = Dispatcher(g.handler, workers=2, handler_timeout=5.0, clock=clock, on_done=lambda i, o, e: got.append((i, o, e)))
    d.submit("hung")
    d.submit("ok")
    g.wait_started("hung", "ok")
    clock.advance_s(3.0)
    assert d.check_timeouts() == 0
    g.open("ok")
    assert d.wait_for_free_slot(WAIT)
    clock.advance_s(3.0)  # "hung" is 6 s old now
    assert d.check_timeouts() == 1
    assert got[-1][:2] == ("hung", Outcome.TIMEOUT) and isinstance(got[-1][2], HandlerTimeout)
    assert d.check_timeouts() == 0  # reported once
    s = d.statistics()
    assert s.timed_out == 1 and s.overrun == 1 and s.in_flight == 0
    assert d.running() == [] and d.overrun() == [("hung", pytest.approx(6.0))]
    assert d.free_slots() == 1  # the hung handler still holds its worker
    assert s.submitted == s.handled + s.failed + s.timed_out + s.skipped + s.in_flight + s.queued
    g.open("hung")  # it returns at last: its late result is dropped, not reported again
    assert d.wait_for_free_slot(WAIT) and wait_for(lambda: d.free_slots() == 2)
    d.close()
    assert [(i, o) for i, o, _ in got] == [("ok", Outcome.SUCCESS), ("hung", Outcome.TIMEOUT)]
    assert d.statistics().overrun == 0 and d.statistics().timed_out == 1


def wait_for(cond: Any) -> bool:
    wait_until(cond)
    return True


def test_watchdog_reports_a_hung_handler_and_close_returns_without_it() -> None:
    hang = threading.Event()
    reported = threading.Event()
    got: list[Outcome] = []

    def on_done(i: int, o: Outcome, e: BaseException | None) -> None:
        got.append(o)
        reported.set()

    def handler(i: int) -> None:
        hang.wait(WAIT)

    d = Dispatcher(handler, workers=1, handler_timeout=0.05, on_done=on_done)  # real clock: the watchdog's own
    d.submit(1)
    assert reported.wait(WAIT)  # real-time: the watchdog fires 50 ms after the start, while the handler hangs
    assert got == [Outcome.TIMEOUT] and d.statistics().overrun == 1
    closer = threading.Thread(target=d.close)  # no timeout: it must not wait for the hung thread
    closer.start()
    closer.join(WAIT)
    assert not closer.is_alive()
    assert d.statistics().live_workers == 1  # the hung thread is left to finish on its own
    hang.set()
    wait_until(lambda: d.statistics().live_workers == 0)
    assert got == [Outcome.TIMEOUT]


def test_close_with_timeout_returns_in_bounded_time_with_a_never_returning_handler() -> None:
    hang = threading.Event()
    started = threading.Event()

    def handler(i: int) -> None:
        started.set()
        hang.wait(WAIT)

    d = Dispatcher(handler, workers=1, handler_timeout=100.0)
    d.submit(1)
    assert started.wait(WAIT)
    t = threading.Thread(target=d.close, kwargs={"timeout": 0.2})
    t.start()
    t.join(WAIT)  # real-time: bounded by close's own 0.2 s (twice: its wait, then the joins)
    assert not t.is_alive()
    hang.set()
    # the handler's return ends the watchdog too (it slept until the handler's 100 s deadline and
    # outlived the test before); a second close then settles at once
    watchdog = d._watchdog
    assert watchdog is not None
    watchdog.join(WAIT)
    assert not watchdog.is_alive()
    assert d.close(timeout=WAIT) is True


def test_waiters_count_blocked_submitters_and_they_get_in_oldest_first() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=1)
    d.submit("first")
    g.wait_started("first")
    threads = []
    for n, name in enumerate(("a", "b", "c"), 1):
        t = threading.Thread(target=d.submit, args=(name,))
        t.start()
        threads.append(t)
        wait_until(lambda n=n: d.statistics().waiters == n)  # arrival order is known
    assert d.statistics().watchers == 0
    g.open("first", "a", "b", "c")
    for t in threads:
        t.join(WAIT)
    d.close()
    assert g.order == ["first", "a", "b", "c"]
    assert d.statistics().waiters == 0


def test_a_newcomer_uses_room_no_blocked_submitter_can_use() -> None:
    g = Gates()
    d = Dispatcher(g.handler, workers=2, policy=Aggressive(max_parked=0), key=lambda s: s[0] if s[0] in "K" else None)
    d.submit("K1")
    g.wait_started("K1")
    t = threading.Thread(target=d.submit, args=("K2",))  # its key is busy and parking is full: blocks
    t.start()
    wait_until(lambda: d.statistics().waiters == 1)
    assert d.submit("u1", timeout=0) is True  # the idle worker is of no use to K2
    g.wait_started("u1")
    g.open("u1", "K1", "K2")
    t.join(WAIT)
    d.close()
    assert d.statistics().handled == 3


def test_time_blocked_in_submit_is_read_from_the_injected_clock() -> None:
    from prometheus_client import CollectorRegistry

    from tracer.dispatch import DispatchMetrics

    reg = CollectorRegistry()
    clock = ManualClock()
    g = Gates()
    d = Dispatcher(g.handler, workers=1, clock=clock, metrics=DispatchMetrics(reg))
    d.submit(0)
    g.wait_started(0)
    t = threading.Thread(target=d.submit, args=(1,))
    t.start()
    wait_until(lambda: d.statistics().waiters == 1)
    clock.advance_s(2.0)
    g.open(0, 1)
    t.join(WAIT)
    d.close()
    total = reg.get_sample_value("rmqtrace_dispatch_submit_blocked_seconds_sum",
                                 {"policy": "aggressive", "consumer_group": ""})
    assert total == pytest.approx(2.0)


def test_handler_keyboard_interrupt_is_a_failure_and_the_worker_lives() -> None:
    got: list[tuple[int, Outcome]] = []

    def handler(i: int) -> None:
        if i == 0:
            raise KeyboardInterrupt

    with Dispatcher(handler, workers=1, on_done=lambda i, o, e: got.append((i, o))) as d:
        d.submit(0)
        d.submit(1)
    assert got == [(0, Outcome.FAILURE), (1, Outcome.SUCCESS)]


def test_validation_is_loud() -> None:
    with pytest.raises(ValueError, match="handler_timeout"):
        Dispatcher(print, handler_timeout=float("nan"))
    with pytest.raises(TypeError, match="key"):
        Dispatcher(print, key="group")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="handler"):
        Dispatcher(None)  # type: ignore[arg-type]


def test_dispatcher_failures_go_through_the_shared_once_logger(caplog: pytest.LogCaptureFixture) -> None:
    def on_done(i: int, o: Outcome, e: BaseException | None) -> None:
        raise RuntimeError("on_done")

    with caplog.at_level(logging.DEBUG, logger="tracer.dispatch"):
        with Dispatcher(lambda i: None, workers=1, on_done=on_done, name="orders") as d:
            d.submit(1)
            d.submit(2)
    lines = [r for r in caplog.records if "on_done" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.ERROR, logging.DEBUG]
    assert lines[0].getMessage() == (
        "dispatcher 'orders': on_done failed (logged once; later ones at debug level)"
    )  # tracer.logonce.OnceLogger's wording
