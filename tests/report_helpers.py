"""Known inputs for the report tests: hand-made spans, and the same scenario through the real tracer.

A scenario row is one message with its stamps in milliseconds after ``T0`` (a realistic epoch in
ns, past 2^53, so precision bugs would show).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from tracer.path.stages import Stage
from tracer.telemetry.spanfile import SpanRecord

T0 = 1_795_978_749_000_000_000  # ns since the epoch
MS = 1_000_000


@dataclass(frozen=True)
class Row:
    group: str
    job: str | None
    key: str
    worker: int | None
    produce: float  # ms after T0 …
    store: float
    pull: float
    enqueue: float
    start: float
    end: float

    def ns(self, stage: Stage) -> int:
        ms = (self.produce, self.store, self.pull, self.enqueue, self.start, self.end)[stage]
        return T0 + round(ms * MS)


# Two workers, one job. m1 and m2 start at once; m3 waits for worker 0 (busy with the long m1)
# although worker 1 is free from 203 ms on: the incident in miniature.
#   completion 1103 ms; handler total 1300 ms → / 2 = 650 ms; longest 1000 ms → LB 1000 ms
#   last: m3 — produced +10, send 1, broker 1, buffer 0, dispatch wait 991, handler 100 (= 1103)
KNOWN: tuple[Row, ...] = (
    Row("g-rr", "J", "m1", 0, 0, 1, 2, 2, 3, 1003),
    Row("g-rr", "J", "m2", 1, 0, 1, 2, 2, 3, 203),
    Row("g-rr", "J", "m3", 0, 10, 11, 12, 12, 1003, 1103),
)


def _hex(n: int, width: int) -> str:
    return f"{n:0{width}x}"


def scenario_spans(rows: Iterable[Row], *, worker_attr: bool = True, stamps: bool = True,
                   topic: str = "t") -> list[SpanRecord]:
    """The spans tracer.telemetry.tracer writes for ``rows``: send, process (client pull to handler end) and its four children."""
    out: list[SpanRecord] = []
    for i, r in enumerate(rows, 1):
        trace_id, send_id, proc_id = _hex(i, 32), _hex(i * 16 + 1, 16), _hex(i * 16 + 2, 16)
        out.append(SpanRecord(trace_id, send_id, None, f"send {topic}", "PRODUCER", r.ns(Stage.PRODUCE),
                              r.ns(Stage.PRODUCE) + 50_000, attributes={"rmqtrace.job.id": r.job} if r.job else {}))
        attrs: dict[str, object] = {
            "messaging.operation.type": "process", "messaging.destination.name": topic,
            "messaging.consumer.group.name": r.group, "messaging.message.id": f"ID-{r.key}",
            "messaging.rocketmq.message.keys": [r.key], "rmqtrace.outcome": "success",
            "messaging.rocketmq.message.delivery_attempt": 1,
        }
        if r.job:
            attrs["rmqtrace.job.id"] = r.job
        if worker_attr and r.worker is not None:
            attrs["rmqtrace.worker"] = r.worker
        if stamps:
            for s in Stage:
                attrs[f"rmqtrace.stamp.{s.name.lower()}_ns"] = r.ns(s)
        fixed = [r.ns(s) for s in Stage]
        for k in range(1, len(fixed)):
            fixed[k] = max(fixed[k], fixed[k - 1])
        out.append(SpanRecord(trace_id, proc_id, send_id, f"process {topic}", "CONSUMER", fixed[Stage.CLIENT_PULL],
                              fixed[Stage.HANDLER_END], attributes=attrs))
        for j, (name, a, b) in enumerate((("broker_wait", Stage.BROKER_STORE, Stage.CLIENT_PULL),
                                          ("client_buffer", Stage.CLIENT_PULL, Stage.DISPATCH_ENQUEUE),
                                          ("dispatch_wait", Stage.DISPATCH_ENQUEUE, Stage.HANDLER_START),
                                          ("handler", Stage.HANDLER_START, Stage.HANDLER_END))):
            out.append(SpanRecord(trace_id, _hex(i * 16 + 3 + j, 16), proc_id, name, "INTERNAL", fixed[a], fixed[b],
                                  attributes={"rmqtrace.stage": name} if name != "handler" else {}))
    return out


class SetClock:
    """A clock a test sets to any time (the tracer reads it for produce, pull and handler stamps)."""

    def __init__(self, ns: int = T0) -> None:
        self.t = ns

    def now_ns(self) -> int:
        return self.t

    # both timelines at once: a test that sets any time gets exactly that stamp
    def wall_ns(self) -> int:
        return self.t

    def monotonic_ns(self) -> int:
        return self.t


def write_scenario_with_tracer(path: Path, rows: Sequence[Row], *, worker_attr: bool = True,
                               topic: str = "t") -> Path:
    """Run ``rows`` through the real MessageTracer into a JSON-lines span file (what the demo writes)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from tracer.path.message import MessageInfo
    from tracer.path.stages import Outcome
    from tracer.telemetry.spanfile import JsonLinesSpanExporter
    from tracer.telemetry.tracer import MessageTracer

    exporter = JsonLinesSpanExporter(path)
    provider = TracerProvider(resource=Resource.create({"service.name": "rmqtrace-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    clock = SetClock()
    producer = MessageTracer(tracer_provider=provider, clock=clock)
    tracers: dict[str, MessageTracer] = {}
    for r in rows:
        props: dict[str, str] = {}
        clock.t = r.ns(Stage.PRODUCE)
        producer.start_send(topic, props.__setitem__, keys=[r.key], job_id=r.job).end(f"ID-{r.key}")
        tracer = tracers.setdefault(r.group, MessageTracer(consumer_group=r.group, tracer_provider=provider,
                                                           clock=clock, worker_attr=worker_attr))
        info = MessageInfo(topic=topic, message_id=f"ID-{r.key}", keys=(r.key,), properties=props,
                           store_ms=round(r.store) + T0 // MS, delivery_attempt=1)
        clock.t = r.ns(Stage.CLIENT_PULL)  # the pull is read now: the message's timeline starts here
        t = tracer.start_message(info, r.ns(Stage.CLIENT_PULL))
        t.mark(Stage.DISPATCH_ENQUEUE, r.ns(Stage.DISPATCH_ENQUEUE))
        t.worker = r.worker
        clock.t = r.ns(Stage.HANDLER_START)
        with t.handler_scope():
            clock.t = r.ns(Stage.HANDLER_END)
        t.finish(Outcome.SUCCESS)
    provider.shutdown()
    return path
