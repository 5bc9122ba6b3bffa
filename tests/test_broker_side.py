"""`--prometheus` of `rmqtrace probe` / `rmqtrace report` and tracer.report.broker_side, without a
broker: argument errors, an unreachable or refusing Prometheus, the one-line description.
Against the real broker and Prometheus: tests/test_broker_side_e2e.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from services import free_port
from tracer.report.broker_side import Backlog, PrometheusError, fetch_backlog
from tracer.tools.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["probe", "--prometheus", "127.0.0.1:19090"], "expected the http(s) URL of a Prometheus server"),
    (["probe", "--group", "g"], "--group needs --prometheus"),
    (["probe", "--embedded", "--prometheus", "http://127.0.0.1:1"], "does not apply to --embedded"),
    (["report", "--prometheus", "ftp://x"], "expected the http(s) URL of a Prometheus server"),
])
def test_bad_arguments_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and not out


def test_an_unreachable_prometheus_fails_the_probe_before_any_probe(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "probe", "--endpoint", "127.0.0.1:1", "--count", "1", "--prometheus", url)
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith(f"rmqtrace probe: error: --prometheus {url}: ")


class _FakePrometheus:
    """/api/v1/query answering from a dict of expression fragments (pure logic: the real one is in
    the e2e test)."""

    def __init__(self, answers: dict[str, list[dict[str, Any]]], status: str = "success") -> None:
        self.queries: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                from urllib.parse import parse_qs, urlparse
                q = parse_qs(urlparse(self.path).query)["query"][0]
                fake.queries.append(q)
                result = next((v for k, v in answers.items() if k in q), [])
                body = {"status": status, "data": {"resultType": "vector", "result": result}} if status == "success" \
                    else {"status": "error", "errorType": "bad_data", "error": "parse error"}
                data = json.dumps(body).encode()
                self.send_response(200 if status == "success" else 400)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def fake() -> Iterator[_FakePrometheus]:
    lab = {"topic": "t|x", "consumer_group": "g"}
    p = _FakePrometheus({
        "rocketmq_consumer_ready_messages": [{"metric": lab, "value": [0, "7"]}],
        "rocketmq_consumer_queueing_latency_milliseconds": [{"metric": lab, "value": [0, "12.5"]}],
        "rocketmq_consumer_connections": [],
    })
    yield p
    p.server.shutdown()


def test_fetch_backlog_quotes_names_and_fills_what_the_broker_reports(fake: _FakePrometheus) -> None:
    (b,) = fetch_backlog(fake.url, ["t|x"], ["g"])
    assert b == Backlog("t|x", "g", ready_messages=7, oldest_ready_s=12.5, consumers=0.0)
    assert 'topic=~"t\\\\|x"' in fake.queries[0]  # '|' is a regex metacharacter: escaped, then string-escaped
    assert b.describe() == "g on t|x: 7 ready (oldest 12.5 s), 0 consumers connected — nothing pulls them"


def test_a_refused_query_is_a_prometheus_error() -> None:
    p = _FakePrometheus({}, status="error")
    try:
        with pytest.raises(PrometheusError, match="bad_data: parse error"):
            fetch_backlog(p.url, ["t"])
    finally:
        p.server.shutdown()
    with pytest.raises(ValueError):
        fetch_backlog(p.url, [])


def test_describe_a_healthy_group() -> None:
    b = Backlog("t", "g", ready_messages=0, inflight_messages=3, lag_latency_s=0.4, consumers=2)
    assert b.describe() == "g on t: 0 ready, 3 in flight, lag latency 0.4 s, 2 consumers connected"
