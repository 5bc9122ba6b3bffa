from prometheus_client import CollectorRegistry

from tracer.tools.demo import DemoOptions, run_demo, where_time_went


def test_demo_reproduces_the_incident_and_the_fix(spans):
    provider, exporter = spans
    opts = DemoOptions(groups=120, workers=4, case_ms=1.0, policies=("round_robin", "aggressive"), seed=3)
    registry = CollectorRegistry()
    rr, ag = run_demo(opts, tracer_provider=provider, registry=registry)
    assert rr.handled == ag.handled == 120 and rr.failed == ag.failed == 0
    # round-robin: messages wait inside the consumer; aggressive: they do not
    local = lambda r: r.share("client_buffer") + r.share("dispatch_wait")  # noqa: E731
    assert local(rr) > 0.3 > local(ag)
    assert rr.makespan_s > ag.makespan_s
    assert ag.makespan_s >= ag.lower_bound_s * 0.99
    assert "inside the consumer" in where_time_went(rr)
    for policy in ("round_robin", "aggressive"):
        assert registry.get_sample_value("rmqtrace_stage_duration_seconds_count", {
            "stage": "dispatch_wait", "topic": "testcase-groups", "consumer_group": f"demo-{policy}"}) == 120
    processes = [s for s in exporter.get_finished_spans() if s.name == "process testcase-groups"]
    assert len(processes) == 240


def test_demo_and_report_say_the_same_sentence(tmp_path):
    """One source for the verdict: the demo's line per policy is the report's line per consumer group."""
    from tracer.report.model import build_report, group_line
    from tracer.report.sources import read_jsonl
    from tracer.tools.cli import main

    assert main(["demo", "--groups", "40", "--workers", "3", "--case-ms", "0.5", "--policies",
                 "round_robin,aggressive", "--out", str(tmp_path)]) == 0
    report = build_report(read_jsonl(tmp_path / "spans.jsonl"))
    import json
    summary = {s["policy"]: s for s in json.loads((tmp_path / "summary.json").read_text())}
    for g in report.groups:
        policy = g.group.removeprefix("demo-")
        line = group_line(g).split(": ", 1)[1]
        assert "consumer_wait (waiting inside the consumer)" in line
        assert f"{summary[policy]['gaps']['consumer_wait']['share']:.0%} of end-to-end time" in line
        assert f"{summary[policy]['makespan_over_lb']:.2f}× the lower bound" in line


def test_demo_reads_the_cost_through_the_propagation_constant():
    import inspect

    from tracer.tools import demo

    assert '"rmqtrace_cost"' not in inspect.getsource(demo)


def test_the_verdict_fits_the_numbers():
    """A large wait share is the incident only when it made the job longer than its lower bound."""
    from tracer.report.model import where_time_went_line

    shares = {"consumer_wait": 0.65, "client_buffer": 0.02, "dispatch_wait": 0.63, "handler": 0.24, "broker_wait": 0.11}
    near = where_time_went_line("cost_aware", shares, 1.03, 0.25)
    assert "where no other consumer could take them" not in near and "within 3% of its lower bound" in near
    far = where_time_went_line("round_robin", shares, 2.01, 0.5)
    assert far.endswith("messages queued inside the consumer, where no other consumer could take them")


def test_the_demo_summary_says_which_order_the_job_was_sent_in(spans):
    """Issue #34: the summary reads the order back from the messages (rmqtrace_order)."""
    from tracer.tools.cli import sent_line

    provider, _ = spans
    said = {}
    for order in ("longest_first", "arrival"):
        opts = DemoOptions(groups=30, workers=2, case_ms=0.5, policies=("aggressive",), seed=3, order=order)
        (run,) = run_demo(opts, tracer_provider=provider, registry=CollectorRegistry())
        assert run.sent_order == order and run.as_dict()["sent_order"] == order
        said[order] = sent_line([run])
    assert said["longest_first"].startswith("The job was sent longest first") and "--order" not in said["longest_first"]
    assert said["arrival"].startswith("The job was sent in arrival order")
    assert "--order longest_first" in said["arrival"]  # the hint, only for a job sent as it came
