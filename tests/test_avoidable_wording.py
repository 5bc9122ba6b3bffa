"""Every report view words avoidable wait by one rule (tracer.report.text.avoidable_verdict):
absolute seconds first, a share of consumer_wait only when the avoidable wait is material, and no
two verdicts that contradict.

Review #31 finding 10: the fleet view led with "50% of 0.0 s consumer_wait" — a share of a ~4 ms
total — beside the group report's "nobody waited while a worker was free". Each view (group and
fleet, terminal and HTML) is run on a near-empty and on a material avoidable wait; the last test
finds every place in the library that formats an avoidable share, so a new view cannot word it
its own way.
"""

from __future__ import annotations

import ast
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from tracer.path import names
from tracer.path.stages import Stage

MS = 1_000_000
T0 = 1_790_000_000_000_000_000


def _span(i: int, service: str, produce: int, pull: int, start: int, end: int) -> dict[str, object]:
    attrs = {"messaging.system": "rocketmq", "messaging.operation.type": "process", "messaging.destination.name": "t",
             "messaging.consumer.group.name": "g", names.MESSAGE_ID: f"m{i}", names.JOB_ID: "job-1", names.WORKER: 0,
             names.OUTCOME: "success",
             names.STAMP_ATTRS[Stage.PRODUCE]: T0 + produce, names.STAMP_ATTRS[Stage.BROKER_STORE]: T0 + produce + MS,
             names.STAMP_ATTRS[Stage.CLIENT_PULL]: T0 + pull, names.STAMP_ATTRS[Stage.DISPATCH_ENQUEUE]: T0 + pull,
             names.STAMP_ATTRS[Stage.HANDLER_START]: T0 + start, names.STAMP_ATTRS[Stage.HANDLER_END]: T0 + end}
    return {"trace_id": f"{i:032x}", "span_id": f"{i:016x}", "parent_span_id": None, "name": "process t",
            "kind": "CONSUMER", "start_ns": T0 + produce + MS, "end_ns": T0 + end, "status": "UNSET",
            "service": service, "attributes": attrs}


# on "a" m2 is pulled while m1 runs and waits for it; "b" is idle meanwhile: every wait is avoidable
CASES = {
    "near-empty": [_span(1, "a", 0, 2 * MS, 2 * MS, 100 * MS), _span(2, "a", 90 * MS, 96 * MS, 100 * MS, 150 * MS),
                   _span(3, "b", 0, 2 * MS, 2 * MS, 60 * MS)],  # ~4 ms of wait
    "material": [_span(1, "a", 0, 2 * MS, 2 * MS, 2000 * MS), _span(2, "a", 0, 2 * MS, 2000 * MS, 2100 * MS),
                 _span(3, "b", 0, 2 * MS, 2 * MS, 60 * MS)],  # ~2 s of wait
}
VIEWS = {
    "group terminal": ([], False), "group html": ([], True),
    "fleet terminal": (["--fleet"], False), "fleet html": (["--fleet"], True),
}


def _text(view: str, case: str, tmp: Path) -> str:
    spans = tmp / "spans.jsonl"
    spans.write_text("".join(json.dumps(s) + "\n" for s in CASES[case]))
    args, page = VIEWS[view]
    out = tmp / "page.html"
    cmd = [sys.executable, "-m", "tracer", "report", *args, str(spans), *(["--html", str(out)] if page else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "COLUMNS": "300",
                                                                                "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text() if page else proc.stdout
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_avoidable_wait_is_seconds_first_and_a_share_only_when_material(view: str, case: str, tmp_path: Path) -> None:
    text = _text(view, case, tmp_path)
    verdicts = re.findall(r"[\d.]+ (?:s|ms|µs) of consumer_wait was avoidable[^)]*\)", text)
    # the old wordings: a share first ("50% of 0.0 s consumer_wait was spent ...", "100% of consumer_wait avoidable")
    share_first = re.findall(r"\d+% of (?:[\d.]+ s )?consumer_wait (?:was spent|avoidable)", text)
    assert "nobody waited" not in text  # every wait here was avoidable: no verdict may say otherwise
    # fails before (fleet views): the share-first wording, and no seconds-first verdict
    assert verdicts and not share_first, (verdicts, share_first, text[:1500])
    if case == "near-empty":
        assert all("negligible" in v and "%" not in v for v in verdicts), verdicts
    else:
        assert all(re.search(r"\d+% of the [\d.]+ (s|ms) waited", v) for v in verdicts), verdicts


SHARES = {"avoidable_share", "fleet_share", "elsewhere_share", "inside_share"}


def test_only_the_rule_formats_an_avoidable_share() -> None:
    """An f-string that formats one of the share fields, anywhere but the rule's module, is a view
    wording avoidable wait its own way."""
    found = []
    for path in sorted((REPO / "tracer").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "tracer/report/text.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FormattedValue):
                names_used = {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)}
                names_used |= {n.value for n in ast.walk(node.value)
                               if isinstance(n, ast.Constant) and isinstance(n.value, str)}
                if names_used & SHARES:
                    found.append(f"{rel}:{node.lineno}")
    assert not found, found
