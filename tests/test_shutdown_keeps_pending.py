"""The provider's shutdown keeps every pending trace (the hold's promise, telemetry/hold.py "Timer"),
also when a handler of the same job still runs: its abandoned finish (a timeout, the job's latest
finisher now) must not supersede and drop the finisher that was pending when the shutdown began.
Found by tests/test_model_keep.py (clock 0.5 s, two job-"a" messages acked, a third running,
shutdown: the second one's trace was dropped)."""

from __future__ import annotations

import contextvars

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.path.propagation import JOB_ID, PRODUCE_NS, TRACEPARENT
from tracer.path.stages import Outcome, Stage
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.tracer import MessageTrace, MessageTracer


class _Collect(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: object) -> SpanExportResult:
        self.spans.extend(spans)  # type: ignore[arg-type]
        return SpanExportResult.SUCCESS


def test_a_pending_finisher_is_kept_though_a_running_handler_of_its_job_is_abandoned() -> None:
    clock = ManualClock()
    out = _Collect()
    hold = HoldingSpanProcessor([SimpleSpanProcessor(out)], clock=clock, ticker=False)
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(hold)
    policy = KeepPolicy({"dispatch_wait": 0.1}, job_idle_s=10.0, max_jobs=2, clock=clock)
    mt = MessageTracer(consumer_group="g", tracer_provider=provider, clock=clock, keep=policy, hold=hold)

    def start(i: int) -> tuple[MessageTrace, contextvars.Context]:
        clock.advance_s(0.5)
        props = {TRACEPARENT: f"00-{i + 1:032x}-{i + 1:016x}-00", PRODUCE_NS: str(clock.now_ns() - 2_000_000),
                 JOB_ID: "a"}
        t = mt.start_message(MessageInfo(topic="jobs", message_id=f"m{i}", properties=props,
                                         store_ms=clock.now_ns() // 1_000_000 - 1))
        t.mark(Stage.DISPATCH_ENQUEUE)
        clock.advance_s(0.001)
        ctx = contextvars.copy_context()
        ctx.run(t.__enter__)
        return t, ctx

    def acked(t: MessageTrace, ctx: contextvars.Context) -> None:
        clock.advance_s(0.001)
        ctx.run(t.__exit__, None, None, None)
        t.finish(Outcome.SUCCESS)

    first, second = start(0), start(1)
    acked(*first)
    acked(*second)  # job "a"'s latest finisher: pending, kept when the job goes idle or at shutdown
    start(2)  # still running at the shutdown
    assert policy.statistics().pending == 1
    provider.shutdown()
    ctx = second[0].context
    assert ctx is not None
    assert any(s.context.span_id == ctx.span_id and s.name == "process jobs" for s in out.spans), \
        "the finisher pending at the shutdown was dropped"
