"""Every PromQL expression we ship — dashboard panels and template variables, Prometheus recording
and alerting rules, Grafana-managed alert rules — is tied to what the code exports (unit tests, no
service) and run against a real Prometheus that scraped the long-tail demo (integration).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services import REPO, Scenario, load_rules, long_tail_scenario, split_alert_expr
from tracer.dispatch import DispatchMetrics
from tracer.path.stages import GAPS, Outcome, Stage
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.occupancy import OccupancyMetrics
from tracer.telemetry.probe_metrics import ProbeMetrics

DASHBOARD = REPO / "dashboards" / "grafana" / "rmqtrace-dashboard.json"
GRAFANA_ALERTS = REPO / "dashboards" / "grafana" / "provisioning" / "alerting" / "rmqtrace-alerts.yml"
DATASOURCES = REPO / "dashboards" / "grafana" / "provisioning" / "datasources" / "datasources.yml"
BROKER_RULES = REPO / "dashboards" / "prometheus" / "rmqtrace-broker.yml"
FLEET_RULES = REPO / "dashboards" / "prometheus" / "rmqtrace-fleet.yml"
PROBE_RULES = REPO / "dashboards" / "prometheus" / "rmqtrace-probe.yml"
TARGET_LABELS = {"job", "instance"}  # added by Prometheus at scrape time
STAGES = {g.name for g in GAPS}


@dataclass(frozen=True)
class Expr:
    where: str  # e.g. "dashboard: Stage latency p99 / p95 / p50 [A]"
    kind: str  # panel | broker-panel | variable | record | alert | grafana-alert
    expr: str


# -- what we ship ---------------------------------------------------------------------------------
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows keep their panels inside
    return out


def variable_query(v: dict[str, Any]) -> str:
    q = v["query"]
    return q["query"] if isinstance(q, dict) else q


def grafana_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(GRAFANA_ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _panel_kind(expr: str) -> str:
    # The broker row reads the broker's exporter (through rmqtrace-broker.yml), which the long-tail
    # scenario on the embedded broker does not have: tests/test_broker_side_e2e.py runs those.
    return "broker-panel" if "rmqtrace:broker_" in expr else "panel"


def shipped_expressions() -> list[Expr]:
    d = dashboard()
    out = [Expr(f"dashboard: {p['title']} [{t['refId']}]", _panel_kind(t["expr"]), t["expr"])
           for p in panels(d) for t in p.get("targets", [])]
    out += [Expr(f"dashboard variable ${v['name']}", "variable", variable_query(v))
            for v in d["templating"]["list"] if v["type"] == "query"]
    out += [Expr(f"rule {r.get('record') or r.get('alert')}", "record" if "record" in r else "alert", r["expr"])
            for r in load_rules()]
    out += [Expr(f"grafana alert {r['title']} [{q['refId']}]", "grafana-alert", q["model"]["expr"])
            for r in grafana_rules() for q in r["data"] if q["datasourceUid"] == "prometheus"]
    return out


# -- what the code exports ------------------------------------------------------------------------
class _Source:
    workers, busy, queued = 8, 3, 2

    def accrued(self) -> tuple[float, float]:
        return 30.0, 2.0


@cache
def exported() -> dict[str, frozenset[str]]:
    """Sample name → label names, from a fresh registry where every series was touched once."""
    reg = CollectorRegistry()
    m, d = TracerMetrics(reg), DispatchMetrics(reg)
    stamps = [1_800_000_000_000_000_000 + i * 250_000_000 for i in range(len(Stage))]  # every stage, 250 ms apart
    m.observe("T", "G", stamps, Outcome.SUCCESS, {"trace_id": "0af7651916cd43dd8448eb211c80319c"})
    m.count_propagation_error("traceparent_malformed")
    m.spans_dropped.inc()
    m.clamped("send")
    m.skew_bound.labels("producer->broker").set(-0.002)
    src = _Source()
    bound = d.bind("aggressive", src)
    bound.slot_wait.observe(0.1)
    bound.submit_blocked.observe(0.0)
    bound.outcomes[Outcome.SUCCESS].inc()
    # the fleet and probe rule files' series too: Grafana carries their alerts
    OccupancyMetrics(reg).track("G", 4)
    probes = ProbeMetrics(reg)
    now = 1_800_000_000_000_000_000
    probes.record("T", "G", [now - 3_000_000, now - 2_000_000, now - 1_000_000, now, now, 0], now)
    probes.sent_one("T", True, now)
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in family.samples:
            names.setdefault(s.name, set()).update(s.labels)
    return {k: frozenset(v) for k, v in names.items()}


_SELECTOR = re.compile(r"\b(rmqtrace_[A-Za-z0-9_]+)\s*(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RECORDED = re.compile(r"\b(rmqtrace:[A-Za-z0-9_:]+)")


def recorded_names() -> set[str]:
    """Recording rules of rmqtrace-alerts.yml (recorded in the long-tail scenario)."""
    return {r["record"] for r in load_rules() if "record" in r}


def broker_recorded_names() -> set[str]:
    return {r["record"] for r in load_rules(BROKER_RULES) if "record" in r}


def test_there_is_something_to_check() -> None:
    kinds = {e.kind for e in shipped_expressions()}
    assert kinds == {"panel", "broker-panel", "variable", "record", "alert", "grafana-alert"}
    assert len(exported()) >= 15


@pytest.mark.parametrize("e", shipped_expressions(), ids=lambda e: e.where)
def test_metric_and_label_names_exist_in_what_the_code_exports(e: Expr) -> None:
    names = exported()
    used = _SELECTOR.findall(e.expr)
    recorded = _RECORDED.findall(e.expr)
    assert used or recorded, "no rmqtrace series referenced"
    known = recorded_names() | broker_recorded_names() | {r["record"] for path in (FLEET_RULES, PROBE_RULES)
                                                           for r in load_rules(path) if "record" in r}
    assert set(recorded) <= known, f"unknown recording rules: {set(recorded) - known}"
    labels_in_play = set(TARGET_LABELS) | {"le"}
    for metric, body in used:
        assert metric in names, f"{metric} is not exported (exported: {sorted(names)})"
        labels_in_play |= names[metric]
        for label, op, value in _MATCHER.findall(body or ""):
            assert label in names[metric] | TARGET_LABELS, f"{metric} has no label {label!r}"
            if label == "stage" and "$" not in value:
                values = value.split("|") if op in ("=~", "!~") else [value]
                assert set(values) <= STAGES, f"unknown stage in {label}{op}{value!r}"
    if recorded:  # labels a recording rule keeps are the ones it aggregates by
        labels_in_play |= {"stage", "topic", "consumer_group", "policy"}
    for group in _GROUPING.findall(e.expr):
        for label in filter(None, (x.strip() for x in group.split(","))):
            assert label in labels_in_play, f"grouping by {label!r}, which none of its series has"


def test_alert_rules_have_the_shape_the_tooling_relies_on() -> None:
    alerts = [r for r in load_rules() if "alert" in r]
    names = {r["alert"] for r in alerts}
    assert {"RmqtraceConsumerWaitHigh", "RmqtraceDispatchShareHigh", "RmqtraceWorkersSaturated",
            "RmqtraceClockSkew", "RmqtracePropagationErrors", "RmqtraceSpansDropped", "RmqtraceLeasesLost"} <= names
    for r in alerts:
        split_alert_expr(r["expr"])  # `<signal> <op> <threshold>`
        assert r["labels"]["severity"] in ("warning", "info", "critical")
        assert {"summary", "description", "runbook"} <= set(r["annotations"])
        assert re.fullmatch(r"\d+[smh]", r["for"])


def test_grafana_rules_are_generated_from_the_prometheus_rules() -> None:
    """One source: the committed Grafana file is what render_alerts.py writes from dashboards/prometheus."""
    proc = subprocess.run([sys.executable, str(REPO / "dashboards" / "grafana" / "render_alerts.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_grafana_alerts_are_the_prometheus_alerts() -> None:
    """Every alert of every documented rule file (alerts, broker, fleet, probe), same signal,
    threshold, `for`, labels and annotations."""
    prom = {r["alert"]: r for path in sorted((REPO / "dashboards" / "prometheus").glob("rmqtrace-*.yml"))
            for r in load_rules(path) if "alert" in r}
    graf = {r["title"]: r for r in grafana_rules()}
    assert set(graf) == set(prom)
    for name, g in graf.items():
        p = prom[name]
        signal, op, threshold = split_alert_expr(p["expr"])
        data = {q["refId"]: q for q in g["data"]}
        query, reduce, cond = data["A"], data["B"], data[g["condition"]]
        assert query["datasourceUid"] == "prometheus" and query["model"]["instant"] is True
        assert " ".join(query["model"]["expr"].split()) == " ".join(signal.split())
        assert reduce["datasourceUid"] == "__expr__" and reduce["model"]["type"] == "reduce"
        assert reduce["model"]["expression"] == "A" and reduce["model"]["reducer"] == "last"
        assert cond["datasourceUid"] == "__expr__" and cond["model"]["type"] == "threshold"
        assert cond["model"]["expression"] == "B"
        evaluator = cond["model"]["conditions"][0]["evaluator"]
        assert evaluator == {"type": {">": "gt", "<": "lt"}[op], "params": [threshold]}
        assert g["for"] == p["for"] and g["labels"] == p["labels"]
        assert g["annotations"] == {k: v.replace("$value", "$values.B.Value") for k, v in p["annotations"].items()}
        assert g["noDataState"] == "OK"


def test_dashboard_wiring() -> None:
    d = dashboard()
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("topic", "consumer_group"):
        assert variables[name]["type"] == "query" and variable_query(variables[name]).startswith("label_values(")
    ps = [p for p in panels(d) if p["type"] != "row"]
    assert len({p["id"] for p in panels(d)}) == len(panels(d))
    for p in ps:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"]
    heatmaps = [p for p in ps if p["type"] == "heatmap"]
    assert heatmaps and all(t["format"] == "heatmap" and t["exemplar"] for p in heatmaps for t in p["targets"])
    assert all("_bucket" in t["expr"] and "by (le)" in t["expr"] for p in heatmaps for t in p["targets"])
    # exemplars on: every panel over a histogram shows them on one query at least
    for p in ps:
        if any("_bucket" in t["expr"] for t in p["targets"]):
            assert any(t.get("exemplar") for t in p["targets"]), p["title"]
    titles = " | ".join(p["title"] for p in ps).lower()
    for needle in ("consumer wait heatmap", "consumer wait p99", "stage latency", "share of end-to-end",
                   "dispatch wait heatmap", "client buffer heatmap", "slot wait", "occupancy",
                   "queued", "outcomes", "skew", "propagation"):
        assert needle in titles


HEADLINE = 'stage="consumer_wait"'
PARTS = re.compile(r'stage=~"client_buffer\|dispatch_wait"')


def test_the_headline_is_consumer_wait_in_the_alerts_and_the_dashboard() -> None:
    """One headline notion (issue 14): the time waiting inside the consumer, consumer_wait =
    client_buffer + dispatch_wait, measured by its own series rather than re-summed from the parts."""
    rules = {r.get("alert") or r.get("record"): r for r in load_rules()}
    assert "RmqtraceDispatchWaitHigh" not in rules
    assert HEADLINE in rules["RmqtraceConsumerWaitHigh"]["expr"]
    for name in ("RmqtraceDispatchShareHigh", "rmqtrace:consumer_wait_share:ratio_5m"):
        assert HEADLINE in rules[name]["expr"] and not PARTS.search(rules[name]["expr"]), name
    assert HEADLINE in next(r for r in grafana_rules() if r["title"] == "RmqtraceConsumerWaitHigh")["data"][0]["model"]["expr"]
    ps = sorted((p for p in panels(dashboard()) if p["type"] != "row"),
                key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    heatmaps = [p for p in ps if p["type"] == "heatmap"]
    assert HEADLINE in heatmaps[0]["targets"][0]["expr"] and heatmaps[0]["targets"][0]["exemplar"]
    first_row = [p for p in ps if p["gridPos"]["y"] == ps[0]["gridPos"]["y"]]
    assert heatmaps[0] in first_row
    p99 = [p for p in first_row if p["type"] == "timeseries"
           and any(HEADLINE in t["expr"] and t["expr"].startswith("histogram_quantile(0.99") for t in p["targets"])]
    assert p99, "no consumer_wait p99 panel next to the heatmap"
    parts = {t["expr"].split('stage="')[1].split('"')[0]: p["title"].lower() for p in heatmaps[1:] for t in p["targets"]}
    assert set(parts) == {"client_buffer", "dispatch_wait"}
    assert all("part" in title for title in parts.values()), parts
    for p in ps:  # nothing re-sums the parts, and a stacked share must not count the headline twice
        for t in p["targets"]:
            assert not PARTS.search(t["expr"]), p["title"]
            if 'stage!="end_to_end"' in t["expr"]:
                raise AssertionError(f"{p['title']}: stage!=\"end_to_end\" also selects consumer_wait")


def test_exemplars_link_to_jaeger() -> None:
    sources = {s["uid"]: s for s in yaml.safe_load(DATASOURCES.read_text())["datasources"]}
    assert sources["prometheus"]["type"] == "prometheus" and sources["jaeger"]["type"] == "jaeger"
    dest = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert {"name": "trace_id", "datasourceUid": "jaeger"}.items() <= dest[0].items()


# -- against the real Prometheus ------------------------------------------------------------------
# What Grafana would put in: all values for the template variables, a rate interval of 4 scrapes.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}
_VAR_REGEX_MATCH = re.compile(r'=~\s*"\$\{?(topic|consumer_group|policy)(?::\w+)?\}?"')
_LABEL_VALUES = re.compile(r"^label_values\(\s*(?:(?P<match>.+?)\s*,\s*)?(?P<label>\w+)\s*\)$", re.DOTALL)


def substitute(expr: str) -> str:
    out = _VAR_REGEX_MATCH.sub('=~".*"', expr)
    for k, v in GRAFANA_VARS.items():
        out = out.replace(k, v)
    assert "$" not in out, f"unsubstituted variable in {out!r}"
    return out


@pytest.fixture(scope="module")
def scenario(request: pytest.FixtureRequest) -> Scenario:
    return long_tail_scenario(request.config)


def _panel_exprs() -> list[Expr]:
    return [e for e in shipped_expressions() if e.kind == "panel"]


@pytest.mark.integration
@pytest.mark.parametrize("e", _panel_exprs(), ids=lambda e: e.where)
def test_every_panel_query_returns_data(scenario: Scenario, e: Expr) -> None:
    # Evaluated while the round-robin run was 90 % done: gauges live, rates over the run.
    result = scenario.prom.query(substitute(e.expr), at=scenario.phases["round_robin"].mid)
    assert result, f"{e.where}: no data for {substitute(e.expr)}"


@pytest.mark.integration
def test_template_variables_resolve(scenario: Scenario) -> None:
    got = {}
    for e in shipped_expressions():
        if e.kind != "variable":
            continue
        m = _LABEL_VALUES.match(e.expr.strip())
        assert m, f"{e.where}: only label_values(...) is supported here: {e.expr}"
        match = [substitute(m["match"])] if m["match"] else []
        got[m["label"]] = scenario.prom.label_values(m["label"], match)
        if match:  # the same through /api/v1/series, as Grafana does for a selector
            assert {s[m["label"]] for s in scenario.prom.series(match)} == set(got[m["label"]])
    assert got["topic"] == ["testcase-groups"]
    assert {"demo-round_robin", "demo-aggressive"} <= set(got["consumer_group"])
    assert {"round_robin", "aggressive"} <= set(got["policy"])


@pytest.mark.integration
@pytest.mark.parametrize("e", [e for e in shipped_expressions() if e.kind in ("record", "alert", "grafana-alert")],
                         ids=lambda e: e.where)
def test_rule_queries_parse_and_run(scenario: Scenario, e: Expr) -> None:
    result = scenario.prom.query(e.expr, at=scenario.phases["round_robin"].mid)  # raises on any PromQL error
    if e.kind == "record":
        assert result, f"{e.where}: recording rule expression has no data"


@pytest.mark.integration
def test_recording_rules_are_recorded(scenario: Scenario) -> None:
    rr = scenario.phases["round_robin"]
    for name in recorded_names():
        assert scenario.prom.query(name, at=rr.finished), f"{name} was never recorded"


@pytest.mark.integration
@pytest.mark.parametrize("alert", [r["alert"] for r in load_rules() if "alert" in r])
def test_grafana_chain_selects_what_the_prometheus_alert_selects(scenario: Scenario, alert: str) -> None:
    """Grafana: query the signal, keep the last value, compare with the threshold. Prometheus: the
    whole expression. Same series either way (shipped thresholds, at two points of the run)."""
    rule = next(r for r in load_rules() if r.get("alert") == alert)
    signal, op, threshold = split_alert_expr(rule["expr"])
    for at in (scenario.phases["round_robin"].mid, scenario.phases["aggressive"].mid):
        by_prom = {_key(s["metric"]) for s in scenario.prom.query(rule["expr"], at=at)}
        by_grafana = {_key(s["metric"]) for s in scenario.prom.query(signal, at=at)
                      if (float(s["value"][1]) > threshold if op == ">" else float(s["value"][1]) < threshold)}
        assert by_prom == by_grafana


def _key(metric: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in metric.items() if k != "__name__"))


@pytest.mark.integration
def test_histogram_panels_carry_exemplars_with_trace_ids(scenario: Scenario) -> None:
    rr = scenario.phases["round_robin"]
    for metric in ('rmqtrace_stage_duration_seconds_bucket{stage="consumer_wait"}',
                   'rmqtrace_stage_duration_seconds_bucket{stage="dispatch_wait"}',
                   "rmqtrace_stage_duration_seconds_bucket"):
        found = scenario.prom.exemplars(metric, rr.started, rr.finished + 5)
        ids = {ex["labels"].get("trace_id") for series in found for ex in series["exemplars"]}
        assert ids and all(re.fullmatch(r"[0-9a-f]{32}", i or "") for i in ids), found[:2]


def test_files_we_point_at_exist() -> None:
    for p in (DASHBOARD, GRAFANA_ALERTS, DATASOURCES):
        assert Path(p).is_file()
