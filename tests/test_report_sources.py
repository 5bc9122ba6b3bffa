"""Reading spans: the JSON-lines file the tracer writes, and Jaeger's HTTP JSON (crafted by its documented shape)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
from report_helpers import KNOWN, MS, T0, scenario_spans, write_scenario_with_tracer

from tracer.path.stages import Stage
from tracer.report.model import build_report, messages_from_spans
from tracer.report.sources import (
    NoTracesForService,
    SourceError,
    jaeger_span,
    parse_duration,
    read_jaeger,
    read_jsonl,
    spans_from_jaeger_json,
)
from tracer.telemetry.spanfile import SpanRecord


# -- JSON lines --------------------------------------------------------------------------------
def test_jsonl_written_by_the_real_tracer_maps_to_the_known_numbers(tmp_path: Path) -> None:
    path = write_scenario_with_tracer(tmp_path / "spans.jsonl", KNOWN)
    spans = read_jsonl(path)
    assert len(spans) == 3 * 5  # send, process, broker_wait, dispatch_wait, handler (an empty client buffer: no span)
    records = {r.message_id: r for r in messages_from_spans(spans)}
    m3 = records["ID-m3"]
    assert m3.timing == "stamps" and m3.group == "g-rr" and m3.job_id == "J" and m3.keys == "m3"
    assert m3.worker == 0 and m3.attempt == 1 and m3.outcome == "success" and m3.topic == "t"
    assert m3.stamps.times == [T0 + ms * MS for ms in (10, 11, 12, 12, 1003, 1103)]
    job = build_report(spans).groups[0].jobs[0]
    assert job.completion_s == pytest.approx(1.103) and job.lower_bound_s == pytest.approx(1.0)
    assert job.critical.message.message_id == "ID-m3"


def test_jsonl_without_worker_attribute(tmp_path: Path) -> None:
    path = write_scenario_with_tracer(tmp_path / "spans.jsonl", KNOWN, worker_attr=False)
    g = build_report(read_jsonl(path)).groups[0]
    assert g.workers_source == "inferred" and g.workers == 2


def test_jsonl_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no spans file"):
        read_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(SourceError, match="directory"):
        read_jsonl(tmp_path)
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n{\"half\": 1}\n")
    assert read_jsonl(junk) == []


# -- Jaeger JSON -------------------------------------------------------------------------------
def _tag(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        kind = "bool"
    elif isinstance(value, int):
        kind = "int64"
    elif isinstance(value, float):
        kind = "float64"
    elif isinstance(value, list):
        kind, value = "string", json.dumps(value)
    else:
        kind = "string"
    return {"key": key, "type": kind, "value": value}


def jaeger_payload(spans: list[SpanRecord], *, stamps: str = "int") -> dict[str, Any]:
    """Spans as Jaeger's /api/traces answers: µs times, tags, CHILD_OF references, processes.

    ``stamps``: how int64 stamp tags come back — ``str`` (what Jaeger v1.76 does for values past
    2^53), ``int`` (a JSON integer) or ``float`` (a double that lost the low digits).
    """
    traces: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        tags = [_tag("span.kind", s.kind.lower()), _tag("otel.scope.name", "rmqtrace")]
        for k, v in s.attributes.items():
            t = _tag(k, v)
            if k.startswith("rmqtrace.stamp.") and stamps != "int":
                t["value"] = str(v) if stamps == "str" else float(v)
            tags.append(t)
        if s.status == "ERROR":
            tags.append(_tag("otel.status_code", "ERROR"))
        refs = [{"refType": "CHILD_OF", "traceID": s.trace_id, "spanID": s.parent_span_id}] if s.parent_span_id else []
        traces.setdefault(s.trace_id, []).append({
            "traceID": s.trace_id.lstrip("0") or "0", "spanID": s.span_id, "operationName": s.name,
            "references": refs, "startTime": s.start_ns // 1000, "duration": (s.end_ns - s.start_ns) // 1000,
            "tags": tags, "logs": [], "processID": "p1", "warnings": None, "flags": 1})
    data = [{"traceID": tid, "spans": sp, "processes": {"p1": {"serviceName": "rmqtrace", "tags": []}},
             "warnings": None} for tid, sp in traces.items()]
    return {"data": data, "total": 0, "limit": 0, "offset": 0, "errors": None}


def test_jaeger_span_mapping() -> None:
    span = {
        "traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "00f067aa0ba902b7", "operationName": "process t",
        "references": [{"refType": "FOLLOWS_FROM", "traceID": "x", "spanID": "aaaa"},
                       {"refType": "CHILD_OF", "traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "1234"}],
        "startTime": 1_795_978_749_984_734, "duration": 86_307, "processID": "p1",
        "tags": [{"key": "span.kind", "type": "string", "value": "consumer"},
                 {"key": "otel.status_code", "type": "string", "value": "ERROR"},
                 {"key": "rmqtrace.stamp.handler_end_ns", "type": "int64", "value": 1795978750071042343},
                 {"key": "rmqtrace.stamp.produce_ns", "type": "int64", "value": "1795978749984734709"},
                 {"key": "rmqtrace.cost", "type": "float64", "value": 2},
                 {"key": "rmqtrace.worker", "type": "int64", "value": 3},
                 {"key": "flag", "type": "bool", "value": "true"},
                 {"key": "messaging.rocketmq.message.keys", "type": "string", "value": "[\"tg-1\", \"tg-2\"]"}],
    }
    rec = jaeger_span(span, {"p1": {"serviceName": "svc"}})
    assert (rec.trace_id, rec.span_id, rec.parent_span_id) == ("4bf92f3577b34da6a3ce929d0e0e4736",
                                                               "00f067aa0ba902b7", "0000000000001234")
    assert (rec.name, rec.kind, rec.status, rec.service) == ("process t", "CONSUMER", "ERROR", "svc")
    assert rec.start_ns == 1_795_978_749_984_734_000 and rec.end_ns == 1_795_978_750_071_041_000
    a = rec.attributes
    assert a["rmqtrace.stamp.handler_end_ns"] == 1795978750071042343  # exact: Python's json keeps big ints
    assert a["rmqtrace.stamp.produce_ns"] == 1795978749984734709
    assert a["rmqtrace.cost"] == 2.0 and a["rmqtrace.worker"] == 3 and a["flag"] is True
    assert a["messaging.rocketmq.message.keys"] == ["tg-1", "tg-2"]
    assert "span.kind" not in a and "otel.status_code" not in a


def test_big_int_tags_survive_json_text_exactly() -> None:
    stamp = 1795978750071042343  # > 2**53: a double would make it …2304 or …2560
    assert stamp > 2 ** 53 and float(stamp) != stamp
    text = json.dumps({"data": [{"traceID": "1", "processes": {}, "spans": [{
        "traceID": "1", "spanID": "2", "operationName": "process t", "startTime": 1, "duration": 1,
        "tags": [{"key": "rmqtrace.stamp.handler_end_ns", "type": "int64", "value": stamp}]}]}]})
    [rec] = spans_from_jaeger_json(json.loads(text))
    assert rec.attributes["rmqtrace.stamp.handler_end_ns"] == stamp


@pytest.mark.parametrize("mode, timing", [("int", "stamps"), ("str", "stamps"), ("float", "spans")])
def test_jaeger_payload_gives_the_known_numbers(mode: str, timing: str) -> None:
    spans = list(spans_from_jaeger_json(jaeger_payload(scenario_spans(KNOWN), stamps=mode)))
    assert len(spans) == 18
    records = messages_from_spans(spans)
    assert {r.timing for r in records} == {timing}
    report = build_report(spans)
    [job] = report.groups[0].jobs
    assert job.completion_s == pytest.approx(1.103, abs=2e-6)  # µs span times in the fallback
    assert job.lower_bound_s == pytest.approx(1.0, abs=2e-6)
    assert job.critical.message.message_id == "ID-m3"
    assert job.critical.split_s["dispatch_wait"] == pytest.approx(0.991, abs=2e-6)
    if timing == "stamps":
        assert records[-1].t(Stage.HANDLER_END) == T0 + 1103 * MS  # ns exact
        assert job.completion_s == pytest.approx(1.103, abs=1e-12)


def test_jaeger_errors_payload() -> None:
    with pytest.raises(SourceError, match="errors"):
        list(spans_from_jaeger_json({"data": None, "errors": [{"code": 400, "msg": "bad service"}]}))


def test_parse_duration() -> None:
    assert [parse_duration(x) for x in ("90s", "15m", "1h", "2d", "500ms", "30", "1.5h")] == \
        [90, 900, 3600, 172800, 0.5, 30, 5400]
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("soon")


# -- the HTTP reader against a loopback stub ---------------------------------------------------
class _Stub:
    def __init__(self, payload: dict[str, Any], status: int = 200, services: list[str] | None = None) -> None:
        self.payload = payload
        self.status = status
        self.services = services or []
        self.operations: dict[str, list[str]] = {}  # per service, for /api/services/{name}/operations
        self.payload_of: dict[str, dict[str, Any]] = {}  # per service: its traces (else payload)
        self.queries: list[tuple[str, dict[str, list[str]]]] = []


@pytest.fixture
def jaeger_stub() -> Iterator[tuple[str, _Stub]]:
    stub = _Stub({"data": []})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urllib.parse.urlsplit(self.path)
            stub.queries.append((url.path, urllib.parse.parse_qs(url.query)))
            query = urllib.parse.parse_qs(url.query)
            body: Any = stub.payload_of.get(query.get("service", [""])[0], stub.payload)
            if url.path == "/api/services":
                body = {"data": stub.services}
            elif url.path.startswith("/api/services/") and url.path.endswith("/operations"):
                body = {"data": stub.operations.get(urllib.parse.unquote(url.path.split("/")[3]))}
            raw = json.dumps(body).encode() if stub.status == 200 else b"boom"
            self.send_response(stub.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_read_jaeger_queries_the_service_window_and_maps(jaeger_stub: tuple[str, _Stub]) -> None:
    url, stub = jaeger_stub
    stub.payload = jaeger_payload(scenario_spans(KNOWN))
    spans = read_jaeger(url + "/", "rmqtrace", limit=50, lookback_s=600, timeout=5, now_s=1_700_000_000)
    assert len(spans) == 18
    path, q = stub.queries[0]
    assert path == "/api/traces"
    assert q == {"service": ["rmqtrace"], "limit": ["50"], "start": [str(1_700_000_000_000_000 - 600_000_000)],
                 "end": ["1700000000000000"], "tags": ['{"messaging.operation.type": "process"}']}
    assert build_report(spans).groups[0].jobs[0].lower_bound_s == pytest.approx(1.0)


def test_read_jaeger_no_traces_names_the_known_services(jaeger_stub: tuple[str, _Stub]) -> None:
    url, stub = jaeger_stub
    stub.services = ["other", "jaeger"]
    with pytest.raises(SourceError, match=r"no traces for service 'rmqtrace'.*services known: jaeger, other"):
        read_jaeger(url, "rmqtrace", timeout=5)


CONSUMER_OPS = ["handler", "dispatch_wait", "process jobs", "receive jobs"]


def test_read_jaeger_no_traces_names_the_services_with_consumer_spans(jaeger_stub: tuple[str, _Stub]) -> None:
    url, stub = jaeger_stub
    stub.services = ["unknown_service:python", "producer-app", "workers"]
    stub.operations = {"unknown_service:python": CONSUMER_OPS, "producer-app": ["send jobs"], "workers": CONSUMER_OPS}
    with pytest.raises(NoTracesForService) as caught:
        read_jaeger(url, "rmqtrace", timeout=5)
    assert caught.value.consumer_services == ["unknown_service:python", "workers"]
    assert str(caught.value).endswith("(services with rmqtrace consumer spans: unknown_service:python, workers; "
                                      "give --service NAME)")


def test_report_reads_the_only_service_with_consumer_spans(jaeger_stub: tuple[str, _Stub],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The README's program set no OTEL_SERVICE_NAME: its traces were unknown_service:python, and
    `report --jaeger` looked for rmqtrace and listed every service (issue 33)."""
    from tracer.tools.cli import main

    url, stub = jaeger_stub
    stub.services = ["unknown_service:python", "producer-app"]
    stub.operations = {"unknown_service:python": CONSUMER_OPS, "producer-app": ["send jobs"]}
    stub.payload_of = {"unknown_service:python": jaeger_payload(scenario_spans(KNOWN))}
    code = main(["report", "--jaeger", url, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert ("rmqtrace report: no traces for service 'rmqtrace'; reading 'unknown_service:python', the only service "
            "with rmqtrace consumer spans (--service picks another)") in err
    assert json.loads(out)["groups"]


def test_read_jaeger_http_error(jaeger_stub: tuple[str, _Stub]) -> None:
    url, stub = jaeger_stub
    stub.status = 500
    with pytest.raises(SourceError, match="HTTP 500"):
        read_jaeger(url, "rmqtrace", timeout=5)


def test_read_jaeger_unreachable_and_bad_url() -> None:
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SourceError, match="cannot reach Jaeger"):
        read_jaeger(f"http://127.0.0.1:{port}", "rmqtrace", timeout=2)
    with pytest.raises(SourceError, match="http"):
        read_jaeger("127.0.0.1:16686", "rmqtrace")


def test_cli_warns_when_jaeger_hits_the_limit(jaeger_stub: tuple[str, _Stub],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from tracer.tools.cli import main
    url, stub = jaeger_stub
    stub.payload = jaeger_payload(scenario_spans(KNOWN), stamps="str")
    assert main(["report", "--jaeger", url, "--limit", "3", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["groups"][0]["jobs"][0]["lower_bound_s"] == pytest.approx(1.0)
    assert "returned --limit 3 traces" in err
    assert stub.queries[0][1]["limit"] == ["3"] and stub.queries[0][1]["service"] == ["rmqtrace"]


def test_a_parent_jaeger_folded_into_follows_from_is_still_the_parent() -> None:
    # `process` links to the `send` that is also its parent; Jaeger reports the pair as one
    # FOLLOWS_FROM reference. A FOLLOWS_FROM into another trace stays a link.
    tid = "4bf92f3577b34da6a3ce929d0e0e4736"
    folded = {"traceID": tid, "spanID": "00f067aa0ba902b7", "operationName": "process t", "startTime": 1,
              "duration": 1, "references": [{"refType": "FOLLOWS_FROM", "traceID": tid, "spanID": "1234"}]}
    assert jaeger_span(folded, {}).parent_span_id == "0000000000001234"
    foreign = dict(folded, references=[{"refType": "FOLLOWS_FROM", "traceID": "ab" * 16, "spanID": "1234"}])
    assert jaeger_span(foreign, {}).parent_span_id is None


# -- Jaeger api_v3 (gRPC, OTLP) ------------------------------------------------------------------
def _v3_classes() -> tuple[Any, Any]:
    """TraceQueryParameters and FindTracesRequest built from jaeger-idl's api_v3 field numbers and
    types, independently of the hand encoder under test."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    f = descriptor_pb2.FileDescriptorProto(name="rmqtrace_test_api_v3.proto", package="rmqtrace_test.api_v3",
                                           syntax="proto3", dependency=["google/protobuf/timestamp.proto"])
    T = descriptor_pb2.FieldDescriptorProto
    q = f.message_type.add(name="TraceQueryParameters")
    for number, name, kind, type_name in ((1, "service_name", T.TYPE_STRING, ""), (2, "operation_name", T.TYPE_STRING, ""),
                                          (4, "start_time_min", T.TYPE_MESSAGE, ".google.protobuf.Timestamp"),
                                          (5, "start_time_max", T.TYPE_MESSAGE, ".google.protobuf.Timestamp"),
                                          (8, "search_depth", T.TYPE_INT32, ""), (9, "raw_traces", T.TYPE_BOOL, "")):
        q.field.add(name=name, number=number, type=kind, label=T.LABEL_OPTIONAL, type_name=type_name or None)
    r = f.message_type.add(name="FindTracesRequest")
    r.field.add(name="query", number=1, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                type_name=".rmqtrace_test.api_v3.TraceQueryParameters")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(
        timestamp_pb2.DESCRIPTOR.serialized_pb))  # type: ignore[attr-defined]
    pool.Add(f)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("rmqtrace_test.api_v3.TraceQueryParameters")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("rmqtrace_test.api_v3.FindTracesRequest")))


@pytest.mark.parametrize("raw", [False, True])
def test_find_traces_request_means_what_jaeger_reads(raw: bool) -> None:
    from tracer.report.sources import find_traces_request

    _, request_class = _v3_classes()
    start, end = 1_795_978_749_000_000_001, 1_795_978_800_123_456_789
    req = request_class.FromString(find_traces_request("rmqtrace-ü", start, end, 100_000, raw=raw))
    q = req.query
    assert q.service_name == "rmqtrace-ü" and q.operation_name == "" and q.search_depth == 100_000
    assert q.raw_traces is raw
    assert (q.start_time_min.seconds, q.start_time_min.nanos) == divmod(start, 10**9)
    assert (q.start_time_max.seconds, q.start_time_max.nanos) == divmod(end, 10**9)
    whole = request_class.FromString(find_traces_request("s", 2 * 10**18, 3 * 10**18, 1))
    assert whole.query.start_time_min.nanos == 0 and whole.query.start_time_max.seconds == 3 * 10**9
    with pytest.raises(ValueError, match="depth"):
        find_traces_request("s", 1, 2, 0)


def test_any_value_keeps_every_otlp_kind() -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

    from tracer.report.sources import any_value

    big = 1_795_978_750_071_042_343
    assert any_value(AnyValue(int_value=big)) == big and type(any_value(AnyValue(int_value=big))) is int
    assert any_value(AnyValue(string_value="x")) == "x"
    assert any_value(AnyValue(bool_value=False)) is False
    assert any_value(AnyValue(double_value=2.5)) == 2.5
    assert any_value(AnyValue(bytes_value=b"\x00")) == b"\x00"
    assert any_value(AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="k1"), AnyValue(int_value=2)]))) \
        == ["k1", 2]
    assert any_value(AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="a", value=AnyValue(int_value=1))]))) \
        == {"a": 1}
    assert any_value(AnyValue()) is None


def test_v3_target_only_where_jaeger_defaults_say() -> None:
    from tracer.report.sources import v3_target

    assert v3_target("http://127.0.0.1:16686") == "127.0.0.1:16685"
    assert v3_target("https://jaeger.example:16686/") == "jaeger.example:16685"
    assert v3_target("http://[::1]:16686") == "[::1]:16685"
    assert v3_target("http://127.0.0.1:8080") is None  # moved: its gRPC port is unknown
    assert v3_target("http://127.0.0.1:8080", "127.0.0.1:9999") == "127.0.0.1:9999"


def test_fleet_collector_reads_otlp_once_per_trace_and_span() -> None:
    """A trace of an earlier page and a process span exported twice count once, as over /api/traces."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, TracesData

    from tracer.report.fleet import FleetCollector

    def kv(key: str, value: Any) -> KeyValue:
        v = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
        return KeyValue(key=key, value=v)

    def trace(tid: int, instance: str, pull: int) -> TracesData:
        attrs = [kv("rmqtrace.stamp.client_pull_ns", pull), kv("rmqtrace.stamp.handler_start_ns", pull + 5),
                 kv("rmqtrace.stamp.handler_end_ns", pull + 9), kv("rmqtrace.worker", 1), kv("rmqtrace.job.id", "J"),
                 kv("messaging.operation.type", "process")]
        process = Span(trace_id=tid.to_bytes(16, "big"), span_id=(tid * 2).to_bytes(8, "big"), name="process t",
                       attributes=attrs, start_time_unix_nano=pull)
        child = Span(trace_id=tid.to_bytes(16, "big"), span_id=(tid * 2 + 1).to_bytes(8, "big"), name="handler",
                     start_time_unix_nano=pull - 7)
        resource = Resource(attributes=[kv("service.name", "svc"), kv("service.instance.id", instance)])
        return TracesData(resource_spans=[ResourceSpans(resource=resource, scope_spans=[
            ScopeSpans(spans=[process, child, process])])])  # the process span twice: exported twice

    c = FleetCollector()
    seen: set[bytes] = set()
    page: dict[bytes, int] = {}
    c.add_otlp_trace(trace(1, "b", T0), seen, page)
    c.add_otlp_trace(trace(2, "a", T0 + 100), seen, page)
    assert page == {(1).to_bytes(16, "big"): T0 - 7, (2).to_bytes(16, "big"): T0 + 93}  # earliest span start
    seen.update(page)
    page2: dict[bytes, int] = {}
    c.add_otlp_trace(trace(1, "b", T0), seen, page2)  # read again in a later page: skipped
    assert list(page2) == [(1).to_bytes(16, "big")] and c.traces == 2 and c.spans == 6  # counted in its page, not read
    (job,) = c.job_views()
    assert job.messages == 2 and [i.name for i in job.instances] == ["a", "b"]  # by name, not by arrival
    assert job.critical["instance"] == "a" and {i.workers for i in job.instances} == {1}


def test_a_cycle_made_while_paused_is_still_collected() -> None:
    import gc
    import weakref

    from tracer.report.sources import paused_gc

    class Node:
        other: Any = None

    with paused_gc():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        del a, b
    assert gone() is not None  # nothing collected it while paused
    gc.collect()
    assert gone() is None


def test_paused_gc_restores_what_it_found() -> None:
    import gc

    from tracer.report.sources import paused_gc

    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        assert not gc.isenabled()
        raise RuntimeError("a reader failing mid-way")
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()  # the caller's choice stands
    finally:
        gc.enable()
