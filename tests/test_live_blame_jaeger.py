"""Live blame in the real Jaeger: a victim's dispatch_wait span links to its blocker's handler span."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rmq_real import unique
from test_jaeger_e2e import _provider, _tag, _traces, jaeger  # noqa: F401 - jaeger: the fixture
from waiting import wait_until

from tracer.dispatch import Dispatcher, RoundRobin
from tracer.path import names as n
from tracer.path.message import MessageInfo
from tracer.telemetry.tracer import MessageTracer

pytestmark = pytest.mark.integration


def work(seconds: float) -> None:
    time.sleep(seconds)  # real-time: a slow handler is the subject



def test_jaeger_shows_the_edge_from_the_victim_to_its_blocker(jaeger):  # noqa: F811
    svc = unique("rmqtrace-blame")
    memory = InMemorySpanExporter()
    provider = _provider(svc, memory)
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider)
    d = Dispatcher(lambda body: work(0.3 if body == "slow" else 0.01), policy=RoundRobin(buffer=4), workers=2)
    for i, body in enumerate(["slow", "a", "b", "c"]):  # round-robin: m2 is dealt to worker 0, behind m0
        d.submit(body, tracer.start_message(MessageInfo(topic="T", message_id=f"m{i}")))
    assert d.close(timeout=30)
    assert provider.force_flush(10_000)
    spans = memory.get_finished_spans()
    ids = {s.context.trace_id: s.attributes[n.MESSAGE_ID] for s in spans if s.name == "process T"}
    blocker_handler = next(s for s in spans if s.name == n.HANDLER_SPAN and ids[s.context.trace_id] == "m0")
    victim_trace = next(f"{t:032x}" for t, m in ids.items() if m == "m2")
    found: list[dict] = []

    def arrived() -> bool:
        found[:] = [tr for tr in _traces(svc) if tr["traceID"] == victim_trace]
        return bool(found) and any(s["operationName"] == n.BLAME_SPAN for s in found[0]["spans"])

    wait_until(arrived, timeout=30, interval=0.25, what="the victim's trace in Jaeger")
    provider.shutdown()
    wait = next(s for s in found[0]["spans"] if s["operationName"] == n.BLAME_SPAN)
    assert _tag(wait, n.BLAME_REASON) == "head_of_line"
    assert _tag(wait, n.BLAME_BLOCKER_MESSAGE_ID) == "m0"
    assert _tag(wait, n.BLAME_AVOIDABLE_WAIT) > 0.1
    links = [(r["refType"], r["traceID"], r["spanID"]) for r in wait["references"] if r["refType"] != "CHILD_OF"]
    assert links == [("FOLLOWS_FROM", f"{blocker_handler.context.trace_id:032x}",
                      f"{blocker_handler.context.span_id:016x}")]
