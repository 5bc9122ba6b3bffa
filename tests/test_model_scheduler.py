"""Model-based test of the policies' pure state machines (no threads: every step is exact).

Random admits (keyed, unkeyed, costs), finishes, failures (``drop_successors`` then ``done``, as a
dispatcher with ``successors_follow`` calls them), timeouts (``expire``) and a final
``take_queued``, on the pool policies (aggressive, cost-aware) and the buffered ones, against a
plain model of who holds what. Named invariants, checked after every step (a failure says
``invariant <name>: ...``):

* ``costliest_first`` — a freed cost-aware worker takes the most expensive message that may start
  (ties: the oldest); aggressive hands a freed worker its key's next message or nothing;
* ``key_order`` — a keyed message is handed out only when no message of its key is held and none
  of its key waits that arrived earlier, and one of a busy key is parked behind it (pool
  policies; buffered: per worker, in order);
* ``work_conserving`` — a pool worker is idle only when nothing queued may start;
* ``expire_gives_back`` — ``expire`` returns exactly what waited behind the message, in order;
* ``per_key_order`` — no message that waited behind a message of its key that failed or timed out
  is handed out afterwards (``drop_successors``/``expire`` returned it, exactly, in order);
* ``counts`` — ``busy``, ``queued``, ``free_slots()`` agree with the model;
* ``take_all`` — ``take_queued`` returns every queued message, oldest first.

Default 400 examples (``RMQTRACE_LONG=1``: ten times more); it runs in a few seconds.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tracer.dispatch import Aggressive, CostAware, Random, RoundRobin
from tracer.dispatch.scheduler import FULL, QUEUED, BufferedScheduler, Entry, Scheduler

LONG = os.environ.get("RMQTRACE_LONG") == "1"

POLICIES = st.sampled_from([Aggressive(max_parked=2), Aggressive(max_parked=0), CostAware(window=1),
                            CostAware(window=3), RoundRobin(buffer=1), Random(buffer=2, seed=1)])  # fmt: skip


def violated(name: str, detail: object) -> str:
    return f"invariant {name}: {detail}"


class SchedulerModel(RuleBasedStateMachine):
    @initialize(policy=POLICIES, workers=st.integers(1, 3))
    def start(self, policy: Any, workers: int) -> None:
        self.policy = policy
        self.s: Scheduler = policy.scheduler(workers)
        self.pool = not isinstance(self.s, BufferedScheduler)
        self.window = policy.window if isinstance(policy, CostAware) else 0
        self.seq = 0
        self.held: dict[int, Entry[Any]] = {}  # worker -> entry it holds (expired ones too)
        self.queued: list[Entry[Any]] = []  # accepted, not held, in arrival order
        self.violations: list[str] = []
        self.must_follow: set[int] = set()  # seqs of what waited behind a failure or a timeout of its key

    # ------------------------------------------------------------------------------ helpers
    def live_keys(self) -> set[str]:
        return {e.key for e in self.held.values() if e.key is not None and not e.expired}

    def may_start(self) -> list[Entry[Any]]:
        """Queued entries that may start now: unkeyed, or their key's oldest with the key not held."""
        live = self.live_keys()
        out: list[Entry[Any]] = []
        seen: set[str] = set()
        for e in self.queued:
            if e.key is None:
                out.append(e)
            elif e.key not in seen:
                seen.add(e.key)
                if e.key not in live:
                    out.append(e)
        return out

    def handed(self, worker: int, e: Entry[Any]) -> None:
        if e.seq in self.must_follow:
            self.violations.append(violated("per_key_order", f"{e} handed out after its key's earlier one failed"))
        if self.pool and e.key is not None:
            if e.key in self.live_keys():
                self.violations.append(violated("key_order", f"{e} handed out while its key is held"))
            earlier = [q for q in self.queued if q.key == e.key and q.seq < e.seq]
            if earlier:
                self.violations.append(violated("key_order", f"{e} handed out before {earlier[0]}"))
        if worker in self.held:
            self.violations.append(violated("counts", f"worker {worker} handed {e} while holding {self.held[worker]}"))
        self.held[worker] = e
        if e in self.queued:
            self.queued.remove(e)

    # -------------------------------------------------------------------------------- rules
    @rule(key=st.sampled_from([None, None, "a", "a", "b"]), cost=st.sampled_from([0.0, 1.0, 2.0, 5.0]))
    def admit(self, key: str | None, cost: float) -> None:
        e: Entry[Any] = Entry(self.seq, None, key, cost)
        e.seq = self.seq
        self.seq += 1
        free_before = self.s.free_slots()
        busy_key = self.pool and key is not None and (
            key in self.live_keys() or any(q.key == key for q in self.queued))  # fmt: skip
        parked_before = getattr(self.s, "parked", 0)
        r = self.s.admit(e)
        if r is FULL:
            if key is None and free_before > 0:
                self.violations.append(violated("counts", f"unkeyed {e} refused with free_slots()={free_before}"))
            return
        if r is QUEUED:
            # seen here, not later as a miscount or a crash: a message of a busy key waits behind it
            if busy_key and getattr(self.s, "parked", 0) != parked_before + 1:
                self.violations.append(violated("key_order", f"{e} of busy key {key!r} queued but not parked behind it"))
            self.queued.append(e)
        else:
            assert isinstance(r, int)
            self.handed(r, e)

    @precondition(lambda self: bool(self.held))
    @rule(pick=st.integers(0, 5))
    def done(self, pick: int) -> None:
        worker = sorted(self.held)[pick % len(self.held)]
        e = self.held.pop(worker)
        could = self.may_start()
        buf = [] if self.pool else self.bufs_of(worker)
        nxt = self.s.done(worker, e)
        if nxt is None:
            if buf:
                self.violations.append(violated("work_conserving", f"buffered worker {worker} idle, {buf[0]} waits"))
            if self.pool and could:
                self.violations.append(violated("work_conserving", f"worker {worker} idle while {could[0]} may start"))
            return
        if self.pool:
            if self.window:
                best = min(could, key=lambda q: (-q.cost, q.seq)) if could else None
                if nxt is not best:
                    self.violations.append(violated("costliest_first", f"took {nxt}, the costliest was {best}"))
            elif not (e.key is not None and not e.expired and nxt.key == e.key):
                self.violations.append(violated("costliest_first", f"aggressive handed {nxt} after {e}"))
        elif nxt is not buf[0]:
            self.violations.append(violated("key_order", f"buffered worker {worker} took {nxt}, not {buf[0]}"))
        self.handed(worker, nxt)

    def waiting_behind(self, worker: int, e: Entry[Any]) -> list[Entry[Any]]:
        """The queued messages of ``e``'s key, in arrival order (buffered: all are in its worker's buffer)."""
        if e.key is None:
            return []
        return [q for q in (self.queued if self.pool else self.bufs_of(worker)) if q.key == e.key]

    @precondition(lambda self: any(not e.expired for e in self.held.values()))
    @rule(pick=st.integers(0, 5))
    def fail(self, pick: int) -> None:
        """A held message ends without success under ``successors_follow``: its key's waiting
        successors leave with it (``drop_successors``), then its worker is done with it."""
        workers = sorted(w for w, e in self.held.items() if not e.expired)
        worker = workers[pick % len(workers)]
        e = self.held[worker]
        want = self.waiting_behind(worker, e)
        self.must_follow.update(q.seq for q in want)
        back = self.s.drop_successors(worker, e)
        if back != want:
            self.violations.append(violated("per_key_order", f"drop_successors({e}) gave back {back}, expected {want}"))
        for q in back:
            if q in self.queued:
                self.queued.remove(q)
        self.done(sorted(self.held).index(worker))

    @rule(finish=st.sampled_from(["done", "fail", "expire"]))
    def burst_of_one_key(self, finish: str) -> None:
        """The exact precondition of the keyed bugs random search rarely reaches: three messages of one
        key back to back (the first busy, its successors parked beside idle workers), then the busy one
        ends (``finish``: succeeds, fails, or overruns its deadline)."""
        for _ in range(3):
            self.admit("k", 1.0)
        holders = [w for w, e in self.held.items() if e.key == "k" and not e.expired]
        if not holders:
            return
        if finish == "done":
            self.done(sorted(self.held).index(holders[0]))
        elif finish == "fail":
            self.fail(sorted(w for w, e in self.held.items() if not e.expired).index(holders[0]))
        else:
            self.expire(sorted(w for w, e in self.held.items() if not e.expired).index(holders[0]))

    @rule(pick=st.integers(0, 5))
    def window_of_costs(self, pick: int) -> None:
        """The precondition of the cost-order bugs random search reaches only sometimes: every
        worker busy, then unkeyed messages of rising and falling cost in the cost-aware window,
        then a worker frees (its next must be the costliest)."""
        for _ in range(self.s.workers):
            self.admit(None, 0.0)
        for cost in (1.0, 5.0, 2.0):
            self.admit(None, cost)
        if self.held:
            self.done(pick)

    @rule(costlier_first=st.booleans())
    def successor_beside_a_costlier_one(self, costlier_first: bool) -> None:
        """A key's parked successor and a costlier unkeyed message both wait when the key's worker
        frees: under cost_aware the freed worker takes the costlier one (the successor moves into
        the window, it is not handed over past it). The state mutmut found unchecked."""
        self.admit("a", 0.0)
        for _ in range(self.s.workers - 1):
            self.admit(None, 0.0)
        for key, cost in ((None, 5.0), ("a", 1.0)) if costlier_first else (("a", 1.0), (None, 5.0)):
            self.admit(key, cost)
        holders = [w for w, e in self.held.items() if e.key == "a" and not e.expired]
        if holders:
            self.done(sorted(self.held).index(holders[0]))

    def bufs_of(self, worker: int) -> list[Entry[Any]]:
        assert isinstance(self.s, BufferedScheduler)
        return list(self.s._bufs[worker])  # the model cannot know the random routing: read it

    @precondition(lambda self: any(not e.expired for e in self.held.values()))
    @rule(pick=st.integers(0, 5))
    def expire(self, pick: int) -> None:
        workers = sorted(w for w, e in self.held.items() if not e.expired)
        worker = workers[pick % len(workers)]
        e = self.held[worker]
        if self.pool:
            want = [q for q in self.queued if e.key is not None and q.key == e.key]
        else:
            want = self.bufs_of(worker)
        self.must_follow.update(q.seq for q in want if q.key == e.key and e.key is not None)
        back = self.s.expire(worker, e)
        if back != want:
            self.violations.append(violated("expire_gives_back", f"expire({e}) gave back {back}, expected {want}"))
        for q in back:
            if q in self.queued:
                self.queued.remove(q)

    @rule()
    def take_all(self) -> None:
        got = self.s.take_queued()
        if got != sorted(self.queued, key=lambda q: q.seq):
            self.violations.append(violated("take_all", f"took {got}, queued {self.queued}"))
        self.queued = []

    # --------------------------------------------------------------------------- invariants
    @invariant()
    def no_violation(self) -> None:
        if hasattr(self, "s"):
            assert not self.violations, "; ".join(self.violations)

    def all_hung(self) -> bool:
        return len(self.held) == self.s.workers and all(e.expired for e in self.held.values())

    @invariant()
    def hung_is_no_room(self) -> None:
        """Nothing waits behind a worker still running a message reported TIMEOUT (a buffer), and
        with every worker so held nothing is room (review30 05: held, renewed, never started)."""
        if not hasattr(self, "s"):
            return
        self.no_violation()
        hung = [w for w, e in self.held.items() if e.expired]
        if not self.pool:
            for w in hung:
                assert not self.bufs_of(w), violated("hung_is_no_room", f"{self.bufs_of(w)} behind hung worker {w}")
        if self.all_hung():
            assert self.s.free_slots() == 0, violated("hung_is_no_room", self.s.free_slots())

    @invariant()
    def counts(self) -> None:
        if not hasattr(self, "s"):
            return
        # hypothesis runs invariants in name order: what a step recorded is named before a miscount
        # it caused (counts < no_violation)
        self.no_violation()
        s = self.s
        assert s.busy == len(self.held), violated("counts", f"busy={s.busy}, held={self.held}")
        assert s.queued == len(self.queued), violated("counts", f"queued={s.queued}, model={self.queued}")
        if self.pool:
            idle = s.workers - len(self.held)
            room = 0 if self.all_hung() else idle + max(0, self.window - len(self.queued))
            assert s.free_slots() == room, violated("counts", s.free_slots())
            # parked = queued behind its key's head: a live run of the key, else (cost-aware) the
            # key's oldest message in the window. A mutant that miscounts it kept every other count
            # right, and the parking room's limit reads this number.
            live = self.live_keys()
            keys = {q.key for q in self.queued if q.key is not None}
            behind = sum(sum(1 for q in self.queued if q.key == k) - (0 if k in live else 1) for k in keys)
            assert s.parked == behind, violated("counts", f"parked={s.parked}, model={behind}")


SchedulerModel.TestCase.settings = settings(
    max_examples=4000 if LONG else 400, stateful_step_count=30, deadline=None,
)  # fmt: skip
test_scheduler_model = SchedulerModel.TestCase
