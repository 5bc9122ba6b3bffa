"""Prometheus series for the stage gaps, outcomes, clock skew and propagation errors.

Every series has bounded labels: gap names and outcomes are fixed sets; topics and consumer
groups come from configuration but are still capped, jointly, by :class:`PairLabels` so a program
that creates topics or groups on the fly cannot blow up the series count. Message ids never become
labels — they reach Prometheus only as exemplar trace ids.

A registry holds one :class:`TracerMetrics` (:class:`~tracer.telemetry.registration.OnePerRegistry`,
the base of every rmqtrace collector, refuses a second): build it once and share it, or use
:meth:`TracerMetrics.shared`.

Prometheus multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set, gunicorn-style workers) keeps
values in files that a :class:`prometheus_client.multiprocess.MultiProcessCollector` reads; a
custom collector's in-memory series would be lost there, so the stage histogram and the outcome
counter are then the stock ``Histogram`` and ``Counter``. Limits in that mode, all
prometheus-client's: no exemplars, a little more cost per observation (a lock and a file write per
gap), and the skew gauge keeps the minimum over live processes (``multiprocess_mode="livemin"``).
The joint label cap is then shared by the directory's processes (``PairLabels(shared=)``), so it
holds in the aggregate.
"""

from __future__ import annotations

import json
import math
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Callable, Final, Iterator, Sequence

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from ..path.names import LEASE_LOST_REASONS
from ..path.stages import GAP_INDEX, GAPS, Outcome
from .registration import OnePerRegistry, SharedAdmission, multiprocess_dir

__all__ = ["DEFAULT_BUCKETS", "OTHER", "BoundedLabel", "MetricsStats", "OnePerRegistry", "PairLabels", "TracerMetrics",
           "multiprocess_dir"]

# The one bucket list of the duration family (stage gaps, dispatch waits, the OTel stage
# histogram): 1 ms … 10 min, a handler of a huge test-case group runs for minutes, a send takes ms.
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
OTHER = "other"
MAX_LABEL_CHARS = 200
_STAGE_HELP = ("Time a message spent in each stage gap (send, broker_wait, client_buffer, dispatch_wait, "
               "handler, end_to_end).")
_MESSAGES_HELP = "Messages whose handling ended, by outcome."


def _label_value(value: str | None) -> str:
    """A label value the exposition can write and a reader can use; anything else is ``other``."""
    v = value or ""
    if len(v) > MAX_LABEL_CHARS:
        return OTHER
    try:
        v.encode("utf-8")  # a lone surrogate would break every scrape
    except UnicodeEncodeError:
        return OTHER
    return v


def _admission(shared: str | None, limit: int) -> Callable[[str], bool] | None:
    """In multiprocess mode, a cap shared by every process of the directory (see SharedAdmission)."""
    path = multiprocess_dir() if shared else None
    return SharedAdmission(path, shared, limit) if path and shared else None


class BoundedLabel:
    """Passes the first ``limit`` distinct values through, maps every later one to ``other``.

    ``shared``: a name for the cap; under ``PROMETHEUS_MULTIPROC_DIR`` the first ``limit`` values
    are counted over every process writing to the directory, so the cap holds in the aggregate.
    """

    def __init__(self, limit: int = 64, *, shared: str | None = None) -> None:
        if limit < 1:
            raise ValueError(f"label limit must be at least 1, got {limit}")
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._admit = _admission(shared, limit)

    def __call__(self, value: str | None) -> str:
        v = _label_value(value)
        if v in self._seen:
            return v
        with self._lock:
            if v in self._seen:
                return v
            if v == OTHER:
                return OTHER
            if self._admit is not None:
                if not self._admit(v):
                    return OTHER
            elif len(self._seen) >= self.limit:
                return OTHER
            self._seen.add(v)
            return v


class PairLabels:
    """Caps the set of (topic, consumer_group) label pairs, not each label alone.

    The first ``limit`` distinct pairs pass through (a value that cannot be a label, see
    :data:`MAX_LABEL_CHARS`, becomes ``other`` first). A later pair keeps its group, itself capped
    at ``limit`` distinct groups, and gets the topic ``other``: the overflow adds at most one pair
    per group, so there are never more than ``2 * limit + 1`` pairs whatever the names.

    ``shared``: as for :class:`BoundedLabel`, both caps then hold over every process of a
    Prometheus multiprocess directory.
    """

    def __init__(self, limit: int = 64, *, shared: str | None = None) -> None:
        if limit < 1:
            raise ValueError(f"label limit must be at least 1, got {limit}")
        self.limit = limit
        self._direct: set[tuple[str, str]] = set()
        self._overflow_groups = BoundedLabel(limit, shared=f"{shared}_groups" if shared else None)
        self._admit = _admission(f"{shared}_pairs" if shared else None, limit)
        self._lock = threading.Lock()

    def __call__(self, topic: str | None, group: str | None) -> tuple[str, str]:
        pair = (topic or "", group or "")
        if pair in self._direct:
            return pair
        with self._lock:
            key = (_label_value(pair[0]), _label_value(pair[1]))
            if key in self._direct:
                return key
            if self._admit is not None:
                admitted = self._admit(json.dumps(key))
            else:
                admitted = len(self._direct) < self.limit
            if admitted:
                self._direct.add(key)
                return key
        return (OTHER, self._overflow_groups(key[1]))


class _Series:
    """Bucket counts for every gap and outcome counts of one (topic, consumer_group)."""

    __slots__ = ("lock", "counts", "sums", "exemplar_values", "exemplars", "outcomes")

    def __init__(self, n_buckets: int) -> None:
        self.lock = threading.Lock()
        self.counts = [[0] * (n_buckets + 1) for _ in GAPS]  # last slot is +Inf
        self.sums = [0.0] * len(GAPS)
        # Per bucket the last exemplar: its value, and (labels, timestamp) — one tuple per message
        # for all its gaps, the labels as given or a trace id (int) to be formatted; made into
        # Exemplar objects only when scraped
        self.exemplar_values: list[list[float]] = [[0.0] * (n_buckets + 1) for _ in GAPS]
        self.exemplars: list[list[tuple[dict[str, str] | int, float] | None]] = [
            [None] * (n_buckets + 1) for _ in GAPS]
        self.outcomes = {o: 0 for o in Outcome}


# An exemplar as kept per bucket: its labels (or a trace id, formatted when scraped) and timestamp.
_ExemplarRef = tuple[dict[str, str] | int, float]


def _count_gaps(counts: list[list[int]], sums: list[float], bounds: list[float], times: Sequence[int],
                exemplars: list[list[Any]], ex_values: list[list[float]], ref: _ExemplarRef | None) -> None:
    """Every gap between present stamps into its bucket and sum (negative as 0) and, with ``ref``,
    the bucket's exemplar. The definition; :func:`_count_gaps_fast` is what runs."""
    for gi, first, last in GAP_INDEX:
        a, b = times[first], times[last]
        if a and b:
            v = (b - a) / 1e9 if b > a else 0.0
            i = bisect_left(bounds, v)
            counts[gi][i] += 1
            sums[gi] += v
            if ref is not None:
                exemplars[gi][i] = ref
                ex_values[gi][i] = v


# A C static when compiled (tracer.compiled), not a lookup in the module's dict per gap.
_bisect_left: Final = bisect_left


# What _count_gaps_fast runs instead of the loop of _count_gaps, once per message: ``rmqtrace bench
# overhead`` (its stamps_metrics loop) is cheaper with it. tests/test_metrics_count_gaps.py holds the
# two equal for every stamp pattern, and fails if GAP_INDEX changes under the written-out copy.
def _count_gaps_fast(counts: list[list[int]], sums: list[float], bounds: list[float], times: Sequence[int],
                     exemplars: list[list[Any]], ex_values: list[list[float]], ref: _ExemplarRef | None) -> None:
    """:func:`_count_gaps` with its loop over GAP_INDEX written out (see the comment above)."""
    produce, store, pull, enqueue, start, end = times
    if produce and store:
        v = (store - produce) / 1e9 if store > produce else 0.0
        i = _bisect_left(bounds, v)
        counts[0][i] += 1
        sums[0] += v
        if ref is not None:
            exemplars[0][i] = ref
            ex_values[0][i] = v
    if store and pull:
        v = (pull - store) / 1e9 if pull > store else 0.0
        i = _bisect_left(bounds, v)
        counts[1][i] += 1
        sums[1] += v
        if ref is not None:
            exemplars[1][i] = ref
            ex_values[1][i] = v
    if pull and enqueue:
        v = (enqueue - pull) / 1e9 if enqueue > pull else 0.0
        i = _bisect_left(bounds, v)
        counts[2][i] += 1
        sums[2] += v
        if ref is not None:
            exemplars[2][i] = ref
            ex_values[2][i] = v
    if enqueue and start:
        v = (start - enqueue) / 1e9 if start > enqueue else 0.0
        i = _bisect_left(bounds, v)
        counts[3][i] += 1
        sums[3] += v
        if ref is not None:
            exemplars[3][i] = ref
            ex_values[3][i] = v
    if start and end:
        v = (end - start) / 1e9 if end > start else 0.0
        i = _bisect_left(bounds, v)
        counts[4][i] += 1
        sums[4] += v
        if ref is not None:
            exemplars[4][i] = ref
            ex_values[4][i] = v
    if produce and end:
        v = (end - produce) / 1e9 if end > produce else 0.0
        i = _bisect_left(bounds, v)
        counts[5][i] += 1
        sums[5] += v
        if ref is not None:
            exemplars[5][i] = ref
            ex_values[5][i] = v
    if pull and start:
        v = (start - pull) / 1e9 if start > pull else 0.0
        i = _bisect_left(bounds, v)
        counts[6][i] += 1
        sums[6] += v
        if ref is not None:
            exemplars[6][i] = ref
            ex_values[6][i] = v


def _check_buckets(buckets: Sequence[float]) -> list[float]:
    bounds = [float(b) for b in buckets]
    if bounds != sorted(bounds) or len(set(bounds)) != len(bounds) or not bounds:
        raise ValueError("buckets must be a non-empty, strictly increasing sequence")
    if bounds[-1] == math.inf:
        bounds.pop()
    return bounds


class _StageCollector:
    """``rmqtrace_stage_duration_seconds`` and ``rmqtrace_messages_total`` as one collector.

    A message observes up to six gaps at once; the stock ``Histogram`` would take a lock and
    validate an exemplar per observation. Here one lock covers the whole message, which keeps
    the per-message cost well under that of one span (see ``rmqtrace bench overhead``). The
    exposition is the same: cumulative ``le`` buckets, ``_sum``, ``_count``, exemplars.
    """

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.series: dict[tuple[str, str], _Series] = {}

    def describe(self) -> list[Metric]:
        # the real names, so a registry refuses a second collector of the same series
        return [HistogramMetricFamily("rmqtrace_stage_duration_seconds", _STAGE_HELP,
                                      labels=["stage", "topic", "consumer_group"]),
                CounterMetricFamily("rmqtrace_messages", _MESSAGES_HELP, labels=["topic", "consumer_group", "outcome"])]

    def collect(self) -> Iterator[Metric]:
        hist, msgs = self.describe()
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        for (topic, group), series in list(self.series.items()):
            with series.lock:
                counts = [list(c) for c in series.counts]
                sums = list(series.sums)
                exemplars = [list(e) for e in series.exemplars]
                ex_values = [list(v) for v in series.exemplar_values]
                outcomes = dict(series.outcomes)
            for gi, gap in enumerate(GAPS):
                if not counts[gi][-1] and not any(counts[gi]):
                    continue
                acc, buckets = 0, []
                for le, c, ex, v in zip(les, counts[gi], exemplars[gi], ex_values[gi]):
                    acc += c
                    buckets.append((le, acc, _exemplar(ex[0], v, ex[1])) if ex is not None else (le, acc))
                hist.add_metric([gap.name, topic, group], buckets, sums[gi])  # type: ignore[attr-defined]
            for outcome, n in outcomes.items():
                if n:
                    msgs.add_metric([topic, group, outcome.value], n)  # type: ignore[attr-defined]
        yield hist
        yield msgs


def _exemplar(labels: dict[str, str] | int, value: float, timestamp: float) -> Exemplar:
    return Exemplar(labels if isinstance(labels, dict) else {"trace_id": f"{labels:032x}"}, value, timestamp)


class _StockSeries:
    """Multiprocess mode: the stock children of one (topic, consumer_group), bound once."""

    __slots__ = ("gaps", "outcomes")

    def __init__(self, hist: Histogram, msgs: Counter, topic: str, group: str) -> None:
        self.gaps = [hist.labels(g.name, topic, group) for g in GAPS]
        self.outcomes = {o: msgs.labels(topic, group, o.value) for o in Outcome}




@dataclass(frozen=True, slots=True)
class MetricsStats:
    """A :class:`TracerMetrics` now (:meth:`TracerMetrics.statistics`)."""

    label_pairs: int  # (topic, consumer_group) pairs with stage series: the cardinality PairLabels caps
    multiprocess: bool


class TracerMetrics(OnePerRegistry):
    """All message-path series on one registry (``registry=None`` means the global one).

    ``label_limit`` caps the distinct (topic, consumer_group) pairs (see :class:`PairLabels`).

    Raises:
        ValueError: the buckets are not strictly increasing, or the registry already holds these
            series (another ``TracerMetrics``: use :meth:`shared`). Nothing stays registered then.
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 buckets: Sequence[float] = DEFAULT_BUCKETS, label_limit: int = 64) -> None:
        reg = DEFAULT_REGISTRY if registry is None else registry
        self.registry = reg
        bounds = _check_buckets(buckets)
        self.multiprocess = multiprocess_dir() is not None
        self._stages = _StageCollector(bounds)
        collectors: list[Any] = []
        self._hist: Histogram | None = None
        self._msgs: Counter | None = None
        self._stock: dict[tuple[str, str], _StockSeries] = {}
        if self.multiprocess:
            self._hist = Histogram("rmqtrace_stage_duration_seconds", _STAGE_HELP, ["stage", "topic", "consumer_group"],
                                   buckets=bounds, registry=None)
            self._msgs = Counter("rmqtrace_messages", _MESSAGES_HELP, ["topic", "consumer_group", "outcome"],
                                 registry=None)
            collectors += [self._hist, self._msgs]
        else:
            collectors.append(self._stages)
        collectors += self._define_series()
        self._pairs = PairLabels(label_limit, shared="stage")
        self._lock = threading.Lock()
        self._skew_clamped = {g.name: self.skew_clamped.labels(g.name) for g in GAPS if g.crosses_clocks}
        self._register(reg, collectors)

    def _define_series(self) -> list[Any]:
        """The stock series beside the stage histogram (the same in multiprocess mode), unregistered."""
        self.skew_clamped = Counter(
            "rmqtrace_clock_skew_clamped",
            "Cross-clock gaps that came out negative by more than the stamps' resolution; "
            "they are reported as zero.",
            ["stage"], registry=None,
        )
        self.skew_bound = Gauge(
            "rmqtrace_clock_skew_bound_seconds",
            "Smallest cross-clock gap of the recent messages per clock pair (at most 128 of them, "
            "from the last 2 minutes); a cross-clock gap is trustworthy only to about its absolute value.",
            ["peer"], registry=None, multiprocess_mode="livemin",
        )
        self.propagation_errors = Counter(
            "rmqtrace_propagation_errors", "Message properties ignored because they were bad.",
            ["kind"], registry=None,
        )
        self.spans_dropped = Counter(
            "rmqtrace_spans_dropped", "Spans the exporter could not deliver.", registry=None,
        )
        # Not a loss: late spans of traces the keep policy dropped on purpose (RMQTRACE_KEEP_*).
        self.spans_policy_dropped = Counter(
            "rmqtrace_spans_policy_dropped",
            "Spans ending after the keep policy dropped their trace, dropped with it on purpose (not a loss).",
            registry=None,
        )
        # A stock Counter: the same in multiprocess mode (values in the directory's files).
        self.avoidable_wait = Counter(
            "rmqtrace_consumer_avoidable_wait_seconds",
            "Seconds messages waited in a dispatcher while one of its workers was idle (live blame).",
            ["topic", "consumer_group", "policy"], registry=None,
        )
        # A lost lease is a message the broker may hand out again while (or after) it ran here:
        # the duplicate run that follows is otherwise a plain success in every other series.
        self.leases_lost = Counter(
            "rmqtrace_consumer_leases_lost",
            "Messages whose lease ended while the consume loop still held them (reason: expired before "
            "renewal, abandoned hung handler); the broker may deliver each again.",
            ["topic", "consumer_group", "reason"], registry=None,
        )
        return [self.skew_clamped, self.skew_bound, self.propagation_errors, self.spans_dropped,
                self.spans_policy_dropped, self.avoidable_wait, self.leases_lost]

    def statistics(self) -> MetricsStats:
        with self._lock:
            pairs = len(self._stock) if self._hist is not None else len(self._stages.series)
        return MetricsStats(pairs, self.multiprocess)

    def labels_for(self, topic: str | None, group: str | None) -> tuple[str, str]:
        """The (topic, consumer_group) label pair a message of ``topic`` and ``group`` is counted under."""
        return self._pairs(topic, group)

    def _series(self, topic: str, group: str) -> _Series:
        series = self._stages.series
        found = series.get((topic, group))
        if found is not None:
            return found
        key = self._pairs(topic, group)
        with self._lock:
            found = series.get(key)
            if found is None:
                found = series[key] = _Series(len(self._stages.bounds))
                self._first_seen(*key)
        return found

    def _first_seen(self, topic: str, group: str) -> None:
        # A consumer's lost-lease series exist at 0 from its first message: a counter born at 1
        # has no increase a rate() or increase() can see, so a first lost lease would read as none.
        for reason in LEASE_LOST_REASONS:
            self.leases_lost.labels(topic, group, reason)

    def observe(self, topic: str, group: str, times: Sequence[int], outcome: Outcome,
                exemplar: dict[str, str] | None = None, trace_id: int = 0) -> None:
        """One message: every gap between present stamps into its histogram (negative gaps as
        0, see :mod:`tracer.path.stamps`), the outcome into its counter.

        The exemplar's labels are ``exemplar``, or ``{"trace_id": <32 hex digits>}`` for a
        nonzero ``trace_id`` — formatted when scraped, not per message."""
        ex_labels: dict[str, str] | int | None = exemplar if exemplar is not None else (trace_id or None)
        if self._hist is not None:
            self._observe_stock(topic, group, times, outcome)
            return
        stages = self._stages
        series = stages.series.get((topic, group)) or self._series(topic, group)  # the first look inline
        bounds = stages.bounds
        counts, sums = series.counts, series.sums
        with series.lock:
            _count_gaps_fast(counts, sums, bounds, times, series.exemplars, series.exemplar_values,
                             None if ex_labels is None else (ex_labels, time.time()))
            series.outcomes[outcome] += 1

    def _observe_stock(self, topic: str, group: str, times: Sequence[int], outcome: Outcome) -> None:
        found = self._stock.get((topic, group))
        if found is None:
            key = self._pairs(topic, group)
            with self._lock:
                found = self._stock.get(key)
                if found is None:
                    assert self._hist is not None and self._msgs is not None
                    found = self._stock[key] = _StockSeries(self._hist, self._msgs, *key)
                    self._first_seen(*key)
        for gi, start, end in GAP_INDEX:
            a, b = times[start], times[end]
            if a and b:
                found.gaps[gi].observe((b - a) / 1e9 if b > a else 0.0)
        found.outcomes[outcome].inc()

    def avoidable(self, topic: str, group: str, policy: str, seconds: float) -> None:
        """One message's avoidable wait (live blame) under its dispatcher's ``policy``."""
        t, g = self._pairs(topic, group)
        self.avoidable_wait.labels(t, g, policy).inc(seconds if seconds > 0 else 0.0)

    def lease_lost(self, topic: str, group: str, reason: str) -> None:
        """One message whose consume-loop lease ended while held (``reason``: expired, abandoned)."""
        t, g = self._pairs(topic, group)
        self.leases_lost.labels(t, g, reason).inc()

    def count_propagation_error(self, kind: str) -> None:
        self.propagation_errors.labels(kind).inc()

    def clamped(self, gap_name: str) -> None:
        self._skew_clamped[gap_name].inc()
