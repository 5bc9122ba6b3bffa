"""Alerts that arrive: real consumer processes on the real broker, a real Prometheus scraping their
``/metrics`` and evaluating dashboards/prometheus/rmqtrace-fleet.yml, the real Alertmanager
(services/alertmanager/am.sh, the shipped config) routing to a webhook receiver in this test.

A push-consumer fleet (3 processes × 2 workers, the official client's cache) must raise
RmqtraceFleetHeadOfLineBlocking, delivered with its instance and consumer-group labels; the
demand-driven ConsumeLoop fleet on the same job must not. The rules are the shipped ones with
`for:` shortened and the fleet threshold lowered for a job of seconds (the 5-minute mean then
covers the whole run); Alertmanager's config is the shipped one with only the receiver URL swapped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
from rmq_real import ensure_broker
from waiting import wait_until

from services import REPO, Prometheus, free_port, render_rule_variant, unavailable
from tracer.tools.bench.fleet import long_tail_job, run_fleet

AM_SH = REPO / "services" / "alertmanager" / "am.sh"
FLEET_RULES = REPO / "dashboards" / "prometheus" / "rmqtrace-fleet.yml"
FLEET_DASHBOARD = REPO / "dashboards" / "grafana" / "rmqtrace-fleet-dashboard.json"
ALERT = "RmqtraceFleetHeadOfLineBlocking"
THRESHOLD = 0.25  # mean fleet-HOL workers over the run; the push fleet's is ~1-2, demand-driven's ~0
WORKERS = 2
MIN_HELD = 1.0  # worker-seconds a push run must hold back to be the incident the tests read
INSTANCES = 3
# The live fleet signal's resolution (dashboards/README.md#fleet): each change of the fleet's state
# is seen up to one scrape late and counted in whole 1 s evaluations, so a run's estimate may be off
# by up to the starved workers, (INSTANCES - 1) x WORKERS, for about two evaluations, whatever the
# run held back (measured: -0.7 to +5.5 worker-s over runs that held back 0.74 to 51.7).
RESOLUTION_WS = (INSTANCES - 1) * WORKERS * 2.0

pytestmark = pytest.mark.integration


class _Receiver:
    """A webhook receiver: keeps every notification Alertmanager posts."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/rmqtrace-alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self) -> list[dict[str, Any]]:
        with self.lock:
            return [a for n in self.notifications for a in n["alerts"]]


def _start_alertmanager(state: Path, webhook: str) -> tuple[int, dict[str, str]]:
    port = free_port()
    env = dict(os.environ, AM_PORT=str(port), AM_STATE_DIR=str(state), AM_WEBHOOK_URL=webhook)
    proc = subprocess.run(["bash", str(AM_SH), "start"], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        subprocess.run(["bash", str(AM_SH), "stop"], env=env, capture_output=True, timeout=60)
        unavailable(f"am.sh start failed (rc={proc.returncode}): {proc.stderr.strip()[-800:]}")
    return port, env


def _start_prometheus(state: Path, targets: list[str], rules: Path, am_port: int) -> tuple[Prometheus, Any]:
    binary = shutil.which("prometheus")
    if binary is None:
        unavailable("prometheus missing: run services/prometheus/prom.sh install")
    state.mkdir(parents=True, exist_ok=True)
    config = state / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "rmqtrace-fleet", "static_configs": [{"targets": targets}]}],
    }))
    port = free_port()
    log = (state / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={state / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    prom = Prometheus(port, {}, state)

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2):
                return True
        except OSError:
            return proc.poll() is not None

    wait_until(ready, timeout=30, interval=0.2, what="prometheus /-/ready")
    if proc.poll() is not None:
        unavailable(f"prometheus exited: {prom.log_tail()}")

    def scraping() -> bool:  # target discovery is throttled (~5 s): the members must not start before
        active = prom.get("/api/v1/targets", {"state": "active"})["activeTargets"]
        return len(active) == len(targets) and all(not t["lastScrape"].startswith("0001-") for t in active)

    wait_until(scraping, timeout=30, interval=0.2, what="prometheus scraping every member port")
    return prom, proc


@pytest.fixture(scope="module")
def fleet_alerts() -> Iterator[dict[str, Any]]:
    ensure_broker()
    tmp = Path(tempfile.mkdtemp(prefix="rmqtrace-am-"))
    receiver = _Receiver()
    am_env: dict[str, str] | None = None
    prom_proc: Any = None
    try:
        am_port, am_env = _start_alertmanager(tmp / "alertmanager", receiver.url)
        rules = render_rule_variant(tmp / "fleet.test.yml", for_="1s", thresholds={ALERT: THRESHOLD}, src=FLEET_RULES)
        ports = [free_port() for _ in range(INSTANCES)]
        targets = [f"127.0.0.1:{p}" for p in ports]
        prom, prom_proc = _start_prometheus(tmp / "prometheus", targets, rules, am_port)
        job = long_tail_job(240, seed=11, long_s=(0.8, 2.5))
        runs = {}
        for mode in ("push_consumer", "demand_driven"):
            runs[mode] = run_fleet(mode, job, instances=INSTANCES, workers=WORKERS, metrics_ports=ports, linger=3.0)
        dd_group = runs["demand_driven"].group

        def delivered(group: str) -> bool:
            return any(a["labels"].get("consumer_group") == group for a in receiver.alerts())

        # How much a push fleet holds back depends on the order the broker delivers in: the first
        # run of a session (a cold broker) once held too little for the threshold (CI, mean HOL
        # under 0.25), and a loaded machine once gave a run with 0.67 worker-s held back in all (the
        # live signal read 6.0: its error is additive, see RESOLUTION_WS). Such a run is not the
        # incident: one more push run then (at most two); the alert must come for the run kept, and
        # that run must hold back over MIN_HELD worker-seconds.
        attempts = 3
        for attempt in range(1, attempts + 1):
            push_group = runs["push_consumer"].group
            push = runs["push_consumer"].summary()
            try:
                wait_until(lambda g=push_group: delivered(g), timeout=90, interval=0.5,
                           what=f"{ALERT} for {push_group} at the webhook (push run {attempt}: {push})")
                if push["idle_worker_seconds"] > MIN_HELD or attempt == attempts:
                    break
            except AssertionError:
                if attempt == attempts:
                    raise
            runs["push_consumer"] = run_fleet("push_consumer", job, instances=INSTANCES, workers=WORKERS,
                                              metrics_ports=ports, linger=3.0)
        yield {"prom": prom, "receiver": receiver, "runs": runs, "push": push_group, "dd": dd_group,
               "targets": targets}
    finally:
        if prom_proc is not None:
            prom_proc.terminate()
            prom_proc.wait(30)
        if am_env is not None:
            subprocess.run(["bash", str(AM_SH), "stop"], env=am_env, capture_output=True, timeout=60)
        receiver.server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_push_fleet_alert_arrives_with_instance_and_group(fleet_alerts: dict[str, Any]) -> None:
    got = [a for a in fleet_alerts["receiver"].alerts() if a["labels"].get("consumer_group") == fleet_alerts["push"]]
    assert got
    for a in got:
        labels = a["labels"]
        assert labels["alertname"] == ALERT and labels["severity"] == "warning"
        assert labels["instance"] in fleet_alerts["targets"]
        assert labels["instance"] in a["annotations"]["summary"] and fleet_alerts["push"] in a["annotations"]["summary"]
        assert a["status"] in ("firing", "resolved")
    # the holder Prometheus named is an instance that held messages while others idled
    push = fleet_alerts["runs"]["push_consumer"].summary()
    assert push["idle_worker_seconds"] > MIN_HELD


def test_the_demand_driven_fleet_stays_quiet(fleet_alerts: dict[str, Any]) -> None:
    dd = fleet_alerts["dd"]
    assert not [a for a in fleet_alerts["receiver"].alerts() if a["labels"].get("consumer_group") == dd]
    prom: Prometheus = fleet_alerts["prom"]
    assert not [a for a in prom.alerts() if a["labels"].get("consumer_group") == dd]
    # its fleet signal was there, and about zero the whole time
    series = prom.query(f'max_over_time(rmqtrace:consumer_fleet_hol_workers{{consumer_group="{dd}"}}[5m])')
    assert series
    mean = prom.query(f'avg_over_time(rmqtrace:consumer_fleet_hol_workers{{consumer_group="{dd}"}}[5m])')
    print("demand-driven mean fleet-HOL workers:", [round(float(s["value"][1]), 3) for s in mean])  # shown with -s
    assert all(float(s["value"][1]) < THRESHOLD for s in mean)


def test_the_live_signal_matches_the_stamps(fleet_alerts: dict[str, Any]) -> None:
    """The sampled fleet signal (1 s evaluations) against the exact sweep of the members' stamps."""
    prom: Prometheus = fleet_alerts["prom"]
    push = fleet_alerts["push"]
    sampled = prom.query(f'sum(sum_over_time(rmqtrace:consumer_fleet_hol_workers{{consumer_group="{push}"}}[5m]))')
    exact = fleet_alerts["runs"]["push_consumer"].summary()["idle_worker_seconds"]
    estimate = float(sampled[0]["value"][1])  # worker-evaluations × 1 s
    print(f"fleet idle worker-s while held elsewhere: sampled {estimate:.1f}, exact {exact:.1f}")  # shown with -s
    # an additive error (the sampling's), not a ratio: a run that held back 0.67 worker-s once read 6.0
    assert abs(estimate - exact) <= RESOLUTION_WS + 0.25 * exact, (estimate, exact)
    # and the exact in-process counter is exported and scraped per instance
    hol = prom.query(f'rmqtrace_consumer_hol_idle_worker_seconds_total{{consumer_group="{push}"}}[5m]')
    assert {s["metric"]["instance"] for s in hol} == set(fleet_alerts["targets"])


# A rate window of many scrapes: on a loaded machine a 1 s scrape is sometimes late or missed.
_VARS = {"$__rate_interval": "30s", "$__range_s": "300", "$__range": "5m"}


def _substitute(expr: str) -> str:
    out = re.sub(r'=~"\$(consumer_group|instance)"', '=~".*"', expr)
    for k, v in _VARS.items():
        out = out.replace(k, v)
    assert "$" not in out, out
    return out


def test_every_fleet_dashboard_query_returns_data(fleet_alerts: dict[str, Any]) -> None:
    prom: Prometheus = fleet_alerts["prom"]
    run = fleet_alerts["runs"]["push_consumer"]
    at = run.t0_ns / 1e9 + run.summary()["makespan_s"] * 0.6  # mid-job: gauges live, caches still full
    d = json.loads(FLEET_DASHBOARD.read_text())
    for p in d["panels"]:
        for t in p.get("targets", []):
            assert prom.query(_substitute(t["expr"]), at=at), f"{p['title']}: no data"
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            m = re.match(r"label_values\((?:(.+),\s*)?(\w+)\)", v["query"])
            assert m, v["query"]
            match = [_substitute(m[1])] if m[1] else []
            assert prom.label_values(m[2], match), v["query"]
