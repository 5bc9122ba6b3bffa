"""The alert rules against a real Prometheus: the long-tail job raises the dispatch alerts under
round-robin dispatch and leaves them quiet under the aggressive dispatcher. The headline alert reads
consumer_wait (client_buffer + dispatch_wait), the same series the dashboard leads with.

Prometheus (services/prometheus/prom.sh, 1 s scrape and evaluation) scrapes this process's
``/metrics`` while the job runs through the embedded broker; the rules are the shipped file with
``for:`` shortened to 2 s and the production thresholds (tests/services.py: VARIANT_FOR). Shares the
run with test_promql_contract.py.
"""

from __future__ import annotations

import math

import pytest

from services import DISPATCH_ALERTS, Scenario, load_rules, long_tail_scenario, split_alert_expr

pytestmark = pytest.mark.integration

GROUPS = 200


@pytest.fixture(scope="module")
def scenario(request: pytest.FixtureRequest) -> Scenario:
    return long_tail_scenario(request.config)


def variant_alerts(scenario: Scenario) -> dict[str, dict]:
    return {r["alert"]: r for r in load_rules(scenario.rules_variant) if "alert" in r}


def test_round_robin_raises_the_dispatch_alerts(scenario: Scenario) -> None:
    rr = scenario.phases["round_robin"]
    assert rr.handled == GROUPS
    rules = variant_alerts(scenario)
    for name in DISPATCH_ALERTS:
        assert (name, "pending") in rr.seen, f"{name} never pending for demo-round_robin: {rr.seen}"
        assert (name, "firing") in rr.seen, f"{name} never firing for demo-round_robin: {rr.seen}"
        assert rr.seen[(name, "pending")] <= rr.seen[(name, "firing")]
        _, op, threshold = split_alert_expr(rules[name]["expr"])
        assert op == ">" and max(rr.values[name]) > threshold
    # the incident's signature in gauge form shows up too: messages queued while workers idle
    assert ("RmqtraceHeadOfLineBlocking", "pending") in rr.seen or ("RmqtraceHeadOfLineBlocking", "firing") in rr.seen


def test_aggressive_leaves_them_quiet(scenario: Scenario) -> None:
    ag = scenario.phases["aggressive"]
    prom = scenario.prom
    assert ag.handled == GROUPS
    quiet = (*DISPATCH_ALERTS, "RmqtraceHeadOfLineBlocking")
    assert not [k for k in ag.seen if k[0] in quiet], f"alerts under aggressive: {ag.seen}"

    # Not just between polls: Prometheus's own ALERTS series never existed for aggressive labels.
    end = ag.finished + 3
    window = math.ceil(end - ag.started) + 1
    hol = 'alertname="RmqtraceHeadOfLineBlocking",policy="aggressive"'
    ever = prom.query(f'max_over_time(ALERTS{{consumer_group="demo-aggressive"}}[{window}s]) '
                      f"or max_over_time(ALERTS{{{hol}}}[{window}s])", at=end)
    assert ever == []

    # The expressions themselves: the alert expression has no aggressive series and its signal is
    # absent (below the share rule's 100 ms floor) or far below the threshold, while round-robin's
    # signal at the end of its run is above it.
    rules = variant_alerts(scenario)
    rr = scenario.phases["round_robin"]
    for name in DISPATCH_ALERTS:
        expr = rules[name]["expr"]
        signal, _, threshold = split_alert_expr(expr)
        fired = [s for s in prom.query(expr, at=ag.mid) if s["metric"].get("consumer_group") == "demo-aggressive"]
        assert fired == []
        ag_value = by_group(prom.query(signal, at=ag.mid)).get("demo-aggressive")
        assert ag_value is None or ag_value < threshold / 5, (name, ag_value)
        assert by_group(prom.query(signal, at=rr.finished))["demo-round_robin"] > threshold, name
    # and the raw numbers exist for aggressive: a tiny consumer-wait p99 and in-consumer share
    p99 = by_group(prom.query('rmqtrace:stage_duration_seconds:p99_5m{stage="consumer_wait"}', at=ag.mid))
    share = by_group(prom.query("rmqtrace:consumer_wait_share:ratio_5m", at=ag.mid))
    assert p99["demo-aggressive"] < 0.1 and share["demo-aggressive"] < 0.05, (p99, share)
    assert share["demo-round_robin"] > 0.5


def by_group(samples: list[dict]) -> dict[str, float]:
    return {s["metric"]["consumer_group"]: float(s["value"][1]) for s in samples}
