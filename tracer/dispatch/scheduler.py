"""The policies' state machines: pure bookkeeping of which worker holds what and what waits.

No threads, no clocks, no locks: the thread engine (:mod:`.engine`) and the asyncio engine
(:mod:`.aio`) call these methods while holding their own lock (or from the event loop), so one
implementation serves both and is unit-testable step by step.

Protocol, per message:

* :meth:`Scheduler.admit` returns a worker index ``>= 0`` (that worker was idle and now holds the
  message: hand it over), :attr:`Admission.QUEUED` (accepted, waiting in the policy's structures),
  or :attr:`Admission.FULL` (no room: nothing changed, the submitter waits and tries again).
* :meth:`Scheduler.done` is called when a worker finished a message; it returns the next entry that
  worker must run right away, or ``None`` (the worker is idle now).
* :meth:`Scheduler.expire` is called when a held message was reported ``TIMEOUT`` while its
  handler still runs (the worker stays held until :meth:`Scheduler.done`): what waited behind that
  message — its key's parked messages (pool) or its worker's buffer (buffered) — leaves with it
  and is returned, to be given back unrun. The successors of a message follow the message that is
  given back, not the thread that hung: no later message of its key waits for that thread.

``busy`` (workers holding a message) and ``queued`` (accepted, not held) are plain attributes so
gauges and stats read them without a call.
"""

from __future__ import annotations

import enum
import heapq
import zlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .protocol import MessageTraceLike

T = TypeVar("T")


class Admission(enum.Enum):
    """What :meth:`Scheduler.admit` answers when it does not hand the message to a worker."""

    QUEUED = "queued"  # accepted: waits in the policy's buffers, window or parking
    FULL = "full"  # refused: nothing changed


QUEUED = Admission.QUEUED
FULL = Admission.FULL

# How far past one slot per worker free_slots() looks ahead: it counts a buffered policy's room one
# drawn target at a time, so without a bound RoundRobin(buffer=10**7) would make every call (the
# consume loop's, on every poll) O(workers x buffer) in time and memory. Nobody asks for more: a
# consume loop receives at most MAX_BATCH (32) at once.
LOOK_AHEAD = 4096


class Entry(Generic[T]):
    """One accepted message. Allocated once per ``submit``; slotted and mutable."""

    __slots__ = ("cost", "error", "expired", "item", "key", "seq", "t_enq", "trace")

    def __init__(self, item: T, trace: MessageTraceLike | None, key: str | None, cost: float) -> None:
        self.item = item
        self.trace = trace
        self.key = key
        self.cost = cost
        self.seq = 0
        self.t_enq = 0
        self.error: BaseException | None = None  # why it cannot be scheduled (its key= failed)
        self.expired = False  # reported TIMEOUT while its handler runs: it no longer holds its key

    def __repr__(self) -> str:
        return f"Entry(seq={self.seq}, key={self.key!r}, cost={self.cost!r}, item={self.item!r})"


class Scheduler(ABC):
    """State of one dispatcher under one policy. Not thread-safe: callers hold their lock."""

    name: str
    workers: int
    busy: int
    queued: int
    # The worker the latest QUEUED admit bound its entry to — its own buffer, or (aggressive) the
    # worker running the entry's key, which runs it next — so live blame binds the message to it;
    # None for a shared structure (the cost-aware window and its parking), which any worker may serve.
    bound: int | None = None

    @abstractmethod
    def admit(self, e: Entry[Any]) -> int | Admission:
        """Accept ``e`` if there is room: a worker index to start it now, QUEUED, or FULL."""

    @abstractmethod
    def done(self, worker: int, e: Entry[Any]) -> Entry[Any] | None:
        """``worker`` finished ``e``: the entry it runs next, or None (it is idle now)."""

    @abstractmethod
    def expire(self, worker: int, e: Entry[Any]) -> list[Entry[Any]]:
        """``e``, held by ``worker``, timed out and is given back: remove and return what waited behind it.

        ``worker`` stays held (busy) until :meth:`done`; the entries returned are no longer queued.
        """

    @abstractmethod
    def drop_successors(self, worker: int, e: Entry[Any]) -> list[Entry[Any]]:
        """``e``, keyed and held by ``worker``, ended without success: remove and return the
        messages of its key waiting behind it, oldest first. ``e`` still holds its key until :meth:`done`."""

    @abstractmethod
    def free_slots(self) -> int:
        """How many unkeyed messages :meth:`admit` would take now without FULL."""

    @abstractmethod
    def idle_workers(self) -> list[int]:
        """Workers holding nothing (only these may be told to stop)."""

    @abstractmethod
    def take_queued(self) -> list[Entry[Any]]:
        """Remove and return every waiting (not held) entry, oldest first."""

    def blocked(self, key: str) -> bool:
        """Whether a message of ``key`` cannot start until a hung handler returns (its key's
        fixed worker hangs). The pool policies release a hung message's key at its TIMEOUT: never."""
        return False


class PoolScheduler(Scheduler):
    """One slot per worker; whichever worker frees first takes the next message.

    ``window`` > 0 adds a waiting room of that many accepted messages from which a freed worker
    takes the most expensive (ties: oldest) — the cost-aware policy. ``window == 0`` is the
    aggressive policy: a message is accepted only when a worker can take it at once.

    Ordering keys: a key is *active* while one of its messages is held by a worker or waits in the
    window; later messages of an active key are parked (per key, FIFO) and do not use a worker.
    When the active message finishes, the key's next parked message runs on the same worker
    (aggressive) or enters the window (cost-aware). So two messages of one key never run at once
    and start in arrival order, and other keys pass a slow one. Parked messages count against
    ``park_limit`` (aggressive) or share the window (cost-aware).
    """

    def __init__(self, workers: int, *, window: int = 0, park_limit: int = 64, name: str = "aggressive") -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if window < 0 or park_limit < 0:
            raise ValueError("window and park_limit must be >= 0")
        self.name = name
        self.workers = workers
        self.busy = 0
        self.queued = 0  # window + parked
        self.parked = 0
        # LIFO of idle workers: the most recently freed thread is the warmest to wake.
        self._idle: list[int] = list(range(workers - 1, -1, -1))
        self._window = window
        # Cost-aware parked entries share the window; aggressive ones have their own limit.
        self._park_limit = window if window > 0 else park_limit
        self._ready: list[tuple[float, int, Entry[Any]]] = []  # heap of (-cost, seq, entry)
        self._active: dict[str, deque[Entry[Any]] | None] = {}
        # aggressive: the worker running each active key's head — its parked successors run on it
        # next, so the blame of their wait is bound to it (``bound``)
        self._holder: dict[str, int] = {}
        self._hung = 0  # workers still held by a message reported TIMEOUT (expired, not yet done)

    def admit(self, e: Entry[Any]) -> int | Admission:
        key = e.key
        if key is not None and key in self._active:
            if self.queued >= self._park_limit:
                return FULL
            dq = self._active[key]
            if dq is None:
                dq = self._active[key] = deque()
            dq.append(e)
            self.parked += 1
            self.queued += 1
            if self._window == 0:
                self.bound = self._holder.get(key)
            return QUEUED
        idle = self._idle
        if idle:  # invariant: idle workers exist only while the window is empty
            w = idle.pop()
            if key is not None:
                self._active[key] = None
                if self._window == 0:
                    self._holder[key] = w
            self.busy += 1
            return w
        if self.queued < self._window and self._hung < self.workers:  # no worker could start it
            if key is not None:
                self._active[key] = None
            heapq.heappush(self._ready, (-e.cost, e.seq, e))
            self.queued += 1
            return QUEUED
        return FULL

    def done(self, worker: int, e: Entry[Any]) -> Entry[Any] | None:
        key = e.key
        if e.expired:
            self._hung -= 1
        if key is not None and not e.expired:  # an expired entry gave its key up already
            dq = self._active[key]
            if dq:
                nxt = dq.popleft()
                self.parked -= 1
                if self._window == 0:
                    self.queued -= 1
                    return nxt
                heapq.heappush(self._ready, (-nxt.cost, nxt.seq, nxt))  # still queued: parked -> window
            else:
                del self._active[key]
                self._holder.pop(key, None)
        if self._ready:
            self.queued -= 1
            return heapq.heappop(self._ready)[2]
        self.busy -= 1
        self._idle.append(worker)
        return None

    def expire(self, worker: int, e: Entry[Any]) -> list[Entry[Any]]:
        e.expired = True
        self._hung += 1
        key = e.key
        if key is None:
            return []
        dq = self._active.pop(key)  # e runs, so it is its key's head: the key was active by e
        self._holder.pop(key, None)
        if not dq:
            return []
        out = list(dq)
        self.parked -= len(out)
        self.queued -= len(out)
        return out

    def drop_successors(self, worker: int, e: Entry[Any]) -> list[Entry[Any]]:
        key = e.key
        if key is None:
            return []
        dq = self._active.get(key)
        if not dq:
            return []
        self._active[key] = None
        out = list(dq)
        self.parked -= len(out)
        self.queued -= len(out)
        return out

    def free_slots(self) -> int:
        if self._hung >= self.workers:
            return 0  # the window is no room while no worker can ever start from it
        return len(self._idle) + max(0, self._window - self.queued)

    def idle_workers(self) -> list[int]:
        return list(self._idle)

    def take_queued(self) -> list[Entry[Any]]:
        out: list[Entry[Any]] = []
        for k, dq in self._active.items():
            if dq:
                out.extend(dq)
                self._active[k] = None
        for _, _, e in self._ready:
            out.append(e)
            if e.key is not None:
                del self._active[e.key]  # a ready entry is its key's head: the key is not running
        self._ready.clear()
        self.parked = 0
        self.queued = 0
        out.sort(key=lambda x: x.seq)
        return out


class BufferedScheduler(Scheduler):
    """The incident SDK: each message is dealt to one worker's own buffer of ``buffer`` (K).

    A worker holds one running message plus up to K waiting in its buffer, run in order. The
    target of each unkeyed message comes from ``draw`` (round-robin cursor, or random); when the
    target's buffer is full the submitter blocks on *that* worker even if others are idle, as a
    send on a full Go channel does. A keyed message always goes to worker ``crc32(key) % workers``
    (fixed routing: per-key order and exclusion follow from one worker running its buffer in order).
    A worker still running a message reported ``TIMEOUT`` is dealt nothing until that call returns
    (an unkeyed message drawn for it goes to the next worker that is not hung; a keyed one is FULL).
    """

    def __init__(self, workers: int, buffer: int, draw: Callable[[], int], *, name: str) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if buffer < 0:
            raise ValueError("buffer must be >= 0")
        self.name = name
        self.workers = workers
        self.busy = 0
        self.queued = 0
        self._k = buffer
        self._draw = draw
        self._upcoming: deque[int] = deque()  # targets drawn but not used yet (free_slots looks ahead)
        self._running = [False] * workers
        self._bufs: list[deque[Entry[Any]]] = [deque() for _ in range(workers)]
        # workers still running a message reported TIMEOUT: nothing is dealt to them until it
        # returns (a buffer behind a hung thread is no room; what it held left at the TIMEOUT)
        self._hung: set[int] = set()

    def _route(self, key: str) -> int:
        # surrogatepass: a key decoded with surrogateescape holds lone surrogates, and must route too
        return zlib.crc32(key.encode("utf-8", "surrogatepass")) % self.workers

    def blocked(self, key: str) -> bool:
        return self._route(key) in self._hung

    def _target(self, drawn: int) -> int | None:
        """The worker an unkeyed message drawn for ``drawn`` goes to: ``drawn``, or the next one
        (in index order) not hung; None when every worker hangs."""
        if drawn not in self._hung:
            return drawn
        for i in range(1, self.workers):
            w = (drawn + i) % self.workers
            if w not in self._hung:
                return w
        return None

    def admit(self, e: Entry[Any]) -> int | Admission:
        key = e.key
        upcoming = self._upcoming
        if key is not None:
            w = self._route(key)
            if w in self._hung:
                return FULL  # its key's worker hangs: it would wait behind a thread that may never return
        else:
            if not upcoming:
                upcoming.append(self._draw())
            target = self._target(upcoming[0])
            if target is None:
                return FULL
            w = target
        if not self._running[w]:
            self._running[w] = True
            self.busy += 1
            if key is None:
                upcoming.popleft()
            return w
        buf = self._bufs[w]
        if len(buf) < self._k:
            buf.append(e)
            self.queued += 1
            self.bound = w
            if key is None:
                upcoming.popleft()
            return QUEUED
        return FULL

    def done(self, worker: int, e: Entry[Any]) -> Entry[Any] | None:
        self._hung.discard(worker)
        buf = self._bufs[worker]
        if buf:
            self.queued -= 1
            return buf.popleft()
        self._running[worker] = False
        self.busy -= 1
        return None

    def expire(self, worker: int, e: Entry[Any]) -> list[Entry[Any]]:
        e.expired = True
        self._hung.add(worker)
        buf = self._bufs[worker]  # its worker's buffer waits behind e, in order
        out = list(buf)
        buf.clear()
        self.queued -= len(out)
        return out

    def drop_successors(self, worker: int, e: Entry[Any]) -> list[Entry[Any]]:
        key = e.key
        buf = self._bufs[worker]  # a key is routed to one worker: all its waiting messages are here
        if key is None or not buf:
            return []
        out = [x for x in buf if x.key == key]
        if out:
            keep = [x for x in buf if x.key != key]  # other keys and unkeyed ones stay, in order
            buf.clear()
            buf.extend(keep)
            self.queued -= len(out)
        return out

    def free_slots(self) -> int:
        room = [0 if i in self._hung else self._k - len(b) + (0 if r else 1)
                for i, (b, r) in enumerate(zip(self._bufs, self._running, strict=True))]
        if len(self._hung) >= self.workers:
            return 0
        upcoming = self._upcoming
        n = 0
        while n < self.workers + LOOK_AHEAD:
            while len(upcoming) <= n:
                upcoming.append(self._draw())
            w = self._target(upcoming[n])
            if w is None or room[w] <= 0:
                return n
            room[w] -= 1
            n += 1
        return n

    def idle_workers(self) -> list[int]:
        return [i for i, r in enumerate(self._running) if not r]

    def take_queued(self) -> list[Entry[Any]]:
        out: list[Entry[Any]] = []
        for b in self._bufs:
            out.extend(b)
            b.clear()
        self.queued = 0
        out.sort(key=lambda x: x.seq)
        return out


__all__ = ["FULL", "LOOK_AHEAD", "QUEUED", "Admission", "BufferedScheduler", "Entry", "PoolScheduler", "Scheduler"]
