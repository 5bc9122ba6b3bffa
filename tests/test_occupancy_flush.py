"""Issue 31 item 11: multiprocess occupancy is written when it changes hands, not only every second.

Before, the ``rmqtrace_consumer_*`` values reached the multiprocess directory only from the 1 s
refresher: a worker that lived under a refresh interval never showed, and every worker lost its
last interval at exit. Now a tracker is written when it is made and when it is closed, and every
refresher flushes once more at the interpreter's exit. The refresh interval is an hour here, so
only those flushes can have written anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector


def aggregate(path: Path) -> CollectorRegistry:
    reg = CollectorRegistry()
    MultiProcessCollector(reg, path=str(path))
    return reg


_MADE_AND_CLOSED = textwrap.dedent("""
    import json, os
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector
    from tracer.path.clock import ManualClock
    from tracer.telemetry.occupancy import OccupancyMetrics

    def read(name):
        reg = CollectorRegistry()
        MultiProcessCollector(reg, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
        return reg.get_sample_value(name, {"consumer_group": "g"})

    metrics = OccupancyMetrics(CollectorRegistry(), refresh_interval=3600.0)
    clock = ManualClock()
    occ = metrics.track("g", 2, clock=clock)
    made = read("rmqtrace_consumer_workers")
    occ.started(occ.received())
    clock.advance_s(0.5)
    occ.ended()
    clock.advance_s(0.25)
    occ.close()
    print(json.dumps([made, read("rmqtrace_consumer_busy_worker_seconds_total"),
                      read("rmqtrace_consumer_idle_worker_seconds_total")]))
""")


def run_child(script: str, path: Path) -> str:
    # a child of its own: prometheus-client picks its multiprocess value class at import
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(path),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60, capture_output=True,
                          text=True).stdout


def test_item11_a_tracker_is_written_when_made_and_when_closed(tmp_path: Path):
    made, busy, idle = json.loads(run_child(_MADE_AND_CLOSED, tmp_path))
    assert made == 2.0, "a new tracker's series are not in the directory until the first refresh"
    assert busy == pytest.approx(0.5)
    assert idle == pytest.approx(0.5 + 0.5), "a closed tracker's totals wait for the next refresh"


_SHORT_WORKER = textwrap.dedent("""
    from prometheus_client import CollectorRegistry
    from tracer.path.clock import ManualClock
    from tracer.telemetry.occupancy import OccupancyMetrics

    metrics = OccupancyMetrics(CollectorRegistry(), refresh_interval=3600.0)
    clock = ManualClock()
    occ = metrics.track("short", 1, clock=clock)
    occ.started(occ.received())
    clock.advance_s(0.3)
    occ.ended()
    clock.advance_s(0.2)  # its last interval: nothing flushes it but the exit
""")


def test_item11_a_short_lived_worker_keeps_its_last_interval_at_exit(tmp_path: Path):
    run_child(_SHORT_WORKER, tmp_path)
    reg = aggregate(tmp_path)
    assert reg.get_sample_value("rmqtrace_consumer_busy_worker_seconds_total", {"consumer_group": "short"}) \
        == pytest.approx(0.3)
    assert reg.get_sample_value("rmqtrace_consumer_idle_worker_seconds_total", {"consumer_group": "short"}) \
        == pytest.approx(0.2), "the last interval before exit was lost"
