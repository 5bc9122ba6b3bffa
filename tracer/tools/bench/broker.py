"""Throughput on the real broker, traced against untraced, in the same run.

Needs the local RocketMQ 5 (``services/rocketmq/rmq.sh start``, proxy gRPC ``127.0.0.1:8081``)
and ``rocketmq-python-client``. One topic and one consumer group are created for the run. Seven
modes run in every round, in a rotating order (so a drift of the shared machine hits all alike):

- ``untraced``: a plain ``Producer`` and ``ConsumeLoop(tracer=None)``;
- ``traced``: :class:`~tracer.producer.TracedProducer` and a :class:`MessageTracer` with histograms
  and every span sampled, handed to a ``BatchSpanProcessor`` whose exporter drops them — rmqtrace's
  own cost, measured like ``rmqtrace bench overhead``;
- ``traced_otlp``: the same, with the exporter encoding every batch to OTLP protobuf bytes (then
  dropped): what an OTLP exporter adds in the process, without the network;
- ``contrib``: no rmqtrace at all — what a contrib-style instrumentation costs: a ``send`` span
  per message with ``traceparent`` injected (the W3C propagator), and on the consumer one
  ``process`` span per message around the handler, parented by the extracted context (the
  baseline a user compares a tracer with; rmqtrace's figures are also given against it);
- ``traced_compact``: ``traced`` with the compact trace shape (one ``process`` span per message,
  the gaps as its attributes: ``RMQTRACE_TRACE_SHAPE=compact``), against ``contrib`` span for span;
- ``traced_child``: ``traced`` with its spans exported through a child process
  (:class:`~tracer.telemetry.exportchild.ChildExportProcessor`, ``RMQTRACE_EXPORT_CHILD=true``),
  the child encoding every batch to OTLP protobuf bytes and dropping them, as ``traced_otlp`` does
  in the process: what the consumer keeps of the export's cost when the export leaves its GIL;
- ``traced_keep``: histograms for every message, head sampling at 1 %
  (``parentbased_traceidratio``) and a :class:`~tracer.telemetry.keep.KeepPolicy` behind a
  :class:`~tracer.telemetry.hold.HoldingSpanProcessor` on the consumer (thresholds no bench
  message reaches, so it keeps only the head-sampled 1 %): what a production set-up that keeps the
  slow traces costs.

A round of one mode: *produce* ``messages`` messages with ``send_async`` (at most ``window`` in
flight), then *consume* them with a :class:`~tracer.consume.ConsumeLoop` (aggressive policy,
``workers`` workers, a ``handler_ms`` sleep as the handler), timed from the loop's start to the
last ack. ``traced_over_untraced`` is the median over rounds of traced ÷ untraced consume
throughput of the same round; the other ratios are reported beside it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Sequence

from ...clients.consume import ConsumeLoop
from ...telemetry.futures import future_error
from ...telemetry.tracer import MessageTracer
from . import DropExporter, client_version, loadavg
from .brokermodes import Clients, EncodeOnlyExporter, Mode, child_mode, contrib_mode, keep_mode, open_clients, traced_mode
from .threadcpu import PARTS, GcTimer, cpu_by_role, thread_cpu

__all__ = ["EncodeOnlyExporter", "format_broker_bench", "main", "run_broker_bench", "run_cli"]

ENDPOINT = "127.0.0.1:8081"
DEFAULT_MESSAGES = 500
DEFAULT_ROUNDS = 15
TARGET = 0.95


def _client() -> Any:
    from ...clients.quiet import import_quietly

    return import_quietly()


def _produce(producer: Any, rmq: Any, topic: str, n: int, run: str, window: int) -> tuple[float, float]:
    """Send ``n`` messages with at most ``window`` in flight: (seconds taken, CPU seconds of this
    process meanwhile — the sending thread, the client's I/O thread, the exporter's)."""
    sem = threading.Semaphore(window)
    errors: list[BaseException] = []
    futures: list[Future[Any]] = []

    def release(f: Future[Any]) -> None:
        sem.release()
        error = future_error(f)
        if error is not None:
            errors.append(error)

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for i in range(n):
        m = rmq.Message()
        m.topic = topic
        m.body = f"{run}-{i:06d}".encode() + b"x" * 100
        m.tag = "bench"
        sem.acquire()
        f = producer.send_async(m)
        f.add_done_callback(release)
        futures.append(f)
    for f in futures:
        f.exception(timeout=60)
    took = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    if errors:
        raise RuntimeError(f"{len(errors)} sends failed, first: {errors[0]!r}")
    return took, cpu


def _consume(consumer: Any, n: int, handler_ms: float, workers: int,
             tracer: MessageTracer | None, breakdown: dict[str, float] | None = None,
             wrap: Callable[[Callable[[Any], None]], Callable[[Any], None]] | None = None) -> tuple[float, float]:
    """Receive, handle and ack ``n`` messages: (seconds from the loop's start to the n-th ack,
    CPU seconds of this process meanwhile — every thread: the client's, the loop's, the exporter's).
    ``breakdown``, if given, is filled with µs of CPU per message by thread role (:data:`~tracer.tools.bench.threadcpu.ROLES`,
    taken before the loop's threads end) and ``gc`` (the cyclic collector's µs per message);
    ``wrap`` wraps the handler (the contrib mode's process span)."""
    pause = handler_ms / 1000.0

    def handler(_msg: Any) -> None:
        time.sleep(pause)

    loop = ConsumeLoop(consumer, handler if wrap is None else wrap(handler), tracer=tracer, policy="aggressive",
                       workers=workers, invisible_duration=60)
    done = threading.Event()
    timer = GcTimer()
    gc.callbacks.append(timer)
    threads0 = thread_cpu()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    end = [0.0]

    def until(stats: Any) -> bool:
        if stats.acked >= n and not done.is_set():
            end[0] = time.perf_counter()
            done.set()
        return done.is_set()

    runner = threading.Thread(target=loop.run, kwargs={"until": until}, daemon=True)
    runner.start()
    # `until` is checked between receives; watch the acks too so a long poll does not count
    while not done.wait(0.005):
        if loop.statistics().acked >= n:
            end[0] = time.perf_counter()
            done.set()
    cpu = time.process_time() - cpu0
    threads1 = thread_cpu()
    gc.callbacks.remove(timer)
    if breakdown is not None:
        breakdown.update(cpu_by_role(threads0, threads1, n), gc=timer.seconds / n * 1e6)
    loop.stop()
    runner.join(60)
    if loop.statistics().acked < n or loop.statistics().redelivered or loop.statistics().ack_errors:
        raise RuntimeError(f"consume round incomplete: {loop.statistics()}")
    return end[0] - t0, cpu


def _run_rounds(clients: Clients, modes: dict[str, Mode], *, messages: int, rounds: int, handler_ms: float,
                workers: int, window: int, progress: Callable[[int, int], None] | None) -> dict[str, dict[str, list[float]]]:
    """A warm-up per mode, then ``rounds`` rounds of every mode in rotating order: produce and
    consume throughput (msg/s) and consumer CPU per message (µs) per round and mode."""
    names = list(modes)
    results: dict[str, dict[str, list[float]]] = {
        m: {"produce": [], "produce_cpu_us": [], "consume": [], "cpu_us": [], "helper_cpu_us": [],
            **{part: [] for part in PARTS}} for m in modes}
    # warm-up: routes, channels, thread pools, the tracers' first spans
    for mode in modes.values():
        _produce(mode.producer, clients.rmq, clients.topic, 200, "warm", window)
        _consume(clients.consumer, 200, handler_ms, workers, mode.tracer, wrap=mode.wrap)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            mode = modes[name]
            helper0 = mode.helper_cpu_s() if mode.helper_cpu_s is not None else 0.0
            took, cpu = _produce(mode.producer, clients.rmq, clients.topic, messages, f"r{r}", window)
            results[name]["produce"].append(messages / took)
            results[name]["produce_cpu_us"].append(cpu / messages * 1e6)
            parts: dict[str, float] = {}
            took, cpu = _consume(clients.consumer, messages, handler_ms, workers, mode.tracer, parts, mode.wrap)
            results[name]["consume"].append(messages / took)
            results[name]["cpu_us"].append(cpu / messages * 1e6)
            for k, v in parts.items():
                results[name][k].append(v)
            for m in modes.values():
                if m.provider is not None:
                    m.provider.force_flush()
            if mode.helper_cpu_s is not None:  # this round's messages, sent and consumed, exported
                results[name]["helper_cpu_us"].append((mode.helper_cpu_s() - helper0) / messages * 1e6)
        if progress is not None:
            progress(r + 1, rounds)
    return results


def _summarize(results: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Per-round ratios of each traced mode to the same round's untraced run, and their medians."""

    def ratios(mode: str, kind: str) -> list[float]:
        return [t / u for t, u in zip(results[mode][kind], results["untraced"][kind])]

    return {
        "traced_over_untraced": statistics.median(ratios("traced", "consume")),
        "consume_ratios": ratios("traced", "consume"),
        "otlp_over_untraced": statistics.median(ratios("traced_otlp", "consume")),
        "otlp_consume_ratios": ratios("traced_otlp", "consume"),
        "produce_traced_over_untraced": statistics.median(ratios("traced", "produce")),
        "produce_ratios": ratios("traced", "produce"),
        "produce_otlp_over_untraced": statistics.median(ratios("traced_otlp", "produce")),
        "produce_cpu_traced_over_untraced": statistics.median(ratios("traced", "produce_cpu_us")),
        "cpu_traced_over_untraced": statistics.median(ratios("traced", "cpu_us")),
        "cpu_otlp_over_untraced": statistics.median(ratios("traced_otlp", "cpu_us")),
        "compact_over_untraced": statistics.median(ratios("traced_compact", "consume")),
        "compact_consume_ratios": ratios("traced_compact", "consume"),
        "cpu_compact_over_untraced": statistics.median(ratios("traced_compact", "cpu_us")),
        "child_over_untraced": statistics.median(ratios("traced_child", "consume")),
        "child_consume_ratios": ratios("traced_child", "consume"),
        "produce_child_over_untraced": statistics.median(ratios("traced_child", "produce")),
        "produce_child_ratios": ratios("traced_child", "produce"),
        "cpu_child_over_untraced": statistics.median(ratios("traced_child", "cpu_us")),
        # the export child's own CPU a message (its send and consumer spans), beside this process's
        "child_process_cpu_us": statistics.median(results["traced_child"]["helper_cpu_us"] or [0.0]),
        "produce_cpu_child_over_untraced": statistics.median(ratios("traced_child", "produce_cpu_us")),
        "keep_over_untraced": statistics.median(ratios("traced_keep", "consume")),
        "keep_consume_ratios": ratios("traced_keep", "consume"),
        "produce_keep_over_untraced": statistics.median(ratios("traced_keep", "produce")),
        "produce_keep_ratios": ratios("traced_keep", "produce"),
        "cpu_keep_over_untraced": statistics.median(ratios("traced_keep", "cpu_us")),
        "produce_cpu_keep_over_untraced": statistics.median(ratios("traced_keep", "produce_cpu_us")),
        "contrib_over_untraced": statistics.median(ratios("contrib", "consume")),
        "contrib_consume_ratios": ratios("contrib", "consume"),
        "produce_contrib_over_untraced": statistics.median(ratios("contrib", "produce")),
        "cpu_contrib_over_untraced": statistics.median(ratios("contrib", "cpu_us")),
        "produce_cpu_contrib_over_untraced": statistics.median(ratios("contrib", "produce_cpu_us")),
        # rmqtrace against the fair baseline (a contrib-style span per message), same round
        "traced_over_contrib": statistics.median(
            [t / c for t, c in zip(results["traced"]["consume"], results["contrib"]["consume"])]),
        "compact_over_contrib": statistics.median(
            [t / c for t, c in zip(results["traced_compact"]["consume"], results["contrib"]["consume"])]),
        "keep_over_contrib": statistics.median(
            [t / c for t, c in zip(results["traced_keep"]["consume"], results["contrib"]["consume"])]),
        "produce_traced_over_contrib": statistics.median(
            [t / c for t, c in zip(results["traced"]["produce"], results["contrib"]["produce"])]),
        # µs of CPU per consumed message by thread role (median over rounds), see ROLES
        "cpu_breakdown_us": {m: {part: statistics.median(d[part]) for part in PARTS} for m, d in results.items()},
        "msgs_per_s": {m: {k: statistics.median(d[k]) for k in ("produce", "produce_cpu_us", "consume", "cpu_us")}
                       for m, d in results.items()},
        "per_round": results,
    }


def run_broker_bench(messages: int = DEFAULT_MESSAGES, handler_ms: float = 1.0, *, rounds: int = DEFAULT_ROUNDS,
                     workers: int = 8, window: int = 64, endpoint: str = ENDPOINT,
                     progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Traced vs untraced produce and consume throughput on the real broker (see the module doc)."""
    clients = open_clients(_client(), endpoint)
    encoder = EncodeOnlyExporter()
    modes = {"untraced": Mode(clients.producer, None, None),
             "traced": traced_mode(clients, DropExporter()),
             "traced_otlp": traced_mode(clients, encoder),
             "traced_compact": traced_mode(clients, DropExporter(), "compact"),
             "traced_child": child_mode(clients),
             "traced_keep": keep_mode(clients),
             "contrib": contrib_mode(clients)}
    load_before = loadavg()
    try:
        results = _run_rounds(clients, modes, messages=messages, rounds=rounds, handler_ms=handler_ms,
                              workers=workers, window=window, progress=progress)
    finally:
        clients.consumer.shutdown()
        clients.producer.shutdown()
        for mode in modes.values():
            if mode.provider is not None:
                mode.provider.shutdown()
    return {
        **_summarize(results),
        "messages_per_round": messages,
        "rounds": rounds,
        "handler_ms": handler_ms,
        "workers": workers,
        "send_window": window,
        "spans_encoded": encoder.spans,
        "otlp_bytes_per_span": encoder.bytes / encoder.spans if encoder.spans else 0.0,
        "target": TARGET,
        "loadavg": {"before": load_before, "after": loadavg()},
        "client": client_version(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
    }






def format_broker_bench(result: dict[str, Any]) -> str:
    m = result["msgs_per_s"]
    met = "met" if result["traced_over_untraced"] >= result["target"] else "NOT met"
    return "\n".join([
        f"real broker, {result['messages_per_round']} messages per mode x {result['rounds']} rounds, "
        f"{result['workers']} workers, {result['handler_ms']:g} ms handler ({result['client']})",
        "consume = receive + handle + ack, msg/s:",
        f"  untraced {m['untraced']['consume']:7.0f}   traced {m['traced']['consume']:7.0f}   "
        f"traced + OTLP encoding {m['traced_otlp']['consume']:7.0f}",
        f"  traced/untraced = {result['traced_over_untraced']:.3f} (target >= {result['target']}: {met});  "
        f"traced + OTLP encoding/untraced = {result['otlp_over_untraced']:.3f}",
        f"produce = send_async, {result['send_window']} in flight, msg/s:",
        f"  untraced {m['untraced']['produce']:7.0f}   traced {m['traced']['produce']:7.0f}   "
        f"traced + OTLP encoding {m['traced_otlp']['produce']:7.0f}",
        f"  traced/untraced = {result['produce_traced_over_untraced']:.3f};  "
        f"traced + OTLP encoding/untraced = {result['produce_otlp_over_untraced']:.3f}",
        f"  producer CPU per send, µs: untraced {m['untraced']['produce_cpu_us']:5.0f}   "
        f"traced {m['traced']['produce_cpu_us']:5.0f}   (traced/untraced = {result['produce_cpu_traced_over_untraced']:.3f})",
        "  per round, produce traced/untraced: " + ", ".join(f"{r:.2f}" for r in result["produce_ratios"]),
        "consumer CPU per message (all threads of the process), µs:",
        f"  untraced {m['untraced']['cpu_us']:7.0f}   traced {m['traced']['cpu_us']:7.0f}   "
        f"traced + OTLP encoding {m['traced_otlp']['cpu_us']:7.0f}   (traced/untraced = "
        f"{result['cpu_traced_over_untraced']:.3f}; + OTLP = {result['cpu_otlp_over_untraced']:.3f})",
        f"load average before/after: {result.get('loadavg', {}).get('before')} / {result.get('loadavg', {}).get('after')}",
        f"1 % head sampling + keep policy: consume {m['traced_keep']['consume']:.0f} msg/s = "
        f"{result['keep_over_untraced']:.3f} of untraced, produce {result['produce_keep_over_untraced']:.3f}, "
        f"CPU per consumed message {result['cpu_keep_over_untraced']:.3f}, "
        f"per send {result['produce_cpu_keep_over_untraced']:.3f}",
        f"contrib-style (a send and a process span per message, no rmqtrace): consume "
        f"{result['contrib_over_untraced']:.3f} of untraced, produce {result['produce_contrib_over_untraced']:.3f}; "
        f"rmqtrace traced/contrib = {result['traced_over_contrib']:.3f}, compact/contrib = "
        f"{result['compact_over_contrib']:.3f}, keep/contrib = {result['keep_over_contrib']:.3f}",
        f"full trace exported by a child process (RMQTRACE_EXPORT_CHILD=true): consume "
        f"{m['traced_child']['consume']:.0f} msg/s = {result['child_over_untraced']:.3f} of untraced, produce "
        f"{result['produce_child_over_untraced']:.3f} (target >= {result['target']} for both), CPU of this process "
        f"per consumed message {result['cpu_child_over_untraced']:.3f}; the child's own CPU "
        f"{result['child_process_cpu_us']:.0f} µs a message",
        f"compact trace (RMQTRACE_TRACE_SHAPE=compact): consume {m['traced_compact']['consume']:.0f} msg/s = "
        f"{result['compact_over_untraced']:.3f} of untraced, CPU per consumed message "
        f"{result['cpu_compact_over_untraced']:.3f}",
        "consumer CPU per message by thread, µs (median over rounds): " + "; ".join(
            f"{mode} " + ", ".join(f"{k} {v:.0f}" for k, v in parts.items())
            for mode, parts in result["cpu_breakdown_us"].items()),
        "per round, consume traced/untraced: " + ", ".join(f"{r:.3f}" for r in result["consume_ratios"])
        + ";  + OTLP: " + ", ".join(f"{r:.3f}" for r in result["otlp_consume_ratios"])
        + ";  keep: " + ", ".join(f"{r:.3f}" for r in result["keep_consume_ratios"]),
    ])


def run_cli(args: argparse.Namespace, console: Any = None) -> int:
    """``rmqtrace bench broker``: reuses the bench parser's ``--messages``, ``--rounds``, ``--json``
    (their defaults there are the overhead bench's, so those defaults mean this bench's own)."""
    messages = getattr(args, "messages", None)
    rounds = getattr(args, "rounds", None)
    result = run_broker_bench(messages=DEFAULT_MESSAGES if messages in (None, 30_000) else messages,
                              rounds=DEFAULT_ROUNDS if rounds in (None, 7) else rounds)
    if getattr(args, "json", False):
        print(json.dumps(result))
    else:
        print(format_broker_bench(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracer.tools.bench.broker", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=DEFAULT_MESSAGES, help="messages per round and mode")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="untraced/traced round pairs")
    p.add_argument("--handler-ms", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    result = run_broker_bench(messages=a.messages, handler_ms=a.handler_ms, rounds=a.rounds, workers=a.workers)
    print(json.dumps(result) if a.json else format_broker_bench(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
