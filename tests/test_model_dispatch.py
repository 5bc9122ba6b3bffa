"""Model-based tests of both dispatcher engines on their own (hypothesis ``RuleBasedStateMachine``).

Random schedules of submits (unkeyed, keyed, a raising key, odd costs; non-blocking and blocking),
handler successes, failures, interrupts, timeouts on a manual clock and hangs (every handler
blocks on an event the test sets), close with and without drain and, for asyncio, cancellation
of worker tasks (mid-handler and idle). The promise, as named invariants checked after every step
(a failure says ``invariant <name>: ...``):

* ``failure_never_success`` — a handler that raised or ran past its deadline is never SUCCESS;
* ``one_copy_at_once`` — no message starts twice, none gets two outcomes;
* ``key_order`` — a keyed message starts only after every earlier-accepted message of its key has
  its outcome (so one key's messages start in arrival order and never overlap; a message given
  back — TIMEOUT — releases its key, its parked successors are given back with it, SKIPPED);
* ``skipped_never_ran`` — a SKIPPED message never started;
* ``no_start_after_close`` — after ``close`` returned, no handler starts;
* ``deadline_kept`` — a handler past its deadline is reported TIMEOUT by the watchdog check;
* ``successors_follow`` — what waited behind a message reported TIMEOUT is given back SKIPPED;
* ``per_key_order`` (a dispatcher built with ``successors_follow=True``, drawn) — a keyed message
  accepted before an earlier one of its key ended without success (FAILURE, NOT_STARTED,
  TIMEOUT) never starts: it is given back SKIPPED with that one;
* ``engine_alive`` — every worker thread lives until close;
* ``stats_add_up`` — the snapshot adds up and agrees with what ``on_done`` saw;
* ``blame_forgets_what_left`` — live blame waits only for messages the engine holds unstarted
  (queued, handed to a worker, or a blocked submitter's): a refused ``submit(timeout=0)``, a
  message given back or rejected leaves nothing in it (else memory grows with every retry);
* ``close_drains_or_gives_back`` — when ``close`` returns True every accepted message has its
  outcome; when False, every one without an outcome is running.
* ``phase_moves_forward`` — ``statistics().phase`` never moves back (a second ``close`` leaves it
  where the first took it: a timed-out close's ABANDONED stays), is OPEN until ``close`` and at
  least STOPPING once ``close`` returned.

``close(timeout=)`` while handlers hang (blocked on their events until ``close`` has returned):

* ``close_keeps_its_deadline`` — it returns before any handler it cannot stop returns (it never
  waits for one past its deadline). The deadline is on the injected clock, which stands still
  during ``close``: the engines turn what is left of it into the seconds they wait, so
  ``timeout=0.01`` costs a few hundredths of a second, never the hung handler's time;
* ``timed_out_close_says_so`` — it returns False exactly when a handler without an outcome is
  still running (overrun handlers, reported TIMEOUT already, are not waited for), and
  ``running()`` lists those handlers;
* ``late_outcome_as_done`` — a hung handler that returns after ``close`` gave up is reported once,
  as what it did (SUCCESS, FAILURE, or TIMEOUT by the clock), never as a message given back;
  an overrun one gets no second outcome; a second ``close`` then returns True.

Costliest-first is checked on the pure scheduler (``tests/test_model_scheduler.py``), where the
window's contents are exact. Default 350 examples (200 thread, 150 asyncio; ``RMQTRACE_LONG=1``: ten times more).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tracer.dispatch import (
    Aggressive,
    AsyncDispatcher,
    CostAware,
    Dispatcher,
    DispatcherClosed,
    DispatchPhase,
    HandlerTimeout,
    NotStarted,
    Random,
    RoundRobin,
)
from tracer.path.clock import ManualClock
from tracer.path.stages import Outcome, Stage

LONG = os.environ.get("RMQTRACE_LONG") == "1"
WAIT = 10.0
GRACE = 3.0  # real seconds a close(timeout=0.01) may take before it counts as waiting for a hung handler
CLOSE_TIMEOUTS = st.sampled_from([0.0, 0.01])
TIMEOUT_S = 5.0
TIMEOUT_NS = int(TIMEOUT_S * 1e9)

POLICIES = st.sampled_from(
    [Aggressive(max_parked=1), Aggressive(max_parked=3), CostAware(window=2), RoundRobin(buffer=1), Random(buffer=1, seed=3)]
)
KINDS = ["plain", "plain", "k1", "k1", "k2", "raise_key", "int_key", "nan_cost", "neg_cost", "str_cost",
         "raise_cost", "big_cost"]  # fmt: skip
BAD_COSTS = {"nan_cost", "neg_cost", "str_cost", "raise_cost"}
ACTIONS = ["success", "success", "fail", "interrupt", "refuse"]  # refuse: raises NotStarted


class Item:
    """One message. Its handler blocks until the test sets ``gate`` (threads) or ``agate`` (asyncio)."""

    def __init__(self, n: int, kind: str) -> None:
        self.n = n
        self.kind = kind
        self.key = kind if kind in ("k1", "k2") else None
        self.cost: object = {"nan_cost": float("nan"), "neg_cost": -1.0, "str_cost": "3", "big_cost": 1e9}.get(kind, 1.0)
        self.gate = threading.Event()
        self.agate: asyncio.Event | None = None
        self.action = "success"
        self.started_ns: int | None = None
        self.starts = 0
        self.released = False
        self.returned = False
        self.expired = False  # reported TIMEOUT while it still ran
        self.accepted = False
        self.accept_no: int | None = None  # its place in acceptance order (trace.mark, under the engine lock)
        self.end_ns: int | None = None  # clock when its handler returned
        self.task: asyncio.Task[Any] | None = None

    def __repr__(self) -> str:
        return f"Item({self.n}, {self.kind})"


def key_of(it: Item) -> Any:
    if it.kind == "raise_key":
        raise LookupError(f"no key for {it.n}")
    if it.kind == "int_key":
        return it.n
    return it.key


def cost_of(it: Item) -> Any:
    if it.kind == "raise_cost":
        raise ValueError("no cost")
    return it.cost


def violated(name: str, detail: object) -> str:
    return f"invariant {name}: {detail}"


def blame_forgets_what_left(s: Any) -> None:
    """Live blame's waiting messages are ones the engine still holds unstarted (one snapshot)."""
    b = s.blame
    if b is not None:
        held = s.queued + s.in_flight + s.overrun + s.waiters
        assert b.waiting <= held, violated("blame_forgets_what_left", f"{b.waiting} waiting > {held} held: {s}")


class ItemTrace:
    """The trace the engines stamp: ``mark(DISPATCH_ENQUEUE)`` gives the true acceptance order."""

    def __init__(self, h: Harness, it: Item) -> None:
        self.h = h
        self.it = it

    def mark(self, stage: Stage) -> None:
        if stage is Stage.DISPATCH_ENQUEUE:
            self.h.accepted(self.it)

    def handler_scope(self) -> Any:
        return contextlib.nullcontext()

    def finish(self, outcome: Outcome, error: BaseException | None) -> None:
        pass


class Harness:
    """What the handlers and on_done saw; ``cond`` is notified on every change."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.cond = threading.Condition()
        self.violations: list[str] = []
        self.running: set[Item] = set()
        self.outcomes: dict[Item, tuple[Outcome, BaseException | None]] = {}
        self.auto_release = False
        self.bg_alive = 0  # blocked submitters not returned yet
        self.blocked: set[Item] = set()  # their items
        self.order: list[Item] = []  # accepted items, in acceptance order
        self.closed_returned = False  # close() has returned
        self.no_more_starts = False  # close(drain=False) began after quiescence: nothing may start
        self.follow = False  # the engine was built with successors_follow=True
        self.failed_at: dict[Item, int] = {}  # keyed item that did not succeed -> items accepted by then

    def accepted(self, it: Item) -> None:
        with self.cond:
            it.accept_no = len(self.order)
            self.order.append(it)

    def started(self, it: Item) -> None:
        with self.cond:
            it.starts += 1
            if it.starts > 1:
                self.violations.append(violated("one_copy_at_once", f"{it} started twice"))
            if self.closed_returned or self.no_more_starts:
                self.violations.append(violated("no_start_after_close", f"{it} started after close returned "
                                                "or during close(drain=False)"))  # fmt: skip
            if it.key is not None and it.accept_no is not None:
                for other in self.order[: it.accept_no]:
                    if other.key == it.key and other not in self.outcomes:
                        self.violations.append(violated(
                            "key_order", f"{it} started while {other}, earlier of key {it.key}, has no outcome"))  # fmt: skip
                    failed = self.failed_at.get(other)
                    if self.follow and other.key == it.key and failed is not None and failed > it.accept_no:
                        self.violations.append(violated(
                            "per_key_order", f"{it} started after {other}, earlier of key {it.key}, did not succeed"))
            it.started_ns = self.clock.now_ns()
            self.running.add(it)

    def returned(self, it: Item) -> None:
        with self.cond:
            self.running.discard(it)
            it.end_ns = self.clock.now_ns()
            it.returned = True

    def on_done(self, it: Item, outcome: Outcome, error: BaseException | None) -> None:
        with self.cond:
            if it in self.outcomes:
                self.violations.append(violated("one_copy_at_once", f"{it} got a second outcome {outcome}"))
            if outcome is Outcome.SUCCESS:
                bad = not it.returned or it.action != "success" or it.started_ns is None or (
                    it.end_ns is not None and it.end_ns - it.started_ns > self.timeout_ns)  # fmt: skip
                if bad:
                    self.violations.append(violated("failure_never_success", f"{it} ({it.action}) reported SUCCESS"))
            if outcome is Outcome.SKIPPED and it.starts:
                self.violations.append(violated("skipped_never_ran", f"{it} reported SKIPPED but it started"))
            if it.key is not None and outcome in (Outcome.FAILURE, Outcome.NOT_STARTED, Outcome.TIMEOUT):
                self.failed_at[it] = len(self.order)
            self.outcomes[it] = (outcome, error)
            self.cond.notify_all()

    timeout_ns = TIMEOUT_NS

    def counts(self) -> Counter[Outcome]:
        return Counter(o for o, _ in self.outcomes.values())


def expected(it: Item, now_ns: int) -> Outcome:
    assert it.started_ns is not None
    if it.action == "refuse":
        return Outcome.NOT_STARTED  # a refusal is never a failure nor a timeout
    if now_ns - it.started_ns > TIMEOUT_NS:
        return Outcome.TIMEOUT
    return Outcome.SUCCESS if it.action == "success" else Outcome.FAILURE


def _ran(action: str) -> str:
    """A hung handler has started: it cannot refuse to start any more (the loop refuses at the
    start, before the user's handler runs), so a late refusal is modelled as a failure."""
    return "fail" if action == "refuse" else action


def raise_for(it: Item) -> None:
    if it.action == "fail":
        raise ValueError(f"handler of {it} failed")
    if it.action == "interrupt":
        raise KeyboardInterrupt
    if it.action == "refuse":
        raise NotStarted(f"{it} refused to start")


class _Model(RuleBasedStateMachine):
    """What both engine machines share: the item bookkeeping and the invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.h = Harness(self.clock)
        self.items: list[Item] = []
        self.closed = False
        self.workers = 0
        self.cost_errors = 0
        self.steps = 0
        self.max_waiters = 0
        self.phase = DispatchPhase.OPEN  # the furthest statistics().phase seen

    def close_allowed(self) -> bool:
        """close ends an example: only after a dozen steps, so most schedules get long."""
        return not self.closed and self.steps >= 15

    def coverage(self) -> None:
        for o in self.h.counts():
            event(f"outcome {o.value}")
        if self.max_waiters:
            event("a submitter blocked")
        event(f"steps {min(self.steps // 10 * 10, 30)}+")

    def new_item(self, kind: str) -> Item:
        it = Item(len(self.items), kind)
        self.items.append(it)
        if kind in BAD_COSTS:
            self.cost_errors += 1
        return it

    def delivered(self, s: Any) -> bool:
        """Every outcome the engine counted has reached on_done (none is being reported now)."""
        h = self.h
        with h.cond:
            pending = [it for it in h.order if it not in h.outcomes]
        unstarted = sum(1 for it in pending if it.starts == 0)
        return bool(unstarted == s.queued and len(pending) - unstarted == s.in_flight)

    def running_unreleased(self) -> list[Item]:
        return sorted((it for it in self.h.running if not it.released), key=lambda it: it.n)

    @precondition(lambda self: hasattr(self, "d") and not self.closed)
    @rule(action=st.sampled_from(["fail", "refuse", "interrupt"]))
    def fail_with_successors(self, action: str) -> None:
        """The precondition of ``per_key_order``'s bugs: a keyed message running with more of its
        key parked (or in its worker's buffer) behind it, then it ends without success."""
        for _ in range(3):
            self.submit("k1", False)  # type: ignore[attr-defined]  # each engine's rule
        heads = [i for i, it in enumerate(self.running_unreleased()) if it.key == "k1" and not it.expired]
        if heads:
            self.release(heads[0], action)  # type: ignore[attr-defined]

    def stats(self) -> Any:
        raise NotImplementedError

    def free_slots(self) -> int:
        raise NotImplementedError

    def check(self) -> None:
        h = self.h
        with h.cond:
            assert not h.violations, "; ".join(h.violations)
        s = self.stats()
        self.check_phase(s)
        inv = "stats_add_up"
        assert s.submitted == (s.handled + s.failed + s.timed_out + s.skipped + s.not_started + s.in_flight
                               + s.queued), violated(inv, s)
        c = h.counts()
        assert (s.handled, s.failed, s.timed_out, s.skipped, s.not_started) == (
            c[Outcome.SUCCESS], c[Outcome.FAILURE], c[Outcome.TIMEOUT], c[Outcome.SKIPPED], c[Outcome.NOT_STARTED]
        ), violated(inv, (s, c))  # fmt: skip
        assert s.submitted == sum(it.accepted for it in self.items), violated(inv, s)
        assert all(it.accepted for it in h.outcomes), violated(inv, "an outcome for a message never accepted")
        assert s.waiters == h.bg_alive, violated(inv, (s, h.bg_alive))
        if any(it.key is None for it in h.blocked):
            assert self.free_slots() == 0, violated("no_idle_refusal", "an unkeyed submitter is blocked while there is room")
        self.steps += 1
        self.max_waiters = max(self.max_waiters, s.waiters)
        assert s.cost_errors == self.cost_errors, violated(inv, s)
        for o, e in h.outcomes.values():
            if o is Outcome.TIMEOUT:
                assert isinstance(e, HandlerTimeout), violated("failure_never_success", e)

    def check_phase(self, s: Any, closed: bool = False) -> None:
        inv = "phase_moves_forward"
        assert s.phase >= self.phase, violated(inv, f"{s.phase!r} after {self.phase!r}")
        self.phase = s.phase
        if closed:
            assert s.phase >= DispatchPhase.STOPPING, violated(inv, f"{s.phase!r} once close returned")
        elif not self.closed:
            assert s.phase is DispatchPhase.OPEN, violated(inv, f"{s.phase!r} before close")

    def check_closed(self, settled: bool) -> None:
        h = self.h
        inv = "close_drains_or_gives_back"
        # The snapshot first: an outcome it counts was delivered to on_done before it was counted,
        # so a second outcome (a hung handler's, returning after close) is named as what it is.
        s = self.stats()
        self.check_phase(s, closed=True)
        with h.cond:
            assert not h.violations, "; ".join(h.violations)
        running = set(h.running)
        for it in self.items:
            if it.accepted and it not in h.outcomes:
                assert not settled and it in running, violated(inv, f"{it} accepted, no outcome, not running")
            if not it.accepted:
                assert it not in h.outcomes, violated(inv, f"{it} not accepted but has an outcome")
        if settled:
            assert s.in_flight == s.queued == s.waiters == 0, violated(inv, s)
        assert s.queued == s.waiters == 0, violated(inv, s)

    def check_timed_close(self, hung: list[Item], settled: bool, returned_first: list[Item], running: list[Item]) -> None:
        """What ``close(timeout=)`` promises when it returns while the ``hung`` handlers are still blocked."""
        assert not returned_first, violated("close_keeps_its_deadline", f"close returned only after {returned_first} "
                                            "returned: it waited for a hung handler past its deadline")  # fmt: skip
        in_flight = sorted((it for it in hung if not it.expired), key=lambda it: it.n)
        inv = "timed_out_close_says_so"
        assert settled is not bool(in_flight), violated(inv, f"close returned {settled} with {in_flight} in flight")
        assert sorted(running, key=lambda it: it.n) == in_flight, violated(inv, f"running() {running}, hung {in_flight}")
        self.check_closed(settled)

    def check_late_outcomes(self, wants: dict[Item, Outcome], settled: bool) -> None:
        """The hung handlers have returned after ``close`` gave up and a second ``close`` returned
        ``settled``: each has the outcome it earned."""
        h = self.h
        inv = "late_outcome_as_done"
        with h.cond:
            assert not h.violations, "; ".join(h.violations)
            for it, want in wants.items():
                got = h.outcomes.get(it, (None, None))[0]
                assert got is want, violated(inv, f"{it} ({it.action}) returned late: {got}, want {want}")
        assert settled, violated(inv, f"a second close returned False: {self.stats()}")
        self.check_closed(settled)


# ----------------------------------------------------------------------------- thread engine
class ThreadEngineModel(_Model):
    @initialize(policy=POLICIES, workers=st.integers(1, 3), follow=st.booleans())
    def start(self, policy: Any, workers: int, follow: bool) -> None:
        self.workers = workers
        self.h.follow = follow
        self.d: Dispatcher[Item] = Dispatcher(
            self.handler, policy=policy, workers=workers, key=key_of, cost=cost_of, on_done=self.h.on_done,
            handler_timeout=TIMEOUT_S, clock=self.clock, name="model", successors_follow=follow,
        )  # fmt: skip
        self.bg: list[threading.Thread] = []

    def handler(self, it: Item) -> None:
        h = self.h
        with h.cond:
            h.started(it)
            h.cond.notify_all()
            auto = h.auto_release
        if not auto:
            assert it.gate.wait(WAIT), f"{it} never released"
        with h.cond:
            h.returned(it)
            h.cond.notify_all()
        raise_for(it)

    def stats(self) -> Any:
        return self.d.statistics()

    def free_slots(self) -> int:
        return self.d.free_slots()

    def await_(self, pred: Any, what: str) -> None:
        h = self.h
        deadline = time.monotonic() + WAIT
        with h.cond:
            while not pred():
                assert not h.violations, "; ".join(h.violations)
                s = self.d.statistics()
                assert self.closed or s.live_workers == self.workers, violated("engine_alive", s)
                assert time.monotonic() < deadline, f"stuck waiting for {what}: {s}"
                h.cond.wait(0.002)  # real-time: re-check for the worker's last step, which signals nothing

    def quiet(self) -> bool:
        s = self.d.statistics()
        h = self.h
        if len(h.running) != s.in_flight + s.overrun or s.waiters != h.bg_alive or not self.delivered(s):
            return False
        return all(it.returned and (it.expired or it in h.outcomes) for it in self.items if it.released)

    def quiesce(self) -> None:
        self.await_(self.quiet, "quiescence")

    def blocked_submit(self, it: Item) -> None:
        try:
            ok = self.d.submit(it, ItemTrace(self.h, it))
        except DispatcherClosed:
            ok = False
        with self.h.cond:
            it.accepted = ok
            self.h.bg_alive -= 1
            self.h.blocked.discard(it)
            self.h.cond.notify_all()

    @precondition(lambda self: not self.closed)
    @rule(kind=st.sampled_from(KINDS), block=st.booleans())
    def submit(self, kind: str, block: bool) -> None:
        it = self.new_item(kind)
        if self.d.submit(it, ItemTrace(self.h, it), timeout=0):
            it.accepted = True
            if kind in ("raise_key", "int_key"):
                # reported before submit returned; it never ran, so never a failure (#30 review 06)
                assert self.h.outcomes[it][0] is Outcome.NOT_STARTED
        elif block:
            if kind in BAD_COSTS:
                self.cost_errors += 1  # evaluated again by the blocking submit
            with self.h.cond:
                self.h.bg_alive += 1
                self.h.blocked.add(it)
            t = threading.Thread(target=self.blocked_submit, args=(it,))
            self.bg.append(t)
            t.start()
        self.quiesce()

    @precondition(lambda self: not self.closed and bool(self.running_unreleased()))
    @rule(pick=st.integers(0, 10), action=st.sampled_from(ACTIONS))
    def release(self, pick: int, action: str) -> None:
        items = self.running_unreleased()
        it = items[pick % len(items)]
        it.action = action
        want = None if it.expired else expected(it, self.clock.now_ns())
        it.released = True
        it.gate.set()
        self.quiesce()
        if want is not None:
            got = self.h.outcomes[it][0]
            assert got is want, violated("failure_never_success" if got is Outcome.SUCCESS else "not_started_never_failure"
                                         if want is Outcome.NOT_STARTED else "outcome_as_done",
                                         (it, got, want))  # fmt: skip

    @precondition(lambda self: not self.closed)
    @rule(seconds=st.sampled_from([1.0, 2.5, 6.0]))
    def advance(self, seconds: float) -> None:
        h = self.h
        now = self.clock.advance_s(seconds)
        due = [it for it in self.running_unreleased() if not it.expired and expected(it, now) is Outcome.TIMEOUT]
        with h.cond:  # what waits behind each: it must follow its message when that is given back
            behind = {it: [p for p in h.order if it.key is not None and p.key == it.key
                           and p not in h.outcomes and p.starts == 0] for it in due}  # fmt: skip
        self.d.check_timeouts()  # reports before it returns (the watchdog may have taken some itself)
        self.quiesce()
        for it in due:
            got = h.outcomes.get(it, (None, None))[0]
            assert got is Outcome.TIMEOUT, violated("deadline_kept", f"{it} past its deadline, outcome {got}")
            it.expired = True
            for p in behind[it]:
                pg = h.outcomes.get(p, (None, None))[0]
                assert pg is Outcome.SKIPPED, violated("successors_follow", f"{p} behind {it} (TIMEOUT) got {pg}")
        s = self.d.statistics()
        assert s.overrun == sum(it.expired and not it.returned for it in self.items), violated("stats_add_up", s)
        assert len(self.d.overrun()) == s.overrun, violated("stats_add_up", s)

    @precondition(lambda self: not self.closed)
    @rule()
    def hang_with_successors(self) -> None:
        """The precondition of the give-back bugs random search reaches only sometimes: a keyed
        message running with more of its key parked (or in its worker's buffer) behind it, then
        its deadline passes while it still runs."""
        for _ in range(3):
            self.submit("k1", False)
        self.advance(6.0)

    @precondition(lambda self: self.close_allowed())
    @rule(drain=st.booleans())
    def close(self, drain: bool) -> None:
        self.check_closed(self.shut(drain))

    @precondition(lambda self: self.close_allowed() and bool(self.running_unreleased()))
    @rule(drain=st.booleans(), timeout=CLOSE_TIMEOUTS, actions=st.lists(st.sampled_from(ACTIONS), min_size=3,
          max_size=3), late=st.sampled_from([0.0, 6.0]), fresh=st.booleans())  # fmt: skip
    def close_timeout_while_hung(self, drain: bool, timeout: float, actions: list[str], late: float, fresh: bool) -> None:
        """close(timeout=) while handlers hang; they are released only after it returned. ``fresh``: the
        overrun handlers return first and two messages of one key follow, so that a handler without
        an outcome is among the hung ones, often with its successor queued."""
        h = self.h
        if fresh:
            while overrun := [i for i, it in enumerate(self.running_unreleased()) if it.expired]:
                self.release(overrun[0], "success")
            self.submit("k1", False)
            self.submit("k1", False)
        hung = self.running_unreleased()
        result: list[tuple[bool, list[Item], list[Item]]] = []

        def close() -> None:
            settled = self.d.close(drain=drain, timeout=timeout)
            running = [item for item, _ in self.d.running()]
            with h.cond:
                h.closed_returned = True
                result.append((settled, [it for it in hung if it.returned], running))

        wants: dict[Item, Outcome] = {}

        def let_go() -> None:  # the hung handlers return now, each with its action, ``late`` s later
            if wants:
                return
            with h.cond:
                h.auto_release = True
                for it in hung:
                    it.action = _ran(actions[it.n % len(actions)])
            now = self.clock.advance_s(late)
            wants.update((it, Outcome.TIMEOUT if it.expired else expected(it, now)) for it in hung)
            for it in self.items:
                it.released = True
                it.gate.set()

        h.no_more_starts = True  # every slot that could start a message is held by a hung handler
        closer = threading.Thread(target=close)
        closer.start()
        closer.join(GRACE)  # real-time: the bound is only how long a wrong close is given
        if closer.is_alive():  # it waits for a hung handler: let them go, it returns after them
            let_go()
            closer.join(WAIT)
            assert not closer.is_alive(), violated("close_keeps_its_deadline", "close did not return")
        for t in self.bg:
            t.join(WAIT)
        self.closed = True
        self.check_timed_close(hung, *result[0])  # as close left it: the hung handlers still blocked
        let_go()
        # the threads end only after their last report; the watchdog's (late=6) is waited for by close
        self.await_(lambda: all(it.returned for it in hung) and self.d.statistics().live_workers == 0,
                    "the hung handlers to return")  # fmt: skip
        self.check_late_outcomes(wants, self.d.close(timeout=GRACE))
        event(f"close(timeout) with {sum(not it.expired for it in hung)} in flight")

    @precondition(lambda self: self.closed)
    @rule()
    def submit_after_close(self) -> None:
        try:
            self.d.submit(Item(-1, "plain"), timeout=0)
        except DispatcherClosed:
            return
        raise AssertionError("submit after close did not raise")

    def shut(self, drain: bool) -> bool:
        result: list[bool] = []

        def close() -> None:
            result.append(self.d.close(drain=drain))
            with self.h.cond:
                self.h.closed_returned = True

        self.h.no_more_starts = not drain
        closer = threading.Thread(target=close)
        closer.start()
        with self.h.cond:
            self.h.auto_release = True
            for it in self.items:
                it.gate.set()
        deadline = time.monotonic() + WAIT
        while closer.is_alive() and not self.h.violations and time.monotonic() < deadline:
            closer.join(0.01)  # real-time: a violation seen while closing ends the example at once
        with self.h.cond:
            assert not self.h.violations, "; ".join(self.h.violations)
        assert not closer.is_alive(), violated("close_drains_or_gives_back", "close did not return")
        for t in self.bg:
            t.join(WAIT)
        self.closed = True
        self.await_(lambda: self.d.statistics().live_workers == 0, "workers to exit")
        return result[0]

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "d"):
            return
        self.check()
        s = self.d.statistics()
        blame_forgets_what_left(s)
        if not self.closed:
            assert s.live_workers == self.workers, violated("engine_alive", s)

    def teardown(self) -> None:
        if hasattr(self, "d") and not self.closed:
            if self.h.violations or self.d.statistics().live_workers < self.workers:  # failed already: end it
                # without waiting on a broken engine
                for it in self.items:
                    it.gate.set()
                self.d.close(timeout=0.1)
                return
            self.check_closed(self.shut(True))
        self.coverage()


ThreadEngineModel.TestCase.settings = settings(
    max_examples=2000 if LONG else 200, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
test_thread_engine_model = ThreadEngineModel.TestCase


# ---------------------------------------------------------------------------- asyncio engine
class AsyncEngineModel(_Model):
    """The loop runs only inside a rule, so every step is deterministic between rules."""

    @initialize(policy=POLICIES, workers=st.integers(1, 3), follow=st.booleans())
    def start(self, policy: Any, workers: int, follow: bool) -> None:
        self.workers = workers
        self.h.follow = follow
        self.loop = asyncio.new_event_loop()
        # A timeout that never fires in test time: timeouts come from the manual clock alone.
        self.d: AsyncDispatcher[Item] = AsyncDispatcher(
            self.handler, policy=policy, workers=workers, key=key_of, cost=cost_of, on_done=self.h.on_done,
            handler_timeout=TIMEOUT_S * 1000, clock=self.clock, name="model", successors_follow=follow,
        )  # fmt: skip
        self.bg: list[asyncio.Task[None]] = []
        self.tasks: dict[asyncio.Task[Any], int] = {}  # worker tasks seen running a handler, numbered
        self.expected_timeout_ns = TIMEOUT_NS * 1000
        self.h.timeout_ns = TIMEOUT_NS * 1000

    async def handler(self, it: Item) -> None:
        h = self.h
        h.started(it)
        task = asyncio.current_task()
        assert task is not None
        it.task = task
        self.tasks.setdefault(task, len(self.tasks))
        try:
            if not h.auto_release:
                assert it.agate is not None
                await it.agate.wait()
        finally:
            h.returned(it)
        raise_for(it)

    def stats(self) -> Any:
        return self.d.statistics()

    def free_slots(self) -> int:
        return self.d.free_slots()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def quiesce(self) -> None:
        for _ in range(20000):
            assert not self.h.violations, self.h.violations
            if self.quiet():
                return
            await asyncio.sleep(0)  # real-time: zero-length, only lets the loop run its ready tasks
        raise AssertionError(f"stuck: {self.d.statistics()}")

    def quiet(self) -> bool:
        s = self.d.statistics()
        h = self.h
        if len(h.running) != s.in_flight or s.waiters != h.bg_alive or not self.delivered(s):
            return False
        return all(it.returned and it in h.outcomes for it in self.items if it.released)

    async def blocked_submit(self, it: Item) -> None:
        try:
            ok = await self.d.submit(it, ItemTrace(self.h, it))
        except DispatcherClosed:
            ok = False
        it.accepted = ok
        self.h.bg_alive -= 1
        self.h.blocked.discard(it)

    def item(self, kind: str) -> Item:
        it = self.new_item(kind)
        it.agate = asyncio.Event()
        return it

    @precondition(lambda self: not self.closed)
    @rule(kind=st.sampled_from(KINDS), block=st.booleans())
    def submit(self, kind: str, block: bool) -> None:
        async def go() -> None:
            it = self.item(kind)
            if await self.d.submit(it, ItemTrace(self.h, it), timeout=0):
                it.accepted = True
                if kind in ("raise_key", "int_key"):
                    assert self.h.outcomes[it][0] is Outcome.NOT_STARTED
            elif block:
                if kind in BAD_COSTS:
                    self.cost_errors += 1
                self.h.bg_alive += 1
                self.h.blocked.add(it)
                self.bg.append(asyncio.ensure_future(self.blocked_submit(it)))
            await self.quiesce()

        self.run(go())

    def expected(self, it: Item) -> Outcome:
        assert it.started_ns is not None
        if it.action == "refuse":
            return Outcome.NOT_STARTED
        if self.clock.now_ns() - it.started_ns > TIMEOUT_NS * 1000:
            return Outcome.TIMEOUT
        return Outcome.SUCCESS if it.action == "success" else Outcome.FAILURE

    @precondition(lambda self: not self.closed and bool(self.running_unreleased()))
    @rule(pick=st.integers(0, 10), action=st.sampled_from(ACTIONS))
    def release(self, pick: int, action: str) -> None:
        items = self.running_unreleased()
        it = items[pick % len(items)]
        it.action = action
        want = self.expected(it)
        it.released = True
        assert it.agate is not None
        it.agate.set()
        self.run(self.quiesce())
        got = self.h.outcomes[it][0]
        assert got is want, violated("failure_never_success" if got is Outcome.SUCCESS else "not_started_never_failure"
                                         if want is Outcome.NOT_STARTED else "outcome_as_done",
                                     (it, got, want))  # fmt: skip

    @precondition(lambda self: not self.closed)
    @rule(seconds=st.sampled_from([1000.0, 2500.0, 6000.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance_s(seconds)  # running handlers past the timeout are TIMEOUT when they return

    @precondition(lambda self: not self.closed and bool(self.running_unreleased()))
    @rule(pick=st.integers(0, 10))
    def cancel_running_worker(self, pick: int) -> None:
        items = self.running_unreleased()
        it = items[pick % len(items)]
        assert it.task is not None
        it.task.cancel()
        it.released = True  # it ends now, by cancellation

        async def go() -> None:
            await self.quiesce()

        self.run(go())
        o, e = self.h.outcomes[it]
        assert o is Outcome.FAILURE and isinstance(e, asyncio.CancelledError), (o, e)
        assert it.task.done()
        event("worker cancelled mid-handler")

    def idle_tasks(self) -> list[asyncio.Task[Any]]:
        busy = {it.task for it in self.h.running}
        # In the order first seen: replays of one example must pick the same task.
        return sorted((t for t in self.tasks if not t.done() and t not in busy), key=self.tasks.__getitem__)

    @precondition(lambda self: not self.closed and bool(self.idle_tasks()))
    @rule(pick=st.integers(0, 10))
    def cancel_idle_worker(self, pick: int) -> None:
        tasks = self.idle_tasks()
        task = tasks[pick % len(tasks)]
        task.cancel()

        async def go() -> None:
            for _ in range(100):
                if task.done():
                    break
                await asyncio.sleep(0)  # real-time: zero-length, lets the cancelled task end
            assert task.done()
            await self.quiesce()
            event("worker cancelled while idle")

        self.run(go())

    @precondition(lambda self: self.close_allowed())
    @rule(drain=st.booleans())
    def close(self, drain: bool) -> None:
        self.check_closed(self.shut(drain))

    @precondition(lambda self: self.close_allowed() and bool(self.running_unreleased()))
    @rule(drain=st.booleans(), timeout=CLOSE_TIMEOUTS, actions=st.lists(st.sampled_from(ACTIONS), min_size=3,
          max_size=3), late=st.sampled_from([0.0, 6000.0]), fresh=st.booleans())  # fmt: skip
    def close_timeout_while_hung(self, drain: bool, timeout: float, actions: list[str], late: float, fresh: bool) -> None:
        """As the thread engine's: close(timeout=) while handlers hang, released after it returned."""
        h = self.h
        if fresh:
            self.submit("k1", False)
            self.submit("k1", False)
        hung = self.running_unreleased()

        async def close() -> tuple[bool, list[Item], list[Item]]:
            settled = await self.d.close(drain=drain, timeout=timeout)
            h.closed_returned = True
            return settled, [it for it in hung if it.returned], [item for item, _ in self.d.running()]

        wants: dict[Item, Outcome] = {}

        def let_go() -> None:  # the hung handlers return when the loop runs next, ``late`` s later
            if wants:
                return
            h.auto_release = True
            for it in hung:
                it.action = _ran(actions[it.n % len(actions)])
            self.clock.advance_s(late)
            wants.update((it, self.expected(it)) for it in hung)
            for it in self.items:
                it.released = True
                if it.agate is not None:
                    it.agate.set()

        async def go() -> tuple[bool, list[Item], list[Item]]:
            h.no_more_starts = True  # every worker that could start a message is held by a hung handler
            closing = asyncio.ensure_future(close())
            done, _ = await asyncio.wait({closing}, timeout=GRACE)  # real-time: how long a wrong close is given
            if not done:  # it waits for a hung handler: let them go, it returns after them
                let_go()
                done, _ = await asyncio.wait({closing}, timeout=WAIT)
                assert done, violated("close_keeps_its_deadline", "close did not return")
            if self.bg:
                await asyncio.wait(self.bg, timeout=WAIT)
            return closing.result()

        result = self.run(go())
        self.closed = True
        self.check_timed_close(hung, *result)  # as close left it: the hung handlers still blocked
        let_go()

        async def settle() -> None:
            for _ in range(20000):
                assert not h.violations, h.violations
                s = self.d.statistics()
                if all(it.returned for it in hung) and s.live_workers == 0:
                    return
                await asyncio.sleep(0)  # real-time: zero-length, lets the released handlers return
            raise AssertionError(f"stuck: {self.d.statistics()}")

        self.run(settle())
        self.check_late_outcomes(wants, self.run(self.d.close(timeout=GRACE)))
        event(f"close(timeout) with {len(hung)} in flight")

    @precondition(lambda self: self.closed)
    @rule()
    def submit_after_close(self) -> None:
        async def go() -> None:
            try:
                await self.d.submit(Item(-1, "plain"), timeout=0)
            except DispatcherClosed:
                return
            raise AssertionError("submit after close did not raise")

        self.run(go())

    def shut(self, drain: bool) -> bool:
        async def go() -> bool:
            self.h.no_more_starts = not drain
            closing = asyncio.ensure_future(self.d.close(drain=drain))
            await asyncio.sleep(0)  # real-time: zero-length, lets close begin before the releases
            self.h.auto_release = True
            for it in self.items:
                if it.agate is not None:
                    it.agate.set()
            settled = await asyncio.wait_for(closing, WAIT)
            self.h.closed_returned = True
            if self.bg:
                await asyncio.wait(self.bg, timeout=WAIT)
            return bool(settled)

        settled = self.run(go())
        self.closed = True
        assert self.d.statistics().live_workers == 0
        return bool(settled)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "d"):
            return
        self.check()
        s = self.d.statistics()
        blame_forgets_what_left(s)
        if not self.closed:
            assert s.live_workers >= s.in_flight  # every held message has a live task to run it

    def teardown(self) -> None:
        if not hasattr(self, "d"):
            return
        try:
            if not self.closed and self.h.violations:  # already failed: do not wait on a broken engine
                return
            if not self.closed:
                self.check_closed(self.shut(True))
            self.coverage()
        finally:
            self.loop.close()


AsyncEngineModel.TestCase.settings = settings(
    max_examples=1500 if LONG else 150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
test_async_engine_model = AsyncEngineModel.TestCase
