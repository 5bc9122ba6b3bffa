"""``rmqtrace demo --consumers C``: C consumers of one group in one process on the embedded broker,
prefetching against demand-driven, per consumer instance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tracer.tools.fleetdemo import FleetDemoOptions, run_fleet_demo


def test_prefetching_consumers_hoard_and_demand_driven_ones_share() -> None:
    reg = CollectorRegistry()
    prefetch, dd = run_fleet_demo(FleetDemoOptions(consumers=3, groups=80, workers=2, case_ms=2.0), registry=reg)
    assert (prefetch.mode, dd.mode) == ("prefetch", "demand_driven")
    for r in (prefetch, dd):
        assert sum(r.messages) >= 80 and len(r.messages) == 3
        assert r.makespan_s >= r.lower_bound_s * 0.95
    # demand-driven: nobody holds more than it can start, every consumer works, ~no fleet idling
    assert max(dd.max_held) <= 2 and all(n > 0 for n in dd.messages)
    assert dd.fleet_idle_while_held_s < prefetch.fleet_idle_while_held_s
    # prefetch: one consumer's cache held far more than its workers
    assert max(prefetch.max_held) > 2 * 2
    # blame across the fleet: prefetch waited while another consumer had a free worker; demand-driven hardly
    assert prefetch.avoidable["consumer_wait_s"] > 0
    assert prefetch.avoidable["avoidable_elsewhere_s"] > dd.avoidable["avoidable_elsewhere_s"]
    assert prefetch.as_dict()["avoidable_wait"]["fleet_share"] == pytest.approx(prefetch.avoidable["fleet_share"], abs=1e-6)
    # the occupancy series of every consumer reached the registry, per group
    workers = reg.get_sample_value("rmqtrace_consumer_workers", {"consumer_group": "demo-fleet-prefetch"})
    assert workers == 0  # closed trackers stop counting; their totals stay
    assert reg.get_sample_value("rmqtrace_consumer_busy_worker_seconds_total",
                                {"consumer_group": "demo-fleet-demand-driven"}) == pytest.approx(
        sum(sum((r.end_ns - r.start_ns) / 1e9 for r in dd.records if r.instance == i) for i in range(3)), rel=0.05)


def test_bad_counts_fail_loudly() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FleetDemoOptions(consumers=0)


def test_the_demo_command_runs_a_fleet(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "tracer", "demo", "--consumers", "3", "--groups", "40",
                          "--workers", "2", "--case-ms", "1", "--out", "out", "--json"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "OTEL_TRACES_EXPORTER": "none",
                              "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)  # stdout is the one JSON document; the tables went to stderr
    assert [m["mode"] for m in summary] == ["prefetch", "demand_driven"]
    assert [c["consumer"] for c in summary[0]["per_consumer"]] == ["consumer-0", "consumer-1", "consumer-2"]
    # the path as given, like the single-consumer demo (not a file:// URL)
    assert "report: open out/fleet.html" in out.stderr and (tmp_path / "out" / "fleet.json").is_file()
    bullets = out.stderr.split("• ", 1)[1].split("report: open")[0].splitlines()[1:]
    assert all(w.startswith(("  • ", "    ")) for w in bullets), bullets  # wrapped lines stay indented (a pipe)
    tmp_path = tmp_path / "out"
    page = (tmp_path / "fleet.html").read_text()
    # one lane group per consumer instance in each mode, a bar per handled message
    assert page.count("consumer-2</text>") == 2 and page.count("<rect ") >= 2 * 40
    assert "prefetch" in page and "demand_driven" in page
