"""A consumer process for the fault tests: ``tracer.clients.consume.ConsumeLoop`` over the real 5.x
``SimpleConsumer``, writing what happens to every message to a log the test reads afterwards.

    python consumer.py --topic T --group G --log LOG --stats STATS [options]

Every line of LOG is ``KIND SEQ ATTEMPT MESSAGE_ID PID`` and is written with one ``write`` and an
``fsync`` (it survives SIGKILL of this process, and a crash of the machine):

* ``S`` the handler started, ``D`` it returned, ``F`` it raised (an injected failure);
* ``A`` the broker accepted the ack (written after ``ack`` returned).

``SEQ`` is the message body (the test's own sequence number). The first line is ``READY - - - PID``
once the consumer is started and its settings are on the broker. SIGTERM or SIGINT stop the loop
gracefully (in-flight work drains and is acked); ``--max-seconds`` stops it on its own. At exit the
loop's statistics and the span counts go to STATS as JSON.

Tracing (``--trace``) is set up exactly as an application would: ``Settings.from_env()`` (so the
test points ``OTEL_EXPORTER_OTLP_ENDPOINT`` wherever it likes), ``configure_tracing`` with a
:class:`~tracer.config.DropCounter` bound to ``rmqtrace_spans_dropped_total``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor
from prometheus_client import CollectorRegistry

from tracer.clients.consume import ConsumeLoop
from tracer.config import DropCounter, Settings, configure_tracing
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer


class Log:
    """Append-only, one fsynced write per line."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.lock = threading.Lock()

    def write(self, kind: str, msg: Any = None) -> None:
        if msg is None:
            line = f"{kind} - - - {os.getpid()}\n"
        else:
            line = f"{kind} {seq_of(msg)} {msg.delivery_attempt} {msg.message_id} {os.getpid()}\n"
        with self.lock:
            os.write(self.fd, line.encode())
            os.fsync(self.fd)


def seq_of(msg: Any) -> int:
    try:
        return int(bytes(msg.body))
    except (TypeError, ValueError):
        return -1


class RecordingConsumer:
    """The real consumer, with every accepted ack written to the log."""

    def __init__(self, consumer: Any, log: Log) -> None:
        self.consumer = consumer
        self.log = log

    def receive(self, max_message_num: int, invisible_duration: float) -> Any:
        return self.consumer.receive(max_message_num, invisible_duration)

    def ack(self, msg: Any) -> None:
        self.consumer.ack(msg)
        self.log.write("A", msg)

    def change_invisible_duration(self, msg: Any, seconds: float) -> None:
        self.consumer.change_invisible_duration(msg, seconds)

    def __getattr__(self, name: str) -> Any:  # route_manager, on_new_endpoints: the loop's resync
        return getattr(self.consumer, name)


class CountSpans(SpanProcessor):
    """Counts sampled spans as they end: what a perfect backend would have received."""

    def __init__(self) -> None:
        self.ended = 0
        self.operations = 0  # of them, the loop's receive (and settle) operation spans
        self.lock = threading.Lock()

    def on_end(self, span: Any) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            operation = (span.attributes or {}).get("messaging.operation.type") in ("receive", "settle")
            with self.lock:
                self.ended += 1
                self.operations += operation


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", default="127.0.0.1:8081")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--invisible", type=float, default=5.0)
    ap.add_argument("--work-ms", type=float, default=10.0, help="the handler's simulated work")
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--fail-every", type=int, default=0, help="seq %% N == 0 raises on its first attempt")
    ap.add_argument("--slow-every", type=int, default=0, help="seq %% N == 0 overruns on its first attempt")
    ap.add_argument("--slow-ms", type=float, default=1500.0)
    ap.add_argument("--handler-timeout", type=float, default=None)
    ap.add_argument("--trace", action="store_true", help="tracing and metrics on, set up from OTEL_* variables")
    ap.add_argument("--start-file", help="once ready, wait for this file before consuming (a start barrier)")
    args = ap.parse_args(argv)

    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    log = Log(args.log)
    tracer = provider = counter = drops = metrics = None
    if args.trace:
        drops = DropCounter()
        provider = configure_tracing(Settings.from_env(), set_global=False, drops=drops)
        counter = CountSpans()
        assert provider is not None
        provider.add_span_processor(counter)
        metrics = TracerMetrics(CollectorRegistry())
        drops.bind(metrics.spans_dropped)
        tracer = MessageTracer(consumer_group=args.group, tracer_provider=provider, metrics=metrics)

    span = {"first_start": 0.0, "last_done": 0.0}  # monotonic: how long handling took

    def handler(msg: Any) -> None:
        seq, attempt = seq_of(msg), msg.delivery_attempt or 1
        if not span["first_start"]:
            span["first_start"] = time.monotonic()
        log.write("S", msg)
        if args.fail_every and seq % args.fail_every == 0 and attempt == 1:
            log.write("F", msg)
            raise RuntimeError(f"injected failure of message {seq}")
        slow = args.slow_every and seq % args.slow_every == 0 and attempt == 1
        time.sleep((args.slow_ms if slow else args.work_ms) / 1000)  # real-time: the handler's simulated work
        log.write("D", msg)
        span["last_done"] = time.monotonic()

    cfg = ClientConfiguration(args.endpoint, Credentials())
    raw = SimpleConsumer(cfg, args.group, {args.topic: FilterExpression()}, await_duration=1, tls_enable=False)
    raw.startup()
    # startup() does not wait for the proxy's answer to the client's settings; a receive before it fails
    if not raw._init_settings_event.wait(15):
        print("consumer settings were not acknowledged within 15 s", file=sys.stderr)
    loop = ConsumeLoop(RecordingConsumer(raw, log), handler, tracer=tracer, workers=args.workers,
                       invisible_duration=args.invisible, handler_timeout=args.handler_timeout)
    loop.install_signal_handlers()
    timer = threading.Timer(args.max_seconds, loop.stop)
    timer.daemon = True
    timer.start()
    alive: list[int] = []  # dispatcher worker threads alive, sampled while the loop runs
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.05) and not loop.stopping:
            alive.append(loop.dispatcher.statistics().live_workers)

    threading.Thread(target=sample, daemon=True).start()
    log.write("READY")
    if args.start_file:
        deadline = time.monotonic() + args.max_seconds
        while not os.path.exists(args.start_file) and time.monotonic() < deadline:
            time.sleep(0.01)  # real-time: polling the start barrier
    t0 = time.monotonic()
    stats = loop.run()
    ran = time.monotonic() - t0
    sampling.set()
    out: dict[str, Any] = {"pid": os.getpid(), "ran_s": ran, "held_after_run": loop.state().held,
                           "workers_alive_min": min(alive, default=0), "workers": args.workers,
                           "handling_s": max(0.0, span["last_done"] - span["first_start"]),
                           **dataclasses.asdict(stats)}
    if provider is not None:
        assert drops is not None and counter is not None and metrics is not None
        out["spans_ended"] = counter.ended
        out["operation_spans"] = counter.operations
        out["spans_dropped_before_shutdown"] = drops.dropped
        t1 = time.monotonic()
        provider.shutdown()
        out["tracing_shutdown_s"] = time.monotonic() - t1
        out["spans_dropped"] = drops.dropped
        out["spans_dropped_metric"] = metrics.registry.get_sample_value("rmqtrace_spans_dropped_total")
        out["propagation_errors"] = {k: v for k, v in tracer.errors.counts.items() if v} if tracer else {}
    raw.shutdown()
    with open(args.stats + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(args.stats + ".tmp", args.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
