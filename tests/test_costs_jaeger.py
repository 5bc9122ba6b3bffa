"""``rmqtrace report --jaeger … --costs`` learns the same table as from the span file, and the send
order survives Jaeger (issue #34 items 2 and 4); the run is test_report_jaeger's (demo policies on
the embedded broker, spans to Jaeger and a file at once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report_jaeger import GROUPS, POLICIES, jaeger, run

from tracer.dispatch.costtable import load_costs
from tracer.tools.cli import main

pytestmark = pytest.mark.integration
__all__ = ["jaeger", "run"]  # the fixtures, imported to be used here


def test_costs_from_jaeger_equal_costs_from_the_file(jaeger: str, run: tuple[str, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    service, spans_file = run
    from_jaeger, from_file = tmp_path / "jaeger.json", tmp_path / "file.json"
    assert main(["report", "--jaeger", jaeger, "--service", service, "--json", "--costs", str(from_jaeger)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [j["sent_order"] for g in report["groups"] for j in g["jobs"]] == ["arrival"] * len(POLICIES)
    assert main(["report", str(spans_file), "--json", "--costs", str(from_file)]) == 0
    a, b = load_costs(from_jaeger), load_costs(from_file)
    assert len(a) == GROUPS and a == b  # the handler times come from the exact stamps either way
