"""Prometheus series for the stage gaps, outcomes, clock skew and propagation errors.

Every series has bounded labels: gap names and outcomes are fixed sets; topics and consumer
groups come from configuration but are still capped by :class:`BoundedLabel` so a program that
creates topics on the fly cannot blow up the series count. Message ids never become labels —
they reach Prometheus only as exemplar trace ids.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from typing import Iterator, Sequence

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from ..path.stages import GAPS, Outcome

# 1 ms … 10 min: a handler of a huge test-case group runs for minutes, a send takes milliseconds.
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
OTHER = "other"
_GAP_INDEX: tuple[tuple[int, int, int], ...] = tuple((g.position, int(g.start), int(g.end)) for g in GAPS)


class BoundedLabel:
    """Passes the first ``limit`` distinct values through, maps every later one to ``other``."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        v = value or ""
        if v in self._seen:
            return v
        with self._lock:
            if v in self._seen:
                return v
            if len(self._seen) >= self.limit or len(v) > 200 or not _encodable(v):
                return OTHER
            self._seen.add(v)
            return v


def _encodable(v: str) -> bool:
    """A label value the exposition can write: a lone surrogate would break every scrape."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Series:
    """Bucket counts for every gap and outcome counts of one (topic, consumer_group)."""

    __slots__ = ("lock", "counts", "sums", "exemplars", "outcomes")

    def __init__(self, n_buckets: int) -> None:
        self.lock = threading.Lock()
        self.counts = [[0] * (n_buckets + 1) for _ in GAPS]  # last slot is +Inf
        self.sums = [0.0] * len(GAPS)
        # (labels, value, timestamp) per bucket; made into Exemplar objects only when scraped
        self.exemplars: list[list[tuple[dict[str, str], float, float] | None]] = [
            [None] * (n_buckets + 1) for _ in GAPS]
        self.outcomes = {o: 0 for o in Outcome}


class _StageCollector:
    """``rmqtrace_stage_duration_seconds`` and ``rmqtrace_messages_total`` as one collector.

    A message observes up to six gaps at once; the stock ``Histogram`` would take a lock and
    validate an exemplar per observation. Here one lock covers the whole message, which keeps
    the per-message cost well under that of one span (see ``rmqtrace bench overhead``). The
    exposition is the same: cumulative ``le`` buckets, ``_sum``, ``_count``, exemplars.
    """

    def __init__(self, buckets: Sequence[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds) or not bounds:
            raise ValueError("buckets must be a non-empty, strictly increasing sequence")
        if bounds[-1] == math.inf:
            bounds.pop()
        self.bounds = bounds
        self.series: dict[tuple[str, str], _Series] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        hist = HistogramMetricFamily(
            "rmqtrace_stage_duration_seconds",
            "Time a message spent in each stage gap (send, broker_wait, client_buffer, dispatch_wait, "
            "handler, end_to_end).", labels=["stage", "topic", "consumer_group"])
        msgs = CounterMetricFamily("rmqtrace_messages", "Messages whose handling ended, by outcome.",
                                   labels=["topic", "consumer_group", "outcome"])
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        for (topic, group), series in list(self.series.items()):
            with series.lock:
                counts = [list(c) for c in series.counts]
                sums = list(series.sums)
                exemplars = [list(e) for e in series.exemplars]
                outcomes = dict(series.outcomes)
            for gi, gap in enumerate(GAPS):
                if not counts[gi][-1] and not any(counts[gi]):
                    continue
                acc, buckets = 0, []
                for le, c, ex in zip(les, counts[gi], exemplars[gi]):
                    acc += c
                    buckets.append((le, acc, Exemplar(*ex)) if ex is not None else (le, acc))
                hist.add_metric([gap.name, topic, group], buckets, sums[gi])
            for outcome, n in outcomes.items():
                if n:
                    msgs.add_metric([topic, group, outcome.value], n)
        yield hist
        yield msgs


class TracerMetrics:
    """All message-path series on one registry (``registry=None`` means the global one)."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 buckets: Sequence[float] = DEFAULT_BUCKETS, label_limit: int = 64) -> None:
        reg = DEFAULT_REGISTRY if registry is None else registry
        self.registry = reg
        self._stages = _StageCollector(buckets)
        reg.register(self._stages)  # type: ignore[arg-type]
        self.skew_clamped = Counter(
            "rmqtrace_clock_skew_clamped",
            "Cross-clock gaps that came out negative by more than the stamps' resolution; "
            "they are reported as zero.",
            ["stage"], registry=reg,
        )
        self.skew_bound = Gauge(
            "rmqtrace_clock_skew_bound_seconds",
            "Smallest cross-clock gap seen per clock pair; a cross-clock gap is trustworthy only "
            "to about its absolute value.",
            ["peer"], registry=reg,
        )
        self.propagation_errors = Counter(
            "rmqtrace_propagation_errors", "Message properties ignored because they were bad.",
            ["kind"], registry=reg,
        )
        self.spans_dropped = Counter(
            "rmqtrace_spans_dropped", "Spans the exporter could not deliver.", registry=reg,
        )
        self._topic = BoundedLabel(label_limit)
        self._group = BoundedLabel(label_limit)
        self._lock = threading.Lock()
        self._skew_clamped = {g.name: self.skew_clamped.labels(g.name) for g in GAPS if g.crosses_clocks}

    def _series(self, topic: str, group: str) -> _Series:
        series = self._stages.series
        found = series.get((topic, group))
        if found is not None:
            return found
        key = (self._topic(topic), self._group(group))
        with self._lock:
            found = series.get(key)
            if found is None:
                found = series[key] = _Series(len(self._stages.bounds))
        return found

    def observe(self, topic: str, group: str, times: Sequence[int], outcome: Outcome,
                exemplar: dict[str, str] | None = None) -> None:
        """One message: every gap between present stamps into its histogram (negative gaps as
        0, see :mod:`tracer.stamps`), the outcome into its counter."""
        series = self._series(topic, group)
        bounds = self._stages.bounds
        ex_ts = time.time() if exemplar is not None else 0.0
        counts, sums = series.counts, series.sums
        with series.lock:
            for gi, start, end in _GAP_INDEX:
                a, b = times[start], times[end]
                if not a or not b:
                    continue
                v = (b - a) / 1e9 if b > a else 0.0
                bucket = bisect_left(bounds, v)
                counts[gi][bucket] += 1
                sums[gi] += v
                if exemplar is not None:
                    series.exemplars[gi][bucket] = (exemplar, v, ex_ts)
            series.outcomes[outcome] += 1

    def count_propagation_error(self, kind: str) -> None:
        self.propagation_errors.labels(kind).inc()

    def clamped(self, gap_name: str) -> None:
        self._skew_clamped[gap_name].inc()
