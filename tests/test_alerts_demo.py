"""`make alerts-demo` end to end: from nothing to a delivered alert within 3 minutes, real rules.

The command (services/alerts_demo.py) starts Alertmanager and Prometheus with the stack's own
scripts, a webhook receiver and the round-robin incident; the rules are generated from
dashboards/prometheus/rmqtrace-alerts.yml with only `for:` changed. The test runs it as a user
would and reads what it printed: the head-of-line alert reached the webhook, the first alert
arrived within 3 minutes, and every port it opened is closed afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from services import REPO, load_rules, unavailable

sys.path.insert(0, str(REPO / "services"))
from alerts_demo import FOR_SETTING, render_demo_rules  # noqa: E402

RULES = REPO / "dashboards" / "prometheus" / "rmqtrace-alerts.yml"
FIRST_ALERT_WITHIN_S = 180.0


def test_demo_rules_differ_from_the_shipped_ones_only_in_for(tmp_path: Path) -> None:
    demo = render_demo_rules(tmp_path / "demo.yml", "7s")
    shipped, changed = load_rules(RULES), load_rules(demo)
    assert len(shipped) == len(changed)
    for a, b in zip(shipped, changed, strict=True):
        diff = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
        assert diff == ({"for"} if "alert" in a else set()), a
        if "alert" in a:
            assert b["for"] == "7s"
    assert yaml.safe_load(demo.read_text())["groups"][0]["name"] == "rmqtrace.recording"


@pytest.mark.parametrize("bad", ["", "10", "ten seconds", "-5s"])
def test_a_bad_setting_is_refused_with_its_name(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match=FOR_SETTING):
        render_demo_rules(tmp_path / "demo.yml", bad)


def _closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.integration
def test_the_command_delivers_the_head_of_line_alert_and_stops_everything() -> None:
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} not installed (services/prometheus/prom.sh install)")
    if shutil.which("prometheus-alertmanager") is None and shutil.which("alertmanager") is None:
        unavailable("alertmanager not installed (services/alertmanager/am.sh install)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(FOR_SETTING, None)  # the documented default
    proc = subprocess.run([sys.executable, str(REPO / "services" / "alerts_demo.py"), "--timeout", "240"],
                          capture_output=True, text=True, timeout=400, env=env, cwd=REPO)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-2000:]
    assert f"every for: set to 10s ({FOR_SETTING})" in out  # it says what it changed, at start
    arrivals = [(float(t), name) for t, name in re.findall(r"\[\s*([\d.]+) s\] webhook got FIRING (\w+)", out)]
    assert arrivals, out
    assert arrivals[0][0] < FIRST_ALERT_WITHIN_S, out
    assert "RmqtraceHeadOfLineBlocking" in {name for _, name in arrivals}, out
    ports = [int(p) for p in re.findall(r"http://127\.0\.0\.1:(\d+)", out)]
    assert len(set(ports)) >= 4, out  # Alertmanager, webhook, Prometheus, /metrics
    assert all(_closed(p) for p in set(ports)), out


def _summary_pattern(template: str) -> re.Pattern[str]:
    """A rule's summary template as the text Alertmanager delivers: every {{ … }} any text."""
    parts = re.split(r"\{\{.*?\}\}", template)
    return re.compile("^" + ".+?".join(re.escape(p) for p in parts) + "$")


def test_the_readme_sample_is_what_the_command_prints() -> None:
    """The README's sample output of `make alerts-demo`: its first and last lines are the ones the
    command says, and each webhook line is a real alert's, with the summary its rule writes."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"make alerts-demo\n```\n.*?```text\n(.*?)```", text, re.S)
    assert block, "the README's alert section shows the command's output"
    lines = block.group(1).splitlines()
    assert lines[0].startswith(f"alerts-demo: the real rules of {RULES.relative_to(REPO)} with every for: set to 10s "
                               f"({FOR_SETTING}) and a 1 s evaluation interval: ")
    assert lines[-1] == "alerts-demo: stopped Prometheus, Alertmanager, the webhook and /metrics"
    summaries = {r["alert"]: str(r["annotations"]["summary"]) for r in load_rules(RULES) if "alert" in r}
    webhook = [re.match(r"^\[\s*[\d.]+ s\] webhook got FIRING (\w+) ((?:\w+=\S+ ?)+): (.*)$", line) for line in lines[1:-1]]
    assert webhook and all(webhook), lines
    assert "RmqtraceHeadOfLineBlocking" in {m[1] for m in webhook if m}
    for m in webhook:
        assert m is not None and m[1] in summaries, m
        assert {kv.split("=")[0] for kv in m[2].split()} <= {"consumer_group", "policy", "instance"}, m[2]
        assert _summary_pattern(summaries[m[1]]).match(m[3]), (m[3], summaries[m[1]])


def test_the_command_needs_only_the_base_install() -> None:
    """`make alerts-demo` installs rmqtrace without extras (.venv/.installed): every module the
    command imports is the standard library's, rmqtrace's, or a base dependency's. From a fresh
    clone it died on `import yaml` (pyyaml comes only with the test extra)."""
    import ast
    import importlib.metadata

    from conftest import pyproject

    base = {re.split(r"[<>=!~\[ ;]", d)[0].lower().replace("_", "-") for d in pyproject()["project"]["dependencies"]}
    dists = importlib.metadata.packages_distributions()
    tree = ast.parse((REPO / "services" / "alerts_demo.py").read_text(encoding="utf-8"))
    tops = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    tops |= {node.module.split(".")[0] for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    outside = sorted(m for m in tops - set(sys.stdlib_module_names) - {"tracer", "__future__"}
                     if not {d.lower().replace("_", "-") for d in dists.get(m, [])} & base)
    assert outside == [], f"imported by services/alerts_demo.py, not in the base install: {outside}"
