"""The report's numbers against hand-made inputs whose answers are worked out in the comments."""

from __future__ import annotations

import dataclasses

import pytest
from report_helpers import KNOWN, MS, T0, Row, scenario_spans

from tracer.path.stages import Stage
from tracer.report.model import (
    NO_JOB,
    PRODUCED_LATE,
    build_report,
    heatmap,
    infer_workers,
    mean_busy,
    messages_from_spans,
    occupancy,
    percentile,
    wait_edges,
)


def approx(x: float) -> object:
    return pytest.approx(x, abs=1e-9)


# -- the job view ------------------------------------------------------------------------------
def test_job_completion_lower_bound_and_critical_path() -> None:
    report = build_report(scenario_spans(KNOWN))
    [g] = report.groups
    assert (g.group, g.workers, g.workers_source) == ("g-rr", 2, "attribute")
    [job] = g.jobs
    assert job.job_id == "J" and job.messages == 3
    assert job.completion_s == approx(1.103)  # first produce 0 → last handler end 1103 ms
    assert job.total_handler_s == approx(1.3)  # 1000 + 200 + 100
    assert job.longest_handler_s == approx(1.0) and job.longest_message_id == "ID-m1"
    assert job.lower_bound_s == approx(1.0)  # max(1.3 / 2, 1.0)
    assert job.over_lb == approx(1.103)
    assert job.occupancy == approx(1.3 / (2 * 1.103))

    c = job.critical
    assert c.message.message_id == "ID-m3"
    assert c.split_s == {PRODUCED_LATE: approx(0.010), "send": approx(0.001), "broker_wait": approx(0.001),
                         "client_buffer": approx(0.0), "dispatch_wait": approx(0.991), "handler": approx(0.100)}
    assert sum(c.split_s.values()) == approx(job.completion_s)
    assert c.waiting_s == approx(0.991) and c.working_s == approx(0.1) and c.broker_s == approx(0.002)
    # m3 waited 12 → 1003 ms; m1 ran all of it (991 ms), m2 until 203 (191 ms): 1182/991 busy on average
    assert c.idle_workers == approx(2 - 1182 / 991)
    assert c.verdict == ("mostly waiting for a worker inside the consumer: 0.991 s of 1.103 s, "
                         "while on average 0.8 of 2 workers were idle")


def test_lower_bound_is_total_over_workers_when_work_dominates() -> None:
    # four 100 ms messages back to back on one worker: LB = max(400 / 1, 100) = 400 ms
    rows = [Row("g", "J", f"k{i}", 0, 0, 0, 0, 0, 100 * i, 100 * (i + 1)) for i in range(4)]
    [job] = build_report(scenario_spans(rows)).groups[0].jobs
    assert job.lower_bound_s == approx(0.4) and job.completion_s == approx(0.4) and job.over_lb == approx(1.0)
    assert job.critical.verdict.startswith("mostly waiting for a worker")  # k3 queued 300 ms, worked 100
    assert job.critical.idle_workers == approx(0.0)  # …but the only worker was busy all along


def test_workers_given_override_and_jobs_split() -> None:
    rows = [*KNOWN, Row("g-rr", None, "x", 1, 2000, 2001, 2002, 2002, 2003, 2503)]
    report = build_report(scenario_spans(rows), workers=4)
    g = report.groups[0]
    assert g.workers == 4 and g.workers_source == "given"
    jobs = {j.job_id: j for j in g.jobs}
    assert set(jobs) == {"J", NO_JOB}
    assert jobs["J"].lower_bound_s == approx(1.0)  # max(1.3 / 4, 1.0)
    assert jobs[NO_JOB].completion_s == approx(0.503) and jobs[NO_JOB].lower_bound_s == approx(0.5)
    assert [j.job_id for j in build_report(scenario_spans(rows), job="J").groups[0].jobs] == ["J"]


def test_groups_side_by_side_in_order_of_start_with_a_shared_axis() -> None:
    later = [dataclasses.replace(r, group="g-b", produce=r.produce + 5000, store=r.store + 5000, pull=r.pull + 5000,
                                 enqueue=r.enqueue + 5000, start=r.start + 5000, end=r.end + 2000 + 5000)
             for r in KNOWN]
    report = build_report(scenario_spans([*later, *KNOWN]))
    assert [g.group for g in report.groups] == ["g-rr", "g-b"]
    assert report.axis_s == approx(3.103)  # the longer group: g-b ends 2 s later relative to its start
    assert build_report(scenario_spans([*later, *KNOWN]), group="g-b").groups[0].group == "g-b"


# -- stage statistics --------------------------------------------------------------------------
def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 1..100, unsorted
    assert [percentile(values, q) for q in (0.5, 0.95, 0.99, 1.0)] == [50.0, 95.0, 99.0, 100.0]
    assert percentile([7.0], 0.5) == 7.0 and percentile([], 0.99) == 0.0
    assert percentile([1.0, 2.0, 3.0], 0.5) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0


def test_stage_percentiles_shares_and_slowest() -> None:
    g = build_report(scenario_spans(KNOWN), top=2).groups[0]
    h = g.stages["handler"]  # 1.0, 0.2, 0.1
    assert (h.count, h.p50, h.p95, h.p99, h.max) == (3, approx(0.2), approx(1.0), approx(1.0), approx(1.0))
    assert h.mean == approx(1.3 / 3) and h.total == approx(1.3)
    d = g.stages["dispatch_wait"]  # 0.001, 0.001, 0.991
    assert (d.p50, d.p95, d.max) == (approx(0.001), approx(0.991), approx(0.991))
    path_total = 3 * 0.002 + 1.3 + 0.993  # send+broker 2 ms each, handlers, dispatch waits
    assert d.share == approx(0.993 / path_total) and h.share == approx(1.3 / path_total)
    assert g.stages["end_to_end"].max == approx(1.093) and g.stages["end_to_end"].share == 0.0
    assert [r.message_id for r in g.slowest] == ["ID-m3", "ID-m1"]  # e2e 1093 and 1003 ms
    assert [r.critical_stage for r in g.slowest] == ["dispatch_wait", "handler"]


def test_clock_skew_is_clamped_and_counted() -> None:
    # the broker stamped 5 ms before the producer: the send gap is clamped to 0 and counted
    rows = [Row("g", "J", "k", 0, 10, 5, 12, 12, 13, 20)]
    g = build_report(scenario_spans(rows)).groups[0]
    assert g.stages["send"].max == 0.0 and g.stages["send"].clamped == 1
    assert g.records[0].gap_s("broker_wait") == approx(0.007)


# -- heatmap and occupancy ---------------------------------------------------------------------
def test_wait_edges_are_log_scale_and_cover_the_longest_wait() -> None:
    assert wait_edges(0.991) == [0, 1e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
    assert wait_edges(0.0) == [0, 1e-4]  # two buckets: no wait, and any wait
    assert wait_edges(12.0)[-1] == 20.0


def test_heatmap_bucket_counts() -> None:
    # dispatch waits (enqueue ms → wait ms): bucket 0.25 s wide over a 1 s axis
    specs = [(0, 0.05), (10, 1.5), (20, 1.0), (300, 150), (600, 900), (999, 0), (1500, 3)]
    rows = [Row("g", "J", f"k{i}", 0, 0, 0, 0, enq, enq + wait, enq + wait + 1) for i, (enq, wait) in enumerate(specs)]
    records = messages_from_spans(scenario_spans(rows))
    edges = [0, 1e-4, 1e-3, 2e-3, 1e-1, 1.0]
    hm = heatmap(records, "dispatch_wait", T0, 1.0, 4, edges)
    assert hm.bucket_s == 0.25 and hm.total == 7
    exact = {(j, i): c for j, row in enumerate(hm.counts) for i, c in enumerate(row) if c}
    assert exact == {  # x is when the wait ended (the handler started), not when it began
        (0, 0): 1,  # 0.05 ms wait, enqueued at 0 ms
        (2, 0): 2,  # 1.5 ms and 1.0 ms waits, ended at 11.5 and 21 ms
        (4, 1): 1,  # 150 ms wait, ended at 450 ms
        (4, 3): 1,  # 900 ms wait, enqueued at 600 ms, ended at 1500 ms: past the axis, in the last bucket
        (0, 3): 1,  # no wait, at 999 ms
        (3, 3): 1,  # 3 ms wait, ended at 1503 ms: the last bucket
    }


def test_occupancy_steps_and_bucket_means() -> None:
    rows = [Row("g", "J", "a", 0, 0, 0, 0, 0, 0, 500), Row("g", "J", "b", 1, 0, 0, 0, 0, 250, 1000)]
    records = messages_from_spans(scenario_spans(rows))
    occ = occupancy(records, T0, 1.0, 2, workers=2)
    assert occ.steps == [(0.0, 1), (0.25, 2), (0.5, 1), (1.0, 0)]
    assert occ.mean_busy == [approx(1.5), approx(1.0)]  # (500 + 250) / 500, 500 / 500
    intervals = [(T0, T0 + 500 * MS), (T0 + 250 * MS, T0 + 1000 * MS)]
    assert mean_busy(intervals, T0, T0 + 1000 * MS) == approx(1.25)
    assert mean_busy(intervals, T0 + 10, T0 + 10) is None


def test_report_carries_heatmaps_and_occupancy_on_the_shared_axis() -> None:
    g = build_report(scenario_spans(KNOWN), time_buckets=4).groups[0]
    assert list(g.heatmaps) == ["consumer_wait"]  # the headline gap: client_buffer + dispatch_wait
    hm = g.heatmaps["consumer_wait"]
    assert hm.bucket_s == approx(1.103 / 4) and hm.total == 3
    # 1 ms (×2), ended by 12 ms; 991 ms, ended at 1003 ms (x is when the wait ended)
    assert hm.counts[2][0] == 2 and hm.counts[10][3] == 1
    assert g.occupancy is not None and g.occupancy.workers == 2
    assert sum(m * g.occupancy.bucket_s for m in g.occupancy.mean_busy) == approx(1.3)  # = total handler time


# -- workers and timing sources ----------------------------------------------------------------
def test_worker_lanes_are_inferred_by_greedy_interval_packing() -> None:
    # A 0-10, B 2-5, C 5-8 (B's lane is free at 5), D 6-12 (needs a third lane), E 10-11 (A's lane)
    spec = {"A": (0, 10), "B": (2, 5), "C": (5, 8), "D": (6, 12), "E": (10, 11)}
    rows = [Row("g", "J", k, None, 0, 0, 0, 0, s, e) for k, (s, e) in spec.items()]
    records = messages_from_spans(scenario_spans(rows))
    assert infer_workers(records) == 3
    assert {r.keys: r.worker for r in records} == {"A": 0, "B": 1, "C": 1, "D": 2, "E": 0}
    assert all(r.worker_inferred for r in records)
    g = build_report(scenario_spans(rows)).groups[0]
    assert (g.workers, g.workers_source) == (3, "inferred")


def test_missing_worker_attribute_falls_back_to_inference() -> None:
    g = build_report(scenario_spans(KNOWN, worker_attr=False)).groups[0]
    assert (g.workers, g.workers_source) == (2, "inferred")  # peak concurrency of the three handlers
    assert g.jobs[0].lower_bound_s == approx(1.0)


def test_float_stamps_fall_back_to_span_times() -> None:
    spans = scenario_spans(KNOWN)
    for s in spans:  # what a store that went through doubles would hand back
        for k, v in list(s.attributes.items()):
            if k.startswith("rmqtrace.stamp."):
                s.attributes[k] = float(v)
    records = {r.message_id: r for r in messages_from_spans(spans)}
    assert {r.timing for r in records.values()} == {"spans"}
    m3 = records["ID-m3"]
    assert m3.gap_s("dispatch_wait") == approx(0.991) and m3.gap_s("handler") == approx(0.1)
    assert m3.t(Stage.PRODUCE) == T0 + 10 * MS  # from the producer's send span
    job = build_report(spans).groups[0].jobs[0]
    assert job.completion_s == approx(1.103) and job.lower_bound_s == approx(1.0)


def test_stamps_that_disagree_with_the_span_are_not_trusted() -> None:
    spans = scenario_spans(KNOWN[:1])
    proc = next(s for s in spans if s.name.startswith("process"))
    proc.attributes["rmqtrace.stamp.handler_end_ns"] += 7_000_000  # 7 ms off the span's own end
    [r] = messages_from_spans(spans)
    assert r.timing == "spans" and r.handler_s == approx(1.0)
    spans = scenario_spans(KNOWN[:1])
    next(s for s in spans if s.name.startswith("process")).attributes["rmqtrace.stamp.handler_end_ns"] += 2_000
    assert messages_from_spans(spans)[0].timing == "stamps"  # within Jaeger's µs slack


def test_no_stamps_at_all_and_duplicates() -> None:
    spans = scenario_spans(KNOWN, stamps=False)
    records = messages_from_spans(spans + spans)  # a file appended twice
    assert len(records) == 3 and {r.timing for r in records} == {"spans"}
    assert build_report(spans).groups[0].jobs[0].completion_s == approx(1.103)
    assert build_report([]).groups == []


def test_the_headline_gap_has_a_share_of_path_time() -> None:
    g = build_report(scenario_spans(KNOWN)).groups[0]
    parts = g.stages["client_buffer"].share + g.stages["dispatch_wait"].share
    assert g.stages["consumer_wait"].share == approx(parts) and parts > 0
    assert g.stages["end_to_end"].share == 0.0  # the whole, not a part


def test_lower_bound_is_the_simulations() -> None:
    from tracer.dispatch.simulate import lower_bound

    g = build_report(scenario_spans(KNOWN)).groups[0]
    handled = [r.handler_s for r in g.records if r.handled]
    assert g.jobs[0].lower_bound_s == lower_bound(handled, g.workers)
