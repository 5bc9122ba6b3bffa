"""Model-based test of the dispatcher's worker-seconds (tracer/dispatch/accrual.py) and of the
counters that export them (tracer/dispatch/metrics.py: GaugeSources).

Random admits (keyed or not), finishes and ``take_queued`` on every policy's scheduler, clock
steps forward (and back), scrapes, and finally the dispatcher's removal, against a plain model
that integrates the scheduler's own counts between steps. Named invariants, checked after every
step (a failure says ``invariant <name>: ...``):

* ``exact_integrals`` — ``accrued()`` is ∫ busy dt and ∫ min(idle, queued) dt of the counts the
  scheduler had between the steps, whatever the order of changes and reads;
* ``bounded`` — 0 <= head-of-line seconds <= idle worker-seconds and busy <= workers × elapsed;
* ``counter_never_down`` — every scrape adds a delta >= 0, and the scraped total is what accrued;
* ``kept_after_close`` — a removed dispatcher's last accrual still reaches the counter once.

Default 300 examples (``RMQTRACE_LONG=1``: ten times more); a few seconds.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tracer.dispatch import Aggressive, CostAware, Random, RoundRobin
from tracer.dispatch.accrual import Accrual
from tracer.dispatch.metrics import GaugeSources
from tracer.dispatch.scheduler import FULL, Entry
from tracer.path.clock import ManualClock

LONG = os.environ.get("RMQTRACE_LONG") == "1"
POLICIES = st.sampled_from([Aggressive(max_parked=3), CostAware(window=2), RoundRobin(buffer=2),
                            Random(buffer=1, seed=3)])  # fmt: skip


def violated(name: str, detail: object) -> str:
    return f"invariant {name}: {detail}"


class AccrualModel(RuleBasedStateMachine):
    @initialize(policy=POLICIES, workers=st.integers(1, 4))
    def start(self, policy: Any, workers: int) -> None:
        self.clock = ManualClock()
        self.s = policy.scheduler(workers)
        self.back_ns = 0  # how far the reading was stepped back (ManualClock only moves forward)
        self.acc = Accrual(self.s, lambda: self.clock.monotonic_ns() - self.back_ns)
        self.sources = GaugeSources()
        self.sources.add(self.acc)
        self.removed = False
        self.held: dict[int, Entry[Any]] = {}
        self.seq = 0
        self.ref_busy = self.ref_hol = self.ref_idle = 0.0
        self.elapsed = 0.0
        self.scraped = [0.0, 0.0]
        self.peak = (0.0, 0.0)  # the largest reading a scrape took (a clock stepping back lowers later ones)

    def _changed(self) -> None:  # what Core does after every scheduler call
        self.acc.mark()

    @rule(key=st.sampled_from([None, None, "a", "b"]), cost=st.floats(0, 5))
    def admit(self, key: str | None, cost: float) -> None:
        self.seq += 1
        e: Entry[Any] = Entry(self.seq, None, key, cost)
        e.seq = self.seq
        r = self.s.admit(e)
        if r is FULL:
            return
        self._changed()
        if isinstance(r, int):
            self.held[r] = e

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(sorted(self.held)))
        nxt = self.s.done(worker, self.held.pop(worker))
        self._changed()
        if nxt is not None:
            self.held[worker] = nxt

    @rule()
    def drop_queued(self) -> None:
        self.s.take_queued()
        self._changed()

    @rule(seconds=st.floats(0, 30))
    def advance(self, seconds: float) -> None:
        ns = int(seconds * 1e9)
        dt = ns / 1e9
        busy, idle, queued = self.s.busy, max(0, self.s.workers - self.s.busy), self.s.queued
        self.ref_busy += busy * dt
        self.ref_idle += idle * dt
        self.ref_hol += min(idle, queued) * dt
        self.elapsed += dt
        self.clock.advance(ns)

    @rule(seconds=st.floats(0.001, 5))
    def step_back(self, seconds: float) -> None:
        """A clock that steps back adds nothing (the dispatcher's is monotonic; stay safe anyway)."""
        self.back_ns += int(seconds * 1e9)
        self.stepped = True

    @rule()
    def scrape(self) -> None:
        if not self.removed:  # what this scrape can have read from the live dispatcher
            b, h = self.acc.accrued()
            self.peak = (max(self.peak[0], b), max(self.peak[1], h))
        db, dh = self.sources.advance()
        self.last_delta = (db, dh)
        self.scraped[0] += db
        self.scraped[1] += dh

    @precondition(lambda self: not self.removed)
    @rule()
    def close(self) -> None:
        self.sources.remove(self.acc)
        self.removed = True
        self.at_close = self.acc.accrued()
        self.peak = (max(self.peak[0], self.at_close[0]), max(self.peak[1], self.at_close[1]))

    # -------------------------------------------------------------------------- invariants
    @invariant()
    def exact_integrals(self) -> None:
        if getattr(self, "stepped", False):
            return  # after a step back the model's times no longer match the clock's; bounded holds
        busy_s, hol_s = self.acc.accrued()
        assert busy_s == pytest.approx(self.ref_busy, abs=1e-6), violated("exact_integrals", (busy_s, self.ref_busy))
        assert hol_s == pytest.approx(self.ref_hol, abs=1e-6), violated("exact_integrals", (hol_s, self.ref_hol))

    @invariant()
    def bounded(self) -> None:
        busy_s, hol_s = self.acc.accrued()
        cap = self.s.workers * self.elapsed + 1e-6
        assert 0 <= busy_s <= cap, violated("bounded", (busy_s, cap))
        assert 0 <= hol_s <= self.ref_idle + 1e-6, violated("bounded", (hol_s, self.ref_idle))

    @invariant()
    def counter_never_down(self) -> None:
        delta = getattr(self, "last_delta", (0.0, 0.0))
        assert delta[0] >= 0 and delta[1] >= 0, violated("counter_never_down", delta)
        assert self.scraped[0] <= self.peak[0] + 1e-6 and self.scraped[1] <= self.peak[1] + 1e-6, \
            violated("counter_never_down", (self.scraped, self.peak))
        if not getattr(self, "stepped", False):
            busy_s, hol_s = self.acc.accrued()  # with a monotonic clock no reading is ever lower
            assert self.peak[0] <= busy_s + 1e-6 and self.peak[1] <= hol_s + 1e-6, \
                violated("counter_never_down", (self.peak, busy_s, hol_s))

    def teardown(self) -> None:
        # kept_after_close: whatever accrued reaches the counter exactly once, closed or not
        if not hasattr(self, "acc"):
            return
        if not self.removed:
            self.sources.remove(self.acc)
            self.at_close = self.acc.accrued()
        db, dh = self.sources.advance()
        # the counter's running maximum: the last reading, or a larger earlier one after a step back
        busy_s, hol_s = (max(self.at_close[0], self.peak[0]), max(self.at_close[1], self.peak[1]))
        total = (self.scraped[0] + db, self.scraped[1] + dh)
        assert total == pytest.approx((busy_s, hol_s), abs=1e-6), violated("kept_after_close", (total, busy_s, hol_s))
        assert self.sources.advance() == (0.0, 0.0), violated("kept_after_close", "counted twice")


AccrualModel.TestCase.settings = settings(max_examples=3000 if LONG else 300, stateful_step_count=40, deadline=None)
TestAccrualModel = AccrualModel.TestCase
