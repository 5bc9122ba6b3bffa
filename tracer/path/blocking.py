"""Live blame: why a message waited inside its consumer, decided the moment its handler starts.

A :class:`BlameTracker` per consumer is fed the events its dispatcher already sees — a message
arrived (client pull), it was bound to one worker's buffer (round_robin, random, a key; never
under aggressive), a handler started, a handler ended — each with its nanosecond stamp, and
answers at every start a :class:`Verdict`: the reason, the avoidable seconds and the blocker. Pure
and clock-free (the caller passes the stamps), so the numbers are the report's numbers
(:mod:`tracer.report.blame` computes the same offline from a span file; the tests hold the two
equal on random schedules).

The definitions are the report's: a worker is *available* from ``grace`` after its handler ended
(from the start if it has not run); a wait is blameable from ``grace`` after it began;
*avoidable* is the blameable wait during which some worker of the consumer was available;
``head_of_line`` when that is at least half of the blameable wait, ``capacity`` when less, ``none``
for a wait no longer than the grace; the *blocker* is the message that ran on the bound worker
during the largest part of the avoidable wait after it was bound (a message never bound has none).

How it stays cheap: one running integral ``A(t)`` = time up to ``t`` during which some worker was
available. A message's avoidable wait is ``A(start) − A(pull + grace)``; a run's part of it is
``min(A(start), A(run end)) − max(A(pull + grace), A(run start))`` (``A`` never decreases). The
stamps a tracker uses never go back (an earlier one is taken as the latest), so the pending
``pull + grace`` marks and the workers' ``end + grace`` availabilities are queued in time order
(FIFO, no heap). Each event costs O(1) amortized plus, at a start, one step per run its worker
made while the message waited (at most its place in that worker's buffer).

What it holds: a worker's run log keeps only the runs a waiting message bound to that worker may
still be held up by — none once no message waits on it (a count per worker says so), so the keys
and ``ref`` objects of finished messages are let go as soon as no waiting message can name them
(the caller's key and ref are often the message's own objects); a pending ``pull + grace`` mark
holds the waiting record, not the key. A verdict hands the blocker's key and ref to the victim;
a ``MessageTrace`` lets both go at its finish, keeping the blocker's id and handler context
(else each live trace would hold the chain of traces that blocked one before it). The idle list
holds at most ``2 x workers + 1`` marks: a worker idle for good (more workers than concurrent
messages) pins its front, so stale marks behind it are compacted away, not only popped at the
front. Memory is bounded by the workers and the waiting messages, never by the messages handled
(``BlameStats.entries`` counts it; ``tests/test_blame_idle.py``).

**Wired** in :class:`tracer.dispatch.core.Core` (both engines), one tracker per dispatcher,
``workers`` = its pool, on the dispatcher's clock, only once a trace or metrics are attached:

* ``arrived(entry, now)`` — at the dispatcher's submit (``Core.number_locked``; a blocked submit
  waits from there). Not the client's pull: the client's buffer before the submit is the report's
  to blame (the push seam's cache announcement, ``watch_push_cache``, feeds no tracker);
* ``bound(entry, worker, dispatch_enqueue)`` — when a per-worker-buffer policy (round_robin,
  random, a key's fixed worker) queued the entry in worker ``r``'s own buffer
  (``Scheduler.bound``); never for the aggressive / cost-aware shared structures;
* ``started(entry, worker, now, ref=trace)`` — ``Core.begin``; the verdict goes to
  ``trace.blame(verdict, policy)``, which writes ``rmqtrace.blame.*`` on ``dispatch_wait``
  (compact: ``process``), a link to the blocker trace's handler span, and at finish adds
  ``verdict.avoidable_s`` to ``rmqtrace_consumer_avoidable_wait_seconds_total`` and
  ``rmqtrace.consumer.avoidable_wait``;
* ``ended(entry, worker, now)`` — when the handler returned (the engines' ``_finish``; a handler
  reported TIMEOUT earlier holds its worker until then);
* ``forget(entry)`` — rejected (key= failed), withdrawn, closed while waiting, given back SKIPPED.

``key`` must be unique per delivery (``(message_id, delivery_attempt)``). The backlog rule of the
offline view (a message still in the client's backlog is held up by whatever holds up the
backlog's oldest message) needs one more event the loop has: which worker its feeder waits for.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Hashable, NamedTuple

__all__ = ["CAPACITY", "GRACE_NS", "HEAD_OF_LINE", "NO_WAIT", "BlameStatistics", "BlameStats", "BlameTracker", "Verdict"]

# The hand-over allowance: 2 ms is well above a dispatcher's hand-off on an idle machine (tens of µs)
# and well below the handlers whose waits are worth blaming.
GRACE_NS = 2_000_000
HEAD_OF_LINE = "head_of_line"
CAPACITY = "capacity"
NO_WAIT = "none"


class Verdict(NamedTuple):
    """Why one message waited: what its wait span should carry."""

    reason: str  # HEAD_OF_LINE, CAPACITY or NO_WAIT
    wait_s: float
    avoidable_s: float
    blocker: Hashable | None  # the delivery that ran on its worker while it waited avoidably
    blocker_ref: object = None  # what the caller passed with the blocker's start (its handler span context)


@dataclass(frozen=True, slots=True)
class BlameStats:
    """A live blame tracker's counts and totals, frozen (:meth:`BlameTracker.statistics`)."""

    started: int
    waiting: int  # arrived, not started
    wait_s: float
    avoidable_s: float
    head_of_line: int
    capacity: int
    out_of_order: int  # events stamped before the previous one (taken as at the previous one)
    unknown: int  # starts or ends of a message or worker the tracker was not told about
    # what it holds now: idle marks + runs in the run logs + waiting records + pending grace marks
    # (bounded by the workers and the waiting messages, never by the messages handled)
    entries: int = 0
    idle_marks: int = 0  # the idle list: at most 2 x workers + 1 (stale marks are compacted away)


BlameStatistics = BlameStats  # its name before issue 36 (one kind of snapshot: ``*Stats``)

_UNKNOWN = Verdict(NO_WAIT, 0.0, 0.0, None)  # the start of a message the tracker was not told about (immutable)


class _Run:
    __slots__ = ("message", "a_start", "a_end", "ref")

    def __init__(self, message: Hashable, a_start: float, ref: object) -> None:
        self.message = message
        self.a_start = a_start
        self.ref = ref
        self.a_end: float | None = None  # None while it runs


class _Waiting:
    __slots__ = ("pull_ns", "a_mark", "worker", "first_run", "a_bound")

    def __init__(self, pull_ns: int) -> None:
        self.pull_ns = pull_ns
        self.a_mark: float | None = None  # A(pull + grace), once time got there
        self.worker: int | None = None
        self.first_run = 0  # index into that worker's run log: the run current when it was bound
        self.a_bound = 0.0  # A(when it was bound): runs are credited from then on only


class BlameTracker:
    """One consumer's live blame. Thread-safe: one lock, held for O(1) amortized per event.

    Raises:
        ValueError: ``workers`` < 1, a negative grace, or a worker id outside ``0 … workers-1``.
    """

    def __init__(self, workers: int, *, grace_ns: int = GRACE_NS) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if grace_ns < 0:
            raise ValueError(f"grace_ns must be >= 0, got {grace_ns}")
        self.workers = workers
        self.grace_ns = grace_ns
        self._lock = threading.Lock()
        self._t: int | None = None  # the latest stamp seen
        self._a = 0.0  # A(_t), in ns
        self._running: list[Hashable | None] = [None] * workers
        self._free_from: list[float] = [-math.inf] * workers  # available from (end + grace) when idle
        # (end + grace, worker) in time order; stale ones (the worker ran again) dropped at the front
        self._idle_since: deque[tuple[float, int]] = deque((-math.inf, w) for w in range(workers))
        self._log: list[list[_Run]] = [[] for _ in range(workers)]
        self._log_base = [0] * workers  # runs trimmed off the front of each log
        self._waiting: dict[Hashable, _Waiting] = {}
        self._bound_waiting = [0] * workers  # waiting messages bound to each worker: 0 = its log can go
        # (pull + grace, its waiting record) in time order: A taken there; the record, not the key,
        # so a message that started within the grace leaves nothing of its own behind
        self._marks: deque[tuple[int, _Waiting]] = deque()
        self._started = self._hol = self._cap = self._ooo = self._unknown = 0
        self._wait_ns = self._avoid_ns = 0.0

    # -- events ----------------------------------------------------------------------------------
    def arrived(self, message: Hashable, ns: int) -> None:
        """The message entered the consumer (client pull). ``message``: any key unique per delivery
        (a redelivered message id is a new delivery: pass e.g. ``(message_id, attempt)``)."""
        with self._lock:
            ns = self._advance(ns)
            w = _Waiting(ns)
            self._waiting[message] = w
            if self.grace_ns == 0:
                w.a_mark = self._a
            else:
                self._marks.append((ns + self.grace_ns, w))

    def bound(self, message: Hashable, worker: int, ns: int) -> None:
        """The message was put in ``worker``'s own buffer: only that worker can run it now."""
        with self._lock:
            self._check(worker)
            self._advance(ns)
            w = self._waiting.get(message)
            if w is None:
                self._unknown += 1
                return
            if w.worker is not None:
                self._unbind(w.worker)
            self._bound_waiting[worker] += 1
            w.worker = worker
            w.a_bound = self._a
            # the run going on now (if any) is the first that can hold it up
            log = self._log[worker]
            w.first_run = self._log_base[worker] + len(log) - (1 if self._running[worker] is not None else 0)

    def started(self, message: Hashable, worker: int, ns: int, ref: object = None) -> Verdict:
        """A handler started: the message's verdict (what its wait span carries). ``ref`` is handed
        back as ``blocker_ref`` to the messages this run holds up (the handler span's context, for
        the link from the victim's wait span)."""
        with self._lock:
            self._check(worker)
            ns = self._advance(ns)
            w = self._waiting.pop(message, None)
            if w is None:
                self._unknown += 1
                verdict = _UNKNOWN
            else:
                verdict = self._verdict(w, ns)
                if w.worker is not None:
                    self._unbind(w.worker)
            if self._running[worker] is not None:
                self._unknown += 1  # a second start on a busy worker: take the new one as running
            self._running[worker] = message
            log = self._log[worker]
            if not self._bound_waiting[worker]:
                self._drop_runs(worker, len(log))  # a message bound from now on starts its count at this run
            log.append(_Run(message, self._a, ref))
            self._started += 1
            if len(log) >= 64 and not len(log) % 32:  # now and then: the trim walks the waiting messages
                self._trim(worker)
            return verdict

    def ended(self, message: Hashable, worker: int, ns: int) -> None:
        with self._lock:
            self._check(worker)
            ns = self._advance(ns)
            if self._running[worker] != message:
                self._unknown += 1
                return
            self._running[worker] = None
            log = self._log[worker]
            if self._bound_waiting[worker]:
                log[-1].a_end = self._a
            else:  # no waiting message can be held up by it: a message bound now waits for no run
                self._drop_runs(worker, len(log))
            self._free_from[worker] = ns + self.grace_ns
            q = self._idle_since
            q.append((ns + self.grace_ns, worker))
            if len(q) > 2 * self.workers:
                self._compact_idle()

    def forget(self, message: Hashable) -> None:
        """The message left without running (given back, expired): it is no longer waiting."""
        with self._lock:
            w = self._waiting.pop(message, None)
            if w is not None and w.worker is not None:
                self._unbind(w.worker)

    def statistics(self) -> BlameStats:
        with self._lock:
            idle = len(self._idle_since)
            held = idle + sum(map(len, self._log)) + len(self._waiting) + len(self._marks)
            return BlameStats(self._started, len(self._waiting), self._wait_ns / 1e9, self._avoid_ns / 1e9,
                              self._hol, self._cap, self._ooo, self._unknown, held, idle)

    # -- inside ------------------------------------------------------------------------------------
    def _check(self, worker: int) -> None:
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} outside 0 … {self.workers - 1}")

    def _unbind(self, worker: int) -> None:
        """A waiting message bound to ``worker`` is no longer waiting there. The last one gone,
        the runs it could have been blamed on go too (all but the one running now, which a
        message bound next starts its count at), not at the worker's next start or end: a
        worker that runs no more would hold them for good."""
        self._bound_waiting[worker] -= 1
        if not self._bound_waiting[worker]:
            log = self._log[worker]
            self._drop_runs(worker, len(log) - (1 if self._running[worker] is not None else 0))

    def _compact_idle(self) -> None:
        """Keep only the live idle marks, in time order, one per worker.

        Stale marks are dropped at the front only; a worker idle for good (more workers than
        concurrent messages) pins the front, and without this every run that ended behind it
        would leave its mark for ever. Compacting once the list exceeds 2 x workers leaves at
        most ``workers``: O(1) amortized per end."""
        seen: set[int] = set()
        live: deque[tuple[float, int]] = deque()
        for at, w in self._idle_since:
            # a start and an end at one stamp make an older mark look live again: keep one
            if self._running[w] is None and self._free_from[w] == at and w not in seen:
                seen.add(w)
                live.append((at, w))
        self._idle_since = live

    def _available_from(self) -> float:
        """When some idle worker became available (inf: every worker runs)."""
        q = self._idle_since
        while q:
            at, w = q[0]
            if self._running[w] is None and self._free_from[w] == at:
                return at
            q.popleft()  # stale: the worker started again, or ended again later
        return math.inf

    def _advance(self, ns: int) -> int:
        """Move A to ``ns`` (taking the marks on the way); returns the stamp used."""
        if self._t is None:
            self._t = ns
        if ns < self._t:
            self._ooo += 1
            ns = self._t
        since = self._available_from()
        t = self._t
        a = self._a  # A grows by the part of each step after ``since`` (inlined: three calls per message)
        marks = self._marks
        while marks and marks[0][0] <= ns:
            at, w = marks.popleft()
            if at < t:
                at = t
            d = at - (t if t > since else since)
            if d > 0:
                a += d
            t = at
            if w.a_mark is None:  # (a message that started or left already: nothing reads it)
                w.a_mark = a
        d = ns - (t if t > since else since)
        if d > 0:
            a += d
        self._a = a
        self._t = ns
        return ns

    def _verdict(self, w: _Waiting, ns: int) -> Verdict:
        wait = max(0, ns - w.pull_ns)
        blameable = wait - self.grace_ns
        if blameable <= 0 or w.a_mark is None:
            self._wait_ns += wait
            return Verdict(NO_WAIT, wait / 1e9, 0.0, None)
        avoid = self._a - w.a_mark
        blocker: _Run | None = None
        if avoid > 0 and w.worker is not None:
            best = 0.0
            log, base = self._log[w.worker], self._log_base[w.worker]
            for run in log[max(0, w.first_run - base):]:
                end = self._a if run.a_end is None else run.a_end
                part = min(self._a, end) - max(w.a_mark, run.a_start, w.a_bound)
                if part > best:
                    best, blocker = part, run
        reason = HEAD_OF_LINE if avoid > 0 and 2 * avoid >= blameable else CAPACITY
        self._hol += reason == HEAD_OF_LINE
        self._cap += reason == CAPACITY
        self._wait_ns += wait
        self._avoid_ns += avoid
        if blocker is None:
            return Verdict(reason, wait / 1e9, avoid / 1e9, None)
        return Verdict(reason, wait / 1e9, avoid / 1e9, blocker.message, blocker.ref)

    def _trim(self, worker: int) -> None:
        """Drop runs no bound waiting message can still be held up by (keeps the log short)."""
        log = self._log[worker]
        oldest = min((w.first_run for w in self._waiting.values() if w.worker == worker),
                     default=self._log_base[worker] + len(log) - 1)
        self._drop_runs(worker, min(oldest - self._log_base[worker], len(log) - 1))

    def _drop_runs(self, worker: int, cut: int) -> None:
        """Drop the first ``cut`` runs of ``worker``'s log (run numbers stay: the base moves)."""
        if cut > 0:
            del self._log[worker][:cut]
            self._log_base[worker] += cut
