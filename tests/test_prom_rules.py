"""promtool on the shipped rules (rmqtrace-alerts.yml, rmqtrace-fleet.yml, rmqtrace-probe.yml and the
broker side's rmqtrace-broker.yml): `check
rules`, the unit tests in dashboards/prometheus/tests, and that every alert has a firing, a pending
and a not-firing case there.

promtool comes with the Debian ``prometheus`` package; when it is missing, services/prometheus/prom.sh
install is tried (skip if that fails, fail under RMQTRACE_REQUIRE_SERVICES=1).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from services import (
    RULE_TESTS,
    RULES,
    VARIANT_FOR,
    VARIANT_THRESHOLDS,
    ensure_promtool,
    load_rules,
    render_rule_variant,
    split_alert_expr,
)

FLEET_RULES = RULES.parent / "rmqtrace-fleet.yml"
PROBE_RULES = RULES.parent / "rmqtrace-probe.yml"
BROKER_RULES = RULES.parent / "rmqtrace-broker.yml"
RULE_FILES = (RULES, FLEET_RULES, PROBE_RULES, BROKER_RULES)


def all_rules() -> list[dict[str, object]]:
    return [r for path in RULE_FILES for r in load_rules(path)]


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ensure_promtool(), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    proc = promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(load_rules(path))} rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    files = sorted(p.name for p in RULE_TESTS.glob("*.yml"))
    assert files
    proc = promtool("test", "rules", *files, cwd=RULE_TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(files), proc.stdout


def test_every_alert_has_firing_pending_and_quiet_cases() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    pending: set[str] = set()
    for path in RULE_TESTS.glob("*.yml"):
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] in ([f"../{p.name}"] for p in RULE_FILES), path
        for case in doc["tests"]:
            for t in case.get("alert_rule_test", []):
                (firing if t["exp_alerts"] else quiet).add(t["alertname"])
            for t in case.get("promql_expr_test", []):
                for sample in t.get("exp_samples") or []:
                    m = re.search(r'alertname="(\w+)",alertstate="pending"', sample["labels"])
                    if m:
                        pending.add(m[1])
    alerts = {r["alert"] for r in all_rules() if "alert" in r}
    assert alerts - firing == set(), "no firing case"
    assert alerts - quiet == set(), "no not-firing case"
    assert alerts - pending == set(), "no pending case"


def test_the_end_to_end_variant_is_valid_and_differs_only_in_for() -> None:
    _check_variant(VARIANT_THRESHOLDS)


def test_a_variant_can_change_one_threshold() -> None:
    _check_variant({"RmqtraceConsumerWaitHigh": 0.5})


def test_the_fleet_rules_have_a_variant_too() -> None:
    _check_variant({"RmqtraceFleetHeadOfLineBlocking": 0.05}, FLEET_RULES)


def test_the_broker_rules_have_a_variant_too() -> None:
    _check_variant({"RmqtraceBrokerLagLatencyHigh": 4.0}, BROKER_RULES)


def test_broker_alerts_name_the_topic_and_the_group() -> None:
    for rule in load_rules(BROKER_RULES):
        if "alert" in rule:
            text = str(rule["annotations"]["summary"])
            assert "$labels.topic" in text and "$labels.consumer_group" in text, rule["alert"]


def test_fleet_alerts_name_the_instance_and_the_group() -> None:
    """What Alertmanager routes on and the webhook receiver sees: both alerts keep both labels."""
    for rule in load_rules(FLEET_RULES):
        if "alert" in rule:
            text = str(rule["annotations"]["summary"])
            assert "$labels.instance" in text and "$labels.consumer_group" in text, rule["alert"]


def _check_variant(thresholds: dict[str, float], src: Path = RULES) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        variant = render_rule_variant(Path(tmp) / "variant.yml", for_=VARIANT_FOR, thresholds=thresholds, src=src)
        proc = promtool("check", "rules", str(variant))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        shipped, test_copy = load_rules(src), load_rules(variant)
    assert len(shipped) == len(test_copy)
    for a, b in zip(shipped, test_copy, strict=True):
        changed = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
        if "alert" not in a:
            assert not changed
            continue
        assert b["for"] == VARIANT_FOR and changed <= {"for", "expr"}
        signal_a, op_a, threshold_a = split_alert_expr(a["expr"])
        signal_b, op_b, threshold_b = split_alert_expr(b["expr"])
        assert (signal_a, op_a) == (signal_b, op_b)
        assert threshold_b == thresholds.get(a["alert"], threshold_a)


INCIDENT = RULE_TESTS / "incident_test.yml"


def test_the_recorded_incident_asserts_hol_on_round_robin_and_silence_on_aggressive() -> None:
    """The fixture is a real run's series (record_incident.py); promtool runs it with the others
    (test_promtool_unit_tests_pass). Here: it is generated, and it asserts what #32 asks."""
    text = INCIDENT.read_text()
    assert text.startswith("# GENERATED by dashboards/prometheus/tests/record_incident.py")
    doc = yaml.safe_load(text)
    case = doc["tests"][0]
    names = {s["series"].split("{")[0] for s in case["input_series"]}
    assert {"rmqtrace_dispatch_hol_idle_worker_seconds_total", "rmqtrace_dispatch_busy_worker_seconds_total",
            "rmqtrace_dispatch_workers"} <= names
    checks = case["promql_expr_test"]
    fires = [c for c in checks if "RmqtraceHeadOfLineBlocking" in c["expr"] and c["exp_samples"]]
    assert fires and all('consumer_group="demo-round_robin"' in s["labels"] for c in fires for s in c["exp_samples"])
    quiet = [c for c in checks if 'consumer_group="demo-aggressive"' in c["expr"]]
    assert any("RmqtraceHeadOfLineBlocking" in c["expr"] for c in quiet)
    assert any('alertstate="firing"' in c["expr"] for c in quiet)
    assert len(quiet) >= 6 and all(c["exp_samples"] == [] for c in quiet)


def test_the_recorder_writes_promtool_notation() -> None:
    import sys

    sys.path.insert(0, str(RULE_TESTS))
    from record_incident import _values

    assert _values({1: 0.0, 2: 0.0, 3: 5.5}, 5) == "_ 0x1 5.5 _"
    assert _values({0: 3.0, 1: 3.0, 2: 3.0}, 3) == "3x2"


# The review asked by issue #32: an alert whose condition is an instant reading of gauges, held
# under `for:`, is reset by one evaluation where the reading dips — the head-of-line rule never
# fired so, nor did the broker's no-consumer rule while a consumer connected now and then. Every
# series an alert reads at an instant (not through a range selector, in its expression or, through
# a recorded series read at an instant, in that record's) is named here with why no evaluation of
# the incident the alert names makes it dip. A subquery's inside counts as instant: none is used; so
# does last_over_time's (the last sample of its window: it bridges a failed scrape's stale markers).
INSTANT_BY_DESIGN: dict[str, dict[str, str]] = {
    "RmqtraceWorkersSaturated": {
        "rmqtrace_dispatch_workers": "the dispatcher's configured worker count: constant while it runs",
    },
    "RmqtraceConsumerStalled": {
        "rmqtrace_consumer_oldest_unstarted_age_seconds": "the oldest unstarted message only ages while no worker "
                                                          "starts it",
    },
    "RmqtraceProbeNotSeen": {
        "rmqtrace_probe_last_seen_timestamp_seconds": "time since the last settled probe only grows while none is "
                                                      "settled",
        "rmqtrace_probe_last_sent_timestamp_seconds": "the sender's last probe, renewed every few seconds while "
                                                      "probes are sent",
    },
    "RmqtraceBrokerLagLatencyHigh": {
        "rocketmq_consumer_lag_latency_milliseconds": "the oldest message the group has not taken only ages while "
                                                      "it takes none",
    },
}
_NAME_READ = re.compile(r"\b(?P<name>(?:rmqtrace[_:]|rocketmq_)[A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*(?P<range>\[)?")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
# last_over_time reads the latest sample of its window: an instant reading that only bridges a stale gap
_LAST = re.compile(r"\blast_over_time\s*\(\s*$")


def instant_reads(expr: str, recorded: dict[str, str], seen: frozenset[str] = frozenset(), *,
                  last_over_time: bool = True) -> set[str]:
    """The scraped series ``expr`` reads at an instant: directly, or through a record it reads at one.
    ``last_over_time=False`` leaves out what it reads through last_over_time (a failed scrape's gap bridged)."""
    out: set[str] = set()
    text = _STRING.sub('""', expr)
    for m in _NAME_READ.finditer(text):
        name = m["name"]
        through_last = bool(m["range"]) and _LAST.search(text[:m.start()]) is not None
        if m["range"] and not (through_last and last_over_time):
            continue
        if name in recorded:
            assert name not in seen, f"recording rules read each other in a cycle through {name}"
            out |= instant_reads(recorded[name], recorded, seen | {name}, last_over_time=last_over_time)
        else:
            out.add(name)
    return out


def test_instant_reads_follows_records_and_stops_at_a_range() -> None:
    recorded = {"rmqtrace:a": "sum(rmqtrace_x) / sum(rate(rmqtrace_y[5m]))", "rmqtrace:b": "rocketmq_z > bool 0"}
    assert instant_reads('rmqtrace:a > 1 and avg_over_time(rmqtrace:b[5m]) > 0', recorded) == {"rmqtrace_x"}
    assert instant_reads('rmqtrace:b{consumer_group="g"} > 0', recorded) == {"rocketmq_z"}
    assert instant_reads('max_over_time((rmqtrace_q > 0)[5m:])', recorded) == {"rmqtrace_q"}
    bridged = 'last_over_time(rmqtrace:a[2m]) > 0 and last_over_time(rmqtrace_v{k="("}[2m]) and rate(rmqtrace_w[5m])'
    assert instant_reads(bridged, recorded) == {"rmqtrace_x", "rmqtrace_v"}
    assert instant_reads(bridged, recorded, last_over_time=False) == set()
    assert instant_reads('rmqtrace:a > 0', recorded, last_over_time=False) == {"rmqtrace_x"}


def _alerts() -> list[dict[str, object]]:
    return [r for r in all_rules() if "alert" in r]


def _recorded() -> dict[str, str]:
    return {str(r["record"]): str(r["expr"]) for r in all_rules() if "record" in r}


@pytest.mark.parametrize("rule", _alerts(), ids=lambda r: r["alert"])
def test_no_alert_holds_an_instant_reading_that_the_incident_interrupts(rule: dict[str, object]) -> None:
    read = instant_reads(str(rule["expr"]), _recorded())
    reviewed = set(INSTANT_BY_DESIGN.get(str(rule["alert"]), {}))
    assert read - reviewed == set(), (
        f"{rule['alert']} reads {sorted(read - reviewed)} at an instant under for: (read a window, or name it in "
        "INSTANT_BY_DESIGN with why no evaluation of its incident dips below the threshold)")
    assert reviewed - read == set(), f"{rule['alert']} no longer reads {sorted(reviewed - read)} at an instant: drop it"


# The same flaw from outside the incident: one failed scrape writes staleness markers for all of its
# target's series, so a series read at a plain instant is absent for an evaluation, and a pending or
# firing alert is dropped (a firing one resolves, then needs its whole `for:` again). What an alert
# reads at an instant it reads through last_over_time over 2 minutes, which spans one failed scrape
# at scrape and evaluation intervals up to a minute; windows ignore staleness markers already.
@pytest.mark.parametrize("rule", _alerts(), ids=lambda r: r["alert"])
def test_no_alert_is_reset_by_one_failed_scrape(rule: dict[str, object]) -> None:
    plain = instant_reads(str(rule["expr"]), _recorded(), last_over_time=False)
    assert plain == set(), f"{rule['alert']} reads {sorted(plain)} at a plain instant: read it through last_over_time"
    assert all(w == "2m" for w in re.findall(r"last_over_time\([^\[]*\[(\w+)\]", str(rule["expr"]))), rule["expr"]


FLEET_INCIDENT = RULE_TESTS / "fleet_incident_test.yml"


def test_the_recorded_fleet_asserts_hol_for_push_consumers_and_silence_for_their_replacement() -> None:
    """The fleet bench's push mode on the real broker, recorded (record_fleet_incident.py); promtool
    runs it with the others. Here: it is generated, real members' series, and it asserts what #32
    asks of the push recording."""
    text = FLEET_INCIDENT.read_text()
    assert text.startswith("# GENERATED by dashboards/prometheus/tests/record_fleet_incident.py")
    doc = yaml.safe_load(text)
    assert doc["rule_files"] == ["../rmqtrace-fleet.yml"]
    case = doc["tests"][0]
    names = {s["series"].split("{")[0] for s in case["input_series"]}
    assert {"rmqtrace_consumer_unstarted_messages", "rmqtrace_consumer_busy_workers", "rmqtrace_consumer_workers",
            "rmqtrace_consumer_hol_idle_worker_seconds_total"} <= names
    instances = {re.search(r'instance="([^"]+)"', s["series"])[1] for s in case["input_series"]}  # type: ignore[index]
    assert instances == {f"{mode}-{i}" for mode in ("push_consumer", "push_replacement") for i in range(3)}
    checks = case["promql_expr_test"]
    fires = [c for c in checks if c["exp_samples"]]
    assert fires and all("RmqtraceFleetHeadOfLineBlocking" in c["expr"] and "fleet-push_consumer" in c["expr"]
                         for c in fires)
    quiet = [c for c in checks if 'consumer_group="fleet-push_replacement"' in c["expr"]]
    assert {"RmqtraceFleetHeadOfLineBlocking", "RmqtraceConsumerHeadOfLineBlocking", 'alertstate="firing"'} <= {
        key for c in quiet for key in ("RmqtraceFleetHeadOfLineBlocking", "RmqtraceConsumerHeadOfLineBlocking",
                                       'alertstate="firing"') if key in c["expr"]}
    assert len(quiet) >= 9 and all(c["exp_samples"] == [] for c in quiet)
