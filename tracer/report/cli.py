"""``rmqtrace report``: the terminal summary, ``--html``, ``--png`` and ``--json`` over recorded spans."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..environ import environment

if TYPE_CHECKING:
    from .model import Report
    from .records import MessageRecord

DEFAULT_SPANS = Path("rmqtrace-out") / "spans.jsonl"

DESCRIPTION = """\
Where did the time go, per message and per job?

Reads the consumer spans rmqtrace wrote — a JSON-lines file (the demo's and the embedded mode's
OUT/spans.jsonl) or a Jaeger query service — and shows, per consumer group (the demo runs one
group per dispatch policy, shown side by side):

  first lines  where the time went, one line per group led by consumer_wait (the demo's
               closing lines say the same)
  job view     completion time against the lower bound max(total handler time / workers,
               longest message), and the message that finished last with its time split
               across stages: was it waiting for a worker, or working?
  stage gaps   p50 / p95 / p99 / max of consumer_wait (the headline: waiting inside the
               consumer = client_buffer + dispatch_wait), send, broker_wait, client_buffer,
               dispatch_wait, handler and end_to_end
  slowest      the N slowest messages and their largest stage

--html writes one self-contained page (opens offline) with a per-message waterfall, a
consumer-wait heatmap and worker occupancy over time; --png a screenshot of it (needs Chromium).
"""

EPILOG = """\
examples:
  rmqtrace report                                  # rmqtrace-out/spans.jsonl (or $RMQTRACE_SPANS_FILE)
  rmqtrace report spans.jsonl --html report.html --png report.png
  rmqtrace report --jaeger http://127.0.0.1:16686 --service rmqtrace --lookback 2h
  rmqtrace report spans.jsonl --group demo-round_robin --job job-1 --top 20
  rmqtrace report spans.jsonl --json | jq '.groups[].jobs[].over_lb'
  rmqtrace report spans.jsonl --costs costs.json   # what the next run's send_job(cost=...) reads

exit status: 0 report written; 1 no spans, the source failed or --costs learned nothing; 2 bad arguments.
"""


JAEGER_DEFAULTS = {"limit": 2000, "lookback": "1h", "timeout": 30.0}  # options that only --jaeger reads


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``report`` on the ``rmqtrace`` parser's subparsers."""
    from ..argtypes import interval, path
    from .sources import DEFAULT_JAEGER, DEFAULT_SERVICE

    p: argparse.ArgumentParser = subparsers.add_parser(
        "report", help="where the time went, per message and per job: terminal, HTML, PNG or JSON",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spans", nargs="?", metavar="SPANS.jsonl", type=path,
                   help=f"JSON-lines span file (default: $RMQTRACE_SPANS_FILE or {DEFAULT_SPANS})")
    src = p.add_argument_group("reading from Jaeger instead of a file")
    src.add_argument("--jaeger", metavar="URL", nargs="?", const=DEFAULT_JAEGER,
                     help=f"Jaeger query service (HTTP API), e.g. {DEFAULT_JAEGER}")
    src.add_argument("--service", default=environment().get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE,
                     help=f"service whose traces to read (default $OTEL_SERVICE_NAME or {DEFAULT_SERVICE})")
    # Defaults applied in _check_args, so that one given with a spans file can be refused by name.
    src.add_argument("--limit", type=int, default=None, help="at most this many traces (default 2000; one per message)")
    src.add_argument("--lookback", default=None, help="how far back to search: 30m, 1h, 2d … (default 1h)")
    src.add_argument("--timeout", type=interval, default=None, metavar="SECONDS",
                     help="HTTP timeout in seconds, > 0 (default 30)")
    src.add_argument("--jaeger-grpc", metavar="HOST:PORT",
                     help="--fleet: Jaeger's api_v3 gRPC query service (default: the --jaeger host on 16685 when "
                          "--jaeger is on 16686); without it --fleet reads the slower HTTP /api/traces")
    src.add_argument("--fleet", action="store_true",
                     help="the fleet view: every trace in --lookback, paged (bounded memory), per job across "
                          "instances (service.instance.id): completion, critical path, occupancy, who held the work, "
                          "the avoidable wait and its blockers; with a spans file instead, each service is an instance")
    sel = p.add_argument_group("what to show")
    sel.add_argument("--group", metavar="G", help="only this consumer group (the demo's are demo-<policy>)")
    sel.add_argument("--job", metavar="J", help="only messages with this rmqtrace.job.id")
    sel.add_argument("--top", type=int, default=10, metavar="N", help="slowest messages to list per group (default 10)")
    sel.add_argument("--workers", type=int, default=None, metavar="N",
                     help="workers per group for the lower bound (default: distinct rmqtrace.worker values, else "
                          "the peak number of concurrent handlers)")
    out = p.add_argument_group("output")
    out.add_argument("--html", metavar="FILE", type=path, help="write the self-contained HTML report here")
    out.add_argument("--png", metavar="FILE", type=path, help="write a screenshot of the HTML report (headless Chromium)")
    out.add_argument("--json", action="store_true", help="print the report as one JSON object instead of tables")
    out.add_argument("--costs", metavar="FILE", type=path,
                     help="also write the cost table learned from these messages (median handler seconds per "
                          "message key, JSON) for TracedProducer.send_job and cost_aware (docs/dispatch.md)")
    from .broker_side import prometheus_url
    out.add_argument("--prometheus", type=prometheus_url, metavar="URL",
                     help="also print the broker's ready backlog and its age for the report's topics and groups, "
                          "from this Prometheus scraping the broker's exporter (to stderr with --json)")
    p.set_defaults(func=cmd_report)
    return p


def _fail(msg: str, code: int = 1) -> int:
    print(f"rmqtrace report: {msg}", file=sys.stderr)
    return code


class _Stop(Exception):
    """Ends the command with this message and exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _check_args(args: argparse.Namespace) -> None:
    from .sources import DEFAULT_JAEGER, parse_duration

    if args.spans and args.jaeger:
        raise _Stop("give either a spans file or --jaeger, not both", 2)
    if not args.jaeger:
        given = [f"--{name}" for name in JAEGER_DEFAULTS if getattr(args, name) is not None]
        if given:
            raise _Stop(f"{', '.join(given)} only apply to --jaeger; a spans file is read whole", 2)
    for name, default in JAEGER_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.top < 0 or args.limit < 1 or (args.workers is not None and args.workers < 1):
        raise _Stop("--top must be >= 0, --limit and --workers >= 1", 2)
    if args.jaeger:
        url = urllib.parse.urlsplit(args.jaeger)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise _Stop(f"--jaeger wants an http(s) URL like {DEFAULT_JAEGER}, got {args.jaeger!r}", 2)
        try:
            args.lookback_s = parse_duration(args.lookback)
        except ValueError as exc:
            raise _Stop(str(exc), 2) from exc
    if args.costs and args.fleet:
        raise _Stop("--costs learns from the per-message report; not with --fleet", 2)
    _check_outputs_distinct(args)
    for flag in ("html", "png", "costs"):
        why = _unwritable(getattr(args, flag))
        if why:
            raise _Stop(f"--{flag} {getattr(args, flag)}: {why}", 2)
    if args.png:
        from .png import find_chromium, no_chromium_message
        if find_chromium() is None:  # before the work: the report is not printed only to fail after it
            raise _Stop(no_chromium_message())


def _spans_path(args: argparse.Namespace) -> Path:
    return Path(args.spans or environment().get("RMQTRACE_SPANS_FILE") or DEFAULT_SPANS)


def _check_outputs_distinct(args: argparse.Namespace) -> None:
    """Refuse an output that is the spans file read, or another output: writing it would replace
    the only record of the run (a slip of tab completion) or one output with the other."""
    named: list[tuple[str, Path]] = []
    if not args.jaeger:
        named.append(("the spans file read", _spans_path(args)))
    for flag in ("html", "png", "costs"):
        if getattr(args, flag):
            path = Path(getattr(args, flag))
            for what, other in named:
                if _same_file(path, other):
                    raise _Stop(f"--{flag} {path}: is {what}; give another file", 2)
            named.append((f"--{flag}'s file", path))


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (through links), or would once written."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)  # hard links too
        return os.path.realpath(a) == os.path.realpath(b)
    except OSError:
        return False


def _unwritable(target: str | None) -> str | None:
    """Why a file cannot be written at ``target`` (its missing folders are made), or None."""
    if not target:
        return None
    path = Path(target)
    if path.is_dir():
        return "is a folder; give a file name in it"
    folder = path.parent
    while not folder.exists():  # the nearest folder that exists: missing ones below it are made
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    # Tried, not asked: os.access says yes to root everywhere, and a folder can refuse files for
    # other reasons (read-only mount, /proc), so asking let such a target through to fail after
    # the tables with the run-failure status. An existing target is opened without truncating.
    try:
        if path.exists():
            with path.open("ab"):
                pass
        else:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".rmqtrace-write-check-")
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return f"cannot write there ({exc.strerror or exc})"
    return None


def _read(args: argparse.Namespace) -> tuple[list[MessageRecord], int, str, str]:
    """The message records, how many spans they came from, where from, and why some of the source
    was not used ("" when all was)."""
    from .records import messages_from_spans
    from .sources import NoTracesForService, SourceError, paused_gc, read_jaeger
    from .spanread import read_span_file

    try:
        if args.jaeger:
            try:
                spans = read_jaeger(args.jaeger, args.service, limit=args.limit, lookback_s=args.lookback_s,
                                    timeout=args.timeout)
            except NoTracesForService as exc:
                if len(exc.consumer_services) != 1:
                    raise
                # one service has rmqtrace consumer spans: that is the one meant (the default name,
                # or OTEL_SERVICE_NAME unset where the spans were written)
                args.service = exc.consumer_services[0]
                print(f"rmqtrace report: no traces for service {exc.service!r}; reading {args.service!r}, the only "
                      "service with rmqtrace consumer spans (--service picks another)", file=sys.stderr)
                spans = read_jaeger(args.jaeger, args.service, limit=args.limit, lookback_s=args.lookback_s,
                                    timeout=args.timeout)
            traces = len({s.trace_id for s in spans})
            left_out = (f"Jaeger returned --limit {args.limit} traces; there may be more (raise --limit or narrow "
                        "--lookback)") if traces >= args.limit else ""
            with paused_gc():
                records = messages_from_spans(spans)
            return records, len(spans), f"Jaeger {args.jaeger} service {args.service}", left_out
        path = _spans_path(args)
        read = read_span_file(path)  # the process spans; the others only when a message needs them
        left_out = f"{read.unparsed} of {read.lines} lines could not be parsed as spans" if read.unparsed else ""
        return read.records, read.spans, f"spans file {path}", left_out
    except SourceError as exc:
        raise _Stop(str(exc)) from exc


def _write(report: Report, args: argparse.Namespace) -> None:
    """The tables or JSON on stdout, and the HTML page and PNG asked for."""
    html_path: Path | None = Path(args.html) if args.html else None
    if args.png and html_path is None:
        html_path = Path(tempfile.mkdtemp(prefix="rmqtrace-report-")) / "report.html"
    if html_path is not None:
        from .html import write_html
        try:
            write_html(report, html_path)
        except OSError as exc:  # checked before the work; the disk can still fill or a folder vanish
            raise _Stop(f"--html {html_path}: {exc.strerror or exc}") from exc
    if args.json:
        print(json.dumps(report.as_dict(), default=str))
    else:
        from rich.console import Console

        from .terminal import render
        render(report, Console(highlight=False), top=args.top)
    info = sys.stderr if args.json else sys.stdout
    if args.html:
        print(f"html: open {Path(args.html).resolve().as_uri()}", file=info)
    if args.png:
        from .png import PngError, screenshot
        assert html_path is not None
        try:
            png = screenshot(html_path, args.png)
        except PngError as exc:
            raise _Stop(str(exc)) from exc
        finally:
            if not args.html:  # the page was only drawn for the picture
                shutil.rmtree(html_path.parent, ignore_errors=True)
        print(f"png: {png}", file=info)


def _write_costs(records: list[MessageRecord], args: argparse.Namespace) -> None:
    from ..dispatch.costtable import CostTableError
    from .costs import costs_from_records

    try:
        learned = costs_from_records(records, group=args.group, job=args.job)
        if not learned.messages:
            # an empty table would replace the last run's and send every next job in arrival order
            raise _Stop(f"--costs {args.costs}: no handled message with a usable message key to learn from"
                        f"{f' ({learned.left_out} without one)' if learned.left_out else ''}; nothing written")
        learned.table.save(args.costs)
    except CostTableError as exc:
        raise _Stop(f"--costs {args.costs}: {exc}") from exc
    except OSError as exc:
        raise _Stop(f"--costs {args.costs}: {exc.strerror or exc}") from exc
    print(learned.line(args.costs), file=sys.stderr if args.json else sys.stdout)


def cmd_report(args: argparse.Namespace) -> int:
    from .model import report_from_messages

    try:
        _check_args(args)
        if args.fleet:
            from .fleetview import cli_fleet
            return cli_fleet(args)
        from .sources import paused_gc
        # a third of the build at 10⁵ messages was collections walking the spans; one pause over the
        # read and the build, or the first allocation between them collects all the records read
        with paused_gc():
            records, spans, source, left_out = _read(args)
            report = report_from_messages(records, spans, group=args.group, job=args.job, top=args.top,
                                          workers=args.workers, source=source)
        if not report.groups:
            what = " and ".join(f"{k} {v!r}" for k, v in (("group", args.group), ("job", args.job)) if v)
            raise _Stop(f"no consumer spans (`process …`) among {spans} spans from {source}"
                        + (f" for {what}" if what else "") + (f"; {left_out}" if left_out else ""))
        if left_out:
            print(f"rmqtrace report: warning: {left_out}", file=sys.stderr)
        _write(report, args)
        if args.costs:
            _write_costs(records, args)
        if args.prometheus:
            from .broker_side import print_for_report
            if not print_for_report(report, args.prometheus, sys.stderr if args.json else sys.stdout):
                return 1
    except _Stop as stop:
        return _fail(str(stop), stop.code)
    return 0


__all__ = ["add_cli", "cmd_report"]
