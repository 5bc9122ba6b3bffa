"""``rmqtrace``: the demo, the benchmarks and reports."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

DESCRIPTION = """\
Find the hidden latency in Apache RocketMQ pipelines.

Every message is stamped at produce, broker store, client pull, dispatch enqueue, handler start
and handler end; the gaps between them become OpenTelemetry spans and Prometheus histograms.
"""


def _console() -> Any:
    from rich.console import Console
    return Console(stderr=False, highlight=False)


def _progress(console: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


# -- demo ------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry
    from rich.table import Table

    from ..config import DropCounter, Settings, configure_tracing, serve_metrics
    from .demo import DemoOptions, run_demo, summary_json, where_time_went
    from ..telemetry.metrics import TracerMetrics
    from ..path.stages import GAPS

    console = _console()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = Settings.from_env()
    spans_file = out / "spans.jsonl"
    if not settings.otlp_endpoint and not settings.spans_file:
        spans_file.unlink(missing_ok=True)
        settings = Settings(**{**settings.__dict__, "spans_file": str(spans_file)})
    if args.metrics_port is not None:
        settings = Settings(**{**settings.__dict__, "metrics_port": args.metrics_port})
    registry = CollectorRegistry()
    drops = DropCounter()
    metrics = TracerMetrics(registry)
    provider = configure_tracing(settings, set_global=False, drops=drops, metrics=metrics)
    server = serve_metrics(settings, registry)
    if server is not None:
        console.print(f"serving /metrics on http://{settings.metrics_addr}:{settings.metrics_port}/metrics")
    opts = DemoOptions(groups=args.groups, workers=args.workers, case_ms=args.case_ms, buffer=args.buffer,
                       policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()), seed=args.seed)
    console.print(f"[bold]rmqtrace demo[/]: {opts.groups} test-case groups, {opts.workers} workers, "
                  f"1 case = {opts.case_ms:g} ms, embedded broker")
    with _progress(console) as progress:
        runs = run_demo(opts, tracer_provider=provider, registry=registry, progress=progress, metrics=metrics)
    if provider is not None:
        provider.force_flush()
    summary_json(runs, out / "summary.json")

    table = Table(title="Job completion per dispatch policy")
    for col in ("policy", "job time", "lower bound", "× LB", "workers busy", "failed"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for r in runs:
        table.add_row(r.policy, f"{r.makespan_s:.2f} s", f"{r.lower_bound_s:.2f} s",
                      f"{r.makespan_s / r.lower_bound_s:.2f}", f"{r.occupancy():.0%}", str(r.failed))
    console.print(table)
    gaps = Table(title="Stage gaps in seconds (share = of all end-to-end time)")
    for col in ("gap", "policy", "p50", "p95", "p99", "max", "share"):
        gaps.add_column(col, justify="left" if col in ("gap", "policy") else "right")
    for g in GAPS:
        for i, r in enumerate(runs):
            share = f"{r.share(g.name):.0%}" if g.name != "end_to_end" else ""
            gaps.add_row(g.name if i == 0 else "", r.policy,
                         *[f"{r.percentile(g.name, q):.3f}" for q in (.5, .95, .99, 1.0)], share,
                         end_section=i == len(runs) - 1)
    console.print(gaps)
    console.print("[bold]Where the time went[/]")
    for r in runs:
        console.print(f"  • {where_time_went(r)}")
    if settings.spans_file:
        console.print(f"spans: {settings.spans_file}")
    report = _maybe_report(out, settings.spans_file)
    if report:
        console.print(f"report: open {report}")
    console.print(f"summary: {out / 'summary.json'}")
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
    if args.which == "broker":
        from .bench.broker import run_cli
        return run_cli(args)
    console = _console()
    if args.which == "overhead":
        from .bench.overhead import format_overhead_bench, run_overhead_bench
        if args.json:
            result = run_overhead_bench(messages=args.messages, rounds=args.rounds)
            print(json.dumps(result))
        else:
            with _progress(console) as progress:
                task = progress.add_task("overhead rounds", total=args.rounds)
                result = run_overhead_bench(messages=args.messages, rounds=args.rounds,
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

    p = argparse.ArgumentParser(prog="rmqtrace", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"rmqtrace {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("demo", help="reproduce the long-tail incident on an embedded broker and compare policies",
                       description="Run one job of test-case groups (long-tailed sizes) through the embedded broker "
                                   "under each dispatch policy and show where the time went. Needs no Java, no Go, "
                                   "no network. Spans go to OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, otherwise "
                                   "to OUT/spans.jsonl.")
    d.add_argument("--groups", type=int, default=500, help="test-case groups in the job, one message each (default 500)")
    d.add_argument("--workers", type=int, default=8, help="handler workers (default 8)")
    d.add_argument("--case-ms", type=float, default=10.0, help="milliseconds one test case takes (default 10)")
    d.add_argument("--buffer", type=int, default=10, help="per-worker buffer of the baseline policies (default 10)")
    d.add_argument("--policies", default="round_robin,aggressive,cost_aware",
                   help="comma-separated: round_robin, random, aggressive, cost_aware")
    d.add_argument("--seed", type=int, default=7, help="seed of the job's size distribution")
    d.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port during the run")
    d.add_argument("--out", default=os.environ.get("RMQTRACE_OUT", "rmqtrace-out"), help="output folder (default rmqtrace-out)")
    d.add_argument("--json", action="store_true", help="also print the per-policy summary as JSON")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="benchmarks behind BENCHMARKS.md (ratios against a baseline in the same run)")
    b.add_argument("which", choices=["overhead", "dispatch", "broker"],
                   help="overhead: tracing cost per message vs one SDK span; dispatch: policies vs lower bound and "
                        "the dispatcher vs ThreadPoolExecutor; broker: traced vs untraced throughput on the local "
                        "RocketMQ (services/rocketmq/rmq.sh start)")
    b.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    b.add_argument("--messages", type=int, default=30_000, help="overhead: messages per loop in all (default 30000)")
    b.add_argument("--rounds", type=int, default=7, help="overhead: interleaved rounds (default 7)")
    b.add_argument("--seeds", type=int, default=5, help="dispatch: job seeds (default 5)")
    b.add_argument("--quick", action="store_true", help="dispatch: smaller runs for CI")
    b.set_defaults(func=cmd_bench)

    from ..report import add_cli as add_report_cli

    add_report_cli(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
