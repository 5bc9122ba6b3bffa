"""`make alerts-demo`: from nothing to a delivered alert, on loopback, in one command.

Starts, each on a free loopback port and in a state directory of its own under
``.cache/alerts-demo/``:

1. a webhook receiver (this process) that prints each alert Alertmanager posts to it;
2. Alertmanager (services/alertmanager/am.sh: the shipped config, only its receiver URL swapped);
3. Prometheus (services/prometheus/prom.sh) scraping this process every second, evaluating a rule
   file generated at start from dashboards/prometheus/rmqtrace-alerts.yml: the real expressions and
   thresholds, with only every alert's ``for:`` set to ``RMQTRACE_ALERTS_DEMO_FOR`` (default
   ``10s``; the one setting) and the evaluation interval at 1 s, as it says when it starts;
4. the incident: the demo's job under round-robin dispatch (``tracer.tools.demo.run_policy``:
   the embedded broker, the real ConsumeLoop, dispatcher and collectors) serving ``/metrics``.

It prints each alert as it arrives and stops everything it started when the run ends, when
``--until`` has been delivered, at ``--timeout`` or on Ctrl-C. Exit status 0 when ``--until``
(default RmqtraceHeadOfLineBlocking) reached the webhook, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "dashboards" / "prometheus" / "rmqtrace-alerts.yml"
PROM_SH = REPO / "services" / "prometheus" / "prom.sh"
AM_SH = REPO / "services" / "alertmanager" / "am.sh"
FOR_SETTING = "RMQTRACE_ALERTS_DEMO_FOR"
_DURATION = re.compile(r"^\d+(ms|s|m|h)$")


_FOR_LINE = re.compile(r"^(?P<indent>\s+)for: \S+[ \t]*$", re.M)
_ALERT_LINE = re.compile(r"^\s+- alert: ", re.M)


def render_demo_rules(dst: Path, for_: str, src: Path = RULES) -> Path:
    """``src`` with every alert's ``for:`` set to ``for_``; nothing else changes, comments included.

    Text, not a YAML round trip: `make alerts-demo` runs on the base install, which has no YAML
    library; in the rule files only alerts carry a ``for:`` line, one each.

    Raises:
        ValueError: ``for_`` is not a Prometheus duration such as ``10s``, or ``src`` has an alert
            without its own ``for:`` line.
    """
    if not _DURATION.match(for_):
        raise ValueError(f"{FOR_SETTING} must be a Prometheus duration like 10s or 1m, got {for_!r}")
    text = src.read_text(encoding="utf-8")
    out, n = _FOR_LINE.subn(lambda m: f"{m['indent']}for: {for_}", text)
    if n != len(_ALERT_LINE.findall(text)):
        raise ValueError(f"{src}: {len(_ALERT_LINE.findall(text))} alerts but {n} for: lines")
    dst.write_text(out, encoding="utf-8")
    return dst


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Receiver:
    """The webhook Alertmanager posts to: prints each alert once per state change."""

    def __init__(self, started: float, out: Callable[[str], None] = print) -> None:
        self.started = started
        self.delivered: list[dict[str, Any]] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self.send_response(200)
                self.end_headers()
                for alert in body.get("alerts", []):
                    receiver.add(alert)

            def log_message(self, *args: Any) -> None:
                pass

        self.out = out
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/rmqtrace-alerts"
        threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True).start()

    def add(self, alert: dict[str, Any]) -> None:
        labels = alert.get("labels", {})
        where = " ".join(f"{k}={labels[k]}" for k in ("consumer_group", "policy", "instance") if k in labels)
        self.out(f"[{time.monotonic() - self.started:6.1f} s] webhook got {alert.get('status', '?').upper()} "
                 f"{labels.get('alertname')} {where}: {alert.get('annotations', {}).get('summary', '')}")
        with self.arrived:
            self.delivered.append(alert)
            self.arrived.notify_all()

    def has(self, name: str) -> bool:
        with self.arrived:
            return any(a.get("labels", {}).get("alertname") == name and a.get("status") == "firing"
                       for a in self.delivered)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Daemon:
    """One of the stack's scripts, started with its own port and state directory."""

    def __init__(self, script: Path, env: dict[str, str]) -> None:
        self.script = script
        self.env = dict(os.environ, **env)
        self.started = False

    def start(self) -> None:
        proc = subprocess.run(["bash", str(self.script), "start"], env=self.env, capture_output=True, text=True,
                              timeout=600)
        self.started = True  # stop() even after a failed start: it may have left a process
        if proc.returncode != 0:
            raise RuntimeError(f"{self.script.name} start failed (rc={proc.returncode}): {proc.stderr[-800:]}")

    def stop(self) -> None:
        if self.started:
            subprocess.run(["bash", str(self.script), "stop"], env=self.env, capture_output=True, timeout=120)
            self.started = False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make alerts-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--until", default="RmqtraceHeadOfLineBlocking",
                   help="stop once this alert was delivered firing ('' = run the whole job)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    p.add_argument("--groups", type=int, default=500)
    p.add_argument("--case-ms", type=float, default=100.0)
    p.add_argument("--workers", type=int, default=8)
    args = p.parse_args(argv)
    for_ = os.environ.get(FOR_SETTING, "10s")
    started = time.monotonic()
    say = print

    from prometheus_client import CollectorRegistry, start_http_server

    from tracer.dispatch import DispatchMetrics
    from tracer.telemetry.metrics import TracerMetrics
    from tracer.tools.demo import DemoOptions, run_policy
    from tracer.tools.workload import make_job

    (REPO / ".cache").mkdir(exist_ok=True)
    base = REPO / ".cache" / "alerts-demo"
    base.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    rules = render_demo_rules(state / "rmqtrace-alerts.demo.yml", for_)
    say(f"alerts-demo: the real rules of {RULES.relative_to(REPO)} with every for: set to {for_} "
        f"({FOR_SETTING}) and a 1 s evaluation interval: {rules}")

    registry = CollectorRegistry()
    metrics, dispatch_metrics = TracerMetrics(registry), DispatchMetrics(registry)
    metrics_port = free_port()
    server, server_thread = start_http_server(metrics_port, addr="127.0.0.1", registry=registry)
    receiver = Receiver(started, say)
    am_port, prom_port = free_port(), free_port()
    am = Daemon(AM_SH, {"AM_PORT": str(am_port), "AM_STATE_DIR": str(state / "alertmanager"),
                        "AM_WEBHOOK_URL": receiver.url})
    prom = Daemon(PROM_SH, {"PROM_PORT": str(prom_port), "PROM_STATE_DIR": str(state / "prometheus"),
                            "PROM_TARGETS": f"127.0.0.1:{metrics_port}", "PROM_RULE_FILES": str(rules),
                            "PROM_ALERTMANAGERS": f"127.0.0.1:{am_port}", "PROM_JOB": "alerts-demo",
                            "PROM_SCRAPE_INTERVAL": "1s", "PROM_EVAL_INTERVAL": "1s"})
    ok = False
    try:
        am.start()
        say(f"alerts-demo: Alertmanager http://127.0.0.1:{am_port} → webhook {receiver.url}")
        prom.start()
        say(f"alerts-demo: Prometheus http://127.0.0.1:{prom_port}/classic/alerts scraping http://127.0.0.1:{metrics_port}/metrics")
        opts = DemoOptions(groups=args.groups, workers=args.workers, case_ms=args.case_ms, policies=("round_robin",))
        job = make_job(opts.groups, seed=opts.seed)
        say(f"alerts-demo: the incident: {opts.groups} test-case groups, {opts.workers} workers, round-robin "
            f"dispatch, {opts.case_ms:g} ms per case (Ctrl-C stops everything)")
        runner = threading.Thread(
            target=run_policy, args=("round_robin", job, opts),
            kwargs={"tracer_provider": None, "registry": registry, "metrics": metrics,
                    "dispatch_metrics": dispatch_metrics}, name="incident", daemon=True)
        runner.start()
        deadline = started + args.timeout
        with receiver.arrived:
            while time.monotonic() < deadline:
                if args.until and receiver.has(args.until):
                    ok = True
                    break
                if not runner.is_alive() and not args.until:
                    ok = bool(receiver.delivered)
                    break
                receiver.arrived.wait(1.0)
        if not ok:
            say(f"alerts-demo: {args.until or 'no alert'} not delivered within {args.timeout:g} s")
        else:
            say(f"alerts-demo: {args.until or 'the run'} done after {time.monotonic() - started:.0f} s; stopping")
    except KeyboardInterrupt:
        say("alerts-demo: interrupted; stopping")
    finally:
        prom.stop()
        am.stop()
        receiver.stop()
        server.shutdown()
        server_thread.join(10)
    if ok:
        shutil.rmtree(state, ignore_errors=True)
    else:
        say(f"alerts-demo: logs kept in {state}")
    say("alerts-demo: stopped Prometheus, Alertmanager, the webhook and /metrics")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
