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
