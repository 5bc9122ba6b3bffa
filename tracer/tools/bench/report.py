"""Reading traces at fleet scale: ``report`` over a span file, ``report --fleet`` over a real Jaeger.

Per size N (default 10⁴ and 10⁵ messages) the bench writes one long job of N messages through
the real :class:`~tracer.telemetry.tracer.MessageTracer` (N messages produced as fast as the
tracer writes them, handled on a set clock by 3 instances × 4 workers, each instance its own
``service.instance.id``; a ``send`` span and the
consumer's ``process`` span with its four stage spans per message, as the tracer writes them) into
a JSON-lines file and, over OTLP HTTP, into Jaeger under a service name of its own, waits until
Jaeger holds all N traces, then times, each in a fresh child process:

- ``file``: ``rmqtrace report FILE --json`` itself (read the file, build the report, JSON);
- ``jaeger``: what ``rmqtrace report --jaeger URL --fleet --json`` does (read, views, JSON) on its
  default read path (api_v3 gRPC, streamed OTLP protobuf), over the job's own time window;
- ``jaeger_http`` (the baseline, sizes up to ``--http-max``): the same over ``/api/traces``, the
  path ``report --fleet`` used before.

A child imports everything first, then runs the work once; ``seconds`` is that run's wall time,
``peak_mib`` the child's peak resident set (``VmHWM``, Linux; ``ru_maxrss`` elsewhere: the whole
interpreter, imports included) and ``base_mib`` that peak before the work. ``--runs`` repeats every timing
(fresh children) for the spread. The ``--fleet`` answers of the two read paths are compared
(they must be identical). Loading 10⁵ traces into a shared Jaeger whose memory store keeps
100 000 evicts everyone else's: point ``--jaeger``/``--otlp``/``--jaeger-grpc`` at a Jaeger of
your own for the large size (BENCHMARKS.md says how).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from . import loadavg

__all__ = ["LoadedJob", "format_report_bench", "load_job", "main", "run_cli", "run_report_bench"]

DEFAULT_SIZES = (10_000, 100_000)
DEFAULT_JAEGER = "http://127.0.0.1:16686"
DEFAULT_OTLP = "http://127.0.0.1:4318"
INSTANCES, WORKERS = 3, 4
TARGETS = {"jaeger_seconds_1e5": 60.0, "jaeger_peak_mib": 200.0, "file_messages_per_s": 20_000.0}


@dataclass(frozen=True)
class LoadedJob:
    """One generated job: its span file, its service in Jaeger and the window its spans lie in."""

    messages: int
    spans_file: Path
    service: str
    start_s: float
    end_s: float


class _Collect:
    """A span exporter that keeps what it is given (the loader hands batches on itself)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class _Schedule:
    """A long-tailed job handed out round-robin over the instances, each instance's first free
    worker taking the next message: (instance, worker, pull, handler start, handler end)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.free = [[0] * WORKERS for _ in range(INSTANCES)]
        self.i = 0

    def next(self, produce_ns: int) -> tuple[int, int, int, int, int]:
        rng, inst = self.rng, self.i % INSTANCES
        self.i += 1
        pull = produce_ns + rng.randint(200_000, 2_000_000)
        free = self.free[inst]
        w = min(range(WORKERS), key=free.__getitem__)
        start = max(pull + 20_000, free[w])
        end = start + rng.choice((1, 1, 1, 2, 2, 3, 5, 8, 40)) * 1_000_000 + rng.randint(0, 999_999)
        free[w] = end
        return inst, w, pull, start, end


def load_job(n: int, *, otlp: str | None, directory: Path, seed: int = 7, batch: int = 500) -> LoadedJob:
    """Write ``n`` messages' spans through the real tracer into ``directory``/spans.jsonl and,
    when ``otlp`` is given, to Jaeger (OTLP HTTP ``otlp``/v1/traces) under a fresh service name."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from ...path.clock import MonoNs, WallNs
    from ...path.message import MessageInfo
    from ...path.stages import Outcome, Stage
    from ...telemetry.spanfile import JsonLinesSpanExporter
    from ...telemetry.tracer import MessageTracer

    class Clock:
        t = 0

        def wall_ns(self) -> WallNs:
            return WallNs(self.t)

        def monotonic_ns(self) -> MonoNs:
            return MonoNs(self.t)

    service = f"rmqtrace-bench-report-{uuid.uuid4().hex[:8]}"
    directory.mkdir(parents=True, exist_ok=True)
    spans_file = directory / "spans.jsonl"
    spans_file.unlink(missing_ok=True)
    file_out = JsonLinesSpanExporter(spans_file)
    jaeger_out = OTLPSpanExporter(endpoint=f"{otlp.rstrip('/')}/v1/traces", timeout=60) if otlp else None
    collect = _Collect()
    clock = Clock()

    def provider(instance: str) -> TracerProvider:
        p = TracerProvider(resource=Resource.create({"service.name": service, "service.instance.id": instance}))
        p.add_span_processor(SimpleSpanProcessor(collect))  # type: ignore[arg-type]
        return p

    producer = MessageTracer(tracer_provider=provider("bench-producer"), clock=clock)
    consumers = [MessageTracer(consumer_group="bench-report", tracer_provider=provider(f"bench-{k}"), clock=clock)
                 for k in range(INSTANCES)]
    # Produce times are the wall clock's: the SDK starts the send span on it, and a trace whose
    # spans lay far apart would match many windows of the fleet reader's split search.
    schedule = _Schedule(seed)
    first_ns, last_ns = time.time_ns(), 0

    def flush() -> None:
        if not collect.spans:
            return
        file_out.export(collect.spans)
        if jaeger_out is not None:
            from opentelemetry.sdk.trace.export import SpanExportResult
            if jaeger_out.export(collect.spans) is not SpanExportResult.SUCCESS:
                raise RuntimeError(f"OTLP export to {otlp} failed")
        collect.spans.clear()

    for i in range(n):
        props: dict[str, str] = {}
        key = f"bench-{i:06d}"
        produce = clock.t = time.time_ns()
        inst, worker, pull, start, end = schedule.next(produce)
        last_ns = max(last_ns, end)
        producer.start_send("bench-report", props.__setitem__, keys=[key], job_id="job-1").end(f"ID-{key}")
        info = MessageInfo(topic="bench-report", message_id=f"ID-{key}", keys=(key,), properties=props,
                           store_ms=(produce + 100_000) // 1_000_000, delivery_attempt=1)
        clock.t = pull
        trace = consumers[inst].start_message(info, pull)
        trace.mark(Stage.DISPATCH_ENQUEUE, pull + 10_000)
        trace.worker = worker
        clock.t = start
        with trace.handler_scope():
            clock.t = end
        trace.finish(Outcome.SUCCESS)
        if (i + 1) % batch == 0:
            flush()
    flush()
    file_out.shutdown()
    return LoadedJob(n, spans_file, service, first_ns / 1e9 - 1.0, last_ns / 1e9 + 1.0)


def wait_in_jaeger(job: LoadedJob, grpc_target: str, *, timeout: float = 300.0) -> int:
    """Seconds until Jaeger's store answers all of the job's traces (counted over api_v3)."""
    from ...report.sources import find_traces_v3

    t0 = time.monotonic()
    while True:
        got = sum(1 for _ in find_traces_v3(grpc_target, job.service, int(job.start_s * 1e9), int(job.end_s * 1e9),
                                            depth=min(job.messages + 1, 100_000), raw=True, timeout=120))
        if got >= job.messages:
            return got
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"Jaeger holds {got} of {job.messages} traces of {job.service} after {timeout:g} s")
        time.sleep(1.0)


# -- the timed children ----------------------------------------------------------------------
def _peak_rss_kib() -> int:
    """This process's peak resident set: ``VmHWM``, which starts afresh at exec. (Linux's
    ``ru_maxrss`` keeps the parent's at fork+exec: a child of a 130 MiB bench started at 130.)"""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # elsewhere: the best there is


def _child_work(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """Runs in the child: import, note the resident set, do the work once, time it."""
    # the report command from its own pieces (tracer.report.cli), not the whole `rmqtrace` parser:
    # tools/cli.py imports this module, so importing it back made the package's one import cycle
    from ...report import add_cli as add_report_cli
    from ...report import fleet, fleetread, fleetview, model, sources, spanread  # noqa: F401 - before the clock
    from ...report.fleetread import read_jaeger_fleet

    parser = argparse.ArgumentParser(prog="rmqtrace")
    add_report_cli(parser.add_subparsers(dest="command"))  # the command's imports, before the clock starts

    base_kib = _peak_rss_kib()
    t0 = time.perf_counter()
    if kind == "file":  # the command itself, its JSON caught
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            args = parser.parse_args(["report", params["path"], "--json"])
            code = int(args.func(args) or 0)
        if code != 0:
            raise RuntimeError(f"rmqtrace report {params['path']} --json exited {code}")
        text = out.getvalue()
        messages = json.loads(text)["messages"]
        answer: Any = None
    else:
        collector = read_jaeger_fleet(params["jaeger"], params["service"], start_s=params["start_s"],
                                      end_s=params["end_s"], api=params["api"], grpc_target=params.get("grpc"),
                                      timeout=600)
        jobs = collector.job_views()
        answer = [j.as_dict() for j in jobs]
        text = json.dumps({"traces": collector.traces, "jobs": answer})
        messages = sum(j.messages for j in jobs)
    seconds = time.perf_counter() - t0
    peak_kib = _peak_rss_kib()
    return {"seconds": seconds, "messages": messages, "peak_mib": peak_kib / 1024, "base_mib": base_kib / 1024,
            "answer": answer, "bytes_out": len(text)}


def _child_main() -> None:
    kind, params = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(_child_work(kind, params)))


def _timed_child(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    code = "from tracer.tools.bench.report import _child_main; _child_main()"
    done = subprocess.run([sys.executable, "-c", code, kind, json.dumps(params)], capture_output=True, text=True,
                          check=False, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"bench child {kind} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    result["messages_per_s"] = result["messages"] / result["seconds"] if result["seconds"] else 0.0
    return result


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    secs = [r["seconds"] for r in runs]
    return {"seconds": statistics.median(secs), "seconds_runs": [round(s, 3) for s in secs],
            "messages": runs[0]["messages"], "messages_per_s": statistics.median(r["messages_per_s"] for r in runs),
            "peak_mib": max(r["peak_mib"] for r in runs), "base_mib": min(r["base_mib"] for r in runs)}


def run_report_bench(sizes: Sequence[int] = DEFAULT_SIZES, *, jaeger: str = DEFAULT_JAEGER, otlp: str = DEFAULT_OTLP,
                     grpc_target: str | None = None, runs: int = 2, http_max: int = 10_000,
                     directory: Path | None = None, progress: Any = None) -> dict[str, Any]:
    """Time both readers per size (see the module doc); the last size is also reported flat as
    ``file`` / ``jaeger`` / ``jaeger_http``."""
    from ...report.sources import v3_target

    if not sizes or min(sizes) < 1 or runs < 1:
        raise ValueError("sizes must be >= 1 messages and runs >= 1")
    target = v3_target(jaeger, grpc_target)
    if target is None:
        raise ValueError(f"--jaeger {jaeger} is not on port 16686: give --jaeger-grpc HOST:PORT")
    load_before = loadavg()
    by_size: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        root = directory or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rmqtrace-bench-report-")))
        for n in sizes:
            say = progress or (lambda _msg: None)
            t0 = time.perf_counter()
            job = load_job(n, otlp=otlp, directory=root / str(n))
            wait_in_jaeger(job, target)
            say(f"{n} messages written and stored in {time.perf_counter() - t0:.0f} s")
            fleet = {"jaeger": jaeger, "service": job.service, "start_s": job.start_s, "end_s": job.end_s,
                     "grpc": target}
            entry: dict[str, Any] = {"spans_file_mib": round(job.spans_file.stat().st_size / 2**20, 1)}
            answers: dict[str, Any] = {}
            for _ in range(runs):  # interleaved, so a drift of the shared machine hits all alike
                for name, kind, params in (("file", "file", {"path": str(job.spans_file)}),
                                           ("jaeger", "fleet", {**fleet, "api": "v3"}),
                                           ("jaeger_http", "fleet", {**fleet, "api": "http"})):
                    if name == "jaeger_http" and n > http_max:
                        continue
                    r = _timed_child(kind, params)
                    answers.setdefault(name, r.pop("answer"))
                    entry.setdefault(name, []).append(r)
                    say(f"{n} {name}: {r['seconds']:.2f} s, peak {r['peak_mib']:.0f} MiB")
            for name in ("file", "jaeger", "jaeger_http"):
                if name in entry:
                    entry[name] = _summary(entry[name])
            if "jaeger_http" in answers:
                entry["fleet_answers_identical"] = answers["jaeger"] == answers["jaeger_http"]
                entry["v3_speedup"] = entry["jaeger_http"]["seconds"] / entry["jaeger"]["seconds"]
            if answers["jaeger"] and answers["jaeger"][0]["messages"] != n:
                raise RuntimeError(f"the fleet read found {answers['jaeger'][0]['messages']} of {n} messages")
            by_size[str(n)] = entry
    largest = by_size[str(max(sizes))]
    return {
        **{k: largest[k] for k in ("file", "jaeger", "jaeger_http") if k in largest},
        "largest_messages": max(sizes),
        "sizes": by_size,
        "runs": runs,
        "read_path": f"api_v3 gRPC FindTraces at {target} (OTLP protobuf, streamed)",
        "memory": "peak_mib: the child process's peak resident set (VmHWM; whole interpreter, imports "
                  "included); base_mib: that peak before the work",
        "targets": TARGETS,
        "loadavg": {"before": load_before, "after": loadavg()},
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
    }


def format_report_bench(result: dict[str, Any]) -> str:
    lines = [f"reading traces: report over a span file, report --fleet over Jaeger ({result['read_path']}); "
             f"{result['runs']} run(s) each, medians; peak = the child's peak RSS"]
    for n, e in result["sizes"].items():
        f, j = e["file"], e["jaeger"]
        lines.append(f"  {int(n):>7} messages: file {f['messages_per_s']:8.0f} msg/s ({f['seconds']:.2f} s, peak "
                     f"{f['peak_mib']:.0f} MiB);  Jaeger api_v3 {j['messages_per_s']:7.0f} msg/s ({j['seconds']:.2f} s, "
                     f"peak {j['peak_mib']:.0f} MiB)")
        if "jaeger_http" in e:
            h = e["jaeger_http"]
            lines.append(f"  {'':>7}           /api/traces {h['messages_per_s']:7.0f} msg/s ({h['seconds']:.2f} s, "
                         f"peak {h['peak_mib']:.0f} MiB): api_v3 is {e['v3_speedup']:.1f}x faster; fleet answers "
                         f"identical: {e['fleet_answers_identical']}")
    lines.append(f"load average before/after: {result['loadavg']['before']} / {result['loadavg']['after']}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This bench's own options on the ``bench`` parser (``--runs``, ``--sizes``, the Jaeger ends)."""
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES),
                   help="report: messages per size, comma-separated (default 10000,100000)")
    p.add_argument("--jaeger", default=DEFAULT_JAEGER, help=f"report: Jaeger query HTTP URL (default {DEFAULT_JAEGER})")
    p.add_argument("--jaeger-grpc", default=None, metavar="HOST:PORT",
                   help="report: Jaeger api_v3 gRPC (default: the --jaeger host, port 16685)")
    p.add_argument("--otlp", default=DEFAULT_OTLP, help=f"report: OTLP HTTP endpoint to load spans (default {DEFAULT_OTLP})")
    p.add_argument("--http-max", type=int, default=10_000,
                   help="report: time the /api/traces baseline up to this size (default 10000)")


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sizes wants whole numbers >= 1, comma-separated, got {text!r}")
    return sizes


def run_cli(args: argparse.Namespace) -> int:
    try:
        sizes = _sizes(getattr(args, "sizes", "10000,100000"))
    except ValueError as exc:
        print(f"rmqtrace bench: {exc}", file=sys.stderr)
        return 2
    rounds = getattr(args, "rounds", None)
    result = run_report_bench(sizes, jaeger=args.jaeger, otlp=args.otlp, grpc_target=args.jaeger_grpc,
                              runs=2 if rounds in (None, 7) else rounds, http_max=args.http_max,
                              progress=None if args.json else (lambda m: print(m, file=sys.stderr)))
    print(json.dumps(result) if args.json else format_report_bench(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracer.tools.bench.report", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.add_argument("--rounds", type=int, default=2, help="timings per reader and size (fresh children)")
    p.add_argument("--json", action="store_true")
    return run_cli(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
