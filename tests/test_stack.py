"""services/stack.sh as documented: every URL it prints answers 200 on the Prometheus it installs
(Debian's 2.42 has only the classic UI: /alerts is a 404 there), every documented rule file is
loaded, PROM_RULE_FILES passes through, and STACK_ALERTMANAGER=1 adds Alertmanager, wired to
Prometheus.

Prometheus and Alertmanager are started here on free ports with their own state directories.
RocketMQ and Jaeger are shared by every test and must not be stopped by one: the full stack's
`up` finds them running (make test started them) and starts only the other two; `down` is asked
for those two only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from rmq_real import ensure_broker
from waiting import wait_until

from services import REPO, free_port, unavailable

STACK = REPO / "services" / "stack.sh"
DOCUMENTED = ("rmqtrace-alerts.yml", "rmqtrace-broker.yml", "rmqtrace-fleet.yml", "rmqtrace-probe.yml")

pytestmark = pytest.mark.integration


def _stack(cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(STACK), cmd], env=env, capture_output=True, text=True, timeout=600)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    if shutil.which("prometheus") is None:
        unavailable("prometheus not installed (services/prometheus/prom.sh install)")
    return dict(os.environ, PROM_PORT=str(free_port()), AM_PORT=str(free_port()),
                PROM_STATE_DIR=str(tmp_path / "prom"), AM_STATE_DIR=str(tmp_path / "am"),
                AM_WEBHOOK_URL="http://127.0.0.1:9/unused", PROM_BROKER_TARGETS="", **extra)


def _printed_urls(stdout: str) -> list[str]:
    """The URLs of the "rmqtrace stack is up" block, less the webhook nothing serves here."""
    return [u for u in re.findall(r"https?://[^\s)]+", stdout.split("Run your application with:")[0])
            if "unused" not in u]


def _needs_alertmanager() -> None:
    if shutil.which("prometheus-alertmanager") is None and shutil.which("alertmanager") is None:
        unavailable("alertmanager not installed (services/alertmanager/am.sh install)")


def test_printed_urls_answer_and_every_documented_rule_file_loads(tmp_path: Path) -> None:
    _needs_alertmanager()
    env = _env(tmp_path, STACK_ALERTMANAGER="1", STACK_SERVICES="prometheus alertmanager")
    env.pop("PROM_RULE_FILES", None)
    try:
        up = _stack("up", env)
        assert up.returncode == 0, up.stderr[-2000:]
        urls = _printed_urls(up.stdout)
        assert any("/alerts" in u for u in urls) and any(u.endswith(f":{env['AM_PORT']}/") for u in urls), up.stdout
        for url in urls:
            assert _get(url)[0] == 200, url
        prom = f"http://127.0.0.1:{env['PROM_PORT']}"
        groups = json.loads(_get(f"{prom}/api/v1/rules")[1])["data"]["groups"]
        assert {Path(g["file"]).name for g in groups} == set(DOCUMENTED)
        want = [f"http://127.0.0.1:{env['AM_PORT']}/api/v2/alerts"]

        def wired() -> bool:  # Prometheus' discovery of Alertmanagers is throttled to 5 s
            ams = json.loads(_get(f"{prom}/api/v1/alertmanagers")[1])["data"]["activeAlertmanagers"]
            return [a["url"] for a in ams] == want

        wait_until(wired, timeout=30, interval=0.5, what=f"Prometheus sending to {want}")
    finally:
        down = _stack("down", env)
    assert down.returncode == 0, down.stderr
    assert _stack("status", env).returncode == 3  # both down


def test_prom_rule_files_passes_through(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yml"
    mine.write_text("groups:\n  - name: mine\n    rules:\n      - record: mine:up\n        expr: up\n")
    rules = f"{REPO / 'dashboards' / 'prometheus' / 'rmqtrace-alerts.yml'},{mine}"
    env = _env(tmp_path, STACK_SERVICES="prometheus", PROM_RULE_FILES=rules)
    try:
        up = _stack("up", env)
        assert up.returncode == 0, up.stderr[-2000:]
        groups = json.loads(_get(f"http://127.0.0.1:{env['PROM_PORT']}/api/v1/rules")[1])["data"]["groups"]
        assert {Path(g["file"]).name for g in groups} == {"rmqtrace-alerts.yml", "mine.yml"}
    finally:
        _stack("down", env)


def test_every_url_the_full_stack_prints_answers(tmp_path: Path) -> None:
    """`make stack STACK_ALERTMANAGER=1` as a user runs it: RocketMQ's and Jaeger's lines too."""
    _needs_alertmanager()
    ensure_broker()
    jaeger = f"http://127.0.0.1:{os.environ.get('JAEGER_QUERY_PORT', '16686')}/api/services"
    try:
        urllib.request.urlopen(jaeger, timeout=5).close()
    except OSError as exc:  # never started here: a cold `jaeger.sh start` builds for minutes
        unavailable(f"Jaeger not running at {jaeger} ({exc}): make services-up")
    env = _env(tmp_path, STACK_ALERTMANAGER="1")
    env.pop("STACK_SERVICES", None)
    env.pop("PROM_BROKER_TARGETS")  # the stack's own: the broker's exporter
    try:
        up = _stack("up", env)
        assert up.returncode == 0, up.stderr[-2000:]
        urls = _printed_urls(up.stdout)
        ports = {int(p) for u in urls for p in re.findall(r"//127\.0\.0\.1:(\d+)", u)}
        assert {5557, int(jaeger.split(":")[2].split("/")[0]), int(env["PROM_PORT"]), int(env["AM_PORT"])} <= ports, up.stdout
        for url in urls:
            assert _get(url)[0] == 200, url
    finally:
        _stack("down", dict(env, STACK_SERVICES="prometheus alertmanager"))


def test_the_printed_jaeger_urls_follow_its_port_variables(tmp_path: Path) -> None:
    """jaeger.sh listens where JAEGER_*_PORT say; the stack printed 16686/4318 whatever they said."""
    env = dict(os.environ, STACK_SERVICES="jaeger", JAEGER_QUERY_PORT="17777", JAEGER_OTLP_HTTP_PORT="17318",
               JAEGER_OTLP_GRPC_PORT="17317")
    out = _stack("urls", env).stdout
    assert "http://127.0.0.1:17777/api/services" in out and "127.0.0.1:17317 (gRPC)" in out, out
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:17318" in out and "16686" not in out, out
