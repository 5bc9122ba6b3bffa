"""The span-file read (tracer.report.spanread) against the plain one: parse every line, then
messages_from_spans. Same records, same counts, whatever the mix of lines."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from report_helpers import MS, Row, scenario_spans

from tracer.report.model import messages_from_spans
from tracer.report.spanread import read_span_file
from tracer.telemetry.spanfile import SpanRecord, read_spans


def _line(span: SpanRecord, compact: bool) -> str:
    d = asdict(span)
    return json.dumps(d, separators=(",", ":")) if compact else json.dumps(d)  # the exporter's, or another writer's


@st.composite
def span_files(draw: st.DrawFn) -> list[str]:
    rows = []
    for i in range(draw(st.integers(1, 6))):
        t = draw(st.integers(0, 50))
        stamps = [t + sum(draw(st.integers(0, 9)) for _ in range(k + 1)) for k in range(6)]
        if draw(st.booleans()):  # clock skew: a cross-clock stamp after the next one
            stamps[1] = stamps[2] + draw(st.integers(1, 5))
        rows.append(Row(draw(st.sampled_from(["g-a", "g-b"])), draw(st.sampled_from([None, "J"])), f"m{i}",
                        draw(st.sampled_from([None, 0, 1])), *stamps))
    spans = scenario_spans(rows, stamps=draw(st.booleans()))
    for s in spans:
        if s.name.startswith("process"):
            how = draw(st.sampled_from(["exact", "exact", "float", "off", "missing_end"]))
            a = s.attributes
            if how == "float" and "rmqtrace.stamp.client_pull_ns" in a:
                a["rmqtrace.stamp.client_pull_ns"] = float(a["rmqtrace.stamp.client_pull_ns"])
            elif how == "off" and "rmqtrace.stamp.handler_end_ns" in a:
                a["rmqtrace.stamp.handler_end_ns"] += 7 * MS  # disagrees with the span's end
            elif how == "missing_end":
                a.pop("rmqtrace.stamp.handler_end_ns", None)
    lines = [_line(s, draw(st.booleans())) for s in spans]
    parsed = [k for k, line in enumerate(lines) if '"process' in line]  # the lines the read parses
    if parsed and draw(st.booleans()):  # one after other text, or with text after it
        k = draw(st.sampled_from(parsed))
        lines[k] = draw(st.sampled_from(["  ", "\t", "x", "\ufeff"])) + lines[k] if draw(st.booleans()) else \
            lines[k] + draw(st.sampled_from(["  ", " x", "}", " \x0b"]))
    lines += draw(st.lists(st.sampled_from(["not json", '{"a": 1}', "", "[1, 2]", "{broken", "null", "12",
                                            '{"a": 1} {"b": 2}']), max_size=3))
    lines += draw(st.lists(st.sampled_from(lines), max_size=4))  # a file appended twice, in parts
    return draw(st.permutations(lines))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(span_files())
def test_the_read_gives_what_parsing_every_line_gives(tmp_path: Path, lines: list[str]) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    got = read_span_file(path)
    spans = list(read_spans(path))
    # invariant: the same message records, in the same order, as the plain read
    assert [r.as_dict() for r in got.records] == [r.as_dict() for r in messages_from_spans(spans)]
    # invariant: the counts are the plain read's (no line here is a skipped one broken inside)
    assert got.spans == len(spans)
    assert got.lines == sum(1 for line in lines if line.strip())
    assert got.unparsed == got.lines - len(spans)
    assert 0 <= got.skipped <= got.spans


def test_only_the_process_spans_are_parsed_when_their_stamps_are_exact(tmp_path: Path) -> None:
    rows = [Row("g", "J", f"m{i}", i % 2, 0, 1, 2, 2, 3 + i, 10 + i) for i in range(4)]
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(_line(s, True) + "\n" for s in scenario_spans(rows)))
    got = read_span_file(path)
    assert len(got.records) == 4 and {r.timing for r in got.records} == {"stamps"}
    assert got.spans == 6 * 4 and got.skipped == 5 * 4  # send and the four stage spans: never parsed


def test_a_message_without_stamps_gets_its_trace_parsed(tmp_path: Path) -> None:
    rows = [Row("g", "J", f"m{i}", 0, 0, 1, 2, 2, 3 + 10 * i, 10 + 10 * i) for i in range(3)]
    spans = scenario_spans(rows)
    bare = scenario_spans(rows[:1], stamps=False)
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(_line(s, True) + "\n" for s in [*bare, *spans[6:]]))
    got = read_span_file(path)
    assert sorted(r.timing for r in got.records) == ["spans", "stamps", "stamps"]
    assert got.skipped == 5 * 2  # the first trace's five other spans were read in the second pass


def test_a_skipped_line_broken_inside_counts_as_a_span_but_is_never_used(tmp_path: Path) -> None:
    """The one documented difference from parsing every line (tracer/report/spanread.py)."""
    rows = [Row("g", "J", "m0", 0, 0, 1, 2, 2, 3, 10)]
    lines = [_line(s, True) for s in scenario_spans(rows)]
    send = next(k for k, line in enumerate(lines) if '"send ' in line)
    lines[send] = lines[send][:40] + "}"  # exporter-shaped, broken inside
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    got = read_span_file(path)
    assert got.spans == len(list(read_spans(path))) + 1 and got.unparsed == 0
    assert [r.as_dict() for r in got.records] == [r.as_dict() for r in messages_from_spans(read_spans(path))]


_STAMP = st.one_of(st.integers(0, 40_000), st.just(0), st.integers(0, 40_000).map(str), st.just(1.0), st.none(),
                   st.just(True))


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.lists(st.one_of(st.none(), _STAMP), min_size=6, max_size=6),
                 st.lists(st.integers(0, 40_000), min_size=6, max_size=6).map(sorted)),  # in stage order, mostly
       st.integers(0, 50_000))
def test_the_fast_record_is_the_general_one(stamps: list[object], end_ns: int) -> None:
    """record_from_fields (stamps in stage order, no causal() copy) against exact_stamps + message_record."""
    from tracer.path import names
    from tracer.report.model import exact_stamps, message_record, record_from_fields

    attrs = {key: v for key, v in zip(names.STAMP_ATTRS.values(), stamps) if v is not None or len(key) % 2}
    span = SpanRecord("t" * 32, "s" * 16, None, "process x", "CONSUMER", 0, end_ns, attributes=attrs)
    exact = exact_stamps(span)
    got = record_from_fields(span.trace_id, span.span_id, span.name, end_ns, attrs)
    # invariant: trusted exactly when the general path trusts the stamps, and then the same record
    assert (got is None) == (exact is None)
    if got is not None and exact is not None:
        assert got.as_dict() == message_record(span, exact).as_dict()
