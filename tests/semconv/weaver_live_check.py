"""Run OpenTelemetry's weaver ``registry live-check`` on rmqtrace's real telemetry.

    python tests/semconv/weaver_live_check.py [--weaver PATH] [--registry DIR] [--out DIR] [--json] [--run control]
    make weaver-check

Starts weaver's OTLP gRPC receiver, points rmqtrace's exporters at it and reads weaver's JSON report:

1. ``python -m tracer demo`` (the CLI, spans over OTLP as a user's run sends them:
   ``OTEL_EXPORTER_OTLP_ENDPOINT``, protocol ``grpc``), in both trace shapes (``full``, ``compact``);
2. in this process, the demo again and the traced 5.x wrappers on the embedded broker (send, receive,
   process with a success, a nack and a failure whose exception is an event on the ``handler`` span,
   the ack and nack settle spans; the same through a ``ConsumeLoop``: tests/semconv_runs.py), with
   an OTLP span exporter and an OTLP metric exporter, so the OTel metrics (``messaging.*`` and
   ours) are checked too.

``--run control`` sends instead one SDK span weaver must flag (``exception.escaped``, item 13's
violation, and a mistyped attribute), so a report read wrongly cannot pass silently.

Exit 0 when weaver finds no violation outside the ``rmqtrace.*`` names (ours are not in the
registry by design: weaver reports each as ``missing_attribute``), 1 when it finds one or the run
fails, 2 for a bad argument (no weaver binary, no registry).

weaver: ``--weaver``, else ``$WEAVER``, else the newest ``.cache/bin/weaver-*``. No package registry
reachable here ships it (docs/semconv.md): it is built from its source repository, which a fresh
machine cannot fetch. The registry: ``--registry``, else ``$WEAVER_REGISTRY``, else
``.cache/semconv-<version>/model`` with the version of rmqtrace's schema URL (the
semantic-conventions repository's ``model`` folder at that tag).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OURS = "rmqtrace."
LEVELS = ("violation", "improvement", "information")

__all__ = ["Report", "find_registry", "find_weaver", "live_check", "main", "read_report"]


def find_weaver(given: str | None = None) -> Path | None:
    """The weaver binary: the one given, ``$WEAVER``, or the newest ``.cache/bin/weaver-*``."""
    named = given or os.environ.get("WEAVER")
    if named:
        return Path(named)
    found = sorted((p for p in (REPO / ".cache" / "bin").glob("weaver-*") if p.is_file() and os.access(p, os.X_OK)),
                   key=lambda p: _version(p.name))  # not a build's stamp or log beside it
    return found[-1] if found else None


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in name.removeprefix("weaver-").split("."))


def schema_version() -> str:
    sys.path.insert(0, str(REPO))
    from tracer.path.names import SCHEMA_URL

    return SCHEMA_URL.rsplit("/", 1)[-1]


def find_registry(given: str | None = None) -> Path:
    """The semantic-conventions model folder of the version rmqtrace declares."""
    named = given or os.environ.get("WEAVER_REGISTRY")
    return Path(named) if named else REPO / ".cache" / f"semconv-{schema_version()}" / "model"


@dataclass
class Report:
    """What weaver's JSON report says, counted."""

    weaver: str
    registry: str
    levels: dict[str, int]  # every advice, by level
    ours: dict[str, int]  # violations on rmqtrace.* names, by message
    violations: dict[str, int]  # every other violation, by message
    signals: dict[str, int]  # entities weaver saw, by type (span, span_event, metric, ...)
    names: list[str] = field(default_factory=list)  # span and metric names seen

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("weaver", "registry", "levels", "ours", "violations", "signals", "names")}


def _advice(node: Any) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """Every advice in a sample, with the attribute key or signal name it is about."""
    if isinstance(node, dict):
        result = node.get("live_check_result")
        if isinstance(result, dict):
            for a in result.get("all_advice") or []:
                yield node.get("name"), a
        for v in node.values():
            yield from _advice(v)
    elif isinstance(node, list):
        for v in node:
            yield from _advice(v)


def _names(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        for kind in ("span", "metric"):
            sample = node.get(kind)
            if isinstance(sample, dict) and isinstance(sample.get("name"), str):
                out.add(f"{kind} {sample['name']}")
        for v in node.values():
            _names(v, out)
    elif isinstance(node, list):
        for v in node:
            _names(v, out)


def read_report(path: Path, weaver: str = "", registry: str = "") -> Report:
    doc = json.loads(path.read_text())
    levels: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    others: Counter[str] = Counter()
    for sample in doc.get("samples") or []:
        for name, a in _advice(sample):
            levels[a.get("level") or "?"] += 1
            if a.get("level") != "violation":
                continue
            key = (a.get("context") or {}).get("attribute_key") or (a.get("context") or {}).get("metric_name") or name
            (ours if str(key).startswith(OURS) else others)[str(a.get("message"))] += 1
    names: set[str] = set()
    _names(doc.get("samples"), names)
    stats = doc.get("statistics") or {}
    return Report(weaver, registry, dict(levels), dict(ours), dict(others),
                  dict(stats.get("total_entities_by_type") or {}), sorted(names))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _NotListening(RuntimeError):
    """weaver exited before it listened (e.g. a port taken between our probe and its bind)."""


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Until weaver's receiver takes connections (it loads the registry first: seconds)."""
    for _ in range(600):
        if proc.poll() is not None:
            raise _NotListening(f"weaver exited with {proc.returncode} before listening: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            try:
                proc.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
    raise RuntimeError(f"weaver did not listen on {port} in 5 minutes: {log.read_text()[-2000:]}")


def _start(weaver: Path, registry: Path, report_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    """weaver listening: the process, its OTLP gRPC port and its admin port (three tries at free ports)."""
    for attempt in range(3):
        port, admin = _free_port(), _free_port()
        cmd = [str(weaver), "registry", "live-check", "-r", str(registry), "--input-source", "otlp",
               "--otlp-grpc-address", "127.0.0.1", "--otlp-grpc-port", str(port), "--admin-port", str(admin),
               "--inactivity-timeout", "600", "--format", "json", "-o", str(report_dir), "--fail-on", "none"]
        with log.open("wb") as sink:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
        try:
            _wait_listening(proc, port, log)
            return proc, port, admin
        except _NotListening:
            if attempt == 2:
                raise
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    raise AssertionError("unreachable")


def _cli_demo(endpoint: str, out: Path, shape: str) -> None:
    # the caller's OTEL_* (a traces endpoint of its own would win over ours) stay out
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_TRACES_EXPORTER": "otlp", "RMQTRACE_TRACE_SHAPE": shape,
                "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})
    run = subprocess.run([sys.executable, "-m", "tracer", "demo", "--groups", "30", "--workers", "3", "--case-ms",
                          "0.5", "--policies", "round_robin,aggressive", "--seed", "3", "--out", str(out), "--json"],
                         env=env, capture_output=True, text=True, cwd=REPO)
    if run.returncode:
        raise RuntimeError(f"rmqtrace demo failed ({run.returncode}): {run.stderr[-2000:]}")


def _in_process(endpoint: str) -> None:
    """The demo and the wrappers, spans and OTel metrics over OTLP gRPC."""
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from semconv_runs import consume_loop, demo, wrappers

    from tracer.telemetry import tracercore
    from tracer.telemetry.otel_metrics import MessagingMeters

    resource = Resource.create({"service.name": "rmqtrace-live-check"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    # one export at shutdown: the interval only has to outlast the run
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint, insecure=True),
                                           export_interval_millis=3_600_000)
    meters = MeterProvider(resource=resource, metric_readers=[reader])
    # every MessageTracer built from here on records into it
    tracercore.GLOBAL_METERS = MessagingMeters(meters)  # type: ignore[attr-defined]
    try:
        demo(provider)
        wrappers(provider)
        consume_loop(provider)
    finally:
        provider.shutdown()
        meters.shutdown()


def _control(endpoint: str) -> None:
    """A span weaver must flag: the SDK's ``record_exception`` writes ``exception.escaped`` (deprecated in
    1.44; issue 31 item 13), and ``messaging.batch.message_count`` of the wrong type."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    with provider.get_tracer("control").start_as_current_span(
            "control", attributes={"messaging.batch.message_count": "3", "rmqtrace.own": 1}) as span:
        span.record_exception(ValueError("x"))
    provider.shutdown()


def _control_run(endpoint: str, _out: Path) -> None:
    _control(endpoint)


def _rmqtrace(endpoint: str, out: Path) -> None:
    for shape in ("full", "compact"):
        _cli_demo(endpoint, out / f"demo-{shape}", shape)
    _in_process(endpoint)


RUNS: dict[str, Callable[[str, Path], None]] = {"rmqtrace": _rmqtrace, "control": _control_run}


def live_check(weaver: Path, registry: Path, out: Path, run: str = "rmqtrace") -> Report:
    log, report_dir = out / "weaver.log", out / "report"
    version = subprocess.run([str(weaver), "--version"], capture_output=True, text=True).stdout.strip()
    proc, port, admin = _start(weaver, registry, report_dir, log)
    try:
        RUNS[run](f"http://127.0.0.1:{port}", out)
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{admin}/stop", method="POST"), timeout=60)
        if proc.wait(300):
            raise RuntimeError(f"weaver exited with {proc.returncode}: {log.read_text()[-2000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return read_report(report_dir / "live_check.json", version, str(registry))


def _summary(r: Report) -> str:
    lines = [f"{r.weaver}, registry {r.registry}",
             "advice by level: " + ", ".join(f"{k} {r.levels.get(k, 0)}" for k in LEVELS),
             "entities: " + ", ".join(f"{k} {v}" for k, v in sorted(r.signals.items())),
             f"violations on rmqtrace.* names (ours, not in the registry by design): {sum(r.ours.values())}",
             f"violations outside rmqtrace.*: {sum(r.violations.values())}"]
    lines += [f"  {n} x {m}" for m, n in sorted(r.violations.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weaver", help="weaver binary (default $WEAVER, else the newest .cache/bin/weaver-*)")
    parser.add_argument("--registry", help="semantic-conventions model folder (default $WEAVER_REGISTRY, else "
                                           ".cache/semconv-<schema version>/model)")
    parser.add_argument("--out", help="folder for weaver's report and log (default: a new temporary folder)")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--run", choices=sorted(RUNS), default="rmqtrace",
                        help="what to send: rmqtrace's telemetry (default), or a control span weaver must flag")
    args = parser.parse_args(argv)
    weaver, registry = find_weaver(args.weaver), find_registry(args.registry)
    if weaver is None or not os.access(weaver, os.X_OK):
        print(f"weaver-check: no weaver binary ({weaver or 'set WEAVER or put one at .cache/bin/weaver-<version>'})",
              file=sys.stderr)
        return 2
    if not registry.is_dir():
        print(f"weaver-check: no semantic-conventions model at {registry} (set WEAVER_REGISTRY)", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="weaver-check-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        report = live_check(weaver, registry, out, args.run)
    except (RuntimeError, OSError) as e:
        print("weaver-check: " + " ".join(str(e).split()), file=sys.stderr)  # one line, weaver's log tail too
        return 1
    print(json.dumps(report.as_json(), indent=2) if args.json else _summary(report))
    print(f"weaver's report: {out / 'report' / 'live_check.json'}", file=sys.stderr)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
