import json
import math
import subprocess
import sys
from pathlib import Path

from tracer.tools.cli import build_parser, main


def test_help_reads_well(capsys):
    for argv in (["--help"], ["demo", "--help"], ["bench", "--help"]):
        try:
            main(argv)
        except SystemExit as e:
            assert e.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "--metrics-port" in out and "overhead" in out


def test_bench_overhead_json_has_the_ratios():
    out = subprocess.run([sys.executable, "-m", "tracer", "bench", "overhead", "--json", "--messages", "2000",
                          "--rounds", "2", "--runs", "3"], capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    # issue 35: each ratio is the median of the runs' ratios, each run's own beside it
    assert result["runs"] == 3 and len(result["per_run"]) == 3
    for key, target in result["targets"].items():
        each = sorted(run["ratios"][key] for run in result["per_run"])
        assert result[key] == each[1] and result["spread"][key] == [each[0], each[2]], key
        assert result["met"][key] == (result[key] <= target)
    assert set(result["targets"]) == {"stamps_metrics_over_span", "full_trace_over_contrib",
                                      "compact_trace_over_contrib", "sampled_out_over_contrib"}
    # which path is cheaper is a benchmark figure (BENCHMARKS.md), measured on a quiet machine: two
    # rounds of 2000 messages on a loaded one can order them either way (issue 33, item 10)
    for key in ("stamps_metrics_over_span", "full_trace_over_span", "contrib_process_over_span",
                "full_trace_over_contrib", "compact_trace_over_contrib", "sampled_out_over_contrib"):
        assert isinstance(result[key], float) and 0 < result[key] < math.inf, key


def test_the_contrib_baseline_is_one_consumer_span_under_the_extracted_context_current_in_the_handler():
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from tracer.tools.bench import contrib_process

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    parent = TraceContextTextMapPropagator().extract(
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    with contrib_process(provider.get_tracer("t"), parent, "T", "G", "M1") as span:
        assert trace.get_current_span() is span
    (done,) = exporter.get_finished_spans()
    assert done.name == "process T" and done.kind is SpanKind.CONSUMER
    assert done.parent is not None and done.parent.span_id == 0xb7ad6b7169203331
    assert done.attributes["messaging.message.id"] == "M1" and len(done.attributes) == 6


def test_demo_command_small_run(tmp_path):
    code = main(["demo", "--groups", "40", "--workers", "4", "--case-ms", "0.5", "--policies", "aggressive",
                 "--out", str(tmp_path)])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary[0]["policy"] == "aggressive" and summary[0]["handled"] == 40
    assert (tmp_path / "spans.jsonl").stat().st_size > 0


def test_parser_rejects_unknown_bench():
    parser = build_parser()
    try:
        parser.parse_args(["bench", "nope"])
    except SystemExit as e:
        assert e.code == 2


# -- every bad argument: one line on stderr, exit status 2, before any work ---------------------
import socket  # noqa: E402

import pytest  # noqa: E402

BAD_DEMO = [
    (["--workers", "0"], "--workers"),
    (["--groups", "-5"], "--groups"),
    (["--groups", "0"], "--groups"),
    (["--case-ms", "-1"], "--case-ms"),
    (["--case-ms", "nan"], "--case-ms"),
    (["--buffer", "-1"], "--buffer"),
    (["--policies", "nonsense"], "nonsense"),
    (["--policies", ""], "--policies"),
    (["--policies", "aggressive,aggressive"], "twice"),
    (["--metrics-port", "70000"], "--metrics-port"),
    (["--metrics-port", "http"], "--metrics-port"),
    (["--bogus"], "--bogus"),
    (["--seed", "abc"], "--seed: expected a whole number, got 'abc'"),
    (["--seed", "-1"], "--seed"),
]


def _one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("argv", "named"), BAD_DEMO)
def test_demo_rejects_each_bad_argument_in_one_line(argv: list[str], named: str, tmp_path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error_line(["demo", *argv, "--out", str(tmp_path / "out")], capsys)
    assert named in line and line.startswith("rmqtrace demo: error:"), line
    assert not (tmp_path / "out").exists()  # rejected before anything was written


def test_a_bad_top_level_flag_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error_line(["--bogus"], capsys)
    assert "--bogus" in line and "COMMAND" not in line, line


def test_no_command_says_which_there_are(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error_line([], capsys)
    assert "demo" in line and "report" in line, line


def _runtime_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_demo_rejects_an_unwritable_out_before_the_run(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = _runtime_error(["demo", "--groups", "5", "--out", str(blocker / "out")], capsys)
    assert "--out" in line and str(blocker / "out") in line


def test_demo_rejects_a_port_in_use_before_the_run(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = _runtime_error(["demo", "--groups", "5", "--metrics-port", str(port), "--out", str(tmp_path)], capsys)
    assert f"--metrics-port {port}" in line and "in use" in line
    assert not (tmp_path / "summary.json").exists()


def test_metrics_port_help_shows_no_made_up_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "[--metrics-port PORT]" in out and "9464" not in out.split("options:")[0]


def test_the_benchmarks_share_one_percentile_and_one_drop_exporter() -> None:
    from tracer.report.model import percentile
    from tracer.tools import bench
    from tracer.tools.bench import broker, dispatch, overhead

    assert dispatch.percentile is percentile  # nearest rank, as the demo and the report (docs/report.md)
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0  # int(q·n) would say 3.0
    assert broker.DropExporter is overhead.DropExporter is bench.DropExporter


def test_the_license_is_an_spdx_string_so_installing_is_quiet() -> None:
    """setuptools >= 77 warns at every build (dozens of lines before `make demo`) for the table form."""
    from conftest import pyproject

    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0"


def test_demo_rejects_a_malformed_environment_variable_in_one_line(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RMQTRACE_METRICS_PORT", "abc")
    line = _runtime_error(["demo", "--groups", "5", "--out", str(tmp_path / "out")], capsys)
    assert "RMQTRACE_METRICS_PORT" in line and not (tmp_path / "out").exists()


def test_bench_without_a_benchmark_names_them(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error_line(["bench"], capsys)
    assert line.startswith("rmqtrace bench: error: give a benchmark: overhead, dispatch") and "which" not in line, line


def test_buffer_help_says_what_zero_means(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "0: no slot, the next message blocks until its own worker is free" in out


# -- the demo's output: one JSON document with --json; units, key, indented bullets, the next step -------
DEMO_SMALL = ["demo", "--groups", "40", "--workers", "3", "--case-ms", "0.5", "--policies", "round_robin,aggressive"]


def test_demo_json_is_exactly_one_document_on_stdout(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*DEMO_SMALL, "--json", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    runs = json.loads(out)  # the whole of stdout, as `| jq` reads it
    assert [r["policy"] for r in runs] == ["round_robin", "aggressive"]
    assert "Job completion per policy" in err and "Where the time went" in err


def test_demo_output_reads_well_when_piped(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import re

    assert main([*DEMO_SMALL, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    gaps = out.split("Stage gaps")[1].split("Where the time went")[0]
    assert re.search(r"\d (µs|ms|s)\b", gaps) and not re.search(r"\b0\.\d{3}\b", gaps), gaps  # report's units
    flat = " ".join(out.split())
    assert "× LB = job time / LB" in flat and "busy = the workers' time in handlers" in flat
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    # bullets keep their indentation: every wrapped line of "Where the time went" starts under the text
    where = out.split("Where the time went")[1].split("spans:")[0].splitlines()[1:]
    assert where and where[0].startswith("  • ") and all(w.startswith(("  • ", "    ")) for w in where), where
    closing = " ".join(out.split("Next:")[1].split())
    assert "round_robin" in closing and 'ConsumeLoop(consumer, handler, policy="aggressive")' in closing
    assert "docs/dispatch.md" in closing and "tracer.clients.demandpush.DemandPushConsumer" in closing


def test_ctrl_c_in_the_demo_says_the_spans_file_is_partial(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from tracer.tools import cli

    def interrupted(args, settings, registry, console):  # type: ignore[no-untyped-def]
        Path(settings.spans_file).write_text("{}\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_demo_job", interrupted)
    assert main(["demo", "--groups", "5", "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "interrupted" in err and str(tmp_path / "spans.jsonl") in err, err
    assert "partial" in err


def test_a_real_ctrl_c_mid_run_ends_at_once_and_says_so(tmp_path) -> None:
    """SIGINT as a terminal sends it, while messages are being handled: exit 130 promptly, one line."""
    import os
    import signal
    import time

    spans = tmp_path / "spans.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "tracer", "demo", "--groups", "300", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RMQTRACE_"))},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a shell's & ignores it
    try:
        deadline = time.monotonic() + 60
        while not (spans.exists() and spans.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.1)  # real-time: the run has started handling messages
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "interrupted" in lines[-1] and str(spans) in lines[-1], err[-2000:]
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.integration
def test_demo_over_otlp_says_where_the_spans_went_and_leaves_no_stale_report(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With OTLP set it wrote no report and pointed at the previous run's report.html (issue 33)."""
    import uuid

    from conftest import unavailable
    from waiting import wait_until

    try:
        socket.create_connection(("127.0.0.1", 4318), timeout=2).close()
    except OSError as exc:
        unavailable(f"no OTLP receiver (Jaeger) on 127.0.0.1:4318: {exc}")
    service = f"rmqtrace-demo-otlp-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_SERVICE_NAME", service)
    (tmp_path / "report.html").write_text("an earlier run's page")
    assert main([*DEMO_SMALL, "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "report.html").exists()  # fails before: the stale page stayed, and was pointed at
    command = f"rmqtrace report --jaeger http://127.0.0.1:16686 --service {service} --html report.html"
    assert (f"spans: sent over OTLP (http/protobuf) to http://127.0.0.1:4318 as service '{service}', no "
            f"report.html; read them back from Jaeger: {command}") in out, out
    assert "report.html" not in out.split("Next:")[1]
    # the command it names reads this run back
    argv = command.split()[1:]
    argv[argv.index("report.html")] = str(tmp_path / "from-jaeger.html")
    wait_until(lambda: main(argv) == 0, timeout=30, interval=0.5, what=f"{service}'s traces in Jaeger")
