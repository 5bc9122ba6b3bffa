"""Per-message CPU cost of tracing, as ratios to one bare OpenTelemetry SDK span.

Five loops run interleaved in rounds on the same provider set-up (a ``BatchSpanProcessor``
to an exporter that drops everything, as a production process would have):
- ``span``: create and end one SDK span — the unit everything is measured in;
- ``contrib_process``: what a contrib-style instrumentation does per message, the fair baseline
  (:func:`~tracer.tools.bench.contrib_process`: the traceparent extracted by the W3C propagator, one
  ``process`` span with six attributes current around the handler) — the ``*_over_contrib`` ratios;
- ``stamps_metrics``: a received message's stamps (property parsing included) and its six
  histogram observations, no spans;
- ``full_trace``: the whole consumer side of one sampled message — stamps, histograms, the
  ``process`` and ``handler`` spans and the three gap spans;
- ``compact_trace``: the same message in the compact shape (``RMQTRACE_TRACE_SHAPE=compact``):
  ``process`` alone, current while the handler runs, gaps and stamps as its attributes;
- ``sampled_out``: a message the producer did not sample and the keep policy drops — stamps,
  histograms, the head decision, the held trace (its ``handler`` context current while the
  handler runs, its id held by a :class:`HoldingSpanProcessor`) and the keep decision, on the
  same batch set-up behind the holding processor.
CPU time (``time.process_time_ns``) per message, median over rounds; the ratio is what is
stable across machines. The whole set of interleaved rounds is one *run*, on fresh providers;
``runs`` runs (default 3) follow each other and every ratio in the result is the median of the
runs' ratios, with each run's ratios and the spread (min, max) beside it.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from typing import Any, Callable

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry

from ...compiled import HOT_MODULES, compiled_modules
from ...path.message import MessageInfo
from ...path.propagation import PRODUCE_NS, TRACEPARENT
from ...path.stages import Outcome, Stage
from ...telemetry.hold import HoldingSpanProcessor
from ...telemetry.keep import KeepPolicy
from ...telemetry.metrics import TracerMetrics
from ...telemetry.tracer import MessageTracer
from . import DropExporter, contrib_process, loadavg

__all__ = ["RATIOS", "TARGETS", "format_overhead_bench", "run_overhead_bench"]

# issue 35's targets: each at most this, against the baseline in its name
TARGETS = {"stamps_metrics_over_span": 0.5, "full_trace_over_contrib": 1.0, "compact_trace_over_contrib": 0.6,
           "sampled_out_over_contrib": 0.4}

# every ratio a run gives: (numerator loop, baseline loop)
RATIOS = {
    "stamps_metrics_over_span": ("stamps_metrics", "span"),
    "full_trace_over_span": ("full_trace", "span"),
    "compact_trace_over_span": ("compact_trace", "span"),
    "sampled_out_over_span": ("sampled_out", "span"),
    "contrib_process_over_span": ("contrib_process", "span"),
    "full_trace_over_contrib": ("full_trace", "contrib_process"),
    "compact_trace_over_contrib": ("compact_trace", "contrib_process"),
    "sampled_out_over_contrib": ("sampled_out", "contrib_process"),
}


def _batch() -> BatchSpanProcessor:
    return BatchSpanProcessor(DropExporter(), max_queue_size=1 << 16)


def _provider() -> TracerProvider:
    p = TracerProvider()
    p.add_span_processor(_batch())
    return p


def _info(i: int, now_ns: int, sampled: bool = True) -> MessageInfo:
    return MessageInfo(
        topic="bench", message_id=f"MSG{i:012d}", tag="t", keys=("k",),
        properties={TRACEPARENT: f"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0{int(sampled)}",
                    PRODUCE_NS: str(now_ns - 5_000_000)},
        store_ms=now_ns // 1_000_000 - 3, delivery_attempt=1, body_size=100)


def _loops(provider: TracerProvider, held_provider: TracerProvider, hold: HoldingSpanProcessor,
           policy: KeepPolicy) -> dict[str, Callable[[int], None]]:
    tracer = provider.get_tracer("bench")
    metrics_only = MessageTracer(consumer_group="g", tracer_provider=trace.NoOpTracerProvider(),
                                 metrics=TracerMetrics(CollectorRegistry()))
    full = MessageTracer(consumer_group="g", tracer_provider=provider,
                         metrics=TracerMetrics(CollectorRegistry()), trace_shape="full")
    compact = MessageTracer(consumer_group="g", tracer_provider=provider,
                            metrics=TracerMetrics(CollectorRegistry()), trace_shape="compact")
    sampled_out = MessageTracer(consumer_group="g", tracer_provider=held_provider,
                                metrics=TracerMetrics(CollectorRegistry()), keep=policy, hold=hold)
    now = time.time_ns()
    infos = [_info(i, now) for i in range(256)]
    unsampled = [_info(i, now, sampled=False) for i in range(256)]

    def span(n: int) -> None:
        for _ in range(n):
            tracer.start_span("bare").end()

    propagator = TraceContextTextMapPropagator()

    def contrib(n: int) -> None:
        for i in range(n):
            info = infos[i & 255]
            with contrib_process(tracer, propagator.extract(info.properties), info.topic, "g", info.message_id or ""):
                pass

    def one_message(mt: MessageTracer, n: int, infos: list[MessageInfo] = infos) -> None:
        for i in range(n):
            t = mt.start_message(infos[i & 255])
            t.mark(Stage.DISPATCH_ENQUEUE)
            with t.handler_scope():
                pass
            t.finish(Outcome.SUCCESS)

    return {
        "span": span,
        "contrib_process": contrib,
        "stamps_metrics": lambda n: one_message(metrics_only, n),
        "full_trace": lambda n: one_message(full, n),
        "compact_trace": lambda n: one_message(compact, n),
        "sampled_out": lambda n: one_message(sampled_out, n, unsampled),
    }


def _one_run(messages: int, rounds: int, progress: Callable[[], None]) -> dict[str, list[float]]:
    """One run: fresh providers, a warm-up, ``rounds`` interleaved rounds; ns per message per loop and round."""
    provider = _provider()
    hold = HoldingSpanProcessor([_batch()])
    held_provider = TracerProvider()
    held_provider.add_span_processor(hold)
    # thresholds no bench message reaches: every one is dropped, after the whole decision
    policy = KeepPolicy({"dispatch_wait": 10.0, "end_to_end": 600.0}, background=0.0)
    loops = _loops(provider, held_provider, hold, policy)
    per_msg: dict[str, list[float]] = {k: [] for k in loops}
    batch = max(100, messages // rounds)
    for fn in loops.values():
        fn(min(batch, 500))  # warm caches and label children
    for _ in range(rounds):
        for name, fn in loops.items():
            # each loop starts from an empty young generation: a collection the previous loop's
            # garbage triggers is not charged to this one (it moved the bare span by a third)
            gc.collect()
            t0 = time.process_time_ns()
            fn(batch)
            per_msg[name].append((time.process_time_ns() - t0) / batch)
        provider.force_flush()
        held_provider.force_flush()
        progress()
    provider.shutdown()
    held_provider.shutdown()
    if hold.statistics().forwarded or policy.statistics().kept:
        raise RuntimeError("the sampled_out loop kept a message: its figure would not be a dropped message's")
    return per_msg


def run_overhead_bench(messages: int = 20_000, rounds: int = 7, runs: int = 3,
                       progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """``runs`` runs of ``rounds`` interleaved rounds of ``messages // rounds`` messages per loop
    (see the module doc); ``progress(done, total)`` after every round."""
    if runs < 1 or rounds < 1 or messages < 1:
        raise ValueError("messages, rounds and runs must each be >= 1")
    load_before = loadavg()
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], rounds * runs)

    run_results: list[dict[str, Any]] = []
    for _ in range(runs):
        per_msg = _one_run(messages, rounds, tick)
        med = {k: statistics.median(v) for k, v in per_msg.items()}
        run_results.append({"ratios": {name: med[a] / med[b] for name, (a, b) in RATIOS.items()},
                            "ns_per_message": med, "per_round_ns": per_msg})
    ratios = {name: statistics.median(r["ratios"][name] for r in run_results) for name in RATIOS}
    return {
        **ratios,
        "spread": {name: [min(r["ratios"][name] for r in run_results), max(r["ratios"][name] for r in run_results)]
                   for name in RATIOS},
        "met": {name: ratios[name] <= target for name, target in TARGETS.items()},
        "ns_per_message": {k: statistics.median(r["ns_per_message"][k] for r in run_results)
                           for k in run_results[0]["ns_per_message"]},
        "per_run": run_results,
        "messages_per_round": max(100, messages // rounds),
        "rounds": rounds,
        "runs": runs,
        "targets": TARGETS,
        "loadavg": {"before": load_before, "after": loadavg()},
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        # the modules of tracer.compiled.HOT_MODULES that ran compiled (mypyc): module -> stale
        "compiled": compiled_modules(),
    }


def format_overhead_bench(result: dict[str, Any]) -> str:
    ns = result["ns_per_message"]
    t = result["targets"]
    spread = result["spread"]

    def line(label: str, loop: str, ratio: str, note: str = "") -> str:
        lo, hi = spread[ratio]
        target = f"  (target ≤ {t[ratio]}×: {'met' if result['met'][ratio] else 'NOT met'})" if ratio in t else ""
        return (f"{label:<34}{ns[loop] / 1000:8.2f} µs  = {result[ratio]:.2f}× {note}, runs {lo:.2f}–{hi:.2f}"
                f"{target}")

    return "\n".join([
        f"median of {result['runs']} runs of {result['rounds']} interleaved rounds, "
        f"{result['messages_per_round']} messages per loop and round",
        f"bare SDK span (create+end):       {ns['span'] / 1000:8.2f} µs  (= 1.00×)",
        line("contrib-style process span:", "contrib_process", "contrib_process_over_span", "a bare span"),
        line("(a) stamps + histograms:", "stamps_metrics", "stamps_metrics_over_span", "a bare span"),
        line("(b) full consumer trace:", "full_trace", "full_trace_over_contrib", "the contrib span"),
        line("(b') compact trace (one span):", "compact_trace", "compact_trace_over_contrib", "the contrib span"),
        line("(c) sampled out, dropped:", "sampled_out", "sampled_out_over_contrib", "the contrib span"),
        f"against a bare span: full {result['full_trace_over_span']:.2f}×, compact "
        f"{result['compact_trace_over_span']:.2f}×, dropped {result['sampled_out_over_span']:.2f}×",
        f"load average before/after: {result['loadavg']['before']} / {result['loadavg']['after']}",
        f"compiled (mypyc, tracer.compiled): {len(result['compiled'])} of {len(HOT_MODULES)} hot modules"
        + (f", STALE: {', '.join(m for m, stale in result['compiled'].items() if stale)}"
           if any(result["compiled"].values()) else ""),
    ])
