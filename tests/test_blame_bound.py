"""The single-group report's blame is bounded as the fleet view's is (blame.MAX_OVERLAPS): a group
whose waits are long and mostly avoidable gets its shares and a note instead of running for
victims × runs per wait (the bench's 10⁴ file with --workers 12 took 47 s). Steps, not time."""

from __future__ import annotations

import io
from typing import Any

import pytest
from report_helpers import Row, scenario_spans
from rich.console import Console

from tracer.report import blame as blame_module
from tracer.report import model
from tracer.report.html import render_html
from tracer.report.model import build_report, group_blame, messages_from_spans, notes
from tracer.report.terminal import render

# 200 messages pulled at once onto worker 0, one after another; --workers 2: worker 1 never runs, so
# it is always available and every wait is avoidable — message k is weighed against the k runs before it
ROWS = [Row("g", "J", f"m{k:03d}", 0, 0, 0, 0, 0, 2 * k, 2 * k + 2) for k in range(200)]


def test_the_report_and_the_fleet_view_share_one_bound() -> None:
    from tracer.report import fleet

    assert model.MAX_OVERLAPS is blame_module.MAX_OVERLAPS and fleet.FleetCollector().max_overlaps == blame_module.MAX_OVERLAPS


def test_past_the_bound_the_shares_are_given_and_a_note_says_why_no_blocker_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spans = scenario_spans(ROWS)
    records = messages_from_spans(spans)
    named = group_blame(records, 2, "given", max_overlaps=10**9)
    assert named is not None and named.top and not named.note
    steps = named.overlaps  # what naming them takes: ~ 200²/2
    assert steps > 10_000
    assert group_blame(records, 2, "given", max_overlaps=steps) == named  # at the bound: still named

    monkeypatch.setattr(model, "MAX_OVERLAPS", steps - 1)  # the one constant, lowered: the report path reads it
    taken: list[int] = []  # the steps of every blame() the report's path ran to the end

    def counted(*args: Any, **kwargs: Any) -> Any:
        done = blame_module.blame(*args, **kwargs)
        taken.append(done.overlaps)
        return done
    monkeypatch.setattr(model, "blame", counted)
    g = build_report(spans, workers=2).groups[0]
    # invariant: the report never completes more steps than the bound (one that gives up raises first)
    assert sum(taken) <= steps - 1
    b = g.blame
    assert b is not None
    # invariant: past the bound nothing is named, and the note says so
    assert b.top == () and "overlap steps" in b.note and "--job" in b.note
    # invariant: the shares do not depend on the bound
    assert (b.wait_s, b.avoidable_s, b.head_of_line, b.capacity, b.messages) == (
        named.wait_s, named.avoidable_s, named.head_of_line, named.capacity,
        tuple(m.__class__(m.message_id, m.wait_s, m.avoidable_s, m.reason, None) for m in named.messages))
    assert b.blockers_known  # the ids are real: it is the bound, not inference, that kept the names back
    assert b.as_dict()["blockers_note"] == b.note and "blockers_note" not in named.as_dict()  # the JSON says it
    assert f"no blocker named: {b.note}" in b.line("g")
    report = build_report(spans, workers=2)
    assert any(b.note in n for n in notes(report))
    out = io.StringIO()
    render(report, Console(file=out, width=300, highlight=False))
    assert "too many overlaps" in out.getvalue() and b.note in out.getvalue().replace("\n", " ")
    page = render_html(report)
    assert "No blocker named: naming the blockers" in page and "Nobody waited while a worker was free" not in page
