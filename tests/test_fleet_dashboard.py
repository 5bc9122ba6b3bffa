"""The fleet dashboard (dashboards/grafana/rmqtrace-fleet-dashboard.json) is tied to what the code
exports: every rmqtrace_consumer_* series it reads, and the label it splits by, exist in
:class:`OccupancyMetrics`' exposition; every recorded series it reads is recorded by the fleet rules.
Its queries run on a real Prometheus in tests/test_alertmanager_e2e.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services import REPO, load_rules
from tracer.path.clock import ManualClock
from tracer.telemetry.occupancy import OccupancyMetrics

FLEET_DASHBOARD = REPO / "dashboards" / "grafana" / "rmqtrace-fleet-dashboard.json"
FLEET_RULES = REPO / "dashboards" / "prometheus" / "rmqtrace-fleet.yml"
_SELECTOR = re.compile(r"\b(rmqtrace_[A-Za-z0-9_]+)\s*(?:\{([^}]*)\})?")
_RECORDED = re.compile(r"\b(rmqtrace:[A-Za-z0-9_:]+)")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")


def fleet_dashboard() -> dict[str, Any]:
    return json.loads(FLEET_DASHBOARD.read_text())


def panel_exprs(d: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]


def exported() -> dict[str, set[str]]:
    reg = CollectorRegistry()
    OccupancyMetrics(registry=reg).track("g", 2, clock=ManualClock()).received()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def test_every_series_and_label_exists() -> None:
    names = exported()
    recorded = {r["record"] for r in load_rules(FLEET_RULES) if "record" in r}
    d = fleet_dashboard()
    queries = panel_exprs(d) + [(f"${v['name']}", v["query"]) for v in d["templating"]["list"] if v["type"] == "query"]
    assert len(queries) >= 9
    for where, expr in queries:
        used, rec = _SELECTOR.findall(expr), _RECORDED.findall(expr)
        assert used or rec, where
        assert set(rec) <= recorded, where
        for metric, body in used:
            assert metric in names, f"{where}: {metric} is not exported"
            for label in _MATCHER.findall(body or ""):
                assert label[0] in names[metric] | {"job", "instance"}, f"{where}: {metric} has no {label[0]}"
        for group in _GROUPING.findall(expr):
            for label in filter(None, (x.strip() for x in group.split(","))):
                assert label in {"job", "instance", "consumer_group"}, f"{where}: by {label}"


def test_panels_are_per_instance_and_wired_to_the_datasource() -> None:
    d = fleet_dashboard()
    assert 36 <= d["schemaVersion"] <= 41 and d["uid"] == "rmqtrace-fleet"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert {"datasource", "consumer_group", "instance"} <= set(variables)
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    graphs = [p for p in d["panels"] if p["type"] == "timeseries"]
    assert len(graphs) >= 5
    for p in d["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"]
    for p in graphs:
        assert all("by (instance)" in t["expr"] for t in p["targets"]), p["title"]
        assert all("{{instance}}" in t["legendFormat"] for t in p["targets"]), p["title"]
    titles = " | ".join(p["title"] for p in d["panels"]).lower()
    for needle in ("busy workers", "unstarted", "oldest", "head-of-line blocking inside", "fleet head-of-line",
                   "busy share"):
        assert needle in titles


def test_the_dashboard_file_is_where_grafana_looks() -> None:
    assert Path(FLEET_DASHBOARD).is_file()
    compose = (REPO / "dashboards" / "docker-compose.yml").read_text()
    assert "./grafana/rmqtrace-fleet-dashboard.json:/var/lib/grafana/dashboards/rmqtrace/" in compose
