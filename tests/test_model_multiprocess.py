"""Model-based tests of what multiprocess mode adds: label caps shared by several processes, and
scrape-time values flushed into stock metrics.

Processes are simulated by separate instances over one directory (they share nothing but its
files, as real processes do); tests/test_multiprocess.py runs real ones.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from tracer.path.clock import ManualClock
from tracer.telemetry.metrics import OTHER, PairLabels
from tracer.telemetry.occupancy import Occupancy, OccupancyMetrics

LONG = os.environ.get("RMQTRACE_LONG") == "1"
LIMIT = 3
PROCESSES = 3
NAMES = st.sampled_from(["a", "b", "c", "d", "e", ""])


class _MultiprocDir:
    """PROMETHEUS_MULTIPROC_DIR set to a fresh directory for one state machine run."""

    def open(self) -> str:
        self.path = tempfile.mkdtemp(prefix="rmqtrace-mp-")
        self.saved = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.path
        return self.path

    def close(self) -> None:
        if self.saved is None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.saved
        shutil.rmtree(self.path, ignore_errors=True)


class SharedPairCap(RuleBasedStateMachine):
    """Several processes label (topic, group) pairs under one joint cap.

    Promise: the aggregate holds at most LIMIT direct pairs and 2 * LIMIT + 1 pairs in all, every
    process maps a pair to the same labels, and a label once given never changes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dir = _MultiprocDir()
        self.dir.open()
        self.procs = [PairLabels(LIMIT, shared="model") for _ in range(PROCESSES)]
        self.given: dict[tuple[str, str], tuple[str, str]] = {}  # first answer per input pair

    def teardown(self) -> None:
        self.dir.close()

    @rule(proc=st.integers(0, PROCESSES - 1), topic=NAMES, group=NAMES)
    def label(self, proc: int, topic: str, group: str) -> None:
        out = self.procs[proc](topic, group)
        first = self.given.setdefault((topic, group), out)
        assert out == first, "a pair changed labels, or two processes disagree"

    @invariant()
    def the_cap_holds_in_the_aggregate(self) -> None:
        outputs = set(self.given.values())
        assert len({o for o in outputs if o[0] != OTHER}) <= LIMIT
        assert len(outputs) <= 2 * LIMIT + 1

    @invariant()
    def a_pair_passes_whole_or_becomes_other(self) -> None:
        for (topic, group), out in self.given.items():
            assert out == (topic, group) or out[0] == OTHER


SharedPairCap.TestCase.settings = settings(max_examples=300 if LONG else 40, stateful_step_count=30, deadline=None)
TestSharedPairCap = SharedPairCap.TestCase


class OccupancyFlush(RuleBasedStateMachine):
    """Multiprocess-mode occupancy: trackers change, the clock runs, flushes happen at any time.

    Promise: right after a flush the stock series equal what a single-process scrape would show
    (every gauge, every integral), and the counters written never go down.
    """

    @initialize()
    def start(self) -> None:
        self.dir = _MultiprocDir()
        self.dir.open()
        self.clock = ManualClock()
        self.registry = CollectorRegistry()
        self.metrics = OccupancyMetrics(self.registry, refresh_interval=3600)  # flushed by the rules only
        self.trackers: list[Occupancy] = []
        self.last: dict[tuple[str, str], float] = {}

    def teardown(self) -> None:
        if hasattr(self, "dir"):
            self.metrics.unregister()
            self.dir.close()

    @rule(group=st.sampled_from(["g", "h"]), workers=st.integers(0, 3))
    def track(self, group: str, workers: int) -> None:
        self.trackers.append(self.metrics.track(group, workers, clock=self.clock))

    @precondition(lambda self: self.trackers)
    @rule(data=st.data(), event=st.sampled_from(["received", "started", "ended", "discarded", "close"]))
    def event(self, data: st.DataObject, event: str) -> None:
        occ = data.draw(st.sampled_from(self.trackers))
        getattr(occ, event)()

    @rule(ms=st.integers(0, 3000))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms * 1_000_000)

    @rule()
    def flush(self) -> None:
        self.metrics.flush()
        want = self.metrics.totals()
        for group, acc in want.items():
            for key, value in acc.items():
                name = _SERIES_NAMES[key]
                got = self.registry.get_sample_value(name, {"consumer_group": group})
                assert got is not None and got == pytest.approx(value, abs=1e-6), (key, group)
                if name.endswith("_total"):
                    assert got >= self.last.get((key, group), 0.0), "a counter went down"
                    self.last[(key, group)] = got

    @invariant()
    def counters_never_go_down(self) -> None:
        for (key, group), before in self.last.items():
            now = self.registry.get_sample_value(_SERIES_NAMES[key], {"consumer_group": group})
            assert now is not None and now >= before


_SERIES_NAMES = {
    "workers": "rmqtrace_consumer_workers", "busy": "rmqtrace_consumer_busy_workers",
    "unstarted": "rmqtrace_consumer_unstarted_messages", "age": "rmqtrace_consumer_oldest_unstarted_age_seconds",
    "busy_s": "rmqtrace_consumer_busy_worker_seconds_total", "idle_s": "rmqtrace_consumer_idle_worker_seconds_total",
    "hol_s": "rmqtrace_consumer_hol_idle_worker_seconds_total", "holding_s": "rmqtrace_consumer_holding_seconds_total",
}

OccupancyFlush.TestCase.settings = settings(max_examples=300 if LONG else 40, stateful_step_count=30, deadline=None)
TestOccupancyFlush = OccupancyFlush.TestCase
