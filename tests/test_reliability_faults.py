"""Faults: the tracer and its consume loop never lose a message (real broker, plus fast checks of
the loop's fault handling against stand-in clients).

Each test sends numbered messages to its own topic and runs ``fault_programs/consumer.py`` (the
consume loop over the official 5.x ``SimpleConsumer``) as a separate process, which logs every
handler start, end and accepted ack with an fsync. The accounting afterwards is exact: every
number handled at least once, and every duplicate traced to a message that was in flight (handled,
ack not yet accepted) when its consumer died. Every wait has a deadline; processes left running
are killed at teardown. The broker is shared: it is started if down, never stopped, and restarted
once (the proxy only) by the restart test.
"""

from __future__ import annotations

import http.server
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from fault_programs.harness import (
    RMQ_SH,
    Accounting,
    Consumers,
    create,
    ensure_broker,
    poll,
    read_log,
    record_figures,
    send_numbered,
    start_producer,
    unique,
)

from tracer.clients.consume import ConsumeLoop

WORKERS = 8
INVISIBLE = 5.0  # seconds: the lease; a message whose consumer died comes back after it


@pytest.fixture(scope="module")
def broker() -> None:
    ensure_broker()


@pytest.fixture
def consumers(request: pytest.FixtureRequest):
    # not pytest's tmp_path: pytest sessions running beside this one rotate those directories away
    tmp = Path(tempfile.mkdtemp(prefix="rmqtrace-faults-"))
    failed = request.session.testsfailed
    c = Consumers(tmp)
    yield c
    c.cleanup()
    if request.session.testsfailed == failed:
        shutil.rmtree(tmp, ignore_errors=True)  # kept when the test failed: the logs explain it


def produce(topic: str, n: int, tracer=None) -> None:
    producer = start_producer(topic, tracer)
    try:
        counts = send_numbered(producer, topic, range(n))
    finally:
        producer.shutdown()
    assert counts.get("sent") == n, counts


def quiet_period() -> None:
    """Long enough for any unacked message to come back (its lease runs out) and be handled."""
    time.sleep(INVISIBLE + 2)  # real-time: a redelivery can only show up after the lease expires


def unexplained(acc: Accounting, suspects: set[int]) -> dict[int, int]:
    return {s: n for s, n in acc.duplicates().items() if s not in suspects}


@pytest.mark.integration
def test_sigkill_mid_job_every_message_handled_at_least_once(broker, consumers):
    n = 600
    topic, group = unique("rel-kill"), unique("rel-kill-g")
    create(topic, [group])
    produce(topic, n)
    args = ("--work-ms", "20", "--invisible", str(INVISIBLE), "--workers", str(WORKERS))
    first = consumers.start(topic, group, *args)
    first.wait_ready()
    poll(lambda: first.count("D") >= n // 3, 60, "a third of the job handled by the first consumer")
    first.signal(signal.SIGKILL)
    first.wait(10)
    killed = Accounting(first.lines())
    started, done, acked = killed.seqs("S"), killed.seqs("D"), killed.seqs("A")
    in_flight = started - acked  # handler started, no ack accepted: the broker will deliver again
    done_not_acked = done - acked

    second = consumers.start(topic, group, *args)
    second.wait_ready()
    poll(lambda: Accounting(read_log(first.log)).seqs("D") >= set(range(n)), 120, "every message handled")
    # The handled-but-unacked ones come back once their lease runs out. (An ack can also reach the
    # broker an instant before the kill with its "A" line unwritten: then it is never redelivered.)
    try:
        poll(lambda: done_not_acked <= Accounting(read_log(first.log)).seqs("D", second.proc.pid),
             INVISIBLE + 10, "handled-but-unacked messages redelivered")
    except AssertionError:
        pass
    second.signal(signal.SIGTERM)
    assert second.wait(60) == 0, second.stderr()

    acc = Accounting(read_log(first.log))
    lost = set(range(n)) - acc.seqs("D")
    dups = acc.duplicates()
    redelivered = [ln for ln in acc.by_kind["S"] if ln.pid == second.proc.pid and ln.attempt > 1]
    record_figures("sigkill", {
        "sent": n, "handled_distinct": len(acc.seqs("D")), "handler_runs": sum(acc.handled_counts().values()),
        "lost": len(lost), "duplicates": len(dups), "handled_before_kill": len(done),
        "in_flight_at_kill": len(in_flight), "in_flight_handled_not_acked": len(done_not_acked),
        "in_flight_unfinished": len(in_flight - done), "redelivered_to_second": len(redelivered),
        "second_consumer": {k: v for k, v in second.stats().items() if isinstance(v, (int, float))},
    })
    assert not lost, f"never handled: {sorted(lost)[:20]}"
    # every duplicate is a message the killed consumer had handled but whose ack was not accepted
    assert not unexplained(acc, done_not_acked), (dups, sorted(done_not_acked))
    assert all(c == 2 for c in dups.values()), dups
    # what was in flight came back as a redelivery (attempt > 1); nothing acked did
    assert not {ln.seq for ln in redelivered} & acked
    assert in_flight - done <= {ln.seq for ln in redelivered}
    assert len(in_flight) <= 4 * WORKERS  # demand-driven receive: no more than the workers hold


@pytest.mark.integration
def test_sigterm_drains_in_flight_work_acks_it_and_loses_nothing(broker, consumers):
    n = 600
    topic, group = unique("rel-term"), unique("rel-term-g")
    create(topic, [group])
    produce(topic, n)
    args = ("--work-ms", "20", "--invisible", str(INVISIBLE), "--workers", str(WORKERS))
    first = consumers.start(topic, group, *args)
    first.wait_ready()
    poll(lambda: first.count("D") >= n // 3, 60, "a third of the job handled")
    first.signal(signal.SIGTERM)
    assert first.wait(60) == 0, first.stderr()
    st = first.stats()
    drained = Accounting(first.lines())
    # everything the stopped consumer started, it finished and the broker accepted the ack
    assert drained.seqs("S") == drained.seqs("D") == drained.seqs("A")
    assert st["acked"] == st["succeeded"] == st["received"] and st["ack_errors"] == 0
    assert st["held_after_run"] == 0

    second = consumers.start(topic, group, *args)
    second.wait_ready()
    poll(lambda: Accounting(read_log(first.log)).seqs("D") >= set(range(n)), 120, "every message handled")
    quiet_period()
    second.signal(signal.SIGTERM)
    assert second.wait(60) == 0, second.stderr()

    acc = Accounting(read_log(first.log))
    lost = set(range(n)) - acc.seqs("D")
    record_figures("sigterm", {
        "sent": n, "handled_distinct": len(acc.seqs("D")), "handler_runs": sum(acc.handled_counts().values()),
        "lost": len(lost), "duplicates": len(acc.duplicates()), "handled_by_stopped_consumer": len(drained.seqs("D")),
        "stopped_consumer": {k: v for k, v in st.items() if isinstance(v, (int, float))},
    })
    assert not lost
    assert not acc.duplicates(), acc.duplicates()
    assert not [ln for ln in acc.by_kind["S"] if ln.attempt > 1], "nothing may be redelivered"


@pytest.mark.integration
def test_proxy_restart_mid_job_the_pipeline_resumes_and_loses_nothing(broker, consumers):
    n = 300
    topic, group = unique("rel-restart"), unique("rel-restart-g")
    create(topic, [group])
    consumer = consumers.start(topic, group, "--work-ms", "10", "--invisible", str(INVISIBLE),
                               "--workers", str(WORKERS), "--max-seconds", "400")
    consumer.wait_ready()
    producer = start_producer(topic)
    sent: dict[str, int] = {}
    stop_sending = threading.Event()

    def send() -> None:  # ~15 s of traffic: it spans the restart; failed sends are retried
        sent.update(send_numbered(producer, topic, range(n), threads=2, retry_for=240, pace=0.1,
                                  stop=stop_sending))

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        poll(lambda: consumer.count("D") >= n // 5, 60, "traffic flowing before the restart")
        t0 = time.monotonic()
        proc = subprocess.run(["bash", str(RMQ_SH), "restart-proxy"], capture_output=True, text=True, timeout=400)
        restart_s = time.monotonic() - t0
        assert proc.returncode == 0, proc.stderr[-1000:]
        handled_at_restart = consumer.count("D")
        poll(lambda: Accounting(consumer.lines()).seqs("D") >= set(range(n)), 240,
             "every message handled after the restart")
        resumed_s = time.monotonic() - t0 - restart_s
        sender.join(60)
    finally:
        stop_sending.set()
        sender.join(30)
        producer.shutdown()
    quiet_period()
    consumer.signal(signal.SIGTERM)
    assert consumer.wait(60) == 0, consumer.stderr()
    st = consumer.stats()
    acc = Accounting(consumer.lines())
    lost = set(range(n)) - acc.seqs("D")
    dups = acc.duplicates()
    # a duplicate is explained when an earlier delivery of the same message was handled but its
    # ack was not accepted (ack lost in the restart), or when the producer's send was retried
    acked = {(ln.seq, ln.message_id, ln.attempt) for ln in acc.by_kind["A"]}
    unacked_done = {ln.seq for ln in acc.by_kind["D"] if (ln.seq, ln.message_id, ln.attempt) not in acked}
    resent = {s for s in dups if len({ln.message_id for ln in acc.by_kind["D"] if ln.seq == s}) > 1}
    record_figures("proxy_restart", {
        "sent": n, "send_errors_retried": sent.get("send_errors", 0), "handled_distinct": len(acc.seqs("D")),
        "handler_runs": sum(acc.handled_counts().values()), "lost": len(lost), "duplicates": len(dups),
        "duplicates_from_producer_retries": len(resent), "restart_s": round(restart_s, 1),
        "handled_when_restart_returned": handled_at_restart, "all_handled_s_after_restart": round(resumed_s, 1),
        "consumer": {k: v for k, v in st.items() if isinstance(v, (int, float))},
        "consumer_errors": st.get("errors_by_kind"),
    })
    assert sent.get("sent") == n and not sent.get("gave_up"), sent
    assert not lost, f"never handled: {sorted(lost)[:20]}"
    assert set(dups) <= unacked_done | resent, (dups, sorted(unacked_done))
    assert st["workers_alive_min"] == WORKERS


class BlackHole:
    """A TCP server that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)  # held open, never read, never answered

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
        for c in self.conns:
            c.close()


class OtlpSink:
    """A healthy OTLP/HTTP backend: answers every export with 200 and counts the bytes."""

    def __init__(self) -> None:
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                sink.bytes += len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.bytes = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once this socket closes


@pytest.mark.integration
def test_trace_backend_down_or_black_holed_handling_keeps_full_speed_and_drops_are_counted(broker, consumers):
    from opentelemetry.sdk.trace import TracerProvider

    from tracer.telemetry.tracer import MessageTracer

    n = 800
    topic = unique("rel-otlp")
    groups = {c: unique(f"rel-otlp-{c}") for c in ("off", "healthy", "closed", "blackhole")}
    create(topic, groups.values())
    produce(topic, n, tracer=MessageTracer(tracer_provider=TracerProvider()))  # carries traceparent
    hole, sink = BlackHole(), OtlpSink()
    endpoints = {"healthy": f"http://127.0.0.1:{sink.port}", "closed": f"http://127.0.0.1:{closed_port()}",
                 "blackhole": f"http://127.0.0.1:{hole.port}"}
    # All four consume side by side, released together: whatever else loads this machine, it
    # loads every condition alike, so the speed ratios compare like with like.
    go = consumers.tmp / "go"
    procs = {}
    try:
        for cond, group in groups.items():
            args = ["--work-ms", "20", "--workers", str(WORKERS), "--invisible", "30", "--start-file", str(go)]
            env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                   "OTEL_EXPORTER_OTLP_TIMEOUT": "2", "OTEL_SERVICE_NAME": "rmqtrace-reliability"}
            if cond != "off":
                args.append("--trace")
                env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoints[cond]
            procs[cond] = consumers.start(topic, group, *args, env=env, log=consumers.tmp / f"{cond}.log")
        for c in procs.values():
            c.wait_ready()
        go.touch()
        poll(lambda: all(c.count("A") >= n for c in procs.values()), 120, "every message acked in every group")
        for c in procs.values():
            c.signal(signal.SIGTERM)
        for c in procs.values():
            assert c.wait(90) == 0, c.stderr()
        results = {cond: c.stats() for cond, c in procs.items()}
    finally:
        hole.close()
        sink.close()
    rate = {cond: n / r["handling_s"] for cond, r in results.items()}
    figures = {"messages_per_run": n, "handler_work_ms": 20, "workers": WORKERS,
               "rate_msgs_per_s": {k: round(v, 1) for k, v in rate.items()}}
    for cond in ("healthy", "closed", "blackhole"):
        r = results[cond]
        figures[cond] = {"speed_vs_tracing_off": round(rate[cond] / rate["off"], 3),
                         "speed_vs_healthy_backend": round(rate[cond] / rate["healthy"], 3),
                         "spans_ended": r["spans_ended"],
                         "spans_dropped": r["spans_dropped"], "spans_dropped_metric": r["spans_dropped_metric"],
                         "dropped_before_shutdown": r["spans_dropped_before_shutdown"],
                         "tracing_shutdown_s": round(r["tracing_shutdown_s"], 2), "acked": r["acked"]}
    figures["healthy"]["otlp_bytes_received"] = sink.bytes
    record_figures("trace_backend_down", figures)
    assert results["healthy"]["spans_dropped"] == 0 and sink.bytes > 0
    for cond in ("closed", "blackhole"):
        r = results[cond]
        assert r["acked"] == n and r["failed"] == 0
        # a dead backend never holds up the handling path. An export on it would cost up to
        # OTEL_EXPORTER_OTLP_TIMEOUT (2 s) per span against 20 ms of work: a rate below 1/100 of
        # healthy. Half is a margin a loaded 2-core machine keeps (0.8 failed at 0.79 in a loaded
        # `make test`, issue 33); the measured ratios are figures (RELIABILITY.md), not asserted.
        assert rate[cond] >= 0.5 * rate["healthy"] and rate[cond] >= 0.4 * rate["off"], (cond, rate)
        # five spans per message (process, handler, three gaps) plus a receive span per receive
        # call; none reached a backend: all counted
        assert r["operation_spans"] >= 1 and r["spans_ended"] == 5 * n + r["operation_spans"]
        assert r["spans_dropped"] == r["spans_ended"] == r["spans_dropped_metric"]
        assert r["spans_dropped_before_shutdown"] > 0  # counted while running, not only at exit


@pytest.mark.integration
def test_handler_exceptions_and_timeouts_are_retried_and_workers_survive(broker, consumers):
    n, workers = 70, 4
    topic, group = unique("rel-fail"), unique("rel-fail-g")
    create(topic, [group])
    produce(topic, n)
    c = consumers.start(topic, group, "--workers", str(workers), "--work-ms", "5", "--invisible", str(INVISIBLE),
                        "--fail-every", "5", "--slow-every", "7", "--slow-ms", "1500", "--handler-timeout", "0.5")
    c.wait_ready()
    poll(lambda: Accounting(c.lines()).seqs("A") >= set(range(n)), 90, "every message finally acked")
    c.signal(signal.SIGTERM)
    assert c.wait(60) == 0, c.stderr()
    st = c.stats()
    acc = Accounting(c.lines())
    raised = {s for s in range(n) if s % 5 == 0}
    overran = {s for s in range(n) if s % 7 == 0} - raised
    acked_at = {ln.seq: ln.attempt for ln in acc.by_kind["A"]}
    record_figures("handler_faults", {
        "sent": n, "raised_first_time": len(raised), "overran_timeout_first_time": len(overran),
        "acked": len(acked_at), "stats": {k: v for k, v in st.items() if isinstance(v, (int, float))},
    })
    assert {ln.seq for ln in acc.by_kind["F"]} == raised
    assert all(acked_at[s] == 2 for s in raised | overran), acked_at
    assert all(acked_at[s] == 1 for s in set(range(n)) - raised - overran)
    assert len(acc.by_kind["A"]) == n  # acked once each: a timed-out run was never acked
    retried = len(raised) + len(overran)
    assert st["failed"] == st["retry_scheduled"] == st["redelivered"] == retried
    assert st["succeeded"] == st["acked"] == n
    assert st["workers_alive_min"] == workers


# -- the same fault handling, fast, against stand-ins for the 5.x client ------------------------
class StrictSeconds:
    """The embedded consumer, refusing durations that are not ``int`` as the 5.x client does
    (``Duration.seconds = 1.5`` raises TypeError inside it)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.durations: list[Any] = []

    def _check(self, seconds: Any) -> None:
        self.durations.append(seconds)
        if type(seconds) is not int:
            raise TypeError(f"'float' object cannot be interpreted as an integer: {seconds!r}")

    def receive(self, n: int, invisible: Any) -> Any:
        self._check(invisible)
        return self.consumer.receive(n, invisible)

    def change_invisible_duration(self, msg: Any, seconds: Any) -> None:
        self._check(seconds)
        self.consumer.change_invisible_duration(msg, seconds)

    def ack(self, msg: Any) -> None:
        self.consumer.ack(msg)


def embedded(n: int) -> tuple[Any, Any]:
    from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer

    broker = EmbeddedBroker(min_receive_invisible=1)  # the tests below use 1-2 s leases
    producer = Producer(broker, ["T"])
    producer.startup()
    for i in range(n):
        m = Message()
        m.topic, m.body = "T", str(i).encode()
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.05)
    consumer.startup()
    return broker, consumer


def run_loop(loop: ConsumeLoop, until: Callable[[], bool], what: str) -> None:
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    try:
        poll(until, 30, what, interval=0.01)
    finally:
        loop.stop()
        t.join(30)
    assert not t.is_alive()


def test_loop_gives_the_client_whole_seconds_for_leases_and_backoff():
    broker, raw = embedded(2)
    strict = StrictSeconds(raw)
    release = threading.Event()

    def handler(msg: Any) -> None:
        if msg.body == b"0" and msg.delivery_attempt == 1:
            raise RuntimeError("first attempt fails")  # backoff: change_invisible_duration
        if msg.body == b"1":
            release.wait(5)  # held past the renewal margin: the lease is renewed

    loop = ConsumeLoop(strict, handler, invisible_duration=1.5, renew_margin=1.2,
                       retry_backoff=lambda attempt: 0.25, workers=2)
    def renewed_and_retried() -> bool:
        if loop.statistics().leases_extended >= 1 and loop.statistics().acked >= 1:
            release.set()
        return loop.statistics().acked == 2

    run_loop(loop, renewed_and_retried, "a renewal and a retry")
    assert all(type(d) is int and d >= 1 for d in strict.durations), strict.durations
    assert loop.statistics().receive_errors == 0 and loop.statistics().lease_errors == 0 and loop.statistics().ack_errors == 0
    assert loop.statistics().retry_scheduled == 1


class Unreachable:
    """A 5.x-like client whose receives fail until its settings are sent again."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.announced: list[Any] = []
        self.route_manager = self

    def get_all_endpoints(self) -> dict[str, str]:
        return {"127.0.0.1:8081": "endpoints"}

    def on_new_endpoints(self, endpoints: Any) -> None:
        self.announced.append(endpoints)

    def receive(self, n: int, invisible: Any) -> Any:
        if not self.announced:
            raise RuntimeError("50001, settings is null")  # what the restarted proxy answers
        return self.consumer.receive(n, invisible)

    def ack(self, msg: Any) -> None:
        self.consumer.ack(msg)

    def change_invisible_duration(self, msg: Any, seconds: Any) -> None:
        self.consumer.change_invisible_duration(msg, seconds)


def test_failing_receives_re_announce_the_client_settings():
    broker, raw = embedded(10)
    client = Unreachable(raw)
    loop = ConsumeLoop(client, lambda m: None, workers=2)
    run_loop(loop, lambda: loop.statistics().acked == 10, "the loop recovered")
    assert loop.statistics().receive_errors == 3 and loop.statistics().resyncs == 1 and client.announced == ["endpoints"]


def test_slow_acks_bound_what_is_handled_but_not_acked():
    broker, raw = embedded(300)
    workers, ack_threads = 8, 2
    pile: list[int] = []

    class SlowAcks(StrictSeconds):
        def ack(self, msg: Any) -> None:
            threading.Event().wait(0.005)  # a broker slower to ack than handlers are to finish
            self.consumer.ack(msg)

    loop = ConsumeLoop(SlowAcks(raw), lambda m: None, workers=workers, ack_threads=ack_threads)

    def sample() -> bool:
        pile.append(loop.statistics().received - loop.statistics().acked)
        return loop.statistics().acked == 300

    run_loop(loop, sample, "every message acked")
    # without the bound the pile grew to hundreds: every one a duplicate if the consumer died
    assert max(pile) <= workers + ack_threads + 1, max(pile)
