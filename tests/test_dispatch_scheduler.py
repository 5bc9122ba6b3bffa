"""The policies' state machines, step by step, without threads."""

from __future__ import annotations

from typing import Any

import pytest

from tracer.dispatch import Aggressive, CostAware, Random, RoundRobin, resolve_policy
from tracer.dispatch.scheduler import FULL, QUEUED, BufferedScheduler, Entry, PoolScheduler

_seq = 0


def entry(item: Any = None, key: str | None = None, cost: float = 0.0) -> Entry[Any]:
    global _seq
    e: Entry[Any] = Entry(item, None, key, cost)
    _seq += 1
    e.seq = _seq
    return e


def test_aggressive_admits_one_per_worker_then_full() -> None:
    s = Aggressive().scheduler(3)
    assert s.free_slots() == 3
    got = [s.admit(entry(i)) for i in range(3)]
    assert sorted(got) == [0, 1, 2]
    assert s.busy == 3 and s.queued == 0 and s.free_slots() == 0
    assert s.admit(entry(99)) == FULL
    assert s.busy == 3  # FULL changes nothing


def test_aggressive_freed_worker_goes_idle_and_takes_next() -> None:
    s = Aggressive().scheduler(2)
    a, b = entry("a"), entry("b")
    wa, wb = s.admit(a), s.admit(b)
    assert s.done(wb, b) is None
    assert s.free_slots() == 1 and s.busy == 1
    assert s.admit(entry("c")) == wb  # the worker that freed takes the next one
    assert s.idle_workers() == []
    assert s.done(wa, a) is None
    assert s.idle_workers() == [wa]


def test_aggressive_parks_busy_key_and_hands_successor_to_same_worker() -> None:
    s = Aggressive(max_parked=2).scheduler(2)
    k1, k2, k3 = entry(1, key="k"), entry(2, key="k"), entry(3, key="k")
    w = s.admit(k1)
    assert w >= 0
    assert s.admit(k2) == QUEUED and s.admit(k3) == QUEUED
    assert s.queued == 2 and s.busy == 1
    assert s.free_slots() == 1  # the other worker is still free for other keys
    assert s.admit(entry(4, key="k")) == FULL  # parking full
    other = entry(5, key="other")
    assert s.admit(other) >= 0  # other keys pass the busy one
    assert s.done(w, k1) is k2
    assert s.done(w, k2) is k3
    assert s.done(w, k3) is None
    assert s.queued == 0 and s.busy == 1


def test_aggressive_key_free_again_after_done() -> None:
    s = Aggressive().scheduler(1)
    a = entry("a", key="k")
    w = s.admit(a)
    assert s.done(w, a) is None
    assert s.admit(entry("b", key="k")) == w  # not parked: key no longer active


def test_cost_aware_window_most_expensive_first_ties_oldest() -> None:
    s = CostAware(window=10).scheduler(1)
    first = entry("first", cost=1)
    w = s.admit(first)
    assert w == 0
    es = [entry(c, cost=c) for c in (1, 5, 3, 5, 2)]
    assert [s.admit(e) for e in es] == [QUEUED] * 5
    assert s.free_slots() == 5
    order = []
    cur: Entry[Any] | None = first
    while cur is not None:
        cur = s.done(w, cur)
        if cur is not None:
            order.append(cur)
    assert [e.item for e in order] == [5, 5, 3, 2, 1]
    assert order[0] is es[1] and order[1] is es[3]  # equal costs: the older first


def test_cost_aware_window_bound_and_keys_share_it() -> None:
    s = CostAware(window=2).scheduler(1)
    a = entry("a", key="k", cost=1)
    w = s.admit(a)
    assert s.admit(entry("b", key="k", cost=9)) == QUEUED  # parked behind a
    assert s.admit(entry("c", cost=1)) == QUEUED
    assert s.admit(entry("d", cost=1)) == FULL
    nxt = s.done(w, a)  # b moves parked -> window and, costing most, starts now
    assert nxt is not None and nxt.item == "b"
    assert s.queued == 1


def test_cost_aware_parked_successor_competes_in_window() -> None:
    s = CostAware(window=5).scheduler(1)
    a = entry("a", key="k")
    w = s.admit(a)
    s.admit(entry("b", key="k", cost=1))
    s.admit(entry("big", cost=7))
    nxt = s.done(w, a)
    assert nxt is not None and nxt.item == "big"
    nxt2 = s.done(w, nxt)
    assert nxt2 is not None and nxt2.item == "b"
    assert s.done(w, nxt2) is None


def test_pool_take_queued_keeps_running_keys_active() -> None:
    s = CostAware(window=5).scheduler(1)
    run = entry("run", key="a")
    w = s.admit(run)
    s.admit(entry("a2", key="a"))
    s.admit(entry("b1", key="b"))  # window head of key b
    s.admit(entry("b2", key="b"))  # parked behind b1
    taken = s.take_queued()
    assert [e.item for e in taken] == ["a2", "b1", "b2"]
    assert s.queued == 0
    assert s.admit(entry("b3", key="b")) == QUEUED  # b is free again: into the window
    assert s.admit(entry("a3", key="a")) == QUEUED  # a still running: parked
    nxt = s.done(w, run)
    assert nxt is not None and nxt.item in ("a3", "b3")


def test_round_robin_deals_in_turn_and_blocks_on_full_target() -> None:
    s = RoundRobin(buffer=1).scheduler(2)
    assert s.free_slots() == 4  # (1 running + 1 buffered) x 2
    e0, e1, e2, e3 = (entry(i) for i in range(4))
    assert s.admit(e0) == 0 and s.admit(e1) == 1
    assert s.admit(e2) == QUEUED and s.admit(e3) == QUEUED
    assert s.free_slots() == 0
    assert s.admit(entry(4)) == FULL  # target worker 0 is full
    # Worker 1 drains completely, yet message 4 still targets worker 0: the incident.
    assert s.done(1, e1) is e3
    assert s.done(1, e3) is None
    assert s.idle_workers() == [1]
    assert s.free_slots() == 0
    assert s.admit(entry(4)) == FULL
    assert s.done(0, e0) is e2
    assert s.free_slots() == 2  # next targets: worker 0 (1 buffer slot), worker 1, worker 0 (full)
    assert s.admit(entry(4)) == QUEUED


def test_round_robin_keys_route_to_a_fixed_worker() -> None:
    s = BufferedScheduler(4, 10, lambda: 0, name="t")
    ws = {s.admit(entry(i, key="grp")) for i in range(3)}
    assert len(ws - {QUEUED}) == 1
    assert s.queued == 2


def test_random_free_slots_agrees_with_admit() -> None:
    s = Random(buffer=2, seed=7).scheduler(3)
    n = s.free_slots()
    assert n >= 3  # at least one message per worker before any target is full
    for _ in range(n):
        assert s.admit(entry()) != FULL
    assert s.free_slots() == 0
    assert s.admit(entry()) == FULL


def test_buffered_take_queued() -> None:
    s = RoundRobin(buffer=3).scheduler(1)
    e0 = entry(0)
    s.admit(e0)
    for i in range(1, 4):
        s.admit(entry(i))
    assert [e.item for e in s.take_queued()] == [1, 2, 3]
    assert s.done(0, e0) is None and s.queued == 0 and s.busy == 0


def test_policy_validation_and_names() -> None:
    with pytest.raises(ValueError):
        CostAware(window=0)
    with pytest.raises(ValueError):
        RoundRobin(buffer=-1)
    with pytest.raises(ValueError):
        Aggressive(max_parked=-1)
    with pytest.raises(ValueError):
        resolve_policy("fifo")
    with pytest.raises(ValueError):
        PoolScheduler(0)
    assert resolve_policy("round_robin") == RoundRobin(buffer=10)
    assert {resolve_policy(n).name for n in ("aggressive", "cost_aware", "round_robin", "random")} == {
        "aggressive",
        "cost_aware",
        "round_robin",
        "random",
    }
    p = CostAware(window=3)
    assert resolve_policy(p) is p


def test_admit_answers_with_named_results() -> None:
    from tracer.dispatch.scheduler import Admission

    s = Aggressive(max_parked=1).scheduler(1)
    first = entry("a", key="k")
    assert s.admit(first) == 0
    assert s.admit(entry("b", key="k")) is Admission.QUEUED is QUEUED
    assert s.admit(entry("c", key="k")) is Admission.FULL is FULL
    assert s.admit(entry("d")) is Admission.FULL


def test_every_dispatch_module_declares_its_api() -> None:
    import importlib
    import pkgutil

    import tracer.dispatch as pkg

    names = [m.name for m in pkgutil.iter_modules(pkg.__path__)]
    assert "core" in names
    for name in ["__init__", *names]:
        mod = importlib.import_module("tracer.dispatch" if name == "__init__" else f"tracer.dispatch.{name}")
        assert hasattr(mod, "__all__"), mod.__name__
        assert all(hasattr(mod, n) for n in mod.__all__), mod.__name__
