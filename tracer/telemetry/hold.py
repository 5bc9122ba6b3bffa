"""Hold a message's spans until its keep decision, then hand them on or drop them.

The user's handler opens spans under rmqtrace's ``handler`` span before anyone knows whether the
message will be slow. :class:`HoldingSpanProcessor` wraps the span processors the user
configured (batch, simple, several): spans of a trace that rmqtrace opened with
:meth:`open_trace` (or marked with :meth:`hold`) are kept in memory when they end, and
:meth:`release` either forwards them to every wrapped processor (the trace is kept) or forgets
them (the trace is dropped, and costs no export). Spans of any other trace pass straight through.

**Nothing leaves without its parent.** Every span lost from a held trace — to a bound, to the age
limit, because its trace was dropped or evicted — is remembered by span id with its trace, and a
span whose parent was lost is lost too (at release, and when it ends later). The trace ids
:meth:`open_trace` makes carry a keyed check value in their low 32 bits, so a span ending after
its trace was decided is recognised as one of ours however long ago that was: it joins its trace
when the trace was kept (and its parent was not lost), and is dropped otherwise. Kept and evicted
traces are the rare outcomes, and remembered (the last 4096 of each); a trace of ours remembered as
neither was dropped by the policy, so its late span is the policy's drop (``policy_dropped``,
never an export loss) however many traces were dropped since — no table of dropped ids to outgrow.
A late span of a kept or evicted trace that many decisions old counts as the policy's drop too (it
is dropped: what its trace lost is forgotten). (A foreign trace id passes the check with
probability 2⁻³²; such a span, ending outside any held trace, would be dropped.)

**Bounds**, each counted by reason in :meth:`statistics` when hit:

- ``max_spans`` held spans: when full, the oldest undecided trace is evicted to make room
  (``max_spans``); the newest spans are the ones a later decision needs;
- ``max_traces`` undecided traces: the oldest is evicted (``max_traces``);
- ``max_age_s``: an undecided trace older than this is evicted (``max_age``) — a message handled
  but never acked or finished (a ``TracedSimpleConsumer.processing()`` without an ack) must not
  hold its spans forever. A trace held with ``running=True`` (rmqtrace holds a message's trace so
  when its handler starts) is not aged while its handler runs: its age counts from :meth:`ran`,
  the handler's return — a handler that runs an hour is rmqtrace's domain, not a leak; the memory
  bounds above still apply to it. Checked when a trace is held and by the ticker.

rmqtrace's own ``process``/``handler``/gap spans are written after the decision and never held, so
a bound can cost a kept message the user's spans (counted), never its own.

**Timer.** A ticker thread runs while anything is held or a policy has a pending decision: it
expires old traces and calls the attached policy's :meth:`~tracer.telemetry.keep.KeepPolicy.tick`,
so a job's latest finisher is settled when the job goes idle even if no message follows.
``force_flush()`` and ``shutdown()`` first settle the attached policies (keeping every pending
trace), then flush or shut down the wrapped processors; at shutdown what is still undecided is
dropped and counted (``shutdown``).

Install it in place of the processors it wraps::

    hold = HoldingSpanProcessor([BatchSpanProcessor(OTLPSpanExporter())])
    provider.add_span_processor(hold)
    tracer = MessageTracer(tracer_provider=provider, keep=KeepPolicy.from_env(), hold=hold)
"""

from __future__ import annotations

import logging
import random
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Final, Iterable, Mapping, Protocol, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from ..environ import environment
from ..path.clock import MonoNs, MonotonicClock, default_clock, require_clock, shared_clock
from ..path.propagation import span_context

__all__ = ["DROP_REASONS", "HoldStats", "HoldingSpanProcessor"]

log = logging.getLogger(__name__)

DEFAULT_MAX_SPANS = 20_000
DEFAULT_MAX_TRACES = 20_000
DEFAULT_MAX_AGE_S = 600.0
# Why spans were lost: a bound, the age limit, undecided at shutdown, their trace evicted (a span
# ending after the eviction), or their parent lost (exporting them would make orphans). A span
# ending after its trace was dropped on purpose is no loss: it counts in ``policy_dropped``.
DROP_REASONS: Final[tuple[str, ...]] = ("max_spans", "max_traces", "max_age", "shutdown", "dropped_trace", "parent_lost")
_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_LOW32: Final = 0xFFFF_FFFF
_RANDOM_IDS: Final = RandomIdGenerator  # a C static when compiled (tracer.compiled)
# Traces remembered after their decision: kept ones (their lost span ids, so late spans can join
# without orphans), evicted ones (so a late decision to keep still knows what was lost) and dropped
# foreign ones (ids without our check). Beyond this a late span of one of our traces is dropped
# with the policy's drops, never exported blind.
_REMEMBERED: Final = 4096
# Dropped traces whose spans are kept a little longer, so a later decision can still keep them
# (:meth:`HoldingSpanProcessor.revive`: a kept head-of-line victim keeps its blocker, whose
# decision came first). The oldest beyond either bound is forgotten for good.
RECENT_TRACES = 256
RECENT_SPANS = 4096


class _Policy(Protocol):
    def tick(self, now_ns: MonoNs | None = None) -> bool: ...
    def flush(self) -> None: ...
    def tick_interval_s(self) -> float: ...
    def busy(self) -> bool: ...
    wake: Callable[[], None] | None


@dataclass(frozen=True, slots=True)
class HoldStats:
    """A snapshot of what is held and what happened to held spans."""

    held_spans: int
    held_traces: int
    dropped: int  # spans lost, every reason
    forwarded: int  # held spans handed on when their trace was kept
    dropped_by_reason: Mapping[str, int] = field(default_factory=dict)  # spans, by DROP_REASONS
    # undecided traces lost to max_spans, max_traces, max_age, shutdown
    traces_evicted: Mapping[str, int] = field(default_factory=dict)
    # age of the oldest undecided trace the age limit applies to (its handler not running), by the
    # hold's clock
    oldest_held_s: float = 0.0
    # late spans of traces the keep policy dropped on purpose: not lost (not in ``dropped``), the
    # decision covers them as it covered the trace's held spans
    policy_dropped: int = 0
    revived: int = 0  # dropped traces kept after all (revive: a kept victim's blocker)
    ticking: bool = False  # the ticker thread runs (it stops when nothing is left to age or settle)


class _Held:
    __slots__ = ("spans", "lost", "since", "ours", "late", "running")

    def __init__(self, since: MonoNs, ours: bool, running: bool) -> None:
        self.spans: list[ReadableSpan] = []
        self.lost: set[int] = set()
        self.since = since  # when it was held, or when its handler returned (ran)
        self.ours = ours  # HoldingSpanProcessor.ours(its trace id), known when it was held
        self.running = running  # its handler runs: not aged (max_age) until ran()
        self.late = 0  # spans that ended after its drop (counted policy_dropped unless revived)


class HoldingSpanProcessor(SpanProcessor):
    """Forwards spans to ``processors``; holds those of traces opened or marked here.

    Raises:
        ValueError: for an empty processor list or bounds below 1.
        TypeError: ``clock`` has no ``monotonic_ns()`` (ages run on the monotonic clock).
    """

    def __init__(self, processors: Sequence[SpanProcessor], *, max_spans: int = DEFAULT_MAX_SPANS,
                 max_traces: int = DEFAULT_MAX_TRACES, max_age_s: float = DEFAULT_MAX_AGE_S,
                 on_dropped: Callable[[int], None] | None = None, clock: MonotonicClock | None = None,
                 ticker: bool = True, on_policy_dropped: Callable[[int], None] | None = None) -> None:
        if not processors:
            raise ValueError("HoldingSpanProcessor needs at least one span processor to forward to")
        if max_spans < 1 or max_traces < 1:
            raise ValueError("max_spans and max_traces must be at least 1")
        if not max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0 seconds, got {max_age_s!r}")
        self.processors = tuple(processors)
        self.max_spans = max_spans
        self.max_traces = max_traces
        self.max_age_ns = int(max_age_s * 1e9)
        self.on_dropped = on_dropped  # spans lost (bounds, age, shutdown, orphans)
        self.on_policy_dropped = on_policy_dropped  # late spans of dropped traces: not a loss
        self.policy_dropped = 0
        if clock is not None:
            require_clock(clock, "HoldingSpanProcessor(clock=)", monotonic=True)
        self.clock: MonotonicClock = clock or default_clock()
        self._clock_pinned = clock is not None
        self._salt = random.getrandbits(64)
        self._lock = threading.Lock()
        # trace id -> its held spans; insertion order = oldest undecided trace first
        self._held: dict[int, _Held] = {}
        self._n_spans = 0
        self._kept: OrderedDict[int, set[int]] = OrderedDict()  # decided kept: lost span ids
        self._evicted: OrderedDict[int, set[int]] = OrderedDict()  # lost undecided: their span ids
        # ids without our check (hold(), not open_trace) the policy dropped; ours need no table
        self._gone: OrderedDict[int, None] = OrderedDict()
        # dropped traces still revivable (RECENT_TRACES, RECENT_SPANS); oldest first
        self._recent: OrderedDict[int, _Held] = OrderedDict()
        self._n_recent = 0
        self.revived = 0
        self._drops = {r: 0 for r in DROP_REASONS}
        self._evictions = {r: 0 for r in ("max_spans", "max_traces", "max_age", "shutdown")}
        self.forwarded = 0
        self._policies: list[_Policy] = []
        self._ticker_on = ticker
        self._ticking = False
        self._closed = False
        # No undecided trace can be aged out before this (monotonic ns): a lower bound, lowered
        # whenever a trace starts aging and made exact by every scan, so holding a trace scans
        # for old ones only when one may be there (one scan a message cost a call and a list)
        self._expire_at = 0

    @property
    def dropped(self) -> int:
        with self._lock:
            return sum(self._drops.values())

    @classmethod
    def from_env(cls, processors: Sequence[SpanProcessor], env: Mapping[str, str] | None = None,
                 on_dropped: Callable[[int], None] | None = None,
                 on_policy_dropped: Callable[[int], None] | None = None) -> HoldingSpanProcessor:
        """Bounds from ``RMQTRACE_KEEP_HELD_SPANS`` (spans; undecided traces get the same bound)
        and ``RMQTRACE_KEEP_HELD_AGE`` (seconds).

        Raises:
            ValueError: naming the variable whose value is not a positive number.
        """
        e = environment() if env is None else env
        raw = e.get("RMQTRACE_KEEP_HELD_SPANS", "").strip()
        try:
            n = int(raw) if raw else DEFAULT_MAX_SPANS
        except ValueError:
            raise ValueError(f"RMQTRACE_KEEP_HELD_SPANS must be a positive integer, got {raw!r}") from None
        raw_age = e.get("RMQTRACE_KEEP_HELD_AGE", "").strip()
        try:
            age = float(raw_age) if raw_age else DEFAULT_MAX_AGE_S
        except ValueError:
            raise ValueError(f"RMQTRACE_KEEP_HELD_AGE must be seconds > 0, got {raw_age!r}") from None
        if not age > 0:
            raise ValueError(f"RMQTRACE_KEEP_HELD_AGE must be seconds > 0, got {raw_age!r}")
        return cls(processors, max_spans=n, max_traces=n, max_age_s=age, on_dropped=on_dropped,
                   on_policy_dropped=on_policy_dropped)

    # -- rmqtrace's side ----------------------------------------------------------------
    def share_clock(self, clock: MonotonicClock) -> None:
        """Age traces on ``clock``, the tracer's, the one its keep policy's timers run on.

        Raises:
            ValueError: this hold runs on another clock, given or taken before.
        """
        self.clock = shared_clock(self.clock, self._clock_pinned, clock, "HoldingSpanProcessor(clock=)")
        self._clock_pinned = True
        self._expire_at = 0  # read on another clock: scan at the next hold

    def attach(self, policy: _Policy) -> None:
        """Settle ``policy`` by time (the ticker) and at ``force_flush``/``shutdown``. Idempotent."""
        with self._lock:
            if any(p is policy for p in self._policies):
                return
            self._policies.append(policy)
        policy.wake = self._wake

    def ours(self, trace_id: int) -> bool:
        """Whether :meth:`open_trace` made this trace id (its low 32 bits check its high 96)."""
        return trace_id & _LOW32 == hash((trace_id >> 32, self._salt)) & _LOW32

    def hold(self, trace_id: int, *, running: bool = False) -> None:
        """Hold every span of ``trace_id`` that ends from now on, until :meth:`release`.
        ``running``: its handler runs now; it is not aged until :meth:`ran`."""
        self._hold(trace_id, False, running)

    def ran(self, trace_id: int) -> None:
        """The handler of a trace held ``running`` returned: its age counts from now. A no-op
        for a trace no longer held (decided, or evicted by a bound)."""
        now = self.clock.monotonic_ns()
        with self._lock:
            held = self._held.get(trace_id)
            if held is None or not held.running:
                return
            held.running = False
            held.since = now
            self._held[trace_id] = self._held.pop(trace_id)  # to the end: the table stays in age order
            if now + self.max_age_ns < self._expire_at:
                self._expire_at = now + self.max_age_ns

    def _hold(self, trace_id: int, fresh: bool, running: bool) -> None:
        """``fresh``: an id :meth:`open_trace` just drew (96 random bits), seen nowhere before."""
        now = self.clock.monotonic_ns()
        lost: list[tuple[str, _Held]] = []
        with self._lock:
            if trace_id in self._held:
                return
            if not fresh:
                self._gone.pop(trace_id, None)  # held again: it starts afresh
                self._kept.pop(trace_id, None)
                self._evicted.pop(trace_id, None)
            if now >= self._expire_at:
                self._expire_locked(now, lost)
            if len(self._held) >= self.max_traces:
                self._evict_oldest_locked("max_traces", lost)
            self._held[trace_id] = _Held(now, fresh or self.ours(trace_id), running)
            if not running and now + self.max_age_ns < self._expire_at:
                self._expire_at = now + self.max_age_ns
        if lost:
            self._count_lost(lost)
        if not self._ticking:  # _wake's own first test, without its call while the ticker runs
            self._wake()

    def open_trace(self, ids: IdGenerator, trace_state: TraceState | None = None, *,
                   running: bool = False) -> SpanContext:
        """A new sampled root context, its trace held (the trace a keep policy decides later).
        ``running``: its handler runs now; it is not aged until :meth:`ran`."""
        if type(ids) is _RANDOM_IDS:  # its ids drawn as it draws them, two method calls less
            high = (random.getrandbits(128) or ids.generate_trace_id()) >> 32
            span_id = random.getrandbits(64) or ids.generate_span_id()
        else:
            high = ids.generate_trace_id() >> 32
            span_id = ids.generate_span_id()
        trace_id = (high << 32) | (hash((high, self._salt)) & _LOW32)
        ctx = span_context(trace_id, span_id, False, _SAMPLED, trace_state)
        self._hold(trace_id, True, running)
        return ctx

    def release(self, trace_id: int, keep: bool) -> bool:
        """Forward the trace's held spans (``keep``) or forget them. Spans ending later join a
        kept trace (unless their parent was lost) and are dropped with a dropped one.

        Returns whether the trace was still held (False: evicted by a bound or the age limit, or
        released before; its lost spans are counted and later spans of it stay consistent)."""
        out: list[ReadableSpan] = []
        orphans = 0
        with self._lock:
            held = self._held.pop(trace_id, None)
            if held is None:
                evicted = self._evicted.pop(trace_id, None)
                if evicted is not None:
                    if keep:  # what it lost stays lost; our own spans and the rest may join
                        self._remember(self._kept, trace_id, evicted)
                    else:  # its late spans are the policy's drop now, not a loss
                        self._remember_gone(trace_id, self.ours(trace_id))
                return False
            self._n_spans -= len(held.spans)
            if not keep:  # a decided drop is the policy's to count, not a loss
                # kept for a while in case a later decision needs it (revive), then remembered
                # (ours too) so its late spans count as the policy's, not as lost
                recent = self._recent
                recent[trace_id] = held
                self._n_recent += len(held.spans)
                if len(recent) == RECENT_TRACES + 1 and self._n_recent <= RECENT_SPANS:
                    # _trim_recent_locked's one step when only the trace bound is passed (every
                    # drop once 256 are recent), inline
                    gone_id, gone = recent.popitem(last=False)
                    self._n_recent -= len(gone.spans)
                    if not gone.ours:
                        self._remember(self._gone, gone_id, None)
                else:
                    self._trim_recent_locked()
                return True
            out, orphans = self._keep_locked(trace_id, held)
        self._forward(out, orphans)
        return True

    def revive(self, trace_id: int) -> bool:
        """Keep a trace dropped a moment ago after all: its spans (also those ended since) are
        forwarded now, and later ones join it. False when it is no longer revivable (dropped
        longer ago than the last ``RECENT_TRACES`` / ``RECENT_SPANS``, or never held here)."""
        with self._lock:
            held = self._recent.pop(trace_id, None)
            if held is None:
                return False
            self._n_recent -= len(held.spans)
            self.policy_dropped -= held.late  # they leave after all
            self.revived += 1
            out, orphans = self._keep_locked(trace_id, held)
        self._forward(out, orphans)
        return True

    def _keep_locked(self, trace_id: int, held: _Held) -> tuple[list[ReadableSpan], int]:
        lost = held.lost
        if lost:
            out, orphans = _without_orphans(held.spans, lost)
        else:
            out, orphans = held.spans, 0
        self._remember(self._kept, trace_id, lost)
        self._drops["parent_lost"] += orphans
        self.forwarded += len(out)
        return out, orphans

    def _forward(self, out: list[ReadableSpan], orphans: int) -> None:
        for span in out:
            for p in self.processors:
                p.on_end(span)
        if orphans:
            self._notify(orphans)

    def _trim_recent_locked(self) -> None:
        recent = self._recent
        while recent and (len(recent) > RECENT_TRACES or self._n_recent > RECENT_SPANS):
            trace_id, held = recent.popitem(last=False)
            self._n_recent -= len(held.spans)
            self._remember_gone(trace_id, held.ours)

    def expire(self, now_ns: MonoNs | None = None) -> int:
        """Evict undecided traces older than ``max_age_s``; how many."""
        now = self.clock.monotonic_ns() if now_ns is None else now_ns
        lost: list[tuple[str, _Held]] = []
        with self._lock:
            self._expire_locked(now, lost)
        if lost:
            self._count_lost(lost)
        return len(lost)

    def tick(self, now_ns: MonoNs | None = None) -> bool:
        """One round of the ticker: expire old traces, settle idle jobs; True while work remains."""
        self.expire(now_ns)
        busy = False
        for policy in list(self._policies):
            try:
                busy = policy.tick(now_ns) or busy
            except Exception:  # noqa: BLE001 - a broken policy must not stop the ticker
                log.exception("rmqtrace: the keep policy's tick failed")
        with self._lock:
            return busy or bool(self._held)

    def statistics(self) -> HoldStats:
        now = self.clock.monotonic_ns()
        with self._lock:
            drops = dict(self._drops)
            since = next((h.since for h in self._held.values() if not h.running), now)
            oldest = (now - since) / 1e9
            return HoldStats(self._n_spans, len(self._held), sum(drops.values()), self.forwarded, drops,
                             dict(self._evictions), oldest, self.policy_dropped, self.revived, self._ticking)

    def holds(self, trace_id: int) -> bool:
        """Whether the spans of ``trace_id`` are held now (between :meth:`hold` and its release or eviction)."""
        with self._lock:
            return trace_id in self._held


    # -- internals (under self._lock unless said) -----------------------------------------
    def _remember(self, table: OrderedDict[int, Any], trace_id: int, value: Any) -> None:
        table[trace_id] = value
        if len(table) > _REMEMBERED:
            table.popitem(last=False)

    def _remember_gone(self, trace_id: int, ours: bool) -> None:
        """A dropped trace forgotten by :meth:`revive`: ours are known by their check, no table."""
        if not ours:
            self._remember(self._gone, trace_id, None)

    def _expire_locked(self, now: int, lost: list[tuple[str, _Held]]) -> None:
        limit = now - self.max_age_ns
        old = []
        # the traces left are younger than the first one past the limit: none ages out before it does
        expire_at = sys.maxsize
        for trace_id, h in self._held.items():  # in age order (ran() moves a trace to the end)
            if h.since > limit:
                expire_at = h.since + self.max_age_ns
                break
            if not h.running:  # a running handler's trace is not aged
                old.append(trace_id)
        self._expire_at = expire_at
        for trace_id in old:
            self._evict_locked(trace_id, "max_age", lost)

    def _evict_oldest_locked(self, reason: str, lost: list[tuple[str, _Held]], spare: int = 0) -> bool:
        for trace_id in self._held:
            if trace_id != spare:
                self._evict_locked(trace_id, reason, lost)
                return True
        return False

    def _evict_locked(self, trace_id: int, reason: str, lost: list[tuple[str, _Held]]) -> None:
        held = self._held.pop(trace_id)
        self._n_spans -= len(held.spans)
        ids = held.lost
        ids.update(s.context.span_id for s in held.spans if s.context is not None)
        self._remember(self._evicted, trace_id, ids)
        self._evictions[reason] += 1
        self._drops[reason] += len(held.spans)
        lost.append((reason, held))

    def _count_lost(self, lost: Iterable[tuple[str, _Held]]) -> None:
        n = sum(len(h.spans) for _r, h in lost)
        if n:
            self._notify(n)

    def _notify(self, n: int) -> None:
        if self.on_dropped is not None:
            self.on_dropped(n)

    def _notify_policy(self, n: int) -> None:
        if self.on_policy_dropped is not None:
            self.on_policy_dropped(n)

    def _wake(self) -> None:
        """Start the ticker thread unless it runs (it stops itself when nothing is left)."""
        if not self._ticker_on or self._closed or self._ticking:  # the common case, no lock
            return
        with self._lock:
            if self._ticking:
                return
            self._ticking = True
        threading.Thread(target=self._run_ticker, name="rmqtrace-hold-ticker", daemon=True).start()

    def _interval_s(self) -> float:
        period = min(1.0, self.max_age_ns / 4e9)
        for p in self._policies:
            period = min(period, p.tick_interval_s())
        return max(period, 0.01)

    def _run_ticker(self) -> None:
        stop = threading.Event()
        while not self._closed:
            stop.wait(self._interval_s())
            try:
                more = self.tick()
            except Exception:  # noqa: BLE001
                log.exception("rmqtrace: the hold's ticker failed")
                more = True
            if not more:
                with self._lock:
                    idle = not self._held  # rechecked under the lock: hold() may have just added one
                    if idle:
                        self._ticking = False
                if not idle:  # (no `continue` inside the lock's block: mypyc cannot compile one)
                    continue
                # a decision may have gone pending between the tick and now: its wake saw us running
                if any(p.busy() for p in list(self._policies)):
                    self._wake()
                return

    # -- the SDK's side -----------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        for p in self.processors:
            p.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if ctx is None:
            return
        trace_id = ctx.trace_id
        parent = span.parent.span_id if span.parent is not None else 0
        lost: list[tuple[str, _Held]] = []
        with self._lock:
            held = self._held.get(trace_id)
            if held is not None:
                if parent in held.lost:
                    held.lost.add(ctx.span_id)
                    self._drops["parent_lost"] += 1
                    drop = 1
                else:
                    if self._n_spans >= self.max_spans:
                        self._evict_oldest_locked("max_spans", lost, spare=trace_id)
                    if self._n_spans < self.max_spans:
                        held.spans.append(span)
                        self._n_spans += 1
                        drop = 0
                    else:  # this trace alone fills the bound
                        held.lost.add(ctx.span_id)
                        self._drops["max_spans"] += 1
                        drop = 1
                passing = False
            else:
                drop, passing = self._late_locked(trace_id, ctx.span_id, parent, span)
        if lost:
            self._count_lost(lost)
        if drop < 0:  # a late span of a trace the policy dropped
            self._notify_policy(-drop)
        elif drop:
            self._notify(drop)
        if passing:
            for p in self.processors:
                p.on_end(span)

    def _late_locked(self, trace_id: int, span_id: int, parent: int, span: ReadableSpan) -> tuple[int, bool]:
        """A span of no held trace: (spans lost, pass it on); -1 spans: the policy's drop."""
        kept = self._kept.get(trace_id)
        if kept is not None:
            if parent in kept:
                kept.add(span_id)
                self._drops["parent_lost"] += 1
                return 1, False
            return 0, True
        evicted = self._evicted.get(trace_id)
        if evicted is not None:
            evicted.add(span_id)
            self._drops["dropped_trace"] += 1
            return 1, False
        recent = self._recent.get(trace_id)
        if recent is not None:  # dropped, still revivable: it waits with its trace
            recent.spans.append(span)
            recent.late += 1
            self._n_recent += 1
            self.policy_dropped += 1
            self._trim_recent_locked()
            return -1, False
        if trace_id in self._gone or self.ours(trace_id):
            # its trace was dropped on purpose (ours and neither kept nor evicted: dropped, however
            # long ago): a late span goes with it, the policy's drop, never exported blind
            self.policy_dropped += 1
            return -1, False
        return 0, True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._settle_policies()
        return all(p.force_flush(timeout_millis) for p in self.processors)

    def shutdown(self) -> None:
        self._settle_policies()
        lost: list[tuple[str, _Held]] = []
        with self._lock:
            self._closed = True
            for trace_id in list(self._held):
                self._evict_locked(trace_id, "shutdown", lost)
            while self._recent:
                trace_id, held = self._recent.popitem(last=False)
                self._remember_gone(trace_id, held.ours)
            self._n_recent = 0
        self._count_lost(lost)
        for p in self.processors:
            p.shutdown()

    def _settle_policies(self) -> None:
        for policy in list(self._policies):
            try:
                policy.flush()
            except Exception:  # noqa: BLE001
                log.exception("rmqtrace: settling the keep policy failed")


def _without_orphans(spans: list[ReadableSpan], lost: set[int]) -> tuple[list[ReadableSpan], int]:
    """The spans whose ancestry avoids ``lost`` (which grows by the others), and how many were not."""
    keep = spans
    while True:
        nxt = []
        for s in keep:
            if s.parent is not None and s.parent.span_id in lost:
                if s.context is not None:
                    lost.add(s.context.span_id)
            else:
                nxt.append(s)
        if len(nxt) == len(keep):
            return nxt, len(spans) - len(nxt)
        keep = nxt
