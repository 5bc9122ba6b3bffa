"""``rmqtrace probe``: send a probe message every few seconds, so every rmqtrace-wrapped consumer
of the topic shows the wait a new message would meet inside it right now (``rmqtrace_probe_*``).

``--embedded`` runs the whole thing in one process for a look: an embedded broker, the probe
sender and a consume loop whose handler counts its calls (it is never called for a probe).

``--prometheus URL`` (a Prometheus scraping the broker's own exporter) prints, before the first
probe and after the last, what waits for each consumer group of the topic on the broker: the ready
backlog and the age of its oldest message, so a probe that is slow because of a backlog says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from typing import Any, Callable

from ..argtypes import interval, port, whole_at_least
from ..report.broker_side import prometheus_url

__all__ = ["PROG", "add_cli", "cmd_probe"]

PROG = "rmqtrace probe"
DEFAULT_TOPIC = "rmqtrace-probe"
DEFAULT_ENDPOINT = "127.0.0.1:8081"


def _fail(message: str, code: int = 2) -> int:
    """One line on stderr; 2 for a bad argument, 1 for a failure of the run (docs/commands.md)."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def _cannot_send(args: argparse.Namespace, what: str, exc: BaseException) -> int:
    """The run failed at its start: say whether the broker is down or the topic missing (the
    client says "failed to fetch topic:T route." for both), exit 1."""
    from ..clients.route import TopicRouteError, check_route, route_hint

    if isinstance(exc, TopicRouteError):
        return _fail(str(exc), 1)
    try:
        trouble = check_route(args.endpoint, args.topic)
    except Exception:  # noqa: BLE001 - the client's own words below
        trouble = None
    if trouble is not None:
        return _fail(route_hint(args.endpoint, args.topic, trouble), 1)
    return _fail(f"--endpoint {args.endpoint}: {what} topic {args.topic!r} ({' '.join(str(exc).split())[:200]})", 1)






def _topic(text: str) -> str:
    # RocketMQ's topic rule: letters, digits, '%', '|', '-' and '_', at most 127 characters
    if not text or len(text) > 127 or not all(c.isascii() and (c.isalnum() or c in "%|-_") for c in text):
        raise argparse.ArgumentTypeError(f"not a RocketMQ topic name: {text!r}")
    return text


def _endpoint(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT of a RocketMQ 5 proxy, got {text!r}")
    return text




def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``probe`` on the ``rmqtrace`` parser's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "probe", help="send a probe message every N seconds: the wait inside every traced consumer, always on",
        description="Send a small marked message to a topic every --interval seconds. Every rmqtrace-wrapped "
                    "consumer of the topic acks it without calling its handler and records its gaps as "
                    "rmqtrace_probe_* series: the wait a new message would meet inside that consumer now, "
                    "even at zero traffic. A probe does not measure the handler's own time.")
    p.add_argument("--topic", type=_topic, default=DEFAULT_TOPIC,
                   help=f"topic the consumers subscribe to (default {DEFAULT_TOPIC})")
    p.add_argument("--interval", type=interval, default=10.0, metavar="SECONDS",
                   help="seconds between probes (default 10)")
    p.add_argument("--count", type=whole_at_least(1), default=None, help="send this many probes, then stop (default: until "
                                                               "Ctrl-C or SIGTERM)")
    p.add_argument("--endpoint", type=_endpoint, default=os.environ.get("RMQ_ENDPOINT", DEFAULT_ENDPOINT),
                   metavar="HOST:PORT", help=f"RocketMQ 5 proxy (default $RMQ_ENDPOINT or {DEFAULT_ENDPOINT})")
    p.add_argument("--tag", default=None, help="message tag, when the consumers subscribe with a tag filter")
    p.add_argument("--metrics-port", type=port, default=None, metavar="PORT",
                   help="serve the sender's /metrics (rmqtrace_probe_sent_total, ..._last_sent_timestamp_seconds)")
    p.add_argument("--prometheus", type=prometheus_url, default=None, metavar="URL",
                   help="a Prometheus scraping the broker's exporter: print the broker's ready backlog and its "
                        "age for the topic's consumer groups before the first probe and after the last")
    p.add_argument("--group", action="append", default=None, metavar="G",
                   help="with --prometheus: only this consumer group (repeatable; default every group of the topic)")
    p.add_argument("--embedded", action="store_true",
                   help="demo in one process: embedded broker, probe sender and a traced consume loop")
    p.set_defaults(func=cmd_probe)
    return p


def cmd_probe(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from ..config import Settings, serve_metrics
    from ..telemetry.probe_metrics import ProbeMetrics

    if args.group and not args.prometheus:
        return _fail("--group needs --prometheus")
    if args.prometheus and args.embedded:
        return _fail("--prometheus reads a real broker's exporter; it does not apply to --embedded")
    if args.prometheus and not _print_backlog(args, "before the first probe"):
        return 2
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    if args.metrics_port is not None:
        try:
            settings = dataclasses.replace(Settings.from_env(), metrics_port=args.metrics_port)
            serve_metrics(settings, registry)
        except (OSError, ValueError) as exc:
            reason = "in use" if getattr(exc, "errno", None) in (98, 48, 10048) else str(exc)
            return _fail(f"--metrics-port {args.metrics_port}: {reason}")
    if args.embedded:
        return _embedded(args, registry, metrics)
    return _real(args, metrics)


def _until_signal(stop: Callable[[], None]) -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop())


def _real(args: argparse.Namespace, metrics: Any) -> int:
    from ..clients.probe import ProbeSender

    try:
        from ..clients.quiet import import_quietly

        rocketmq = import_quietly()
    except ImportError:
        return _fail("the RocketMQ 5.x client is not installed (pip install 'rmqtrace[rocketmq]')", 1)
    try:
        producer = rocketmq.Producer(rocketmq.ClientConfiguration(args.endpoint, rocketmq.Credentials()), (args.topic,))
        producer.startup()
    except Exception as exc:  # noqa: BLE001 - the client raises plain Exceptions for an unreachable proxy
        return _cannot_send(args, "could not start a producer for", exc)
    sender = ProbeSender(producer, args.topic, rocketmq.Message, interval=args.interval, tag=args.tag, metrics=metrics)
    _until_signal(sender.stop)
    print(f"{PROG}: a probe to {args.topic!r} every {args.interval:g} s via {args.endpoint}"
          + (f", {args.count} in all" if args.count else "; Ctrl-C stops"), flush=True)
    try:
        sender.run(args.count, check_first=True)
    except Exception as exc:  # noqa: BLE001 - the first probe failed: wrong endpoint or topic
        return _cannot_send(args, "cannot send a probe to", exc)
    finally:
        producer.shutdown()
    print(f"{sender.sent} probes sent, {sender.failed} failed")
    if args.prometheus and not _print_backlog(args, "after the last probe"):
        return 2
    return 0 if sender.sent else 1


def _print_backlog(args: argparse.Namespace, when: str) -> bool:
    """The broker's backlog for the probed topic's groups; False (after one error line) when
    Prometheus cannot be asked."""
    from ..report.broker_side import PrometheusError, fetch_backlog

    try:
        backlog = fetch_backlog(args.prometheus, [args.topic], args.group)
    except PrometheusError as exc:
        _fail(f"--prometheus {exc}")
        return False
    if not backlog:
        which = f" for group {', '.join(args.group)}" if args.group else ""
        print(f"broker side ({when}): no rocketmq_consumer_* series for topic {args.topic!r}{which} in "
              f"{args.prometheus} (is the broker's exporter scraped? a group shows once a consumer connected)",
              flush=True)
        return True
    print(f"broker side ({when}, {args.prometheus}):", flush=True)
    for b in backlog:
        print(f"  {b.describe()}", flush=True)
    return True


def _embedded(args: argparse.Namespace, registry: Any, metrics: Any) -> int:
    from ..clients.consume import ConsumeLoop
    from ..clients.probe import ProbeSender
    from ..embedded import EmbeddedBroker, FilterExpression, Message, Producer, SimpleConsumer
    from ..telemetry.metrics import TracerMetrics
    from ..telemetry.tracer import MessageTracer

    group = "probe-demo"
    broker = EmbeddedBroker()
    producer = Producer(broker, [args.topic])
    producer.startup()
    consumer = SimpleConsumer(broker, group, {args.topic: FilterExpression()}, await_duration=0.05)
    consumer.startup()
    calls = 0

    def handler(message: Any) -> None:  # the user's handler: a probe never reaches it
        nonlocal calls
        calls += 1

    tracer = MessageTracer(consumer_group=group, metrics=TracerMetrics(registry))
    loop = ConsumeLoop(consumer, handler, tracer=tracer, workers=2)
    runner = threading.Thread(target=loop.run, name="rmqtrace-probe-demo", daemon=True)
    runner.start()
    sender = ProbeSender(producer, args.topic, Message, interval=args.interval, metrics=metrics)
    stop = threading.Event()
    _until_signal(stop.set)
    count = args.count or 5
    print(f"{PROG} --embedded: {count} probes to {args.topic!r}, one every {args.interval:g} s, "
          f"consumer group {group!r} (a consume loop, 2 workers)")
    acked = 0
    try:
        for i in range(1, count + 1):
            if stop.is_set() or not sender.send_one():
                break
            if not loop.wait(_acked_at_least(i), timeout=10):
                return _fail(f"probe {i} was not acked within 10 s", 1)
            acked = i
            reading = metrics.latest().get((args.topic, group))
            if reading is not None:
                g = reading.gaps
                print(f"  probe {i}: consumer_wait {_ms(g, 'consumer_wait')} (client_buffer {_ms(g, 'client_buffer')}"
                      f" + dispatch_wait {_ms(g, 'dispatch_wait')}), broker_wait {_ms(g, 'broker_wait')}, "
                      f"send {_ms(g, 'send')}, end_to_end {_ms(g, 'end_to_end')}")
            if i < count:
                stop.wait(args.interval)  # real-time: the demo paces its probes like the real sender
    finally:
        loop.stop(timeout=5)
        runner.join(5)
    print(f"{acked} probes acked, handler called {calls} times; series: rmqtrace_probe_stage_duration_seconds, "
          "rmqtrace_probe_last_seen_timestamp_seconds, ...")
    return 0


def _acked_at_least(n: int) -> Callable[[Any], bool]:
    return lambda stats: bool(stats.acked >= n)


def _ms(gaps: dict[str, float], name: str) -> str:
    v = gaps.get(name)
    return "-" if v is None else f"{v * 1000:.2f} ms"
