"""Blame: the avoidable share and the blockers against an exact, cell-by-cell offline computation."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from report_helpers import KNOWN, MS, T0, Row, scenario_spans

from tracer.path import names
from tracer.path.stages import Stage
from tracer.report.blame import (
    CAPACITY,
    HEAD_OF_LINE,
    NO_WAIT,
    Blame,
    Run,
    TooManyOverlaps,
    blame,
    pack_lanes,
)
from tracer.report.fleetblame import fleet_avoidable, fleet_blame
from tracer.report.model import build_report


# -- the exact offline computation: integer times, one unit cell at a time ---------------------------
def _available(runs: list[Run], worker: int, t: int, grace: int) -> bool:
    return not any(r.worker == worker and r.start_ns <= t < r.end_ns + grace for r in runs)


def _some_free(runs: list[Run], workers: int, t: int, grace: int) -> bool:
    return any(_available(runs, w, t, grace) for w in range(workers))


def _offline_parts(runs: list[Run], workers: int, grace: int, free: Callable[[int], bool] | None = None,
                   ) -> tuple[list[int], list[dict[int, int]]]:
    """Per run its avoidable cells, and per run how many of them each other run held up.
    ``free(t)``: some worker that could take a message was available at ``t`` (default: one of this
    consumer's)."""
    avoid: list[int] = []
    held: list[dict[int, int]] = []
    for k, r in enumerate(runs):
        cells = [t for t in range(r.wait_start_ns + grace, r.start_ns)
                 if (free(t) if free is not None else _some_free(runs, workers, t, grace))]
        avoid.append(len(cells))
        parts: dict[int, int] = {}
        for t in cells:
            if r.bound_ns is None or t >= r.bound_ns:
                w = r.worker  # in its worker's own buffer
            else:  # in the backlog: behind its oldest message, which waits for its own worker
                backlog = [m for m, o in enumerate(runs)
                           if o.bound_ns is not None and o.wait_start_ns <= t < o.bound_ns]
                w = runs[min(backlog, key=lambda m: (runs[m].wait_start_ns, runs[m].bound_ns, runs[m].message_id))].worker
            for j, o in enumerate(runs):
                if j != k and o.worker == w and o.start_ns <= t < o.end_ns:
                    parts[j] = parts.get(j, 0) + 1
        held.append(parts)
    return avoid, held


def _offline(runs: list[Run], workers: int, grace: int, free: Callable[[int], bool] | None = None,
             ) -> tuple[list[int], dict[int, int], list[int | None]]:
    """Per run its avoidable cells; per run the avoidable cells it blocked; per run its blocker."""
    avoid, held = _offline_parts(runs, workers, grace, free)
    credit: dict[int, int] = {}
    blockers: list[int | None] = []
    for parts in held:
        for j, n in parts.items():
            credit[j] = credit.get(j, 0) + n
        most = max(parts.values(), default=0)
        blockers.append(min((j for j, n in parts.items() if n == most),
                            key=lambda j: (runs[j].start_ns, runs[j].message_id)) if parts else None)
    return avoid, credit, blockers


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[Run], int, int]:
    """A consumer's handler runs: each worker runs messages one after another; a message waited
    some time before its start (possibly since before the previous one on its worker began)."""
    workers = draw(st.integers(1, 4))
    used = draw(st.integers(1, workers))
    runs: list[Run] = []
    for w in range(used):
        t = draw(st.integers(0, 5))
        for _ in range(draw(st.integers(0, 5))):
            t += draw(st.integers(0, 4))  # idle before it
            dur = draw(st.integers(1, 8))
            wait = draw(st.integers(0, 15))
            bound = draw(st.one_of(st.none(), st.integers(t - wait, t)))  # put in the worker's buffer then
            runs.append(Run(f"m{len(runs)}", f"k{len(runs)}", w, t - wait, t, t + dur, bound))
            t += dur
    return runs, workers, draw(st.integers(0, 3))


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_avoidable_wait_and_blockers_match_the_exact_offline_computation(case: tuple[list[Run], int, int]) -> None:
    runs, workers, grace = case
    b = blame(runs, workers, grace_ns=grace, top=len(runs) + 1)
    avoid, credit, blockers = _offline(runs, workers, grace)
    # invariant: avoidable seconds per message are exactly the cells some worker was available
    assert [round(m.avoidable_s * 1e9) for m in b.messages] == avoid
    assert round(b.avoidable_s * 1e9) == sum(avoid)
    total_wait = sum(max(0, r.start_ns - r.wait_start_ns) for r in runs)
    assert round(b.wait_s * 1e9) == total_wait
    assert b.avoidable_share == (pytest.approx(sum(avoid) / total_wait) if total_wait else 0.0)
    # invariant: the blocker is the message that ran on the victim's worker during most of its avoidable wait
    assert [m.blocker_id for m in b.messages] == [runs[j].message_id if j is not None else None for j in blockers]
    # invariant: the ranking credits each blocker with exactly the avoidable wait it overlapped, largest first
    assert {x.message_id: round(x.held_up_s * 1e9) for x in b.top} == {runs[j].message_id: n for j, n in credit.items()}
    assert [x.held_up_s for x in b.top] == sorted((x.held_up_s for x in b.top), reverse=True)
    assert sum(x.held_up_s for x in b.top) <= b.avoidable_s + 1e-12
    # invariant: max_overlaps bounds exactly the overlap steps the blockers took
    if b.overlaps:
        assert blame(runs, workers, grace_ns=grace, top=len(runs) + 1, max_overlaps=b.overlaps) == b
        with pytest.raises(TooManyOverlaps):
            blame(runs, workers, grace_ns=grace, top=len(runs) + 1, max_overlaps=b.overlaps - 1)
    # invariant: the reason is head_of_line when at least half the blameable wait was avoidable
    for m, r, n in zip(b.messages, runs, avoid):
        wait = r.start_ns - r.wait_start_ns
        blameable = wait - grace
        assert m.reason == (HEAD_OF_LINE if n and 2 * n >= blameable else CAPACITY if wait > grace else NO_WAIT)


@settings(max_examples=200, deadline=None)
@given(st.lists(schedules(), min_size=1, max_size=3))
def test_fleet_avoidable_matches_the_exact_offline_computation(cases: list[tuple[list[Run], int, int]]) -> None:
    instances = [c[0] for c in cases]
    workers = [c[1] for c in cases]
    grace = cases[0][2]
    got = fleet_avoidable(instances, workers, grace_ns=grace)
    inside = elsewhere = either = wait = 0
    for i, runs in enumerate(instances):
        for r in runs:
            wait += max(0, r.start_ns - r.wait_start_ns)
            for t in range(r.wait_start_ns + grace, r.start_ns):
                here = _some_free(runs, workers[i], t, grace)
                there = any(_some_free(o, workers[j], t, grace) for j, o in enumerate(instances) if j != i)
                inside += here
                elsewhere += there
                either += here or there
    assert round(got["consumer_wait_s"] * 1e9) == wait
    assert round(got["avoidable_inside_s"] * 1e9) == inside
    assert round(got["avoidable_elsewhere_s"] * 1e9) == elsewhere
    assert round(got["avoidable_fleet_s"] * 1e9) == either


@settings(max_examples=200, deadline=None)
@given(st.lists(schedules(), min_size=1, max_size=3), st.data())
def test_fleet_blockers_match_the_exact_offline_computation(cases: list[tuple[list[Run], int, int]],
                                                            data: st.DataObject) -> None:
    instances = [c[0] for c in cases]
    workers = [c[1] for c in cases]
    grace = cases[0][2]
    names = [f"i{i}" for i in range(len(cases))]
    known = [data.draw(st.booleans()) or i == 0 for i in range(len(cases))]  # an instance with inferred lanes names none

    def fleet_free(t: int) -> bool:
        return any(_some_free(rs, w, t, grace) for rs, w in zip(instances, workers))

    shares, ranked = fleet_blame(instances, workers, names, blockers_known=known, grace_ns=grace, top=10**6)
    credit: dict[tuple[str, str], int] = {}
    victims: dict[tuple[str, str], int] = {}
    avoid_cells = 0
    for i, runs in enumerate(instances):
        avoid, held = _offline_parts(runs, workers[i], grace, fleet_free)
        avoid_cells += sum(avoid)
        if not known[i]:
            continue
        for parts in held:  # a victim counts once per run that held up some of its wait
            for j, n in parts.items():
                key = (names[i], runs[j].message_id)
                credit[key] = credit.get(key, 0) + n
                victims[key] = victims.get(key, 0) + 1
    # invariant: the fleet's avoidable wait is the cells some worker of any instance was available
    assert round(shares["avoidable_fleet_s"] * 1e9) == avoid_cells
    # invariant: each blocker is credited with exactly the fleet-avoidable cells it held up, on its instance
    assert {(b.instance, b.message_id): round(b.held_up_s * 1e9) for b in ranked} == credit
    assert {(b.instance, b.message_id): b.victims for b in ranked} == victims
    # invariant: ranked by the wait caused, largest first; the credits never exceed the avoidable wait
    assert [b.held_up_s for b in ranked] == sorted((b.held_up_s for b in ranked), reverse=True)
    assert sum(b.held_up_s for b in ranked) <= shares["avoidable_fleet_s"] + 1e-12
    # invariant: with one instance the fleet's blockers are the consumer's own
    if len(instances) == 1 and known[0]:
        own = blame(instances[0], workers[0], grace_ns=grace, top=10**6)
        assert [(b.message_id, b.held_up_s, b.victims) for b in ranked] == sorted(
            ((b.message_id, b.held_up_s, b.victims) for b in own.top), key=lambda x: (-x[1], x[0]))


def test_blame_of_the_known_scenario_names_m1() -> None:
    # m3 waited 12 → 1003 ms on worker 0 behind m1; worker 1 was free from 203 ms (+2 ms grace)
    [g] = build_report(scenario_spans(KNOWN)).groups
    b = g.blame
    assert b is not None
    by_id = {m.message_id: m for m in b.messages}
    assert by_id["ID-m3"].reason == HEAD_OF_LINE and by_id["ID-m3"].blocker_id == "ID-m1"
    assert by_id["ID-m3"].avoidable_s == pytest.approx(0.798)
    assert by_id["ID-m1"].reason == NO_WAIT  # 1 ms: the hand-over, not blamed
    [top] = b.top
    assert (top.message_id, top.label, top.victims, top.worker) == ("ID-m1", "m1", 1, 0)
    assert top.held_up_s == pytest.approx(0.798)
    assert b.avoidable_share == pytest.approx(0.798 / (0.001 + 0.001 + 0.991))


def test_capacity_wait_is_not_blamed_on_anyone() -> None:
    # one worker: m2 waits behind m1, but no worker was free — the price of the worker count
    rows = [Row("g", "J", "m1", 0, 0, 0, 0, 0, 0, 100), Row("g", "J", "m2", 0, 0, 0, 0, 0, 100, 200)]
    [g] = build_report(scenario_spans(rows)).groups
    assert g.blame is not None
    assert [m.reason for m in g.blame.messages] == [NO_WAIT, CAPACITY]
    assert g.blame.avoidable_s == 0 and g.blame.top == () and g.blame.messages[1].blocker_id is None


def test_a_worker_that_never_ran_makes_every_wait_avoidable() -> None:
    # --workers 2 but one worker id seen: the other was idle all along
    rows = [Row("g", "J", "m1", 0, 0, 0, 0, 0, 0, 100), Row("g", "J", "m2", 0, 0, 0, 0, 0, 100, 200)]
    [g] = build_report(scenario_spans(rows), workers=2).groups
    assert g.blame is not None and g.blame.avoidable_s == pytest.approx(0.098)
    assert g.blame.top[0].message_id == "ID-m1"


def test_inferred_workers_give_the_share_but_name_no_blocker() -> None:
    [g] = build_report(scenario_spans(KNOWN, worker_attr=False)).groups
    assert g.workers_source == "inferred" and g.blame is not None
    assert not g.blame.blockers_known and g.blame.top == ()
    assert g.blame.avoidable_s == pytest.approx(0.798)
    assert "inferred" in g.blame.line("g-rr")


def test_pack_lanes_agrees_with_the_report_inference() -> None:
    assert pack_lanes([(0, 10), (0, 5), (5, 8), (10, 12)]) == [1, 0, 0, 0]  # by start, then end: (0,5) first


def test_bad_arguments_are_loud() -> None:
    with pytest.raises(ValueError, match="workers"):
        blame([], 0)
    with pytest.raises(ValueError, match="distinct worker ids"):
        blame([Run("a", "a", 0, 0, 0, 1), Run("b", "b", 1, 0, 0, 1)], 1)
    with pytest.raises(ValueError, match="grace"):
        blame([], 1, grace_ns=-1)
    with pytest.raises(ValueError, match="worker counts"):
        fleet_avoidable([[]], [1, 2])


def test_line_and_json_carry_the_numbers() -> None:
    [g] = build_report(scenario_spans(KNOWN)).groups
    assert g.blame is not None
    line = g.blame.line("round_robin")
    assert line.startswith("round_robin: 798 ms of consumer_wait was avoidable (266 ms per message, 80% of the "
                           "993 ms waited)")
    assert "m1 (handler 1.0 s) held up 1 messages for 798 ms" in line
    d = g.blame.as_dict()
    assert d["avoidable_wait_share"] == pytest.approx(0.798 / 0.993)
    assert d["top_blockers"][0]["message_id"] == "ID-m1"


# -- the fleet view ---------------------------------------------------------------------------------
def _attrs(job: str, worker: int, pull_ms: float, start_ms: float, end_ms: float) -> dict[str, object]:
    return {names.JOB_ID: job, names.WORKER: worker,
            names.STAMP_ATTRS[Stage.CLIENT_PULL]: T0 + round(pull_ms * MS),
            names.STAMP_ATTRS[Stage.HANDLER_START]: T0 + round(start_ms * MS),
            names.STAMP_ATTRS[Stage.HANDLER_END]: T0 + round(end_ms * MS)}


def test_fleet_view_gives_the_share_avoidable_elsewhere() -> None:
    from tracer.report.fleet import FleetCollector
    from tracer.report.fleetview import fleet_lines
    c = FleetCollector()
    # a: one worker, m2 waits 0 → 100 ms behind m1; b: one worker, done at 10 ms, free from 12 ms on
    c.add("a", _attrs("J", 0, 0, 0, 100))
    c.add("a", _attrs("J", 0, 0, 100, 200))
    c.add("b", _attrs("J", 0, 0, 0, 10))
    [job] = c.job_views()
    a = job.avoidable
    assert a["consumer_wait_s"] == pytest.approx(0.100)
    assert a["avoidable_inside_s"] == pytest.approx(0.0)
    assert a["avoidable_elsewhere_s"] == pytest.approx(0.088)  # blameable 2 → 100 ms, b available from 12
    assert a["fleet_share"] == pytest.approx(0.88)
    assert job.as_dict()["avoidable_wait"]["elsewhere_share"] == pytest.approx(0.88)
    # seconds first; 88 ms in all is not material, so no share (tracer.report.blame.avoidable_verdict)
    verdict = ("88 ms of consumer_wait was avoidable in the fleet (29 ms per message: negligible) — 88 ms while "
               "another instance had a free worker, 0.0 s while its own instance had one")
    assert any(verdict in line for line in fleet_lines([job]))
    assert job.section is not None and verdict in job.section.subtitle


# -- the demo: blockers against the stamps the spans carry ---------------------------------------
def test_demo_blockers_really_ran_in_front_of_their_victims(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from tracer.report.sources import read_jsonl
    from tracer.tools.cli import main

    assert main(["demo", "--groups", "60", "--workers", "3", "--case-ms", "1", "--policies",
                 "round_robin,random,aggressive,cost_aware", "--out", str(tmp_path), "--json"]) == 0
    report = build_report(read_jsonl(tmp_path / "spans.jsonl"))
    summary = {s["policy"]: s for s in json.loads((tmp_path / "summary.json").read_text())}
    for g in report.groups:
        b = g.blame
        assert b is not None and b.blockers_known
        by_id = {r.message_id: r for r in g.records}
        for m in b.messages:
            if m.blocker_id is None:
                continue
            victim, blocker = by_id[m.message_id], by_id[m.blocker_id]
            # invariant: the blocker ran while the victim waited, on the victim's worker — or, while
            # the victim was still in the backlog (before dispatch_enqueue), on another
            assert blocker.t(Stage.HANDLER_START) < victim.t(Stage.HANDLER_START)
            assert blocker.t(Stage.HANDLER_END) > victim.t(Stage.CLIENT_PULL)
            assert blocker.worker == victim.worker or (
                victim.t(Stage.DISPATCH_ENQUEUE) > victim.t(Stage.CLIENT_PULL)
                and blocker.t(Stage.HANDLER_START) < victim.t(Stage.DISPATCH_ENQUEUE))
        # the demo's own numbers (from its stamps) and the report's (from the span file) agree
        policy = g.group.removeprefix("demo-")
        assert summary[policy]["avoidable_wait_share"] == pytest.approx(b.avoidable_share, abs=1e-6)
        assert [x["message_id"] for x in summary[policy]["top_blockers"]] == [x.message_id for x in b.top]
    rr = report.group("demo-round_robin").blame
    assert rr is not None and rr.avoidable_share > 0.2 and rr.top
    # one sentence: the demo's blame line per policy is the report's per consumer group
    demo_out = " ".join(capsys.readouterr().err.split())  # with --json the lines go to stderr
    for g in report.groups:
        assert g.blame is not None
        assert g.blame.line(g.group.removeprefix("demo-")) in demo_out


def test_terminal_and_html_show_who_blocked_whom() -> None:
    from rich.console import Console

    from tracer.report.html import render_html
    from tracer.report.terminal import render

    report = build_report(scenario_spans(KNOWN))
    page = render_html(report)
    assert 'id="blame"' in page and "798 ms of consumer_wait was avoidable (266 ms per message, 80% of" in page
    assert ">m1<" in page
    console = Console(width=100, record=True, highlight=False)
    render(report, console, top=0)  # --top 0 hides the slowest table, not the blockers
    text = console.export_text()
    assert "Who blocked whom" in text and "m1" in text.split("Who blocked whom", 1)[1]
    assert "g-rr: 798 ms of consumer_wait was avoidable (266 ms per message, 80% of" in " ".join(text.split())


@settings(max_examples=150, deadline=None)
@given(schedules(), st.randoms(use_true_random=False))
def test_blame_does_not_depend_on_the_order_the_spans_came_in(case: tuple[list[Run], int, int], rnd: Any) -> None:
    runs, workers, grace = case
    shuffled = list(runs)
    rnd.shuffle(shuffled)
    a, b = blame(runs, workers, grace_ns=grace, top=100), blame(shuffled, workers, grace_ns=grace, top=100)
    # invariant: the same verdict per message and the same ranking, whatever the input order
    assert sorted(a.messages, key=lambda m: m.message_id) == sorted(b.messages, key=lambda m: m.message_id)
    assert a.top == b.top


def _blame_of(wait_s: float, avoidable_s: float, n: int) -> Blame:
    from tracer.report.blame import MessageBlame

    msgs = tuple(MessageBlame(f"m{i}", wait_s / n, avoidable_s / n, CAPACITY, None) for i in range(n))
    return Blame(4, wait_s, avoidable_s, 0, n, True, msgs, ())


def test_item12_a_negligible_avoidable_wait_reads_as_seconds_not_a_share() -> None:
    """The demo's aggressive policy: 4 ms avoidable of 8 ms waited over 200 messages read
    "50% of consumer_wait was avoidable" — a share of an almost empty total — and the HTML card
    said "Nobody waited while a worker was free" right under it."""
    from types import SimpleNamespace

    from tracer.report.html import _blame as html_blame

    b = _blame_of(0.008, 0.004, 200)
    line = b.line("aggressive")
    assert line.startswith("aggressive: 4 ms of consumer_wait was avoidable (20 µs per message: negligible)")
    assert "%" not in line
    card = html_blame(SimpleNamespace(groups=[SimpleNamespace(group="demo-aggressive", blame=b)]))
    assert "4 ms of consumer_wait was avoidable" in card and "%</b>" not in card
    assert "Nobody waited" not in card, "two verdicts that contradict"
    material = _blame_of(10.0, 8.0, 100)
    assert material.line("rr").startswith("rr: 8.0 s of consumer_wait was avoidable (80 ms per message, 80% of the "
                                          "10.0 s waited)")
    nobody = _blame_of(1.0, 0.0, 10)
    assert nobody.line("x") == "x: nobody waited while a worker was free"
    d = b.as_dict()
    assert d["material"] is False and d["avoidable_wait_per_message_s"] == pytest.approx(0.00002)


def test_item6_a_worker_busy_with_another_jobs_message_is_not_idle_in_the_fleet_view() -> None:
    """One instance, one worker: job X's message runs 0-1000 ms; job Y's arrives at 10 ms and waits
    for that worker — a pure capacity wait. Before, Y's fleet view saw only Y's runs, so the worker
    looked idle: 99 % "avoidable", and ~1 idle worker-second while it was held."""
    from tracer.report.fleet import FleetCollector

    c = FleetCollector()
    c.add("a", _attrs("X", 0, 0, 0, 1000))
    c.add("a", _attrs("Y", 0, 10, 1000, 1100))
    views = {j.job: j for j in c.job_views()}
    y = views["Y"]
    assert y.avoidable["consumer_wait_s"] == pytest.approx(0.99)
    assert y.avoidable["avoidable_fleet_s"] == 0.0 and y.avoidable["fleet_share"] == 0.0, y.avoidable
    assert y.avoidable["avoidable_inside_s"] == 0.0
    assert y.inprocess_idle_while_held_s == pytest.approx(0.0), "the worker ran X's message: not idle"
