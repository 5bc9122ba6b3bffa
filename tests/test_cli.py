import json
import subprocess
import sys

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
                          "--rounds", "2"], capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    assert result["stamps_metrics_over_span"] > 0 and result["full_trace_over_span"] > 0
    assert result["full_trace_over_span"] > result["stamps_metrics_over_span"]


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
