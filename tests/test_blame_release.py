"""Live blame must not keep history alive: a trace blamed on its blocker holds the blocker's trace
only until it finishes (it resolves the blocker's id and handler context then). Otherwise every
live message would hold the chain of every trace that blocked one before it — under steady
head-of-line blocking, the whole run's traces (unbounded memory in a long-lived consumer)."""

from __future__ import annotations

import gc

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tracer.path import names as n
from tracer.path.blocking import HEAD_OF_LINE, Verdict
from tracer.path.message import MessageInfo
from tracer.path.stages import Outcome, Stage
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTrace, MessageTracer


class _Entry:
    """A dispatcher entry: what the tracker is given as the message's key."""

    def __init__(self, trace: MessageTrace) -> None:
        self.trace = trace


@pytest.mark.parametrize("shape", ["full", "compact"])
def test_a_finished_trace_lets_its_blocker_go_and_keeps_its_blame(shape: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    mt = MessageTracer(consumer_group="g", tracer_provider=provider, metrics=TracerMetrics(CollectorRegistry()),
                       trace_shape=shape)
    previous = None
    for i in range(50):
        t = mt.start_message(MessageInfo(topic="T", message_id=f"M{i}"))
        t.mark(Stage.DISPATCH_ENQUEUE)
        if previous is not None:  # held up behind the previous message, as aggressive blames it
            # as Core wires it: the key is the blocker's entry (holding its trace), the ref its trace
            t.blame(Verdict(HEAD_OF_LINE, 0.2, 0.1, _Entry(previous), previous), "aggressive")
        with t.handler_scope():
            pass
        t.finish(Outcome.SUCCESS)
        previous = t
    del t
    gc.collect()
    alive = sorted(o.info.message_id for o in gc.get_objects() if type(o) is MessageTrace and o.tracer is mt)
    assert alive == ["M49"], f"traces kept alive by the newest one's blame chain: {alive}"
    # the blame still made it to the spans: blocker id, reason, and a link to its span
    carrier = n.BLAME_SPAN if shape == "full" else "process T"
    blamed = [s for s in exporter.get_finished_spans()
              if s.name == carrier and s.attributes.get(n.BLAME_BLOCKER_MESSAGE_ID) == "M48"]
    assert len(blamed) == 1 and blamed[0].attributes[n.BLAME_REASON] == HEAD_OF_LINE
    # linked to the blocker's span that was current in its handler (full: handler; compact: process)
    (m48,) = [s for s in exporter.get_finished_spans() if s.name == "process T"
              and s.attributes.get(n.MESSAGE_ID) == "M48"]
    current = [s.context.span_id for s in exporter.get_finished_spans() if s.context.trace_id == m48.context.trace_id
               and s.name == ("handler" if shape == "full" else "process T")]
    assert [lk.context.span_id for lk in blamed[0].links] == current
