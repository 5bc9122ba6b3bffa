"""Helpers for the tests that need a real Prometheus (a plain module, imported by the tests).

* :func:`start_prometheus` runs ``services/prometheus/prom.sh`` on a free port with its own state
  directory (so it never touches an instance someone else started) and returns a small HTTP client.
* :func:`render_rule_variant` writes the test copy of the shipped rules: same expressions, shorter
  ``for:``, and — only where a test names one — another trailing threshold.
* :func:`long_tail_scenario` is the run the end-to-end alert test and the PromQL contract test
  share: the long-tail job through the embedded broker, round-robin then aggressive, each on its
  own registry and ``/metrics`` port, scraped every second by one Prometheus with the rules loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from conftest import REPO, require_services, unavailable  # noqa: F401 - re-exported for the service tests
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, start_http_server
from waiting import wait_until

from tracer.dispatch import DispatchMetrics
from tracer.path.message import MessageInfo
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer
from tracer.tools.demo import TOPIC, DemoOptions, run_policy
from tracer.tools.workload import make_job

PROM_SH = REPO / "services" / "prometheus" / "prom.sh"
RULES = REPO / "dashboards" / "prometheus" / "rmqtrace-alerts.yml"
RULE_TESTS = REPO / "dashboards" / "prometheus" / "tests"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_promtool() -> str:
    """Path of ``promtool``, installing the Debian package through prom.sh when it is missing."""
    found = shutil.which("promtool")
    if found is None:
        proc = subprocess.run(["bash", str(PROM_SH), "install"], capture_output=True, text=True, timeout=600)
        found = shutil.which("promtool")
        if found is None:
            unavailable(f"promtool missing and `prom.sh install` failed: {proc.stderr.strip()[-500:]}")
    assert found is not None
    return found


# -- alert expressions ----------------------------------------------------------------------------
_ALERT_EXPR = re.compile(r"^(?P<signal>.*?)\s*(?P<op>>|<)\s*(?P<threshold>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*$",
                         re.DOTALL)


def split_alert_expr(expr: str) -> tuple[str, str, float]:
    """``<signal> <op> <threshold>`` → (signal, op, threshold); the shape every shipped alert has."""
    m = _ALERT_EXPR.match(expr.strip())
    if m is None:
        raise ValueError(f"alert expression does not end in `> N` or `< N`: {expr!r}")
    return m["signal"], m["op"], float(m["threshold"])


def load_rules(path: Path = RULES) -> list[dict[str, Any]]:
    """Every rule (recording and alerting) of a rules file, in order."""
    doc = yaml.safe_load(path.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def render_rule_variant(dst: Path, *, for_: str, thresholds: dict[str, float] | None = None,
                        src: Path = RULES) -> Path:
    """Write ``src`` to ``dst`` with every ``for:`` set to ``for_`` and the named alerts' trailing
    threshold replaced; expressions are otherwise untouched."""
    doc = yaml.safe_load(src.read_text())
    pending = dict(thresholds or {})
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            rule["for"] = for_
            if rule["alert"] in pending:
                signal, op, _ = split_alert_expr(rule["expr"])
                rule["expr"] = f"{signal} {op} {pending.pop(rule['alert'])!r}"
    if pending:
        raise KeyError(f"no such alerts in {src}: {sorted(pending)}")
    dst.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return dst


# -- Prometheus -----------------------------------------------------------------------------------
class PromQLError(AssertionError):
    pass


@dataclass
class Prometheus:
    """A Prometheus started by :func:`start_prometheus`; a thin client of its HTTP API."""

    port: int
    env: dict[str, str]
    state_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, params: dict[str, Any] | list[tuple[str, str]] | None = None) -> Any:
        query = urllib.parse.urlencode(params or {}, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:  # 400/422 carry the PromQL error as JSON
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PromQLError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.get("/api/v1/query", params)
        result = data["result"]
        return result if data["resultType"] in ("vector", "matrix") else [{"metric": {}, "value": result}]

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/alerts")["alerts"])

    def label_values(self, label: str, match: list[str] | None = None) -> list[str]:
        return list(self.get(f"/api/v1/label/{label}/values", [("match[]", m) for m in match or []]))

    def series(self, match: list[str]) -> list[dict[str, str]]:
        return list(self.get("/api/v1/series", [("match[]", m) for m in match]))

    def exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query_exemplars", {"query": expr, "start": start, "end": end}))

    def stop(self) -> None:
        subprocess.run(["bash", str(PROM_SH), "stop"], env=self.env, capture_output=True, timeout=60)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join((self.state_dir / "prometheus.log").read_text().splitlines()[-n:])
        except OSError:
            return ""


def start_prometheus(targets: list[str], rule_files: list[Path], *, state_dir: Path,
                     broker_targets: list[str] | None = None, alertmanagers: list[str] | None = None) -> Prometheus:
    """Start our own Prometheus (free port, own state dir) scraping ``targets`` (job rmqtrace) and
    ``broker_targets`` (job rocketmq-broker) every second, alerting to ``alertmanagers``."""
    if shutil.which("prometheus") is None:
        ensure_promtool()  # installs prometheus too
    port = free_port()
    env = dict(os.environ, PROM_PORT=str(port), PROM_STATE_DIR=str(state_dir),
               PROM_TARGETS=",".join(targets), PROM_RULE_FILES=",".join(str(p) for p in rule_files),
               PROM_BROKER_TARGETS=",".join(broker_targets or []), PROM_ALERTMANAGERS=",".join(alertmanagers or []),
               PROM_SCRAPE_INTERVAL="1s", PROM_EVAL_INTERVAL="1s", PROM_START_TIMEOUT="30")
    proc = subprocess.run(["bash", str(PROM_SH), "start"], env=env, capture_output=True, text=True, timeout=120)
    prom = Prometheus(port, env, state_dir)
    if proc.returncode != 0:
        prom.stop()
        unavailable(f"prom.sh start failed (rc={proc.returncode}): {proc.stderr.strip()[-800:]}")
    return prom


# -- the shared long-tail scenario ------------------------------------------------------------------
# The end-to-end run loads the shipped rules with `for:` shortened to a few evaluations; thresholds
# stay as shipped (VARIANT_THRESHOLDS could scale one down for a shorter run). At 30 ms per test
# case the round-robin consumer-wait p99 reaches ~9 s, above the production 5 s.
VARIANT_FOR = "2s"
# The long-tail job runs ~20 s: it cannot accrue the 150 idle worker-seconds a 5-minute mean of
# 0.5 workers needs, so here the head-of-line rule keeps its expression with a lower bar. Its
# production threshold fires on the recorded 11-minute incident (dashboards/prometheus/tests/
# incident_test.yml) and in `make alerts-demo` (tests/test_alerts_demo.py).
VARIANT_THRESHOLDS: dict[str, float] = {"RmqtraceHeadOfLineBlocking": 0.05}
DISPATCH_ALERTS = ("RmqtraceConsumerWaitHigh", "RmqtraceDispatchShareHigh")


@dataclass
class PolicyPhase:
    policy: str
    consumer_group: str
    port: int
    started: float = 0.0
    mid: float = 0.0  # wall time when 90 % of the messages had finished: gauges still live
    finished: float = 0.0
    handled: int = 0
    # (alertname, state) -> first wall time /api/v1/alerts showed it for this phase's labels
    seen: dict[tuple[str, str], float] = field(default_factory=dict)
    values: dict[str, list[float]] = field(default_factory=dict)  # alertname -> values seen


@dataclass
class Scenario:
    prom: Prometheus
    rules_variant: Path
    phases: dict[str, PolicyPhase]


_scenario: Scenario | BaseException | None = None
_scenario_lock = threading.Lock()


def _belongs(alert: dict[str, Any], phase: PolicyPhase) -> bool:
    labels = alert["labels"]
    return labels.get("consumer_group") == phase.consumer_group or labels.get("policy") == phase.policy


def _run_phase(prom: Prometheus, phase: PolicyPhase, registry: CollectorRegistry, opts: DemoOptions, job: Any,
               provider: TracerProvider, until: Callable[[PolicyPhase], bool], linger: float) -> None:
    metrics, dispatch_metrics = TracerMetrics(registry), DispatchMetrics(registry)
    done = [0]

    def on_message() -> None:
        done[0] += 1
        if done[0] == int(len(job) * 0.9):
            phase.mid = time.time()

    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(run_policy(phase.policy, job, opts, tracer_provider=provider, registry=registry,
                                     metrics=metrics, dispatch_metrics=dispatch_metrics, on_message=on_message))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    # A consumer reading a message whose traceparent is broken: the propagation-error series exists.
    _read_bad_message(metrics, phase.consumer_group)
    phase.started = time.time()
    runner = threading.Thread(target=run, name=f"scenario-{phase.policy}", daemon=True)
    runner.start()

    def poll() -> bool:
        for alert in prom.alerts():
            if _belongs(alert, phase):
                name = alert["labels"]["alertname"]
                phase.seen.setdefault((name, alert["state"]), time.time())
                phase.values.setdefault(name, []).append(float(alert["value"]))
        if runner.is_alive():
            return False
        if not phase.finished:
            phase.finished = time.time()
        return until(phase) or time.time() > phase.finished + linger

    wait_until(poll, timeout=180, interval=0.5, what=f"{phase.policy} run and its alerts")
    runner.join()
    if errors:
        raise errors[0]
    phase.handled = result[0].handled


def _read_bad_message(metrics: TracerMetrics, group: str) -> None:
    # A traceparent is parsed (and a bad one counted) when the message's spans are written, so the
    # message goes through an SDK provider and finishes.
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

    from tracer.path.stages import Outcome, Stage

    trace = MessageTracer(consumer_group=group, metrics=metrics, tracer_provider=SdkTracerProvider()).start_message(
        MessageInfo(topic=TOPIC, properties={"traceparent": "not-a-traceparent"}))
    trace.mark(Stage.DISPATCH_ENQUEUE)
    with trace.handler_scope():
        pass
    trace.mark(Stage.HANDLER_END)
    trace.finish(Outcome.SUCCESS)


def long_tail_scenario(config: pytest.Config) -> Scenario:
    """Run once per session (both test modules share it); Prometheus stops at session end."""
    global _scenario
    with _scenario_lock:
        if _scenario is None:
            try:
                _scenario = _build_scenario(config)
            except BaseException as exc:  # a skip or a failure: the second module gets the same
                _scenario = exc
                raise
        if isinstance(_scenario, BaseException):
            raise _scenario
        return _scenario


def _build_scenario(config: pytest.Config) -> Scenario:
    tmp = Path(tempfile.mkdtemp(prefix="rmqtrace-prom-"))
    variant = render_rule_variant(tmp / "rmqtrace-alerts.test.yml", for_=VARIANT_FOR, thresholds=VARIANT_THRESHOLDS)
    registries, servers, phases = {}, [], {}
    proms: list[Prometheus] = []

    def cleanup() -> None:
        for p in proms:
            p.stop()
        for s in servers:
            s.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)

    config.add_cleanup(cleanup)
    for policy in ("round_robin", "aggressive"):
        registries[policy] = CollectorRegistry()
        port = free_port()
        server, _thread = start_http_server(port, addr="127.0.0.1", registry=registries[policy])
        servers.append(server)
        phases[policy] = PolicyPhase(policy, f"demo-{policy}", port)
    prom = start_prometheus([f"127.0.0.1:{p.port}" for p in phases.values()], [variant], state_dir=tmp / "prom")
    proms.append(prom)
    # ~19 s under round-robin, ~14 s under aggressive: 200 groups of 1-600 cases at 30 ms a case on 8 workers.
    opts = DemoOptions(groups=200, workers=8, case_ms=30.0, seed=7)
    job = make_job(opts.groups, seed=opts.seed)
    provider = TracerProvider()  # sampled spans, nothing exported: exemplars carry real trace ids

    def fired(phase: PolicyPhase) -> bool:
        return all((name, "firing") in phase.seen for name in DISPATCH_ALERTS)

    _run_phase(prom, phases["round_robin"], registries["round_robin"], opts, job, provider, fired, linger=30)
    # aggressive: watch a few evaluations past the end; nothing must show up
    _run_phase(prom, phases["aggressive"], registries["aggressive"], opts, job, provider,
               lambda p: False, linger=3)
    return Scenario(prom, variant, phases)
