"""``rmqtrace``: the demo, the benchmarks and reports.

Every argument is checked before any work starts: a bad one gives one line on stderr and exit
status 2 (:class:`Parser`), so a typo never costs a run or overwrites the last output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Sequence

if TYPE_CHECKING:
    from ..config import Settings
    from .demo import PolicyRun

from ..argtypes import path, port, positive_number, probability, whole_at_least
from ..environ import environment

__all__ = ["Parser", "build_parser", "main"]

DESCRIPTION = """\
Find the hidden latency in Apache RocketMQ pipelines.

Every message is stamped at produce, broker store, client pull, dispatch enqueue, handler start
and handler end; the gaps between them become OpenTelemetry spans and Prometheus histograms.
"""
COMMANDS = "demo, report, bench or probe"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``PROG: error: WHAT (see PROG --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _fail(prog: str, message: str) -> int:
    """A bad argument found after parsing (a busy port, an unwritable folder): same form, status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


# -- argument types (the numeric ones are in argtypes) ---------------------------------------
def _policies(text: str) -> tuple[str, ...]:
    from ..dispatch import POLICY_NAMES

    names = tuple(p.strip() for p in text.split(",") if p.strip())
    known = ", ".join(POLICY_NAMES)
    if not names:
        raise argparse.ArgumentTypeError(f"give at least one policy: {known}")
    for name in names:
        if name not in POLICY_NAMES:
            raise argparse.ArgumentTypeError(f"unknown policy {name!r} (choose from {known})")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{', '.join(twice)} given twice (one run per policy)")
    return names


def _console(stderr: bool = False) -> Any:
    """The human output; on stderr when stdout carries the one ``--json`` document."""
    from rich.console import Console
    return Console(stderr=stderr, highlight=False)


def _progress(console: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


# -- demo ------------------------------------------------------------------------------------
DEMO_PROG = "rmqtrace demo"


def add_demo_arguments(d: argparse.ArgumentParser) -> None:
    """Every ``rmqtrace demo`` option, each with the type that checks it."""
    d.add_argument("--groups", type=whole_at_least(1), default=500,
                   help="test-case groups in the job, one message each (default 500)")
    d.add_argument("--workers", type=whole_at_least(1), default=8, help="handler workers (default 8)")
    d.add_argument("--case-ms", type=positive_number, default=10.0, metavar="MS",
                   help="milliseconds one test case takes (default 10)")
    d.add_argument("--buffer", type=whole_at_least(0), default=10, metavar="K",
                   help="round_robin and random only: waiting slots per worker; each message is dealt to one worker "
                        "and waits in its buffer even while others idle. 0: no slot, the next message blocks until "
                        "its own worker is free (still head-of-line). aggressive and cost_aware ignore it (default 10)")
    d.add_argument("--policies", type=_policies, default=("round_robin", "aggressive", "cost_aware"),
                   metavar="LIST", help="comma-separated, each once: round_robin, random, aggressive, cost_aware "
                                        "(default round_robin,aggressive,cost_aware)")
    d.add_argument("--seed", type=whole_at_least(0), default=7, help="seed of the job's size distribution (default 7)")
    d.add_argument("--order", choices=("arrival", "longest_first"), default="arrival",
                   help="the order the producer sends the job in (TracedProducer.send_job): arrival, as the job "
                        "came (the incident's), or longest_first (default arrival)")
    d.add_argument("--consumers", type=whole_at_least(1), default=1, metavar="C",
                   help="C > 1: the job over C consumers of one group (each --workers workers), prefetching "
                        "vs demand-driven, per consumer (default 1: the policies on one consumer)")
    d.add_argument("--metrics-port", type=port, default=None, metavar="PORT",
                   help="serve Prometheus /metrics on this port during the run (default: not served; "
                        "$RMQTRACE_METRICS_PORT also works)")
    d.add_argument("--out", default=environment().get("RMQTRACE_OUT") or "rmqtrace-out", metavar="DIR", type=path,
                   help="output folder (default $RMQTRACE_OUT or rmqtrace-out)")
    d.add_argument("--json", action="store_true",
                   help="print the per-policy summary as one JSON document on stdout; tables and progress go to stderr")
    d.add_argument("--trace-sampling", type=probability, default=None, metavar="P",
                   help="keep traces by the in-process keep policy: producers sample nothing; failures, slow "
                        "messages and each job's critical path are kept, other messages with probability P")


def demo_settings(args: argparse.Namespace, out: Path) -> Settings:
    """The environment's settings, with the demo's span file and ``--metrics-port``."""
    from ..config import Settings

    settings = Settings.from_env(default_service_name="rmqtrace")  # the service `rmqtrace report` reads
    if not settings.otlp_endpoint and not settings.spans_file and settings.traces_exporter is None:
        settings = dataclasses.replace(settings, spans_file=str(out / "spans.jsonl"))
    if args.metrics_port is not None:
        settings = dataclasses.replace(settings, metrics_port=args.metrics_port)
    return settings


def _writable(out: Path) -> str | None:
    """Why ``out`` cannot hold the demo's files, or None."""
    probe = out / ".rmqtrace-write-check"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _serve(settings: Settings, registry: Any) -> tuple[Any, str | None]:
    """The /metrics server, or why it could not start (a port in use, an address not ours)."""
    from ..config import serve_metrics

    try:
        return serve_metrics(settings, registry), None
    except OSError as exc:
        reason = "in use" if exc.errno in (98, 48, 10048) else (exc.strerror or str(exc))  # EADDRINUSE
        return None, f"--metrics-port {settings.metrics_port} on {settings.metrics_addr}: {reason}"


def run_demo_job(args: argparse.Namespace, settings: Settings, registry: Any, console: Any) -> list[PolicyRun]:
    """Every policy's run, spans flushed, ``summary.json`` written."""
    from ..config import DropCounter, configure_tracing
    from ..telemetry.metrics import TracerMetrics
    from .demo import DemoOptions, run_demo, summary_json

    metrics = TracerMetrics(registry)
    if settings.spans_file == str(Path(args.out) / "spans.jsonl"):
        Path(settings.spans_file).unlink(missing_ok=True)  # the demo's own file holds this run's spans only
    provider = configure_tracing(settings, set_global=False, drops=DropCounter(), metrics=metrics)
    opts = DemoOptions(groups=args.groups, workers=args.workers, case_ms=args.case_ms, buffer=args.buffer,
                       policies=args.policies, seed=args.seed, trace_sampling=args.trace_sampling,
                       order=getattr(args, "order", "arrival"))
    console.print(f"[bold]rmqtrace demo[/]: {opts.groups} test-case groups, {opts.workers} workers, "
                  f"1 case = {opts.case_ms:g} ms, embedded broker, job sent {_order_words(opts.order)}")
    with _progress(console) as progress:
        runs = run_demo(opts, tracer_provider=provider, registry=registry, progress=progress, metrics=metrics)
    if provider is not None:
        provider.force_flush()
    summary_json(runs, Path(args.out) / "summary.json")
    return runs


def policy_table(runs: Sequence[PolicyRun]) -> Any:
    """Job time against the lower bound, and the headline: the share spent waiting in the consumer."""
    from ..path.stages import HEADLINE_GAP
    from ..report.terminal import titled_table

    table = titled_table("Job completion per policy (LB = lower bound)")
    # Short headers, unwrapped names: the table fits an 80-column terminal (and a pipe's default).
    for col in ("policy", "job time", "LB", "× LB", "busy", HEADLINE_GAP.name, "failed"):
        table.add_column(col, justify="right" if col != "policy" else "left", no_wrap=True)
    for r in runs:
        table.add_row(r.policy, f"{r.makespan_s:.2f} s", f"{r.lower_bound_s:.2f} s", f"{r.over_lb:.2f}",
                      f"{r.occupancy():.0%}", f"{r.share(HEADLINE_GAP.name):.0%}", str(r.failed))
    return table


def gap_table(runs: Sequence[PolicyRun]) -> Any:
    """Percentiles of every gap, the headline first, one row per gap and policy (fits 80 columns),
    in the report's units (µs, ms, s)."""
    from rich import box

    from ..path.stages import GAPS, HEADLINE_GAP
    from ..report.terminal import titled_table
    from ..report.text import format_seconds

    # No vertical rules: with the report's units (up to "655.6 ms") the table still fits 80 columns.
    gaps = titled_table("Stage gaps (share = of all end-to-end time)", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("gap", "policy", "p50", "p95", "p99", "max", "share"):
        gaps.add_column(col, justify="left" if col in ("gap", "policy") else "right", no_wrap=True)
    for g in (HEADLINE_GAP, *(g for g in GAPS if g is not HEADLINE_GAP)):
        for i, r in enumerate(runs):
            share = f"{r.share(g.name):.0%}" if g.name != "end_to_end" else ""
            gaps.add_row(g.name if i == 0 else "", r.policy,
                         *[format_seconds(r.percentile(g.name, q)) for q in (.5, .95, .99, 1.0)], share,
                         end_section=i == len(runs) - 1)
    return gaps


POLICY_TABLE_KEY = ("× LB = job time / LB: 1.00 is as fast as any schedule can be. busy = the workers' time "
                    "in handlers, total handler time / (workers × job time).")
FIX = 'ConsumeLoop(consumer, handler, policy="aggressive")'
PUSH_FIX = "tracer.clients.demandpush.DemandPushConsumer"
BASELINES = ("round_robin", "random")


def spans_went(settings: Settings) -> str:
    """Where the spans went when no span file was written (OTLP, or another exporter), and the
    command that reads them back."""
    import urllib.parse

    exporters = (settings.traces_exporter or "otlp").split(",")
    if exporters == ["none"]:
        return "spans: not written (OTEL_TRACES_EXPORTER=none); no report.html"
    service = settings.service_name or "rmqtrace"
    if "otlp" not in exporters:
        return f"spans: to the {', '.join(exporters)} exporter as service {service!r}; no report.html"
    grpc = settings.otlp_protocol == "grpc"
    # the SDK's defaults when no endpoint is set (OTLP/gRPC 4317, OTLP/HTTP 4318)
    endpoint = settings.otlp_endpoint or ("http://localhost:4317" if grpc else "http://localhost:4318")
    host = urllib.parse.urlsplit(endpoint if "//" in endpoint else f"//{endpoint}").hostname or "localhost"
    return (f"spans: sent over OTLP ({settings.otlp_protocol}) to {endpoint} as service {service!r}, no report.html; "
            f"read them back from Jaeger: rmqtrace report --jaeger http://{host}:16686 --service {service} --html report.html")


def next_step(runs: Sequence[PolicyRun], *, report_written: bool = True) -> str:
    """The closing line: which run is the incident, the fix, where to read more (report.html only
    when this run wrote it)."""
    from ..path.stages import HEADLINE_GAP
    from ..report.text import NEAR_LOWER_BOUND

    more = "read more: README \"The dispatcher\", docs/dispatch.md" + (", and report.html" if report_written else "")
    fix = (f"the fix in your consumer is {FIX}: every worker holds at most one message and whichever is free "
           f"takes the next (a PushConsumer: {PUSH_FIX}, same constructor)")
    incident = max((r for r in runs if r.policy in BASELINES), key=lambda r: r.over_lb, default=None)
    if incident is None:
        return (f"none of these runs is the incident (round_robin: a buffer per worker); run --policies "
                f"round_robin,aggressive to see it next to the fix, {FIX}; {more}.")
    numbers = f"{HEADLINE_GAP.name} {incident.share(HEADLINE_GAP.name):.0%}, {incident.over_lb:.2f}× LB"
    if incident.over_lb < NEAR_LOWER_BOUND:
        return (f"{incident.policy} is the incident's dispatch, but in this job its wait did not make the job longer "
                f"({numbers}): the longest message set the pace. With many groups (the default 500) it does; "
                f"{fix}; {more}.")
    return (f"{incident.policy} is the incident: each worker's own buffer held messages behind a long one "
            f"({numbers}); {fix}; {more}.")


def _order_words(order: str) -> str:
    from ..report.text import sent_order_words
    return sent_order_words(order)


def sent_line(runs: Sequence[PolicyRun]) -> str:
    """Which order the job was sent in, as the consumers read it back from the messages."""
    orders = {r.sent_order for r in runs}
    said = _order_words(next(iter(orders))) if len(orders) == 1 else "differently per policy"
    hint = ("" if orders != {"arrival"} else
            "; --order longest_first sends it longest first (TracedProducer.send_job)")
    return f"The job was sent {said} (read back from each message's rmqtrace_order){hint}."


def print_results(console: Any, runs: Sequence[PolicyRun]) -> None:
    from ..report.terminal import hanging
    from .demo import blame_line, keep_line, where_time_went

    console.print(policy_table(runs))
    hanging(console, " ", [POLICY_TABLE_KEY, sent_line(runs)])
    console.print(gap_table(runs))
    console.print("[bold]Where the time went[/]")
    hanging(console, "  •", [where_time_went(r) for r in runs])
    blamed = [line for line in (blame_line(r) for r in runs) if line]
    if blamed:
        hanging(console, "  •", blamed)
    kept = [line for line in (keep_line(r) for r in runs) if line]
    if kept:
        console.print("[bold]Traces kept[/]")
        hanging(console, "  •", kept)


def cmd_demo(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    out = Path(args.out)
    try:
        settings = demo_settings(args, out)
    except ValueError as exc:  # a malformed RMQTRACE_* / OTEL_* variable
        return _fail(DEMO_PROG, f"settings from the environment: {exc}")
    registry = CollectorRegistry()
    server, why = _serve(settings, registry)
    if why:
        return _fail(DEMO_PROG, why)
    why = _writable(out)
    if why:
        return _fail(DEMO_PROG, f"--out {out}: cannot write there ({why})")
    console = _console(stderr=args.json)
    if server is not None:
        console.print(f"serving /metrics on http://{settings.metrics_addr}:{settings.metrics_port}/metrics")
    try:
        if args.consumers > 1:
            from .fleetdemo import cli_fleet_demo
            return cli_fleet_demo(args, settings, registry, console, _progress(console))
        runs = run_demo_job(args, settings, registry, console)
    except KeyboardInterrupt:
        left = f"{settings.spans_file} holds only the messages finished so far" if settings.spans_file else \
            "spans sent so far were exported"
        print(f"{DEMO_PROG}: interrupted; {left} (a partial run: no summary.json or report.html was written "
              "by it)", file=sys.stderr)
        return 130
    print_results(console, runs)
    if settings.spans_file:
        console.print(f"spans: {settings.spans_file}")
    report = _maybe_report(out, settings.spans_file)
    if report:
        console.print(f"report: open {report}")
    else:  # an earlier run's page would be taken for this one's
        (out / "report.html").unlink(missing_ok=True)
        console.print(spans_went(settings))
    console.print(f"summary: {out / 'summary.json'}")
    from ..report.terminal import hanging
    hanging(console, "[bold]Next:[/]", [next_step(runs, report_written=report is not None)])
    if args.json:
        print(json.dumps([r.as_dict() for r in runs]))
    return 0


def _maybe_report(out: Path, spans_file: str | None) -> str | None:
    if not spans_file:
        return None
    try:
        from ..report import write_demo_report
    except ImportError:
        return None
    return str(write_demo_report(Path(spans_file), out))


# -- bench -----------------------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> int:
    if args.which is None:
        names = list(args.benchmarks)
        Parser(prog="rmqtrace bench").error(f"give a benchmark: {', '.join(names[:-1])} or {names[-1]}")
    if args.which in ("broker", "fleet"):
        if args.which == "broker":
            from .bench.broker import run_cli
        else:
            from .bench.fleet import run_cli
        from .bench import rmq_admin

        try:
            rmq_admin(args.which)  # before any progress line: the checkout's topic admin is there
            return run_cli(args)
        except (RuntimeError, OSError, ImportError) as exc:  # no checkout, client or broker: one line
            print(f"rmqtrace bench {args.which}: {exc}", file=sys.stderr)
            return 1
    if args.which == "report":
        from .bench.report import run_cli as run_report_cli
        return run_report_cli(args)
    console = _console()
    if args.which == "overhead":
        from .bench.overhead import format_overhead_bench, run_overhead_bench
        if args.json:
            result = run_overhead_bench(messages=args.messages, rounds=args.rounds, runs=args.runs or 3)
            print(json.dumps(result))
        else:
            with _progress(console) as progress:
                task = progress.add_task("overhead rounds", total=args.rounds * (args.runs or 3))
                result = run_overhead_bench(messages=args.messages, rounds=args.rounds, runs=args.runs or 3,
                                            progress=lambda done, total: progress.update(task, completed=done))
            console.print(format_overhead_bench(result))
        return 0
    from .bench.dispatch import format_dispatch_bench, run_dispatch_bench
    if args.json:
        print(json.dumps(run_dispatch_bench(seeds=args.seeds, quick=args.quick)))
        return 0
    with _progress(console) as progress:
        task = progress.add_task("dispatch runs", total=None)
        result = run_dispatch_bench(seeds=args.seeds, quick=args.quick,
                                    progress=lambda done, total: progress.update(task, completed=done, total=total))
    console.print(format_dispatch_bench(result))
    return 0


# -- parser ----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from ..version import __version__

    p = Parser(prog="rmqtrace", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"rmqtrace {__version__}")
    # Not required=True: argparse would then report a missing COMMAND before an unknown flag.
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("demo", help="reproduce the long-tail incident on an embedded broker and compare policies",
                       description="Run one job of test-case groups (long-tailed sizes) through the embedded broker "
                                   "under each dispatch policy and show where the time went. Needs no Java, no Go, "
                                   "no network. Spans go to OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, otherwise "
                                   "to DIR/spans.jsonl (--out).")
    add_demo_arguments(d)
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="benchmarks behind BENCHMARKS.md (ratios against a baseline in the same run)")
    # nargs="?": a missing benchmark gets our sentence (cmd_bench), not argparse's "required: which".
    which = b.add_argument("which", nargs="?", metavar="BENCHMARK", choices=["overhead", "dispatch", "broker", "fleet",
                                                                                 "report"],
                   help="overhead: tracing cost per message vs one SDK span; dispatch: policies vs lower bound and "
                        "the dispatcher vs ThreadPoolExecutor; broker: traced vs untraced throughput on the local "
                        "RocketMQ (services/rocketmq/rmq.sh start); fleet: one long-tailed job over 3 consumer "
                        "processes on the local RocketMQ, push consumer vs prefetch vs demand-driven; report: "
                        "reading 10^4/10^5 messages from a span file and from Jaeger (report --fleet)")
    b.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    b.add_argument("--messages", type=whole_at_least(1), default=30_000,
                   help="overhead: messages per loop in all (default 30000)")
    b.add_argument("--rounds", type=whole_at_least(1), default=7, help="overhead: interleaved rounds (default 7)")
    b.add_argument("--runs", type=whole_at_least(1), default=None,
                   help="overhead: runs, each of --rounds interleaved rounds; ratios are the runs' median (default 3); "
                        "fleet: runs per mode (default 3; 5 with --orders)")
    b.add_argument("--seeds", type=whole_at_least(1), default=5, help="dispatch: job seeds (default 5)")
    b.add_argument("--quick", action="store_true", help="dispatch, fleet: smaller runs for CI")
    b.add_argument("--orders", action="store_true",
                   help="fleet: the job sent in arrival order vs longest first (true costs, and costs learned from "
                        "an earlier run with ±30%% noise), demand-driven loop and push replacement")
    b.add_argument("--topic", choices=("priority", "normal"), default="priority",
                   help="fleet --orders: where the longest-first jobs go: a PRIORITY topic with send_job's priorities "
                        "(the broker keeps the order sent; RocketMQ 5.5) or a normal topic (default %(default)s)")
    b.add_argument("--sizes", default="10000,100000", help="report: messages per size, comma-separated")
    b.add_argument("--jaeger", default="http://127.0.0.1:16686", help="report: Jaeger query HTTP URL")
    b.add_argument("--jaeger-grpc", metavar="HOST:PORT", help="report: Jaeger api_v3 gRPC (default: --jaeger host:16685)")
    b.add_argument("--otlp", default="http://127.0.0.1:4318", help="report: OTLP HTTP endpoint the spans are loaded through")
    b.add_argument("--http-max", type=whole_at_least(1), default=10_000,
                   help="report: time the /api/traces baseline up to this size (default 10000)")
    b.set_defaults(func=cmd_bench, benchmarks=tuple(which.choices or ()))

    from ..report import add_cli as add_report_cli

    add_report_cli(sub)
    from .probe import add_cli as add_probe_cli

    add_probe_cli(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command they were given to
        prog = f"{parser.prog} {args.command}" if args.command else parser.prog
        Parser(prog=prog).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.error(f"give a command: {COMMANDS}")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
