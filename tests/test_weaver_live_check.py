"""OpenTelemetry's weaver ``registry live-check`` on rmqtrace's real telemetry (issue 31's "Done when":
no violation outside the ``rmqtrace.*`` names), when a weaver binary and the registry are here.

tests/semconv/weaver_live_check.py sends the CLI demo's spans and, in-process, the demo's, the
traced wrappers' and a ConsumeLoop's spans and OTel metrics over OTLP gRPC to weaver, and reads its JSON report. Skipped
without weaver: no package registry reachable here ships it (PyPI, npm, crates.io, the Go proxy:
docs/semconv.md) and it is built from its source repository (GitHub), which a fresh machine cannot
fetch; tests/test_semconv_conformance.py makes the same checks against the in-repo registry. The
script's arguments and its reading of weaver's report are tested everywhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "semconv"))
from weaver_live_check import REPO, find_registry, find_weaver, main, read_report  # noqa: E402

SCRIPT = Path(__file__).parent / "semconv" / "weaver_live_check.py"
WEAVER, REGISTRY = find_weaver(), find_registry()

needs_weaver = pytest.mark.skipif(
    WEAVER is None or not WEAVER.exists() or not REGISTRY.is_dir(),
    reason=f"no weaver binary ({WEAVER or 'set WEAVER or put one at .cache/bin/weaver-<version>'}) or no "
           f"semantic-conventions model ({REGISTRY}; WEAVER_REGISTRY): no package registry reachable here ships "
           "weaver and its source (GitHub) cannot be fetched; tests/test_semconv_conformance.py checks against the "
           "in-repo registry instead")


def _live_check(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    run = subprocess.run([sys.executable, str(SCRIPT), "--json", "--out", str(tmp_path), *args],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode in (0, 1) and run.stdout, run.stderr[-3000:]
    return run.returncode, json.loads(run.stdout)


@needs_weaver
def test_weaver_finds_no_violation_outside_our_names(tmp_path: Path) -> None:
    code, report = _live_check(tmp_path)
    # not vacuous: every path's spans, the exception event, the links and the OTel metrics reached weaver
    assert {"span send testcase-groups", "span process testcase-groups", "span receive T", "span process T",
            "span handler", "span ack T", "span change_invisible_duration T", "span dispatch_wait", "span process L",
            "span change_invisible_duration L",
            "metric messaging.client.operation.duration", "metric messaging.client.sent.messages",
            "metric messaging.process.duration", "metric messaging.client.consumed.messages"
            } <= set(report["names"]), report["names"]
    assert report["signals"].get("span_event", 0) >= 2 and report["signals"].get("span_link", 0) >= 1
    assert report["ours"], "our rmqtrace.* names are not in the registry: weaver reports them"
    assert (code, report["violations"]) == (0, {})


@needs_weaver
def test_weaver_flags_the_control_span(tmp_path: Path) -> None:
    """The report is read right: item 13's exception.escaped (as the SDK writes it) and a mistyped
    attribute come back as violations, our own name as ours."""
    code, report = _live_check(tmp_path, "--run", "control")
    assert code == 1
    assert sorted(report["violations"]) == [
        "Attribute 'exception.escaped' has type 'string'. Type should be 'boolean'.",
        "Attribute 'exception.escaped' is deprecated; reason = 'obsoleted', note = 'It's no longer recommended to "
        "record exceptions that are handled and do not escape the scope of a span.\n'.",
        "Attribute 'messaging.batch.message_count' has type 'string'. Type should be 'int'.",
    ]
    assert list(report["ours"]) == ["Attribute 'rmqtrace.own' does not exist in the registry."]


def test_a_missing_weaver_or_registry_is_a_bad_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--weaver", str(tmp_path / "none"), "--registry", str(tmp_path)]) == 2
    assert main(["--weaver", sys.executable, "--registry", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("weaver-check: no ") for line in err), err


def test_the_report_is_read_by_level_and_by_name(tmp_path: Path) -> None:
    """Ours (attribute key or metric under rmqtrace.*) apart from every other violation; every level counted."""
    def advice(level: str, message: str, **context: str) -> dict[str, Any]:
        return {"id": "x", "level": level, "message": message, "context": context}

    def result(*a: dict[str, Any]) -> dict[str, Any]:
        return {"all_advice": list(a)}

    doc = {"samples": [
        {"span": {"name": "process T", "live_check_result": result(), "attributes": [
            {"name": "rmqtrace.cost", "live_check_result": result(advice("violation", "ours", attribute_key="rmqtrace.cost"))},
            {"name": "exception.escaped", "live_check_result": result(
                advice("violation", "deprecated", attribute_key="exception.escaped"),
                advice("improvement", "not stable", attribute_key="exception.escaped"))}]}},
        {"metric": {"name": "rmqtrace.stage.duration", "live_check_result": result(advice("violation", "no metric"))}},
        {"metric": {"name": "messaging.process.duration", "live_check_result": result(advice("information", "enum"))}},
    ], "statistics": {"total_entities_by_type": {"span": 1, "metric": 2}}}
    path = tmp_path / "live_check.json"
    path.write_text(json.dumps(doc))
    r = read_report(path)
    assert (r.levels, r.ours, r.violations) == ({"violation": 3, "improvement": 1, "information": 1},
                                                {"ours": 1, "no metric": 1}, {"deprecated": 1})
    assert r.names == ["metric messaging.process.duration", "metric rmqtrace.stage.duration", "span process T"]
