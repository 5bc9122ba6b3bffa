"""Per-message CPU cost of tracing, as ratios to one bare OpenTelemetry SDK span.

Three loops run interleaved in rounds on the same provider set-up (a ``BatchSpanProcessor``
to an exporter that drops everything, as a production process would have):
- ``span``: create and end one SDK span — the unit everything is measured in;
- ``stamps_metrics``: a received message's stamps (property parsing included) and its six
  histogram observations, no spans;
- ``full_trace``: the whole consumer side of one sampled message — stamps, histograms, the
  ``process`` and ``handler`` spans and the three gap spans.
CPU time (``time.process_time_ns``) per message, median over rounds; the ratio is what is
stable across machines.
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import Any, Callable

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client import CollectorRegistry

from ...path.message import MessageInfo
from ...path.propagation import PRODUCE_NS, TRACEPARENT
from ...path.stages import Outcome, Stage
from ...telemetry.metrics import TracerMetrics
from ...telemetry.tracer import MessageTracer
from . import DropExporter


def _provider() -> TracerProvider:
    p = TracerProvider()
    p.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=1 << 16))
    return p


def _info(i: int, now_ns: int) -> MessageInfo:
    return MessageInfo(
        topic="bench", message_id=f"MSG{i:012d}", tag="t", keys=("k",),
        properties={TRACEPARENT: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                    PRODUCE_NS: str(now_ns - 5_000_000)},
        store_ms=now_ns // 1_000_000 - 3, delivery_attempt=1, body_size=100)


def _loops(provider: TracerProvider) -> dict[str, Callable[[int], None]]:
    tracer = provider.get_tracer("bench")
    metrics_only = MessageTracer(consumer_group="g", tracer_provider=trace.NoOpTracerProvider(),
                                 metrics=TracerMetrics(CollectorRegistry()))
    full = MessageTracer(consumer_group="g", tracer_provider=provider,
                         metrics=TracerMetrics(CollectorRegistry()))
    now = time.time_ns()
    infos = [_info(i, now) for i in range(256)]

    def span(n: int) -> None:
        for _ in range(n):
            tracer.start_span("bare").end()

    def one_message(mt: MessageTracer, n: int) -> None:
        for i in range(n):
            t = mt.start_message(infos[i & 255])
            t.mark(Stage.DISPATCH_ENQUEUE)
            with t.handler_scope():
                pass
            t.finish(Outcome.SUCCESS)

    return {
        "span": span,
        "stamps_metrics": lambda n: one_message(metrics_only, n),
        "full_trace": lambda n: one_message(full, n),
    }


def run_overhead_bench(messages: int = 20_000, rounds: int = 7,
                       progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    provider = _provider()
    loops = _loops(provider)
    per_msg: dict[str, list[float]] = {k: [] for k in loops}
    batch = max(100, messages // rounds)
    for fn in loops.values():
        fn(min(batch, 500))  # warm caches and label children
    for r in range(rounds):
        for name, fn in loops.items():
            t0 = time.process_time_ns()
            fn(batch)
            per_msg[name].append((time.process_time_ns() - t0) / batch)
        provider.force_flush()
        if progress is not None:
            progress(r + 1, rounds)
    provider.shutdown()
    med = {k: statistics.median(v) for k, v in per_msg.items()}
    return {
        "stamps_metrics_over_span": med["stamps_metrics"] / med["span"],
        "full_trace_over_span": med["full_trace"] / med["span"],
        "ns_per_message": med,
        "messages_per_round": batch,
        "rounds": rounds,
        "targets": {"stamps_metrics_over_span": 0.5, "full_trace_over_span": 3.0},
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def format_overhead_bench(result: dict[str, Any]) -> str:
    ns = result["ns_per_message"]
    t = result["targets"]
    return "\n".join([
        f"bare SDK span (create+end):       {ns['span'] / 1000:8.2f} µs  (= 1.00×)",
        f"(a) stamps + histograms:          {ns['stamps_metrics'] / 1000:8.2f} µs  "
        f"= {result['stamps_metrics_over_span']:.2f}×  (target ≤ {t['stamps_metrics_over_span']}×)",
        f"(b) full consumer trace:          {ns['full_trace'] / 1000:8.2f} µs  "
        f"= {result['full_trace_over_span']:.2f}×  (target ≤ {t['full_trace_over_span']}×)",
    ])
