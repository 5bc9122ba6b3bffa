"""dashboards/docker-compose.yml, checked without Docker (no engine, no compose plugin here): the
services and images, published ports, that every bind-mounted file exists and sits where the
mounted configs expect it; dashboards/prometheus/prometheus.yml through `promtool check config`,
the Alertmanager config through `amtool check-config`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from conftest import unavailable

from services import REPO, ensure_promtool

COMPOSE = REPO / "dashboards" / "docker-compose.yml"
BASE = COMPOSE.parent


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).split(":")[-1].split("/")[0]) for p in service.get("ports", [])}


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """container path → host path, for bind mounts (relative host paths are relative to the file)."""
    out = {}
    for v in service.get("volumes", []):
        host, container = str(v).split(":")[:2]
        if host.startswith((".", "/")):
            out[container] = (BASE / host).resolve()
    return out


def test_services_images_and_ports() -> None:
    s = compose()["services"]
    assert {"namesrv", "broker", "proxy", "jaeger", "prometheus", "alertmanager", "grafana"} <= set(s)
    for name in ("namesrv", "broker", "proxy"):
        assert s[name]["image"].startswith("apache/rocketmq:5.")
    assert s["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")
    assert s["prometheus"]["image"].startswith("prom/prometheus:")
    assert s["grafana"]["image"].startswith("grafana/grafana:")
    assert s["alertmanager"]["image"].startswith("prom/alertmanager:") and 9093 in ports(s["alertmanager"])
    assert 9876 in ports(s["namesrv"]) and 10911 in ports(s["broker"])
    assert {8080, 8081} <= ports(s["proxy"])
    assert {16686, 4317, 4318} <= ports(s["jaeger"])
    assert 9090 in ports(s["prometheus"]) and 3000 in ports(s["grafana"])
    published = [str(p).split(":")[-2] for svc in s.values() for p in svc.get("ports", [])]
    assert len(published) == len(set(published)), "a host port is published twice"
    # issue 24's sibling: every published port is on the host's loopback only ("IP:HOST:CONTAINER")
    exposed = [str(p) for svc in s.values() for p in svc.get("ports", []) if str(p).count(":") != 2
               or not str(p).startswith("127.0.0.1:")]
    assert exposed == [], f"published on every host interface: {exposed}"
    for svc in s.values():
        for dep in svc.get("depends_on", []):
            assert dep in s


def test_every_mounted_file_exists_where_its_config_expects_it() -> None:
    s = compose()["services"]
    for svc in s.values():
        for container, host in mounts(svc).items():
            assert host.exists(), f"{host} (mounted at {container}) is missing"
    prom = mounts(s["prometheus"])
    config = yaml.safe_load(prom["/etc/prometheus/prometheus.yml"].read_text())
    for rule_file in config["rule_files"]:  # relative to the config file's directory
        assert str(Path("/etc/prometheus") / rule_file) in prom
    graf = mounts(s["grafana"])
    provider = yaml.safe_load(graf["/etc/grafana/provisioning/dashboards"].joinpath("dashboards.yml").read_text())
    dash_dir = provider["providers"][0]["options"]["path"]
    assert any(c.startswith(dash_dir + "/") and c.endswith(".json") for c in graf)
    assert {"/etc/grafana/provisioning/datasources", "/etc/grafana/provisioning/alerting"} <= set(graf)


def test_prometheus_scrapes_the_host_and_keeps_exemplars() -> None:
    s = compose()["services"]["prometheus"]
    assert "host.docker.internal:host-gateway" in s["extra_hosts"]
    assert "--enable-feature=exemplar-storage" in s["command"]
    config = yaml.safe_load((BASE / "prometheus" / "prometheus.yml").read_text())
    targets = [t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert "host.docker.internal:9464" in targets


def test_grafana_datasources_point_at_the_compose_services() -> None:
    services = compose()["services"]
    sources = yaml.safe_load((BASE / "grafana" / "provisioning" / "datasources" / "datasources.yml").read_text())
    for ds in sources["datasources"]:
        host, port = ds["url"].split("//")[1].split(":")
        assert host in services and int(port) in ports(services[host])


def test_promtool_accepts_the_compose_prometheus_config() -> None:
    proc = subprocess.run([ensure_promtool(), "check", "config", str(BASE / "prometheus" / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_prometheus_loads_the_fleet_rules_and_sends_to_the_compose_alertmanager() -> None:
    s = compose()["services"]
    config = yaml.safe_load((BASE / "prometheus" / "prometheus.yml").read_text())
    assert {"rmqtrace-alerts.yml", "rmqtrace-fleet.yml"} <= set(config["rule_files"])
    targets = [t for am in config["alerting"]["alertmanagers"] for sc in am["static_configs"] for t in sc["targets"]]
    for target in targets:
        host, port = target.split(":")
        assert host in s and int(port) in ports(s[host])
    am = mounts(s["alertmanager"])
    assert am["/etc/alertmanager/alertmanager.yml"] == BASE / "prometheus" / "alertmanager.yml"
    assert any("--config.file=/etc/alertmanager/alertmanager.yml" == c for c in s["alertmanager"]["command"])


def test_the_alertmanager_config_routes_rmqtrace_alerts_by_group_and_instance() -> None:
    config = yaml.safe_load((BASE / "prometheus" / "alertmanager.yml").read_text())
    assert {"consumer_group", "instance", "alertname"} <= set(config["route"]["group_by"])
    receivers = {r["name"]: r for r in config["receivers"]}
    assert receivers[config["route"]["receiver"]]["webhook_configs"][0]["url"].startswith("http://host.docker.internal:")
    amtool = shutil.which("amtool")
    if amtool is None:
        unavailable("amtool missing: run services/alertmanager/am.sh install")
    proc = subprocess.run([str(amtool), "check-config", str(BASE / "prometheus" / "alertmanager.yml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
