"""The fleet view names its blockers: the compact records carry the message id and dispatch
enqueue, read alike from /api/traces JSON and from api_v3 OTLP, and the terminal, JSON and HTML
views name the runs that held up the fleet-avoidable waits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tracer.path import names
from tracer.path.stages import Stage
from tracer.report.blame import Run
from tracer.report.fleet import FleetCollector
from tracer.report.fleetblame import fleet_blame
from tracer.report.fleetview import fleet_lines, fleet_page

S = 1_000_000_000
T0 = 1_800_000_000 * S  # past 2^53: /api/traces writes such int64 tags as strings

# (instance, worker, key, pull, enqueue, start, end) in seconds after T0
# On a: the long L holds worker 0; V1 and V2 were dealt to worker 0 behind it at once, while a's
# worker 1 and b's only worker idle from 1 s on. L held up both, V1 held up V2.
ROWS = (
    ("a", 0, "L", 0, 0, 0, 10),
    ("a", 0, "V1", 0, 0, 10, 11),
    ("a", 0, "V2", 0, 0, 11, 12),
    ("a", 1, "x", 0, 0, 0, 1),
    ("b", 0, "y", 0, 0, 0, 1),
)


def _attrs(row: tuple[Any, ...]) -> dict[str, Any]:
    _inst, worker, key, pull, enqueue, start, end = row
    stamps = {Stage.CLIENT_PULL: pull, Stage.DISPATCH_ENQUEUE: enqueue, Stage.HANDLER_START: start,
              Stage.HANDLER_END: end}
    out: dict[str, Any] = {names.STAMP_ATTRS[s]: T0 + v * S for s, v in stamps.items()}
    out.update({names.WORKER: worker, names.JOB_ID: "J", names.MESSAGE_ID: f"ID-{key}", names.MESSAGE_KEYS: [key]})
    return out


def _jaeger_trace(i: int, row: tuple[Any, ...]) -> dict[str, Any]:
    """As /api/traces answers: int64 past 2^53 as a string, an array attribute as its JSON text."""
    tags = []
    for k, v in _attrs(row).items():
        if isinstance(v, list):
            tags.append({"key": k, "type": "string", "value": json.dumps(v)})
        elif isinstance(v, int):
            tags.append({"key": k, "type": "int64", "value": str(v) if v > 2**53 else v})
        else:
            tags.append({"key": k, "type": "string", "value": v})
    pid = f"p-{row[0]}"
    return {"traceID": f"{i:032x}", "processes": {pid: {"serviceName": "svc", "tags": [
        {"key": "service.instance.id", "type": "string", "value": row[0]}]}},
        "spans": [{"traceID": f"{i:032x}", "spanID": f"{i:016x}", "operationName": "process T", "tags": tags,
                   "processID": pid, "startTime": 0, "duration": 0}]}


def _otlp_trace(i: int, row: tuple[Any, ...]) -> Any:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, TracesData

    def kv(key: str, value: Any) -> KeyValue:
        if isinstance(value, list):
            return KeyValue(key=key, value=AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=x)
                                                                                    for x in value])))
        v = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
        return KeyValue(key=key, value=v)

    span = Span(trace_id=i.to_bytes(16, "big"), span_id=i.to_bytes(8, "big"), name="process T",
                attributes=[kv(k, v) for k, v in _attrs(row).items()], start_time_unix_nano=T0)
    resource = Resource(attributes=[kv("service.name", "svc"), kv("service.instance.id", row[0])])
    return TracesData(resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=[span])])])


def _three_ways() -> list[FleetCollector]:
    direct, http, otlp = FleetCollector(), FleetCollector(), FleetCollector()
    for row in ROWS:
        direct.add(row[0], _attrs(row))
    http.add_jaeger_page({"data": [_jaeger_trace(i, row) for i, row in enumerate(ROWS, 1)]})
    seen: set[bytes] = set()
    page: dict[bytes, int] = {}
    for i, row in enumerate(reversed(ROWS), 1):  # another order: the views must not depend on it
        otlp.add_otlp_trace(_otlp_trace(len(ROWS) + 1 - i, row), seen, page)
    return [direct, http, otlp]


def test_the_fleet_view_names_the_blockers_with_their_instance() -> None:
    views = [c.job_views() for c in _three_ways()]
    # invariant: the same records whichever way they were read
    assert views[0][0].as_dict() == views[1][0].as_dict() == views[2][0].as_dict()
    (job,) = views[0]
    grace = 0.002  # GRACE_NS: a's worker 1 and b's worker are available from 1 s + grace
    l_held, v1_held = 2 * (10 - 1 - grace), 1.0
    got = [(b.instance, b.message_id, b.label, b.worker, b.victims) for b in job.blockers]
    assert got == [("a", "ID-L", "ID-L", 0, 2), ("a", "ID-V1", "ID-V1", 0, 1)]
    assert [b.held_up_s for b in job.blockers] == pytest.approx([l_held, v1_held])
    assert job.blockers[0].handler_s == pytest.approx(10)
    # invariant: the credits are the fleet-avoidable wait (V1 waited 10 s, V2 11 s; both avoidable from 1 s + grace)
    assert job.avoidable["avoidable_fleet_s"] == pytest.approx((10 - 1 - grace) + (11 - 1 - grace))
    assert sum(b.held_up_s for b in job.blockers) == pytest.approx(job.avoidable["avoidable_fleet_s"])
    d = job.as_dict()["top_blockers"][0]
    assert d == {"instance": "a", "message_id": "ID-L", "label": "ID-L", "worker": 0, "handler_s": 10.0, "victims": 2,
                 "held_up_s": pytest.approx(l_held)}
    text = "\n".join(fleet_lines([job]))
    assert "ID-L on a, worker 0" in text and "held up 2 messages for 17.996 s" in text
    page = fleet_page("fleet", [job.section] if job.section else [])
    assert "<td>ID-L</td><td>a</td><td>0</td>" in page and "17.996 s" in page


def test_the_view_matches_fleet_blame_on_the_same_runs() -> None:
    (job,) = _three_ways()[0].job_views()
    instances: dict[str, list[Run]] = {"a": [], "b": []}
    for inst, worker, key, pull, enqueue, start, end in ROWS:
        instances[inst].append(Run(f"ID-{key}", f"ID-{key}", worker, T0 + pull * S, T0 + start * S, T0 + end * S,
                                   T0 + enqueue * S))
    shares, ranked = fleet_blame(list(instances.values()), [2, 1], list(instances))
    assert list(job.blockers) == list(ranked)
    assert job.avoidable == shares


def test_an_instance_without_worker_ids_names_no_blocker() -> None:
    c = FleetCollector()
    for row in ROWS:
        attrs = _attrs(row)
        if row[0] == "a":
            del attrs[names.WORKER]
        c.add(row[0], attrs)
    (job,) = c.job_views()
    assert job.avoidable["avoidable_fleet_s"] > 0 and job.blockers == []
    assert "no blocker named" in "\n".join(fleet_lines([job]))


def test_report_fleet_over_a_span_file_names_the_same_blockers(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A span file has no service.instance.id: each service is an instance (here one per row's instance)."""
    from tracer.tools.cli import main

    lines = []
    for i, row in enumerate(ROWS, 1):
        start, end = T0 + row[5] * S, T0 + row[6] * S
        lines.append({"trace_id": f"{i:032x}", "span_id": f"{i:016x}", "parent_span_id": None, "name": "process T",
                      "kind": "CONSUMER", "start_ns": start, "end_ns": end, "status": "UNSET", "service": row[0],
                      "attributes": {names.OPERATION_TYPE: names.PROCESS, **_attrs(row)}})
        lines.append({"trace_id": f"{i:032x}", "span_id": f"{i + 100:016x}", "parent_span_id": f"{i:016x}",
                      "name": "handler", "kind": "INTERNAL", "start_ns": start, "end_ns": end, "status": "UNSET",
                      "service": row[0], "attributes": {}})
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(d, separators=(",", ":")) + "\n" for d in lines + lines[:2]))  # one twice
    assert main(["report", str(path), "--fleet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (job,) = _three_ways()[0].job_views()
    assert out["traces"] == len(ROWS) and out["api"] == f"spans file {path}"
    assert out["jobs"] == [json.loads(json.dumps(job.as_dict()))]
    assert main(["report", str(path), "--fleet"]) == 0
    assert "ID-L on a, worker 0" in capsys.readouterr().out


def test_blockers_too_costly_to_name_are_said_to_be_missing_and_the_share_stays() -> None:
    full = _three_ways()[0]
    (normal,) = full.job_views()
    capped = FleetCollector(max_overlaps=0)
    for row in ROWS:
        capped.add(row[0], _attrs(row))
    (job,) = capped.job_views()
    assert job.blockers == [] and "overlap steps" in job.blockers_note and "--job" in job.blockers_note
    assert job.avoidable == normal.avoidable  # the share does not need the names
    assert job.as_dict()["blockers_note"] == job.blockers_note and normal.as_dict()["blockers_note"] == ""
    assert "no blocker named: naming the blockers" in "\n".join(fleet_lines([job]))
    assert job.section is not None and "No blocker named" in fleet_page("fleet", [job.section])
