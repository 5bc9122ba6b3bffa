"""`rmqtrace report` on a small spans file written by the real tracer, and the demo's report."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from report_helpers import KNOWN, write_scenario_with_tracer

from tracer.report import write_demo_report
from tracer.tools.cli import _maybe_report, main

# The same job under a second group that used worker 1 for m3: done at 303 ms instead of 1103.
BETTER = tuple(dataclasses.replace(r, group="g-ok", worker=1, start=203, end=303) if r.key == "m3" else
               dataclasses.replace(r, group="g-ok") for r in KNOWN)


@pytest.fixture(scope="module")
def spans_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scenario_with_tracer(tmp_path_factory.mktemp("spans") / "spans.jsonl", KNOWN + BETTER)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_terminal_summary(spans_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(spans_file), "--top", "2")
    assert code == 0
    assert "6 messages in 2 consumer group(s)" in out
    for text in ("Job view", "g-rr", "g-ok", "1.10 s", "1.00 s", "1.10", "Stage gaps", "dispatch_wait",
                 "Slowest messages of g-rr",
                 "ID-m3 (m3) finished last, mostly waiting for a worker inside the consumer"):
        assert text in out, text


def test_json_numbers(spans_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(spans_file), "--json", "--top", "1")
    assert code == 0
    report = json.loads(out)
    assert report["messages"] == 6 and [g["group"] for g in report["groups"]] == ["g-rr", "g-ok"]
    rr, ok = report["groups"]
    [job] = rr["jobs"]
    assert job["completion_s"] == pytest.approx(1.103) and job["lower_bound_s"] == pytest.approx(1.0)
    assert job["over_lb"] == pytest.approx(1.103) and job["workers"] == 2
    assert job["critical"]["message"]["message_id"] == "ID-m3"
    assert job["critical"]["split_s"]["dispatch_wait"] == pytest.approx(0.991)
    # g-ok ran m3 on the idle worker: m1 (the longest message) is last, the job is as short as it can be
    assert ok["jobs"][0]["completion_s"] == pytest.approx(1.003) and ok["jobs"][0]["lower_bound_s"] == pytest.approx(1)
    assert ok["jobs"][0]["critical"]["message"]["message_id"] == "ID-m1"
    assert ok["jobs"][0]["critical"]["verdict"].startswith("mostly working (its own handler): 1.000 s of 1.003 s")
    assert rr["stages"]["handler"]["p50"] == pytest.approx(0.2) and rr["stages"]["handler"]["max"] == pytest.approx(1)
    assert [m["message_id"] for m in rr["slowest"]] == ["ID-m3"]
    assert rr["slowest"][0]["critical_stage"] == "dispatch_wait"
    assert rr["workers_source"] == "attribute" and rr["timing_from_spans"] == 0


def test_group_and_job_filters(spans_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(spans_file), "--json", "--group", "g-ok", "--job", "J")
    assert code == 0 and [g["group"] for g in json.loads(out)["groups"]] == ["g-ok"]
    code, _, err = run(capsys, str(spans_file), "--job", "nope")
    assert code == 1 and "no consumer spans" in err and "job 'nope'" in err


def test_workers_override(spans_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(spans_file), "--json", "--workers", "1", "--group", "g-rr")
    job = json.loads(out)["groups"][0]["jobs"][0]
    assert code == 0 and job["lower_bound_s"] == pytest.approx(1.3)  # max(1.3 / 1, 1.0)


def test_html_is_self_contained_with_every_section(spans_file: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    html_path = tmp_path / "r.html"
    code, out, _ = run(capsys, str(spans_file), "--html", str(html_path))
    assert code == 0 and f"html: open {html_path.resolve().as_uri()}" in out
    page = html_path.read_text()
    for section in ("job-view", "stages", "waterfall", "heatmap", "occupancy", "slowest"):
        assert f'id="{section}"' in page
    for external in ("<script", "<link", " src=", "url(", "@import", "http://", "https://"):
        assert external not in page, external
    # side by side: every chart section has one card per group
    for section in ("waterfall", "heatmap", "occupancy"):
        body = page.split(f'id="{section}"')[1].split("</section>")[0]
        assert body.count('data-group="g-rr"') == body.count('data-group="g-ok"') >= 1
    assert page.count('class="waterfall"') == 2 and page.count('class="occupancy"') == 2
    assert page.count("<g class=\"crit\">") == 2  # the last message of each group is framed
    assert "all 3 messages" in page
    # the heatmap cells carry their counts: 3 messages per group
    heat = page.split('id="heatmap"')[1].split("</section>")[0]
    assert sum(int(c) for c in re.findall(r'data-count="(\d+)"', heat)) == 6


def test_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str], spans_file: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run(capsys, str(tmp_path / "missing.jsonl"))
    assert code == 1 and "no spans file at" in err
    code, _, err = run(capsys, str(spans_file), "--jaeger", "http://127.0.0.1:1")
    assert code == 2 and "not both" in err
    code, _, err = run(capsys, "--jaeger", "http://127.0.0.1:1", "--lookback", "soon")
    assert code == 2 and "not a duration" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = run(capsys, str(empty))
    assert code == 1 and "no consumer spans" in err
    monkeypatch.setenv("RMQTRACE_CHROMIUM", str(tmp_path / "no-such-browser"))
    code, out, err = run(capsys, str(spans_file), "--png", str(tmp_path / "r.png"), "--html", str(tmp_path / "r.html"))
    assert code == 1 and "needs Chromium" in err and len(err.strip().splitlines()) == 1, err
    assert out == "" and not (tmp_path / "r.html").exists()  # found out before the work, not after the tables


# -- every bad argument or output: one line, exit 2 (1 for a failure of the run), checked before the work --
# (argv with {spans} and {tmp}, exit status, words the line must hold)
BAD_REPORT = [
    (["{spans}", "--html", "{tmp}"], 2, "is a folder"),
    (["{spans}", "--html", "{tmp}/a-file/r.html"], 2, "is not a folder"),
    (["{spans}", "--png", "{tmp}"], 2, "is a folder"),
    (["{spans}", "--png", "{tmp}/a-file/r.png"], 2, "is not a folder"),
    # a folder that says it is writable (root: os.access says yes to everything) and takes no file
    (["{spans}", "--html", "/proc/rmqtrace-report.html"], 2, "cannot write there"),
    (["{spans}", "--png", "/proc/rmqtrace-report.png"], 2, "cannot write there"),
    (["--jaeger", "http://127.0.0.1:1", "--timeout", "-5"], 2, "--timeout"),
    (["--jaeger", "http://127.0.0.1:1", "--timeout", "soon"], 2, "--timeout"),
    (["--jaeger", "notaurl"], 2, "http(s) URL"),
    (["--jaeger", "http://"], 2, "http(s) URL"),
    (["{spans}", "--lookback", "2h"], 2, "--lookback only apply to --jaeger"),
    (["{spans}", "--limit", "5", "--timeout", "3"], 2, "--limit, --timeout only apply to --jaeger"),
    (["{spans}", "--top", "-1"], 2, "--top"),
    (["{tmp}/missing.jsonl"], 1, "no spans file at"),
    (["--jaeger", "http://127.0.0.1:1", "--timeout", "2"], 1, "127.0.0.1:1"),
]


@pytest.mark.parametrize(("argv", "status", "words"), BAD_REPORT, ids=[" ".join(a) for a, _, _ in BAD_REPORT])
def test_each_bad_argument_is_one_line_before_the_work(argv: list[str], status: int, words: str, spans_file: Path,
                                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("")
    argv = [a.format(spans=spans_file, tmp=tmp_path) for a in argv]
    try:
        code = main(["report", *argv])
    except SystemExit as exc:  # argparse's own refusals (a type that does not parse)
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert code == status, err
    assert out == "", out  # nothing printed before the refusal
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and words in lines[0], err


def test_html_and_png_make_missing_folders(spans_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(spans_file), "--html", str(tmp_path / "new" / "deeper" / "r.html"), "--top", "0")
    assert code == 0 and (tmp_path / "new" / "deeper" / "r.html").exists(), err


def test_default_spans_file_from_env(spans_file: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMQTRACE_SPANS_FILE", str(spans_file))
    code, out, _ = run(capsys, "--json")
    assert code == 0 and json.loads(out)["messages"] == 6


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["report", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for text in ("SPANS.jsonl", "--jaeger", "--service", "--limit", "--lookback", "--group", "--job", "--top",
                 "--html", "--png", "--json", "lower bound", "waterfall"):
        assert text in out, text


def test_demo_report_side_by_side(spans_file: Path, tmp_path: Path) -> None:
    path = write_demo_report(spans_file, tmp_path / "out")
    assert path == tmp_path / "out" / "report.html"
    page = path.read_text()
    assert "g-rr" in page and "g-ok" in page and 'id="job-view"' in page
    assert _maybe_report(tmp_path / "again", str(spans_file)) == str(tmp_path / "again" / "report.html")
    assert _maybe_report(tmp_path, None) is None


def test_demo_ends_with_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--groups", "24", "--workers", "3", "--case-ms", "0.5", "--policies", "round_robin,aggressive",
                 "--out", str(tmp_path)])
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert code == 0
    report = tmp_path / "report.html"
    assert f"report: open {report}" in out
    page = report.read_text()
    assert 'data-group="demo-round_robin"' in page and 'data-group="demo-aggressive"' in page


def test_a_file_of_garbage_lines_says_they_could_not_be_parsed(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n{\"a\": 1}\n\n[1, 2]\n")
    code, out, err = run(capsys, str(junk))
    assert code == 1 and out == ""
    assert "3 of 3 lines could not be parsed as spans" in err and len(err.strip().splitlines()) == 1, err


def test_some_garbage_lines_are_counted_and_the_rest_reported(spans_file: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(spans_file.read_text() + "garbage\n{broken\n")
    code, out, err = run(capsys, str(mixed), "--top", "0")
    assert code == 0 and "Job view" in out
    assert "warning: 2 of " in err and "lines could not be parsed as spans" in err, err


def test_where_the_time_went_bullets_stay_indented_when_piped(spans_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The report's lines, like the demo's (tests/test_cli.py): wrapped lines start under the text."""
    code, out, _ = run(capsys, str(spans_file), "--top", "0")
    assert code == 0
    head = out.split("Job view")[0].splitlines()[1:]
    assert head and head[0].startswith("  • ") and all(w.startswith(("  • ", "    ")) for w in head), head


@pytest.mark.parametrize("fleet", [False, True], ids=["report", "fleet"])
def test_an_html_write_failing_after_the_checks_is_a_failed_run(fleet: bool, spans_file: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks passed, then the disk filled: a failure of the run (1), one line, not a bad argument (2)."""
    import errno

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    if fleet:
        monkeypatch.setattr(Path, "write_text", full)  # the fleet page is written in place
    else:
        from tracer.report import html
        monkeypatch.setattr(html, "write_html", full)
    code, _, err = run(capsys, str(spans_file), *(["--fleet"] if fleet else []), "--html", str(tmp_path / "r.html"))
    assert code == 1 and err.strip().splitlines() == [f"rmqtrace report: --html {tmp_path / 'r.html'}: No space left on device"]
