"""A fault-injecting 5.x-client double over the embedded broker, for the fault-class harness.

Every fault is planned for the next call of one operation (``receive``, ``ack``, ``nack`` — a
``change_invisible_duration`` that is not the lease keeper's — and ``renew``) and fires once:

* ``stall`` ``before`` / ``during`` / ``after`` the broker acts: a jump of the injected clock (the
  loop's monotonic clock and the broker's, whose pop times the receipt handles carry: the wall
  clock the loop dates a lease on), so a GC pause, a SIGSTOP or a slow answer is deterministic. ``before``: the clock jumps,
  then the broker acts (it sees the late time). ``during``: the broker acts, then the clock jumps
  before the answer returns (a stall while the call is in flight, or a slow answer). ``after``:
  the call returns, and the clock jumps as soon as the loop's step that made it is over
  (:meth:`FaultyClient.after_step`);
* ``raise``: an :class:`Injected` (an ``Exception``) before or after the broker acted;
* ``base``: a ``BaseException`` (:class:`InjectedBase`) before or after the broker acted;
* ``timeout``: the clock moves by the client's request timeout, then ``TimeoutError``, before or
  after the broker acted (the answer was lost).

The double records what reached the broker: each delivery's lease end *at the broker* (so a
model can say whether a lease was really alive when a handler started), every ack it applied,
every renewal (which delivery, when), and every call on a message after its settle began (a
renewal then revives an acked message on the proxy).

How the clock moves inside a call is the model's (:attr:`FaultyClient.jump`): a stall past every
lease stops the whole process at once; a slow answer or a request timeout holds up only the
calling thread, so the model lets the lease keeper's other passes run meanwhile. Thread-safe:
the loop calls it from its receive, keeper and ack threads at once.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from manual_clock import Clock

__all__ = ["FaultyClient", "Injected", "InjectedBase", "Plan"]

OPS = ("receive", "ack", "nack", "renew")
KINDS = ("stall", "raise", "base", "timeout")


class Injected(ConnectionError):
    """A broker error the harness injected (an ``Exception``)."""


class InjectedBase(BaseException):
    """A ``BaseException`` from inside a broker call (a ``SystemExit`` or a ``KeyboardInterrupt``
    raised by the client's own code, a gevent ``Timeout``): never one of the loop's errors."""


@dataclass(frozen=True)
class Plan:
    kind: str  # stall | raise | base | timeout
    when: str  # before | during | after (stall); before | after (the others)
    seconds: float = 0.0  # the clock jump (stall) or the request timeout (timeout)


class FaultyClient:
    """``receive`` / ``ack`` / ``change_invisible_duration`` of a ``SimpleConsumer``, with faults."""

    def __init__(self, consumer: Any, clock: Clock) -> None:
        self.consumer = consumer
        self.clock = clock
        self.lock = threading.Lock()
        self.plans: dict[str, Plan] = {}
        self.fired: Counter[str] = Counter()  # "op:kind" -> faults fired
        self.errors: Counter[str] = Counter()  # op -> calls that raised an Exception the loop sees
        self.faulted: set[str] = set()  # message ids a fault of any kind hit (excused from a re-run)
        self.dated_late: set[str] = set()  # received by a call that stalled past the lease (see receive)
        # id(message) -> seconds the loop may date its lease early: a receive the clock jumped in
        # before the broker popped (see receive)
        self.dated_early: dict[int, float] = {}
        self.acked: Counter[str] = Counter()  # message id -> acks the broker applied
        self.acked_deliveries: set[int] = set()  # id(message) of each delivery acked
        self.held: dict[int, Any] = {}  # id(message) -> delivery handed out and not settled
        self.lease_end: dict[int, float] = {}  # id(message) -> when the broker hands it out again
        self.settle_began: set[int] = set()  # id(message) whose ack or nack reached this double
        self.renewed_after_settle: list[str] = []
        self.renewals: list[tuple[int, float]] = []  # (id(message), clock) of every renewal the broker applied
        self.refused: list[str] = []  # broker refusals no fault explains: "op message_id"
        self.seen: list[Any] = []  # every delivery, so ids are never reused
        self.pending_after = 0.0  # a stall planned "after": applied by after_step()
        self.calls: Counter[str] = Counter()
        # a gate holds the next call of its op on one delivery (id(message)) in flight until set
        self.ack_gate: tuple[int, threading.Event] | None = None
        self.ack_entered = threading.Event()
        self.renew_gate: tuple[int, threading.Event] | None = None
        self.renew_entered = threading.Event()
        # moves the clock by `seconds` inside a call of `op` (a fault): the model's, see the module
        self.jump: Callable[[str, float], None] = lambda op, seconds: self.clock.advance(seconds)

    # -- planning ---------------------------------------------------------------------------------
    def plan(self, op: str, plan: Plan) -> None:
        with self.lock:
            self.plans[op] = plan

    def clear(self) -> None:
        with self.lock:
            self.plans.clear()
            self.pending_after = 0.0

    def after_step(self) -> float:
        """Apply a stall planned ``after`` its call: the loop's step that made the call is over."""
        with self.lock:
            jump, self.pending_after = self.pending_after, 0.0
        if jump:
            self.clock.advance(jump)
        return jump

    def _take(self, op: str, mid: str | None) -> Plan | None:
        with self.lock:
            p = self.plans.pop(op, None)
            if p is not None:
                self.fired[f"{op}:{p.kind}"] += 1
                if mid is not None:
                    self.faulted.add(mid)
            return p

    def _fire(self, op: str, p: Plan | None, phase: str) -> None:
        """``phase`` "pre" (before the broker acts) or "post" (it acted, the answer is on its way)."""
        if p is None:
            return
        if phase == "pre" and p.when != "before":
            return
        if phase == "post" and p.when == "before":
            return
        if p.kind == "stall":
            if p.when == "after":  # the call returns first
                with self.lock:
                    self.pending_after += p.seconds
            else:
                self.jump(op, p.seconds)
            return
        if p.kind == "raise":
            with self.lock:
                self.errors[op] += 1
            raise Injected(f"injected {op} failure ({p.when})")
        if p.kind == "timeout":  # the client waited its request timeout, then gave up
            self.jump(op, p.seconds)
            with self.lock:
                self.errors[op] += 1
            raise TimeoutError(f"injected {op} timeout ({p.when})")
        if op in ("ack", "nack", "renew"):  # the loop counts these an ack or lease error, then lets them go on
            with self.lock:
                self.errors[op] += 1
        raise InjectedBase(f"injected BaseException in {op} ({p.when})")

    def _broker(self, op: str, m: Any, p: Plan | None, call: Any) -> None:
        """The broker's own answer; a refusal of a message a fault hit (a stall inside this call
        let its handle expire) is the fault's doing, any other is a call the loop should not
        have sent."""
        try:
            call()
        except Exception:
            with self.lock:
                if p is not None or m.message_id in self.faulted:
                    self.errors[op] += 1
                else:
                    self.refused.append(f"{op} {m.message_id}")
            raise

    def _held_in_flight(self, m: Any, gate: threading.Event) -> None:
        """A gated call waits in flight; should the clock move meanwhile (another thread's fault),
        it is a slow call like any other: its lease may end before the broker acts."""
        began = self.clock()
        gate.wait(30)
        if self.clock() != began:
            with self.lock:
                self.faulted.add(m.message_id)

    # -- the client's surface ---------------------------------------------------------------------
    def receive(self, n: int, invisible: int) -> list[Any]:
        p = self._take("receive", None)
        with self.lock:
            self.calls["receive"] += 1
        self._fire("receive", p, "pre")
        got = self.consumer.receive(n, invisible)
        acted = self.clock()
        # a stall inside the call past the lease: until a recent receive came back at once, the loop
        # dates these leases from the call's start (it cannot tell a stall from a broker clock
        # ahead of its own) and lets them go unstarted, to expire at the broker (docs/consume.md)
        dated_late = p is not None and p.kind == "stall" and p.when in ("before", "during") and p.seconds >= invisible
        # a jump before the broker popped looks to the loop like a broker clock that far ahead of its
        # own (BrokerLead keeps only an upper bound): until a receive answered at once tightens it,
        # the loop dates these leases from the call's start, that much earlier than the broker's end
        early = p.seconds if p is not None and p.kind == "stall" and p.when == "before" else 0.0
        with self.lock:
            for m in got:
                if dated_late:
                    self.dated_late.add(m.message_id)
                if early:
                    self.dated_early[id(m)] = early
                self.seen.append(m)
                self.held[id(m)] = m
                self.lease_end[id(m)] = acted + invisible
        try:
            self._fire("receive", p, "post")
        except BaseException:
            with self.lock:  # the answer is lost: never the loop's; back after their lease
                for m in got:
                    self.held.pop(id(m), None)
                    self.faulted.add(m.message_id)
            raise
        return got

    def ack(self, m: Any) -> None:
        with self.lock:
            self.calls["ack"] += 1
            self.settle_began.add(id(m))
            gate = None
            if self.ack_gate is not None and self.ack_gate[0] == id(m):
                gate, self.ack_gate = self.ack_gate[1], None
        if gate is not None:  # an ack in flight: the harness lets the keeper run meanwhile
            self.ack_entered.set()
            self._held_in_flight(m, gate)
        p = self._take("ack", m.message_id)
        self._fire("ack", p, "pre")
        self._broker("ack", m, p, lambda: self.consumer.ack(m))
        with self.lock:
            self.held.pop(id(m), None)  # (a failed ack leaves it at the broker until its lease ends)
            self.acked[m.message_id] += 1
            self.acked_deliveries.add(id(m))
        self._fire("ack", p, "post")

    def change_invisible_duration(self, m: Any, seconds: int) -> None:
        # the keeper renews (lease.py); any other caller gives the message back (a nack)
        caller = sys._getframe(1).f_code.co_filename
        op = "renew" if Path(caller).name == "lease.py" else "nack"
        gate = None
        with self.lock:
            self.calls[op] += 1
            if op == "renew" and id(m) in self.settle_began:
                self.renewed_after_settle.append(m.message_id)
            if op == "nack":
                self.settle_began.add(id(m))
            if op == "renew" and self.renew_gate is not None and self.renew_gate[0] == id(m):
                gate, self.renew_gate = self.renew_gate[1], None
        if gate is not None:  # a renewal in flight: the harness starts the message's settle meanwhile
            self.renew_entered.set()
            self._held_in_flight(m, gate)
            with self.lock:
                if id(m) in self.settle_began:
                    self.renewed_after_settle.append(m.message_id)
        p = self._take(op, m.message_id)
        self._fire(op, p, "pre")
        acted = self.clock()
        self._broker(op, m, p, lambda: self.consumer.change_invisible_duration(m, seconds))
        with self.lock:
            self.lease_end[id(m)] = acted + seconds
            if op == "renew":
                self.renewals.append((id(m), acted))
            if op == "nack":
                self.held.pop(id(m), None)
        self._fire(op, p, "post")
