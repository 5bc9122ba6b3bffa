"""Who blocked whom: why each message waited inside its consumer, and how much of that was avoidable.

Pure functions over handler runs (where a message waited and on which worker it then ran); no I/O,
no clock. The report feeds them from a span file (the stamps and ``rmqtrace.worker`` are on every
``process`` span, so old recordings work too), the demo from its own stamps, the fleet view from
the compact records it keeps per instance.

Definitions (also in ``docs/report.md``):

* **wait**: client pull → handler start (``consumer_wait``), the time a message sat inside the
  consumer.
* **idle worker**: a worker of the same consumer that runs no handler. Handing a message over takes
  a moment, so the first :data:`GRACE_NS` of a worker's idle spell and of a message's wait are not
  blamed: a worker becomes *available* ``grace`` after its handler ended (or from the start when it
  has not run yet), a wait becomes *blameable* ``grace`` after it began.
* **avoidable wait**: the part of a message's blameable wait during which at least one worker of
  its consumer was available — a dispatcher that gives every message to a free worker would not
  have let it wait then. A consumer with more workers than ever ran (``workers`` larger than the
  worker ids seen) has a worker that is always available.
* **reason**: ``head_of_line`` when at least half of its blameable wait was avoidable (it sat
  behind a message on one worker while another worker was free), ``capacity`` when most of it was
  spent while every worker was busy (the price of the worker count, not of the policy), ``none``
  when it waited no longer than the grace.
* **blocker**: for a message with avoidable wait, when the worker ids are real (not inferred), the
  message whose run held up the largest part of its avoidable wait. In its worker's own buffer
  (from dispatch enqueue on, only that worker could run it) that is the run on its worker. Before,
  in the client's backlog (cache, receive buffer), which hands messages on in arrival order, it
  waited behind the backlog's oldest message, itself waiting for room on *its* worker: the run
  there held up the whole backlog. The ranking credits every
  such run with that overlap: ``held_up_s`` is the avoidable wait it caused, ``victims`` how many
  messages it caused some of.
* the live counterpart, fed by a dispatcher as messages start: :class:`tracer.path.blocking.BlameTracker`
  (same definitions, same numbers).
* **a key's own wait**: under aggressive a keyed message whose key is running is parked, and the pool
  runs it next on the worker that ran the key's message; its dispatch enqueue is its ``bound_ns``, so
  the buffer rule above names the key's running message. (The live tracker is not told of parking:
  see :mod:`tracer.path.blocking`.)
* **across a fleet** (:func:`tracer.report.fleetblame.fleet_avoidable`): a wait is avoidable in the fleet when some worker of
  another instance was available meanwhile (waiting in one process while another idled);
  :func:`~tracer.report.fleetblame.fleet_blame` credits the runs that held such waits up (the rules above inside each
  instance, on the fleet's busy time).
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

from ..path.blocking import CAPACITY, GRACE_NS, HEAD_OF_LINE, NO_WAIT  # one definition, live and offline
from .intervals import IntervalSet, intersection, pack_lanes
from .text import (
    MATERIAL_PER_MESSAGE_S,
    MATERIAL_S,
    avoidable_cell,
    avoidable_verdict,
    fleet_verdict,
    is_material,
    sentence_seconds,
)

__all__ = ["CAPACITY", "GRACE_NS", "HEAD_OF_LINE", "MATERIAL_PER_MESSAGE_S", "MATERIAL_S", "MAX_OVERLAPS", "NO_WAIT",
           "Blame", "Blocker", "IntervalSet", "MessageBlame", "Run", "TooManyOverlaps", "all_busy",
           "avoidable_cell", "avoidable_verdict", "blame", "fleet_verdict",
           "is_material", "pack_lanes"]

# (victim, run) overlap steps naming the blockers of one consumer group (the report) or one job
# (the fleet view) may take, ~2.5 µs each, so ~8 s: the 10⁵-message bench job takes 0.75·10⁶, its
# 10⁴ file 0 (no wait avoidable), the same file with --workers 5 (every wait avoidable) 6.2·10⁶;
# 10⁵ messages dealt at once to one instance's 2 workers while another idles would take 2.5·10⁹
# (its 3000-message form: 2.25·10⁶ steps, 5.5 s). Past it the shares are still given, the names not.
MAX_OVERLAPS = 3_000_000


_new_tuple = tuple.__new__  # a NamedTuple's own __new__ is a Python function around this one


class Run(NamedTuple):
    """One handled delivery: which message, where it ran, its wait and handler stamps (ns)."""

    message_id: str
    label: str  # what to print: its keys (a test-case group) or the message id
    worker: int
    wait_start_ns: int  # client pull
    start_ns: int  # handler start
    end_ns: int  # handler end
    # when it was put in its worker's own buffer (dispatch enqueue); before that it waited where any
    # worker could take it, so nobody's run held it up. None: from wait_start_ns on.
    bound_ns: int | None = None


def all_busy(runs: Sequence[Run], workers: int, grace_ns: int = GRACE_NS) -> IntervalSet:
    """When no worker of the consumer was available: each worker is unavailable from a handler's
    start until ``grace`` after its end; with more workers than ids seen, never."""
    by_worker: dict[int, list[tuple[int, int]]] = {}
    for r in runs:
        by_worker.setdefault(r.worker, []).append((r.start_ns, r.end_ns + grace_ns))
    if not by_worker or workers > len(by_worker):
        return IntervalSet(())
    return intersection([IntervalSet(ivs) for ivs in by_worker.values()])


class MessageBlame(NamedTuple):  # one per handled message: a NamedTuple is far cheaper to make than a dataclass
    message_id: str
    wait_s: float
    avoidable_s: float
    reason: str  # HEAD_OF_LINE, CAPACITY or NO_WAIT
    blocker_id: str | None  # the message that ran on its worker while it waited avoidably

    def as_dict(self) -> dict[str, Any]:
        return {"message_id": self.message_id, "wait_s": self.wait_s, "avoidable_s": self.avoidable_s,
                "reason": self.reason, "blocker": self.blocker_id}


@dataclass(frozen=True, slots=True)
class Blocker:
    message_id: str
    label: str
    worker: int
    handler_s: float
    victims: int
    held_up_s: float  # avoidable wait it caused

    def as_dict(self) -> dict[str, Any]:
        return {"message_id": self.message_id, "label": self.label, "worker": self.worker,
                "handler_s": round(self.handler_s, 6), "victims": self.victims, "held_up_s": round(self.held_up_s, 6)}


@dataclass(frozen=True, slots=True)
class Blame:
    """One consumer's blame: totals, the per-message verdicts (in input order) and the ranking."""

    workers: int
    wait_s: float  # all consumer_wait
    avoidable_s: float
    head_of_line: int
    capacity: int
    blockers_known: bool  # False when worker ids were inferred: no blocker is named
    messages: tuple[MessageBlame, ...]
    top: tuple[Blocker, ...]  # by held_up_s, largest first
    overlaps: int = 0  # (victim, run) overlap steps it took to name the blockers (see max_overlaps)
    note: str = ""  # why no blocker is named although the ids are real (the steps' bound was hit); "" otherwise

    @property
    def avoidable_share(self) -> float:
        return self.avoidable_s / self.wait_s if self.wait_s > 0 else 0.0

    @property
    def avoidable_per_message_s(self) -> float:
        return self.avoidable_s / len(self.messages) if self.messages else 0.0

    @property
    def material(self) -> bool:
        """:func:`is_material` of this consumer's avoidable wait."""
        return is_material(self.avoidable_s, len(self.messages))

    def verdict(self) -> str:
        """:func:`avoidable_verdict`: what the terminal, the HTML card and the demo print."""
        return avoidable_verdict(self.avoidable_s, self.wait_s, len(self.messages))

    def line(self, name: str) -> str:
        """One sentence: the verdict and the worst blocker, numbers from the run."""
        text = f"{name}: {self.verdict()}"
        if self.top:
            b = self.top[0]
            text += (f"; {b.label} (handler {sentence_seconds(b.handler_s)}) held up {b.victims} messages "
                     f"for {sentence_seconds(b.held_up_s)}")
        elif self.note:
            text += f"; no blocker named: {self.note}"
        elif self.avoidable_s > 0 and not self.blockers_known:
            text += "; no blocker named: worker ids were inferred"
        return text

    def as_dict(self, top: int | None = None) -> dict[str, Any]:
        d = {"workers": self.workers, "consumer_wait_s": round(self.wait_s, 6),
             "avoidable_wait_s": round(self.avoidable_s, 6), "avoidable_wait_share": self.avoidable_share,
             "avoidable_wait_per_message_s": round(self.avoidable_per_message_s, 6), "material": self.material,
             "head_of_line": self.head_of_line, "capacity": self.capacity,
             "blockers_known": self.blockers_known,
             "top_blockers": [b.as_dict() for b in self.top[:top]]}
        if self.note:  # only then: a report whose blockers were named reads as it did before the bound
            d["blockers_note"] = self.note
        return d


class _Piece(NamedTuple):
    """A stretch of the backlog's wait held up by one run."""

    lo: int
    hi: int
    run: int  # index into the runs


class _Queued(NamedTuple):  # a backlog entry, in the order the backlog hands messages on
    wait_start_ns: int
    bound_ns: int
    message_id: str
    run: int


def _backlog_pieces(runs: Sequence[Run], on_worker: dict[int, list[int]]) -> list[_Piece]:
    """Who held up the client's backlog, over time: pieces sorted and disjoint.

    A backlog (the client cache, the loop's receive buffer) hands messages on in the order they
    arrived, so while its oldest message waits for room in one worker's buffer every message behind
    it waits too: the run going on in that worker then holds up the whole backlog.
    """
    events: list[tuple[int, int, int]] = []  # (time, 0 leave / 1 join, run)
    for k, r in enumerate(runs):
        if r.bound_ns is not None and r.bound_ns > r.wait_start_ns:
            events += [(r.wait_start_ns, 1, k), (r.bound_ns, 0, k)]
    if not events:
        return []
    events.sort()
    # the backlog, oldest first; a batch arrives at one instant and is handed on in enqueue order
    heap: list[_Queued] = []
    gone: set[int] = set()
    segments: list[_Piece] = []  # the backlog's head over time
    for i, (t, kind, k) in enumerate(events):
        if kind:
            r = runs[k]
            heapq.heappush(heap, _Queued(r.wait_start_ns, r.bound_ns or 0, r.message_id, k))
        else:
            gone.add(k)
        while heap and heap[0].run in gone:
            heapq.heappop(heap)
        nxt = events[i + 1][0] if i + 1 < len(events) else t
        if heap and nxt > t:
            segments.append(_Piece(t, nxt, heap[0].run))
    starts = {w: [runs[j].start_ns for j in ks] for w, ks in on_worker.items()}
    pieces: list[_Piece] = []
    for lo, hi, head in segments:
        w = runs[head].worker
        ks = on_worker.get(w, [])
        for j in ks[max(0, bisect.bisect_right(starts.get(w, []), lo) - 1):]:
            o = runs[j]
            if o.start_ns >= hi:
                break
            a, b = max(lo, o.start_ns), min(hi, o.end_ns)
            if b > a:
                if pieces and pieces[-1].run == j and pieces[-1].hi == a:
                    pieces[-1] = _Piece(pieces[-1].lo, b, j)  # the head changed, its worker's run did not
                else:
                    pieces.append(_Piece(a, b, j))
    return pieces


class TooManyOverlaps(RuntimeError):
    """Naming the blockers would weigh more (victim, run) overlaps than the caller allowed."""


def _check_blame(runs: Sequence[Run], workers: int, grace_ns: int) -> None:
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if grace_ns < 0:
        raise ValueError(f"grace_ns must be >= 0, got {grace_ns}")
    ids = {r.worker for r in runs}
    if len(ids) > workers:
        raise ValueError(f"{len(ids)} distinct worker ids but workers={workers}")


def _avoidable_waits(runs: Sequence[Run], busy: IntervalSet, grace_ns: int) -> list[int]:
    """Stage 1: each run's avoidable wait (ns, may be <= 0): its blameable wait less the time no
    worker was available."""
    return [(r.start_ns - r.wait_start_ns - grace_ns) - busy.covered(r.wait_start_ns + grace_ns, r.start_ns)
            if r.start_ns > r.wait_start_ns + grace_ns else 0 for r in runs]


class _Blockers:
    """Stage 2: who held up each avoidable wait, and the credit every run earns by it.

    Built only when a run waited avoidably and the worker ids are real: the runs by worker are
    needed only to name the blockers of such a run, the backlog only by one that waited so before
    it was bound (most runs of a saturated consumer wait with every worker busy).
    """

    def __init__(self, runs: Sequence[Run], avoids: Sequence[int], busy: IntervalSet, grace_ns: int,
                 max_overlaps: int | None) -> None:
        self.runs, self.busy, self.grace_ns, self.budget = runs, busy, grace_ns, max_overlaps
        self.on_worker: dict[int, list[int]] = {}
        self.reach: dict[int, list[int]] = {}
        for k in sorted(range(len(runs)), key=lambda k: runs[k].start_ns):
            self.on_worker.setdefault(runs[k].worker, []).append(k)
        # the latest end so far, per worker: monotone even if a worker's runs overlap (ids that collide)
        for w, ks in self.on_worker.items():
            top_end, row = 0, []
            for k in ks:
                top_end = max(top_end, runs[k].end_ns)
                row.append(top_end)
            self.reach[w] = row
        self.backlog = _backlog_pieces(runs, self.on_worker) if any(
            avoid > 0 and r.bound_ns is not None and r.bound_ns > r.wait_start_ns + grace_ns
            for avoid, r in zip(avoids, runs)) else []
        self.backlog_ends = [p.hi for p in self.backlog]
        self.weight = [(hi - lo) - busy.covered(lo, hi) for lo, hi, _j in self.backlog]  # available time in each piece
        self.credit: dict[int, int] = {}
        self.victims: dict[int, int] = {}
        self.steps = 0

    def name(self, k: int) -> int | None:
        """The run that held up most of run ``k``'s avoidable wait (credited to all that held some).

        Raises:
            TooManyOverlaps: the steps so far passed ``max_overlaps``.
        """
        parts = self._parts(k)
        if self.budget is not None and self.steps > self.budget:
            raise TooManyOverlaps(f"naming the blockers of {len(self.runs)} runs needs more than {self.budget} "
                                  "(victim, run) overlap steps")
        runs, credit, victims = self.runs, self.credit, self.victims
        best: tuple[int, int, str] | None = None  # (-part, start, id): the largest part, then the earliest
        blocker: int | None = None
        for j, part in parts.items():
            if part > 0:
                credit[j] = credit.get(j, 0) + part  # integer ns: sums that do not depend on the order
                victims[j] = victims.get(j, 0) + 1
                key = (-part, runs[j].start_ns, runs[j].message_id)
                if best is None or key < best:
                    best, blocker = key, j
        return blocker

    def _parts(self, k: int) -> dict[int, int]:
        """Each run's share (ns) of run ``k``'s avoidable wait; counts the overlap steps."""
        runs, busy = self.runs, self.busy
        r = runs[k]
        a, b = r.wait_start_ns + self.grace_ns, r.start_ns
        parts: dict[int, int] = {}
        bound = max(a, r.bound_ns if r.bound_ns is not None else 0)
        steps = 0
        # waiting in its worker's own buffer: the runs there held it up
        for j in self.on_worker[r.worker][bisect.bisect_right(self.reach[r.worker], bound):]:
            o = runs[j]
            if o.start_ns >= b:
                break
            steps += 1
            lo, hi = max(bound, o.start_ns), min(b, o.end_ns)
            if j != k and hi > lo:
                parts[j] = parts.get(j, 0) + (hi - lo) - busy.covered(lo, hi)
        # waiting in the backlog before that: whatever held up the backlog's head
        if bound > a:
            backlog, weight = self.backlog, self.weight
            i = bisect.bisect_right(self.backlog_ends, a)
            while i < len(backlog):
                lo0, hi0, j = backlog[i]
                if lo0 >= bound:
                    break
                steps += 1
                if j != k:
                    if a <= lo0 and hi0 <= bound:
                        parts[j] = parts.get(j, 0) + weight[i]  # inside the window: precomputed
                    else:
                        lo, hi = max(a, lo0), min(bound, hi0)
                        parts[j] = parts.get(j, 0) + (hi - lo) - busy.covered(lo, hi)
                i += 1
        self.steps += steps
        return parts

    def ranked(self, top: int) -> tuple[Blocker, ...]:
        """Stage 3: the ``top`` runs by the avoidable wait they held up, then start, then id."""
        runs, credit = self.runs, self.credit
        order = sorted(credit, key=lambda j: (-credit[j], runs[j].start_ns, runs[j].message_id))[:max(0, top)]
        return tuple(Blocker(runs[j].message_id, runs[j].label, runs[j].worker, (runs[j].end_ns - runs[j].start_ns) / 1e9,
                             self.victims[j], credit[j] / 1e9) for j in order)


def _reason(avoid: int, blameable_ns: int, wait: int, grace_ns: int) -> str:
    if avoid > 0 and 2 * avoid >= blameable_ns:
        return HEAD_OF_LINE
    return CAPACITY if wait > grace_ns else NO_WAIT


def blame(runs: Sequence[Run], workers: int, *, grace_ns: int = GRACE_NS, blockers_known: bool = True,
          top: int = 10, busy: IntervalSet | None = None, max_overlaps: int | None = None) -> Blame:
    """Blame every run of one consumer with ``workers`` workers.

    ``busy``: when no worker that could have taken a message was available; default the consumer's
    own (:func:`all_busy`). The fleet view passes the fleet's (:func:`fleet_blame`), so a wait
    counts as avoidable while any instance had a worker available, and the runs that held it up
    are credited with that.

    Each message that waited avoidably is weighed against every run that went on where it waited
    (its worker's, or the backlog head's): a consumer whose waits are long *and* avoidable costs
    victims × runs per wait. ``max_overlaps`` bounds those steps.

    Raises:
        ValueError: ``workers`` < 1, a negative ``grace_ns``, or more distinct worker ids than ``workers``.
        TooManyOverlaps: more than ``max_overlaps`` steps were needed (nothing is returned).
    """
    _check_blame(runs, workers, grace_ns)
    if busy is None:
        busy = all_busy(runs, workers, grace_ns)
    avoids = _avoidable_waits(runs, busy, grace_ns)
    blockers = _Blockers(runs, avoids, busy, grace_ns, max_overlaps) \
        if blockers_known and max(avoids, default=0) > 0 else None
    out: list[MessageBlame] = []
    wait_total = avoidable_total = 0.0
    reasons = {HEAD_OF_LINE: 0, CAPACITY: 0, NO_WAIT: 0}
    for k, r in enumerate(runs):
        wait = r.start_ns - r.wait_start_ns
        if wait < 0:
            wait = 0
        avoid = avoids[k] if avoids[k] > 0 else 0
        blocker = blockers.name(k) if avoid and blockers is not None else None
        reason = _reason(avoid, r.start_ns - r.wait_start_ns - grace_ns, wait, grace_ns)
        reasons[reason] += 1
        wait_total += wait / 1e9
        avoidable_total += avoid / 1e9
        out.append(_new_tuple(MessageBlame, (r.message_id, wait / 1e9, avoid / 1e9, reason,
                                             runs[blocker].message_id if blocker is not None else None)))
    return Blame(workers, wait_total, avoidable_total, reasons[HEAD_OF_LINE], reasons[CAPACITY], blockers_known,
                 tuple(out), blockers.ranked(top) if blockers is not None else (),
                 blockers.steps if blockers is not None else 0)
