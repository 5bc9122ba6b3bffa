"""services/stack.sh as documented: every URL it prints answers 200 on the Prometheus it installs
(Debian's 2.42 has only the classic UI: /alerts is a 404 there), every documented rule file is
loaded, PROM_RULE_FILES passes through, and STACK_ALERTMANAGER=1 adds Alertmanager, wired to
Prometheus.

Only the Prometheus and Alertmanager parts are started here (STACK_SERVICES), on free ports with
their own state directories: RocketMQ and Jaeger are shared by every test and must not be
stopped by one.
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


def test_printed_urls_answer_and_every_documented_rule_file_loads(tmp_path: Path) -> None:
    if shutil.which("prometheus-alertmanager") is None and shutil.which("alertmanager") is None:
        unavailable("alertmanager not installed (services/alertmanager/am.sh install)")
    env = _env(tmp_path, STACK_ALERTMANAGER="1", STACK_SERVICES="prometheus alertmanager")
    env.pop("PROM_RULE_FILES", None)
    try:
        up = _stack("up", env)
        assert up.returncode == 0, up.stderr[-2000:]
        urls = re.findall(r"https?://[^\s)]+", up.stdout.split("Run your application with:")[0])
        assert any("/alerts" in u for u in urls) and any(u.endswith(f":{env['AM_PORT']}/") for u in urls), up.stdout
        for url in urls:
            if "unused" in url:  # the webhook, which nothing serves here
                continue
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
