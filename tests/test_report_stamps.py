"""Stamps that cannot be stamps (negative, past int64, digits int() refuses, infinity) through every
reader that builds records from a process span's attributes: none raises, and each treats such a
stamp as it treats a missing one — the report rebuilds that message from its span times, the fleet
view has no place for it (or, for produce, leaves it unstamped)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import pytest
from report_helpers import KNOWN, MS, scenario_spans

from tracer.report.fleet import FleetCollector
from tracer.report.model import MessageRecord, messages_from_spans, stamp_ns
from tracer.report.spanread import read_span_file
from tracer.telemetry.spanfile import SpanRecord

END, PULL, ENQUEUE, START, PRODUCE = (f"rmqtrace.stamp.{s}_ns" for s in (
    "handler_end", "client_pull", "dispatch_enqueue", "handler_start", "produce"))


def _alone(value: int) -> Callable[[dict[str, Any]], None]:
    def spoil(a: dict[str, Any]) -> None:  # the input that raised KeyError in model._consistent
        for key in (PULL, ENQUEUE, START):
            a.pop(key)
        a[END] = value
    return spoil


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda a: a.__setitem__(key, value)


# (what, how the process span of m2 is spoilt, which attribute it spoils)
SPOILT: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("the only consumer stamp, negative", _alone(-1), "stamp"),
    ("handler end negative", _set(END, -5 * MS), "stamp"),
    ("handler end '-5'", _set(END, "-5"), "stamp"),
    ("handler end '--5'", _set(END, "--5"), "stamp"),
    ("handler end '²'", _set(END, "²"), "stamp"),
    ("handler end past int64", _set(END, 2**63), "stamp"),
    ("handler end of 5000 digits", _set(END, "9" * 5000), "stamp"),
    ("handler end infinite", _set(END, math.inf), "stamp"),
    ("produce not a number", _set(PRODUCE, "abc"), "produce"),
    ("produce negative", _set(PRODUCE, -1), "produce"),
    ("worker '--1'", _set("rmqtrace.worker", "--1"), "worker"),
]


def _spans(spoil: Callable[[dict[str, Any]], None]) -> list[SpanRecord]:
    spans = scenario_spans(KNOWN)
    m2 = next(s for s in spans if s.name.startswith("process") and s.attributes["messaging.message.id"] == "ID-m2")
    spoil(m2.attributes)
    return spans


def _file(tmp_path: Path, spans: list[SpanRecord]) -> Path:
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(asdict(s), separators=(",", ":")) + "\n" for s in spans))  # inf: Infinity
    return path


def _jaeger_page(spans: list[SpanRecord]) -> dict[str, Any]:
    """As /api/traces answers: int64 past 2^53 as a string (others as numbers), text as strings."""
    def tag(k: str, v: Any) -> dict[str, Any]:
        if isinstance(v, int) and not isinstance(v, bool):
            return {"key": k, "type": "int64", "value": str(v) if abs(v) > 2**53 else v}
        if isinstance(v, float):
            return {"key": k, "type": "float64", "value": v}
        return {"key": k, "type": "string", "value": v if isinstance(v, str) else json.dumps(v)}
    by_trace: dict[str, list[SpanRecord]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    return {"data": [{"traceID": tid, "processes": {"p": {"serviceName": "svc", "tags": [
        {"key": "service.instance.id", "type": "string", "value": "i"}]}}, "spans": [
        {"traceID": tid, "spanID": s.span_id, "operationName": s.name, "processID": "p", "startTime": s.start_ns // 1000,
         "duration": (s.end_ns - s.start_ns) // 1000, "tags": [tag(k, v) for k, v in s.attributes.items()]}
        for s in ss]} for tid, ss in by_trace.items()]}


def _otlp(collector: FleetCollector, spans: list[SpanRecord]) -> None:
    """As api_v3 streams them: one TracesData a trace; an int past int64 can only be a string there."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, TracesData

    def any_value(v: Any) -> AnyValue:
        if isinstance(v, list):
            return AnyValue(array_value=ArrayValue(values=[any_value(x) for x in v]))
        if isinstance(v, int) and -2**63 <= v < 2**63:
            return AnyValue(int_value=v)
        if isinstance(v, float):
            return AnyValue(double_value=v)
        return AnyValue(string_value=str(v))

    resource = Resource(attributes=[KeyValue(key="service.instance.id", value=AnyValue(string_value="i"))])
    seen: set[bytes] = set()
    page: dict[bytes, int] = {}
    for s in spans:
        span = Span(trace_id=bytes.fromhex(s.trace_id), span_id=bytes.fromhex(s.span_id), name=s.name,
                    start_time_unix_nano=s.start_ns, end_time_unix_nano=s.end_ns,
                    attributes=[KeyValue(key=k, value=any_value(v)) for k, v in s.attributes.items()])
        collector.add_otlp_trace(TracesData(resource_spans=[ResourceSpans(resource=resource, scope_spans=[
            ScopeSpans(spans=[span])])]), seen, page)


def _report_records(reader: str, spans: list[SpanRecord], tmp_path: Path) -> list[MessageRecord]:
    return messages_from_spans(spans) if reader == "spans" else read_span_file(_file(tmp_path, spans)).records


def _fleet(reader: str, spans: list[SpanRecord], tmp_path: Path) -> FleetCollector:
    c = FleetCollector()
    if reader == "fleet span file":
        c.add_span_file(str(_file(tmp_path, spans)))
    elif reader == "fleet /api/traces":
        c.add_jaeger_page(_jaeger_page(spans))
    else:
        _otlp(c, spans)
    return c


READERS = ["spans", "span file", "fleet span file", "fleet /api/traces", "fleet api_v3"]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(("what", "spoil", "part"), SPOILT, ids=[s[0] for s in SPOILT])
def test_a_stamp_that_cannot_be_one_is_not_trusted(reader: str, what: str, spoil: Callable[[dict[str, Any]], None],
                                                  part: str, tmp_path: Path) -> None:
    spans = _spans(spoil)
    if not reader.startswith("fleet"):
        records = {r.message_id: r for r in _report_records(reader, spans, tmp_path)}  # invariant: it does not raise
        assert sorted(records) == ["ID-m1", "ID-m2", "ID-m3"]
        assert {records[m].timing for m in ("ID-m1", "ID-m3")} == {"stamps"}
        m2 = records["ID-m2"]
        if part == "worker":
            assert m2.timing == "stamps" and m2.worker is None
        else:  # invariant: as if its stamps were missing, rebuilt from the span times (handler 3 → 203 ms)
            assert m2.timing == "spans" and m2.handler_s == pytest.approx(0.2)
        return
    (job,) = _fleet(reader, spans, tmp_path).job_views()  # invariant: it does not raise
    recs = _fleet(reader, spans, tmp_path).jobs["J"]
    if part == "stamp":  # invariant: no place in the occupancy, as a message whose handler never ran
        assert job.messages == 2 and {r.message_id for r in recs} == {"ID-m1", "ID-m3"}
        return
    assert job.messages == 3
    m2 = next(r for r in recs if r.message_id == "ID-m2")
    if part == "produce":
        assert m2.produce_ns == 0  # as if not stamped
    else:
        assert m2.worker == -1  # unknown, as without the attribute


@pytest.mark.parametrize(("value", "ns"), [
    (5, 5), ("5", 5), (" 12 ", 12), (0, 0), (2**63 - 1, 2**63 - 1), (-1, None), ("-1", None), (2**63, None),
    ("--5", None), ("²", None), ("9" * 5000, None), (1.0, None), (math.inf, None), (math.nan, None), (True, None),
    (None, None), ("", None), ("1_000", None), ("+5", None), ([5], None),
])
def test_what_a_stamp_can_be(value: object, ns: int | None) -> None:
    assert stamp_ns(value) == ns
