"""The group report counts workers per instance: worker 0 of two consumer instances is two workers.

Review #31 finding 9: ``rmqtrace report`` pooled a group run by two instances (one worker each,
both ``rmqtrace.worker=0``) into one worker, so the job "finished at 0.73× its lower bound" with
"workers busy 137 %". Every reader the group report builds its records with is a case: the span
file's fast path, spans through ``messages_from_spans`` (the span-file fallback and Jaeger's
path), and Jaeger's JSON, where two instances share one service name and only
``service.instance.id`` tells them apart; plus the inferred-workers path (no worker attribute).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tracer.path import names
from tracer.path.stages import Stage
from tracer.report.model import MessageRecord, build_report, messages_from_spans, report_from_messages
from tracer.report.sources import spans_from_jaeger_json
from tracer.report.spanread import read_span_file
from tracer.telemetry.spanfile import SpanRecord

MS = 1_000_000
T0 = 1_790_000_000_000_000_000
# (message, instance, produce, pull, start, end): on "a" m2 follows m1 on its one worker; "b" runs m3
ROWS = [(1, "a", 0, 2 * MS, 2 * MS, 100 * MS), (2, "a", 90 * MS, 96 * MS, 100 * MS, 150 * MS),
        (3, "b", 0, 2 * MS, 2 * MS, 60 * MS)]


def _attrs(i: int, produce: int, pull: int, start: int, end: int, worker: bool) -> dict[str, Any]:
    a: dict[str, Any] = {
        "messaging.system": "rocketmq", "messaging.operation.type": "process", "messaging.destination.name": "t",
        "messaging.consumer.group.name": "g", names.MESSAGE_ID: f"m{i}", names.JOB_ID: "job-1",
        names.OUTCOME: "success",
        names.STAMP_ATTRS[Stage.PRODUCE]: T0 + produce, names.STAMP_ATTRS[Stage.BROKER_STORE]: T0 + produce + MS,
        names.STAMP_ATTRS[Stage.CLIENT_PULL]: T0 + pull, names.STAMP_ATTRS[Stage.DISPATCH_ENQUEUE]: T0 + pull,
        names.STAMP_ATTRS[Stage.HANDLER_START]: T0 + start, names.STAMP_ATTRS[Stage.HANDLER_END]: T0 + end}
    if worker:
        a[names.WORKER] = 0
    return a


def _file(tmp: Path, worker: bool) -> list[MessageRecord]:
    path = tmp / "spans.jsonl"
    with path.open("w") as fh:
        for i, inst, produce, pull, start, end in ROWS:
            fh.write(json.dumps({"trace_id": f"{i:032x}", "span_id": f"{i:016x}", "parent_span_id": None,
                                 "name": "process t", "kind": "CONSUMER", "start_ns": T0 + produce + MS,
                                 "end_ns": T0 + end, "status": "UNSET", "service": inst,
                                 "attributes": _attrs(i, produce, pull, start, end, worker)}) + "\n")
    return read_span_file(path).records


def _span_records(tmp: Path, worker: bool) -> list[MessageRecord]:
    return messages_from_spans([SpanRecord(f"{i:032x}", f"{i:016x}", None, "process t", "CONSUMER", T0 + produce + MS,
                                           T0 + end, service=inst, attributes=_attrs(i, produce, pull, start, end, worker))
                                for i, inst, produce, pull, start, end in ROWS])


def _jaeger(tmp: Path, worker: bool) -> list[MessageRecord]:
    def tag(k: str, v: Any) -> dict[str, Any]:
        return {"key": k, "type": "int64" if isinstance(v, int) else "string", "value": v}

    data = []
    for i, inst, produce, pull, start, end in ROWS:
        pid = f"p-{inst}"
        span = {"traceID": f"{i:032x}", "spanID": f"{i:016x}", "operationName": "process t",
                "startTime": (T0 + produce + MS) // 1000, "duration": (end - produce - MS) // 1000, "processID": pid,
                "tags": [tag("span.kind", "consumer")] + [tag(k, v) for k, v in
                                                         _attrs(i, produce, pull, start, end, worker).items()]}
        # one service name for both: only the instance id tells them apart
        data.append({"traceID": f"{i:032x}", "spans": [span], "processes": {pid: {
            "serviceName": "svc", "tags": [tag("service.instance.id", f"host:{inst}")]}}})
    return messages_from_spans(spans_from_jaeger_json({"data": data}))


READERS: dict[str, Callable[[Path, bool], list[MessageRecord]]] = {
    "span file": _file, "span records": _span_records, "jaeger json": _jaeger}


@pytest.mark.parametrize("worker", [True, False], ids=["worker attribute", "inferred"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_two_instances_are_two_workers(reader: str, worker: bool, tmp_path: Path) -> None:
    records = READERS[reader](tmp_path, worker)
    g = report_from_messages(records, len(records)).groups[0]
    (job,) = g.jobs
    # fails before: 1 worker, over_lb 0.73, occupancy 137 %
    assert g.workers == 2 and job.workers == 2, (g.workers, g.workers_source)
    assert job.over_lb is not None and job.over_lb >= 1.0
    assert job.occupancy <= 1.0
    assert len({r.worker for r in records}) == 2  # two lanes: the blame reads one per worker
    assert {r.instance for r in records} == ({"a", "b"} if reader != "jaeger json" else {"host:a", "host:b"})


def test_one_instance_keeps_its_worker_ids() -> None:
    spans = [SpanRecord(f"{i:032x}", f"{i:016x}", None, "process t", "CONSUMER", T0, T0 + end, service="a",
                        attributes={**_attrs(i, produce, pull, start, end, True), names.WORKER: i})
             for i, _inst, produce, pull, start, end in ROWS]
    g = build_report(spans).groups[0]
    assert g.workers == 3 and sorted(r.worker for r in g.records) == [1, 2, 3]
