"""Which consumer traces to keep, decided in-process at handler end with every gap known.

A collector's tail sampler decides per trace after a fixed wait and sees a trace's latency as its
earliest start to latest end. rmqtrace writes the consumer spans after the fact, so it can decide
when the handler ends, with the real gaps in hand. :class:`KeepPolicy` keeps a message's whole
consumer trace when

- the head decision sampled it (the producer's ``send`` span is recorded: dropping the consumer
  part would leave half a trace) — ``OTEL_TRACES_SAMPLER``/``_ARG`` keep their meaning;
- it failed or timed out (always);
- its consume loop lost its lease while holding it (``lease_lost``, always: the redelivery's
  span links to it, so the run that may have gone twice is there to see);
- a gap exceeded its threshold: an absolute number of seconds, or "the slowest X % of the last
  interval" judged against a streaming estimate of the previous interval;
- it is the first message of a job seen here (earliest produce stamp) or, held until the job is
  idle, the job's latest finisher — so a sampled recording still gives each job's completion time
  and critical path;
- a background probability picks it;
- it blocked a kept message (``blocker``: the head-of-line blocker a kept victim's blame links
  to, kept even when judged alone it was dropped a moment before — within the hold's
  ``RECENT_TRACES``/``RECENT_SPANS``; past them the victim's link is left out and counted,
  ``blockers_unkept``, so a kept link never dangles);

and drops the rest. Histograms stay complete whatever is kept; exemplars point only at kept
traces.

**When the producer did not sample a message that turns out slow**, its ``send`` span was never
recorded. The kept consumer trace is then a *new trace* whose root is ``process {topic}``, with
a span link to the producer's context (the messaging conventions' creation link), instead of a
child of the unrecorded ``send`` span. Jaeger shows the link as a ``FOLLOWS_FROM`` reference into
the producer's trace id, and the trace has a proper root; a span whose parent was never recorded
gets Jaeger's ``invalid parent span IDs=…; skipping clock skew adjustment`` warning and no root
(``tests/test_keep_jaeger.py`` checks both on the real Jaeger). A fresh trace id also keys the
held spans uniquely when one producer trace sent many messages.

Limits: until the decision the handler's context is sampled, so what the handler propagates
(a message it sends, an HTTP call) is recorded downstream even when this trace is dropped — the
downstream trace then has a parent that was never exported. While the decision is pending,
rmqtrace's own ``process``/``handler`` are not live spans: the handler runs under a sampled
non-recording context carrying their pre-allocated ids, processors see no ``on_start`` for them
(the user's spans get theirs as usual), and they are written, with those ids, only if the trace is
kept. The user's spans are held and reach the processors' ``on_end`` only when kept.

Environment (parsed by :meth:`KeepPolicy.from_env`; its callers hand it and the hold one reading,
:func:`tracer.telemetry.tracerconfig.keep_variables`, at an entry point, never at import; none set:
no policy; docs/telemetry.md lists them): ``RMQTRACE_KEEP_DISPATCH_WAIT``, ``_CLIENT_BUFFER``,
``_CONSUMER_WAIT``, ``_END_TO_END`` (a threshold: seconds, ``250ms``, or a share of the slowest,
``1%``); ``_BACKGROUND`` (probability, 0); ``_INTERVAL`` (s per estimate interval, 60); ``_JOB_IDLE``
(s, 30); ``_MAX_JOBS`` (jobs tracked at once, 10000: past it the oldest is settled, kept);
``_HELD_SPANS`` and ``_HELD_AGE`` (the hold's bounds: 20000 spans, 600 s; see
:meth:`tracer.telemetry.hold.HoldingSpanProcessor.from_env`).

**Settling by time.** A job's latest finisher is held until the job has been idle for
``job_idle_s``; a timer (:meth:`KeepPolicy.tick`, run by the hold's ticker thread while anything
is pending) settles it even when no further message arrives, and the provider's ``force_flush()``
and ``shutdown()`` settle every pending one as kept (:meth:`KeepPolicy.flush`): the latest finisher
*so far* — a job still running after a flush may keep a second, later one.

**Counting.** Every message decided is kept (by reason), dropped (by reason: ``unremarkable``,
``superseded`` — a later finisher of its job took its place, ``not_handled`` — finished without a
handler run, so there was nothing to keep) or pending: ``messages = kept + dropped + pending``.
"""

from __future__ import annotations

import math
import random
import re
import threading
from dataclasses import dataclass, field
from typing import Callable, Final, Mapping, Sequence

from ..compiled import mypyc_attr
from ..environ import environment
from ..path.clock import MonoNs, MonotonicClock, default_clock, require_clock, shared_clock
from ..path.stages import GAP_BY_NAME, Outcome, Stage

__all__ = [
    "DROP_REASONS", "KEEP_GAPS", "PENDING", "REASONS", "KeepPolicy", "KeepStats", "Slowest", "parse_threshold",
]

# Gaps a threshold may be set on: the consumer-side waits and what the user feels.
KEEP_GAPS: Final[tuple[str, ...]] = ("dispatch_wait", "client_buffer", "consumer_wait", "end_to_end")
# Why a message was kept; PENDING means "held as its job's latest finisher, settled later".
REASONS: Final[tuple[str, ...]] = ("head", "failure", "lease_lost", "slow", "job_start", "critical_path", "background",
                            "blocker")
PENDING: Final = "pending"
# Why a message was not kept.
DROP_REASONS: Final[tuple[str, ...]] = ("unremarkable", "superseded", "not_handled")

_ENV_GAPS: Final = {f"RMQTRACE_KEEP_{g.upper()}": g for g in KEEP_GAPS}
_SECONDS_RE: Final = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)?\s*$")
_PERCENT_RE: Final = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")
# Streaming estimate: log-spaced buckets, 8 per doubling (9 % wide), 1 µs … ~12 days.
_PER_OCTAVE: Final = 8
_N_BUCKETS: Final = 40 * _PER_OCTAVE
_FLOOR_NS: Final = 1_000
# Read per message: module constants, not Enum members off their class (a descriptor call each).
_PRODUCE: Final = int(Stage.PRODUCE)
_END: Final = int(Stage.HANDLER_END)
_FAILURE: Final = Outcome.FAILURE
_TIMEOUT: Final = Outcome.TIMEOUT


@dataclass(frozen=True)
class Slowest:
    """Keep the slowest ``percent`` % of a gap, judged against the previous interval's estimate."""

    percent: float

    def __post_init__(self) -> None:
        if not 0.0 < self.percent < 100.0:
            raise ValueError(f"Slowest(percent) must be between 0 and 100, got {self.percent!r}")


def parse_threshold(text: str) -> float | Slowest:
    """``"0.5"``/``"0.5s"``/``"250ms"`` → seconds; ``"1%"`` → :class:`Slowest` (1 %).

    Raises:
        ValueError: for anything else.
    """
    m = _PERCENT_RE.match(text)
    if m:
        return Slowest(float(m.group(1)))
    m = _SECONDS_RE.match(text)
    if m:
        value = float(m.group(1))
        return value / 1000.0 if m.group(2) == "ms" else value
    raise ValueError(f"a keep threshold is seconds ('0.5', '250ms') or a share ('1%'), got {text!r}")


@dataclass(frozen=True, slots=True)
class KeepStats:
    """A snapshot of what the policy decided (``kept`` counts settled keeps only):
    ``messages == kept + dropped + pending``."""

    messages: int
    kept: int
    dropped: int
    pending: int
    slow: int  # messages over a threshold (all of them kept)
    by_reason: Mapping[str, int]
    dropped_by_reason: Mapping[str, int] = field(default_factory=dict)
    blockers_unkept: int = 0  # kept victims whose blocker could not be kept: their blame link left out


class _Estimate:
    """Bucket counts of one gap in the current interval; the threshold comes from the last one.

    Counts are bumped without a lock: a lost increment under a race only blurs an estimate."""

    __slots__ = ("share", "counts", "threshold_ns")

    def __init__(self, share: float) -> None:
        self.share = share
        self.counts = [0] * (_N_BUCKETS + 1)
        self.threshold_ns: int | None = None  # none until one interval has been seen

    def add(self, v_ns: int) -> None:
        if v_ns <= _FLOOR_NS:
            self.counts[0] += 1
            return
        i = int(math.log2(v_ns / _FLOOR_NS) * _PER_OCTAVE) + 1
        self.counts[i if i < _N_BUCKETS else _N_BUCKETS] += 1

    def roll(self) -> None:
        counts, self.counts = self.counts, [0] * (_N_BUCKETS + 1)
        total = sum(counts)
        if not total:
            return  # an empty interval keeps the last estimate
        # The bucket holding the (1 - share) quantile; its upper edge is the threshold, so the
        # kept share is at most `share` (one bucket's width below it is not kept).
        allowed = total * self.share
        above = 0
        for i in range(_N_BUCKETS, -1, -1):
            above += counts[i]
            if above > allowed:
                self.threshold_ns = int(_FLOOR_NS * 2 ** (i / _PER_OCTAVE)) if i else _FLOOR_NS
                return


class _Job:
    __slots__ = ("first_produce", "last_end", "seen_ns", "pending")

    def __init__(self) -> None:
        self.first_produce = 0
        self.last_end = 0
        self.seen_ns = 0
        self.pending: Callable[[bool], None] | None = None


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (tracer.compiled), an application's policy may extend it
class KeepPolicy:
    """The keep decision for one consumer process (thread-safe; one per tracer or shared).

    ``thresholds`` maps a gap in :data:`KEEP_GAPS` to seconds or :class:`Slowest`. ``rng`` and
    the stamps passed to :meth:`decide` are its only inputs, so tests drive it deterministically.

    Raises:
        ValueError: for an unknown gap, a negative threshold, a probability outside 0–1 or a
            non-positive interval, idle time or job bound.
        TypeError: ``clock`` has no ``monotonic_ns()`` (the timers run on the monotonic clock).
    """

    def __init__(self, thresholds: Mapping[str, float | Slowest] | None = None, *, background: float = 0.0,
                 interval_s: float = 60.0, job_idle_s: float = 30.0, max_jobs: int = 10_000,
                 rng: random.Random | None = None, clock: MonotonicClock | None = None) -> None:
        if not 0.0 <= background <= 1.0:
            raise ValueError(f"background must be a probability in [0, 1], got {background!r}")
        if interval_s <= 0 or job_idle_s <= 0 or max_jobs < 1:
            raise ValueError("interval_s and job_idle_s must be > 0 and max_jobs >= 1")
        self.background = background
        self.interval_ns = int(interval_s * 1e9)
        self.job_idle_ns = int(job_idle_s * 1e9)
        self.max_jobs = max_jobs
        # Read by tick(); the finishes' ``end_mono`` is on it too (the tracer's clock in tests).
        if clock is not None:
            require_clock(clock, "KeepPolicy(clock=)", monotonic=True)
        self.clock: MonotonicClock = clock or default_clock()
        self._clock_pinned = clock is not None
        # Called when a job's latest finisher becomes pending, so a timer will settle it (hold.py).
        self.wake: Callable[[], None] | None = None
        self._random = (rng or random.Random()).random
        absolute: list[tuple[int, int, int]] = []
        estimates: list[tuple[int, int, _Estimate]] = []
        for gap_name, limit in (thresholds or {}).items():
            if gap_name not in KEEP_GAPS:
                raise ValueError(f"no keep threshold for gap {gap_name!r}; choose from {', '.join(KEEP_GAPS)}")
            gap = GAP_BY_NAME[gap_name]
            if isinstance(limit, Slowest):
                estimates.append((int(gap.start), int(gap.end), _Estimate(limit.percent / 100.0)))
            elif isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit >= 0:
                absolute.append((int(gap.start), int(gap.end), int(limit * 1e9)))
            else:
                raise ValueError(f"threshold for {gap_name} must be seconds >= 0 or Slowest(%), got {limit!r}")
        self.thresholds = dict(thresholds or {})
        self._absolute = tuple(absolute)
        self._estimates = tuple(estimates)
        self._interval_end = 0
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}  # insertion order = least recently finished first
        self._next_sweep = 0
        self._counts = {r: 0 for r in REASONS}
        self._messages = 0
        self._drops = {r: 0 for r in DROP_REASONS}
        self._slow = 0
        self._pending = 0
        self._blockers_unkept = 0
        self._latest_ns = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, rng: random.Random | None = None) -> KeepPolicy | None:
        """The policy the ``RMQTRACE_KEEP_*`` variables describe, or None when none is set.

        Raises:
            ValueError: naming the variable whose value cannot work.
        """
        e = environment() if env is None else env
        if not any(k.startswith("RMQTRACE_KEEP_") and v.strip() for k, v in e.items()):
            return None
        thresholds: dict[str, float | Slowest] = {}
        for var, gap in _ENV_GAPS.items():
            if e.get(var, "").strip():
                try:
                    thresholds[gap] = parse_threshold(e[var])
                except ValueError as exc:
                    raise ValueError(f"{var}: {exc}") from None

        def number(var: str, default: float) -> float:
            raw = e.get(var, "").strip()
            try:
                return float(raw) if raw else default
            except ValueError:
                raise ValueError(f"{var} must be a number, got {raw!r}") from None

        return cls(thresholds, background=number("RMQTRACE_KEEP_BACKGROUND", 0.0),
                   interval_s=number("RMQTRACE_KEEP_INTERVAL", 60.0),
                   job_idle_s=number("RMQTRACE_KEEP_JOB_IDLE", 30.0),
                   max_jobs=int(number("RMQTRACE_KEEP_MAX_JOBS", 10_000)), rng=rng)

    def decide(self, times: Sequence[int], outcome: Outcome, job_id: str | None = None, *,
               head: bool = False, settle: Callable[[bool], None] | None = None,
               end_mono: MonoNs | None = None, flag: str | None = None) -> str | None:
        """Decide one finished message from its stamps: a reason in :data:`REASONS` (keep it now),
        :data:`PENDING` (``settle(keep)`` will be called later, once, from some later call of
        this policy or :meth:`flush`), or None (drop it).

        ``head`` says the head sampler kept it already; it is still counted and fed to the
        estimates, so thresholds and the critical path see every message. ``flag``: a reason in
        :data:`REASONS` the caller already knows (``lease_lost``), kept like a failure.

        ``end_mono``: the handler end on :attr:`clock` (the monotonic clock), which the job-idle
        and interval timers run on, as :meth:`tick` does; without it the handler-end stamp stands
        in (a caller that drives the policy and its ticks on one clock of its own).

        Raises:
            ValueError: ``flag`` is not one of :data:`REASONS`."""
        if flag is not None and flag not in self._counts:
            raise ValueError(f"keep flag must be one of {', '.join(REASONS)}, got {flag!r}")
        now = times[_END]
        if now and end_mono is not None:
            now = end_mono
        if not now:
            return self._not_handled(flag)
        if now >= self._interval_end:
            self._roll(now)
        slow = self._slow_gap(times)
        if head:
            reason: str | None = "head"
        elif outcome is _FAILURE or outcome is _TIMEOUT:
            reason = "failure"
        elif flag is not None:
            reason = flag
        elif slow:
            reason = "slow"
        elif self.background and self._random() < self.background:
            reason = "background"
        else:
            reason = None
        settled: list[tuple[Callable[[bool], None], bool]] = []
        with self._lock:
            self._messages += 1
            if slow:
                self._slow += 1
            if job_id:
                reason = self._job(job_id, times, now, reason, settle, settled)
            if now >= self._next_sweep:
                self._sweep(now, settled)
            if reason is None:
                self._drops["unremarkable"] += 1
            elif reason is not PENDING:
                self._counts[reason] += 1
        if reason is PENDING and self.wake is not None:
            self.wake()
        for fn, keep in settled:
            fn(keep)
        return reason

    def _not_handled(self, flag: str | None) -> str | None:
        """Never handled: nothing to judge, kept only for what the caller knows (a lost lease's ``flag``)."""
        with self._lock:
            self._messages += 1
            if flag is None:
                self._drops["not_handled"] += 1
                return None
            self._counts[flag] += 1
        return flag

    def _slow_gap(self, times: Sequence[int]) -> bool:
        """Whether a gap passed its threshold (absolute, or its estimate's, which every gap feeds)."""
        slow = False
        for a, b, limit in self._absolute:
            if times[a] and times[b] and times[b] - times[a] > limit:
                slow = True
        for a, b, est in self._estimates:
            if times[a] and times[b]:
                v = times[b] - times[a]
                est.add(v)
                t = est.threshold_ns
                if t is not None and v > t:
                    slow = True
        return slow

    def _job(self, job_id: str, times: Sequence[int], now: int, reason: str | None,
             settle: Callable[[bool], None] | None, settled: list[tuple[Callable[[bool], None], bool]]) -> str | None:
        jobs = self._jobs
        job = jobs.pop(job_id, None)  # re-inserted below: dict order stays least recent first
        produce = times[_PRODUCE]
        if job is None:
            if len(jobs) >= self.max_jobs:
                self._retire(next(iter(jobs)), settled)
            job = _Job()
            job.first_produce = produce
            if reason is None:
                reason = "job_start"
        elif produce and (not job.first_produce or produce < job.first_produce):
            job.first_produce = produce
            if reason is None:
                reason = "job_start"
        # Idle is measured from the latest handler end seen by then (monotone in the jobs' order,
        # so a sweep stops at the first busy job correctly even when a late finish has old stamps).
        if now > self._latest_ns:
            self._latest_ns = now
        job.seen_ns = self._latest_ns
        jobs[job_id] = job
        if now < job.last_end:
            return reason  # finished before the job's latest: not on the critical path
        job.last_end = now
        if job.pending is not None:
            settled.append((job.pending, False))  # a later finisher takes its place
            job.pending = None
            self._pending -= 1
            self._drops["superseded"] += 1
        if reason is None and settle is not None:
            job.pending = settle
            self._pending += 1
            return PENDING
        return reason

    def _retire(self, job_id: str, settled: list[tuple[Callable[[bool], None], bool]]) -> None:
        job = self._jobs.pop(job_id)
        if job.pending is not None:
            settled.append((job.pending, True))
            self._pending -= 1
            self._counts["critical_path"] += 1

    def _sweep(self, now: int, settled: list[tuple[Callable[[bool], None], bool]]) -> None:
        """Keep the latest finisher of every job idle for ``job_idle_s``; checked about once a second."""
        self._next_sweep = now + 1_000_000_000
        jobs = self._jobs
        while jobs:
            job_id = next(iter(jobs))
            if now - jobs[job_id].seen_ns < self.job_idle_ns:
                break
            self._retire(job_id, settled)

    def _roll(self, now: int) -> None:
        with self._lock:
            if now < self._interval_end:
                return
            if self._interval_end:
                for _a, _b, est in self._estimates:
                    est.roll()
            self._interval_end = now + self.interval_ns

    def tick(self, now_ns: MonoNs | None = None) -> bool:
        """Settle (keep) the latest finisher of every job idle for ``job_idle_s`` at ``now_ns``
        (default: :attr:`clock`), whether or not another message finished; True while any is
        still pending. The hold's ticker calls it; tests call it with their clock."""
        now = self.clock.monotonic_ns() if now_ns is None else now_ns
        settled: list[tuple[Callable[[bool], None], bool]] = []
        with self._lock:
            if self._jobs:
                self._sweep(now, settled)  # idle jobs retire by time, pending finisher or not
            pending = self._pending > 0
        for fn, keep in settled:
            fn(keep)
        return pending

    def share_clock(self, clock: MonotonicClock) -> None:
        """Run the timers on ``clock``, the tracer's (its finishes' ``end_mono`` are read on it).

        Raises:
            ValueError: this policy runs on another clock, given or taken before.
        """
        self.clock = shared_clock(self.clock, self._clock_pinned, clock, "KeepPolicy(clock=)")
        self._clock_pinned = True

    def busy(self) -> bool:
        """Whether a job's latest finisher waits to be settled (the ticker keeps running)."""
        return self._pending > 0

    def tick_interval_s(self) -> float:
        """How often :meth:`tick` should run: a fraction of the idle time, at most a second."""
        return min(1.0, self.job_idle_ns / 4e9)

    def flush(self) -> None:
        """Settle every job's held latest finisher as kept (at shutdown, or when a run ends)."""
        settled: list[tuple[Callable[[bool], None], bool]] = []
        with self._lock:
            for job_id in list(self._jobs):
                self._retire(job_id, settled)
        for fn, keep in settled:
            fn(keep)

    def statistics(self) -> KeepStats:
        """A frozen snapshot of the policy's decisions so far."""
        with self._lock:
            counts, drops = dict(self._counts), dict(self._drops)
            return KeepStats(self._messages, sum(counts.values()), sum(drops.values()), self._pending, self._slow,
                             counts, drops, self._blockers_unkept)

    def kept_after_all(self, reason: str, was: str = "unremarkable") -> None:
        """A message this policy dropped (``was``: its drop reason) is kept after all (``reason``:
        ``blocker``); the counts stay ``messages == kept + dropped + pending``."""
        with self._lock:
            if self._drops[was] > 0:
                self._drops[was] -= 1
                self._counts[reason] += 1

    def blocker_unkept(self) -> None:
        """A kept victim's blocker could not be kept (its link is left out)."""
        with self._lock:
            self._blockers_unkept += 1

    def slow_threshold_s(self, gap: str) -> float | None:
        """The threshold in force for ``gap`` (seconds): the absolute one, or the estimate from
        the last interval (None before one has passed or when the gap has none)."""
        g = GAP_BY_NAME[gap]
        for a, b, limit in self._absolute:
            if (a, b) == (int(g.start), int(g.end)):
                return limit / 1e9
        for a, b, est in self._estimates:
            if (a, b) == (int(g.start), int(g.end)):
                return None if est.threshold_ns is None else est.threshold_ns / 1e9
        return None
