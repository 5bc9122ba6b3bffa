"""Probes (tracer.clients.probe): the marker, the sender's schedule, the probe series, the shared
settle step on the embedded broker, the dispatcher path (a probe waits for a slot like any message
and never reaches the handler), the CLI, and the probe alert rules (promtool) and dashboard."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services import REPO, ensure_promtool, load_rules, split_alert_expr
from tracer.clients.probe import (
    PROBE_PROPERTY,
    ProbeSender,
    ProbeTrace,
    is_probe,
    probe_stage,
    settle_probe,
    skip_probes,
)
from tracer.dispatch import Dispatcher
from tracer.embedded import EmbeddedBroker, FilterExpression, Message, Producer, SimpleConsumer
from tracer.path.clock import ManualClock
from tracer.path.message import describe
from tracer.path.stages import Outcome, Stage
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.probe_metrics import ProbeMetrics
from tracer.telemetry.tracer import MessageTracer
from tracer.tools.cli import main

TOPIC, GROUP = "jobs", "workers"
PROBE_RULES = REPO / "dashboards" / "prometheus" / "rmqtrace-probe.yml"
PROBE_RULE_TESTS = REPO / "dashboards" / "prometheus" / "tests" / "probe_test.yml"
PROBE_DASHBOARD = REPO / "dashboards" / "grafana" / "rmqtrace-probe-dashboard.json"


def value(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


# -- the marker ----------------------------------------------------------------------------------
class _Legacy:
    def __init__(self, props: dict[str, bytes]) -> None:
        self._props = props

    def get_property(self, key: str) -> bytes:
        return self._props.get(key, b"")


class _Hostile:
    @property
    def properties(self) -> Any:
        raise RuntimeError("no")


def test_is_probe_reads_every_kind_of_message_and_never_raises() -> None:
    m = Message()
    assert not is_probe(m)
    m.add_property(PROBE_PROPERTY, "1")
    assert is_probe(m) and is_probe(m.properties) and is_probe(describe(m))
    assert is_probe(_Legacy({PROBE_PROPERTY: b"1"})) and not is_probe(_Legacy({}))
    assert not is_probe(_Hostile()) and not is_probe(None) and not is_probe({PROBE_PROPERTY: ""})


# -- the series ----------------------------------------------------------------------------------
def test_probe_metrics_record_every_gap_up_to_the_handler_start_and_the_last_seen_time() -> None:
    reg = CollectorRegistry()
    m = ProbeMetrics(reg)
    s = 1_800_000_000_000_000_000
    times = [s, s + 2_000_000, s + 5_000_000, s + 7_000_000, s + 10_000_000, s + 10_000_000]
    reading = m.record(TOPIC, GROUP, times, s + 10_000_000)
    lab = {"topic": TOPIC, "consumer_group": GROUP}
    assert reading.gaps == pytest.approx({"send": 0.002, "broker_wait": 0.003, "client_buffer": 0.002,
                                          "dispatch_wait": 0.003, "consumer_wait": 0.005, "end_to_end": 0.010})
    assert value(reg, "rmqtrace_probe_stage_duration_seconds_count", stage="consumer_wait", **lab) == 1
    assert value(reg, "rmqtrace_probe_stage_duration_seconds_count", stage="handler", **lab) is None
    assert value(reg, "rmqtrace_probe_last_stage_duration_seconds", stage="dispatch_wait", **lab) == pytest.approx(0.003)
    assert value(reg, "rmqtrace_probe_last_seen_timestamp_seconds", **lab) == pytest.approx(1_800_000_000.01)
    assert value(reg, "rmqtrace_probe_received_total", **lab) == 1
    assert m.latest()[(TOPIC, GROUP)] == reading
    # nothing of it in the real messages' series
    assert "rmqtrace_stage_duration_seconds" not in generate_latest(reg).decode()


def test_probe_metrics_one_per_registry() -> None:
    reg = CollectorRegistry()
    first = ProbeMetrics.shared(reg)
    assert ProbeMetrics.shared(reg) is first
    with pytest.raises(ValueError, match="already holds rmqtrace.s ProbeMetrics series"):
        ProbeMetrics(reg)
    first.unregister()
    ProbeMetrics(reg)  # room again


# -- the sender ----------------------------------------------------------------------------------
class _Schedule:
    """A manual monotonic clock whose sleep moves it; every sleep is recorded."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(round(s, 6))
        self.now += s


class _SlowProducer:
    """Each send takes ``cost`` seconds on the schedule; the ones in ``fail`` raise."""

    def __init__(self, sched: _Schedule, cost: float, fail: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.sched, self.cost, self.fail = sched, cost, fail
        self.sent: list[Message] = []

    def send(self, msg: Message) -> None:
        self.sched.now += self.cost
        if len(self.sent) + 1 in self.fail:
            self.sent.append(msg)
            raise ConnectionError("broker away")
        self.sent.append(msg)


def test_sender_keeps_a_fixed_schedule_counts_failures_and_marks_every_probe() -> None:
    sched = _Schedule()
    clock = ManualClock()
    reg = CollectorRegistry()
    producer = _SlowProducer(sched, cost=0.25, fail={2})
    sender = ProbeSender(producer, "probes", Message, interval=1.0, metrics=ProbeMetrics(reg), clock=clock,
                         monotonic=sched.monotonic, sleep=sched.sleep)
    assert sender.run(count=4) == 3
    assert sched.sleeps == [0.75, 0.75, 0.75]  # a slow send does not push the next one back
    assert sender.failed == 1
    assert all(is_probe(m) and m.topic == "probes" for m in producer.sent)
    assert producer.sent[0].properties["rmqtrace_produce_ns"] == str(clock.now_ns())
    assert value(reg, "rmqtrace_probe_sent_total", topic="probes", outcome="success") == 3
    assert value(reg, "rmqtrace_probe_sent_total", topic="probes", outcome="failure") == 1
    assert value(reg, "rmqtrace_probe_last_sent_timestamp_seconds", topic="probes") == pytest.approx(clock.now_ns() / 1e9)


def test_sender_that_falls_behind_restarts_its_schedule_and_stop_ends_run() -> None:
    sched = _Schedule()
    producer = _SlowProducer(sched, cost=2.5)
    sender = ProbeSender(producer, "probes", Message, interval=1.0, monotonic=sched.monotonic, sleep=sched.sleep)
    assert sender.run(count=3) == 3
    assert sched.sleeps == [0.0, 0.0]  # no burst to catch up

    stopping = ProbeSender(producer, "probes", Message, interval=1.0, monotonic=sched.monotonic,
                           sleep=lambda s: stopping.stop())
    assert stopping.run() == 1


@pytest.mark.parametrize("kwargs, match", [
    ({"interval": 0}, "interval must be"), ({"interval": float("nan")}, "interval must be"),
    ({"interval": float("inf")}, "interval must be"), ({"topic": ""}, "topic must be"),
])
def test_sender_refuses_arguments_that_cannot_work(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"topic": "probes", **kwargs}
    with pytest.raises(ValueError, match=match):
        ProbeSender(object(), args.pop("topic"), Message, **args)
    with pytest.raises(ValueError, match="count must be"):
        ProbeSender(object(), "probes", Message).run(count=0)


# -- the shared settle step, through a small seam on the embedded broker ----------------------------
def _pipeline(clock: ManualClock | None = None) -> tuple[EmbeddedBroker, Producer, SimpleConsumer]:
    broker = EmbeddedBroker(min_receive_invisible=0)
    producer = Producer(broker, [TOPIC])
    producer.startup()
    consumer = SimpleConsumer(broker, GROUP, {TOPIC: FilterExpression()}, await_duration=0)
    consumer.startup()
    return broker, producer, consumer


def _harness_consume(tracer: MessageTracer, consumer: SimpleConsumer, handler: Any) -> int:
    """The smallest seam: receive, trace, the shared settle step, else the handler; ack either way."""
    n = 0
    for m in consumer.receive(32, 10):
        trace = tracer.start_message(describe(m))
        if not settle_probe(tracer, trace):
            with trace.handler_scope():
                handler(m)
            trace.finish(Outcome.SUCCESS)
        consumer.ack(m)
        n += 1
    return n


def test_settle_probe_on_the_embedded_broker_acks_skips_the_handler_and_keeps_real_series_clean() -> None:
    broker, producer, consumer = _pipeline()
    reg = CollectorRegistry()
    tracer = MessageTracer(consumer_group=GROUP, metrics=TracerMetrics(reg))
    sender = ProbeSender(producer, TOPIC, Message, interval=1.0, sleep=lambda s: None)
    sender.run(count=2)
    real = Message()
    real.topic, real.body = TOPIC, b"order-1"
    producer.send(real)
    handled: list[bytes] = []
    assert _harness_consume(tracer, consumer, lambda m: handled.append(m.body)) == 3
    assert handled == [b"order-1"]
    lab = {"topic": TOPIC, "consumer_group": GROUP}
    assert value(reg, "rmqtrace_probe_received_total", **lab) == 2
    assert value(reg, "rmqtrace_probe_stage_duration_seconds_count", stage="broker_wait", **lab) == 2
    assert value(reg, "rmqtrace_messages_total", outcome="success", **lab) == 1  # the real one only
    assert value(reg, "rmqtrace_stage_duration_seconds_count", stage="broker_wait", **lab) == 1
    assert broker.backlog(GROUP, TOPIC) == 0 and consumer.receive(32, 10) == []  # acked, not redelivered


def test_settle_probe_is_false_for_real_messages_and_without_a_trace() -> None:
    tracer = MessageTracer(consumer_group=GROUP)
    real = Message()
    real.topic = TOPIC
    assert not settle_probe(tracer, tracer.start_message(describe(real)))
    assert not settle_probe(tracer, None) and not settle_probe(None, None)


def test_settle_probe_without_tracer_metrics_records_nothing_but_still_settles() -> None:
    tracer = MessageTracer(consumer_group=GROUP)
    m = ProbeSender(object(), TOPIC, Message).message()
    assert settle_probe(tracer, tracer.start_message(describe(m)))


# -- the dispatcher path: a probe waits for a slot like any message --------------------------------
def test_a_probe_behind_a_busy_worker_shows_the_dispatch_wait_and_never_runs_the_handler() -> None:
    clock = ManualClock()
    reg = CollectorRegistry()
    tracer = MessageTracer(consumer_group=GROUP, metrics=TracerMetrics(reg), clock=clock)
    started, release = threading.Event(), threading.Event()
    handled: list[Any] = []

    def handler(m: Any) -> None:
        handled.append(m)
        started.set()
        assert release.wait(10)

    done = threading.Event()
    outcomes: list[Outcome] = []

    def on_done(m: Any, outcome: Outcome, error: BaseException | None) -> None:
        outcomes.append(outcome)
        if len(outcomes) == 2:
            done.set()

    d: Dispatcher[Any] = Dispatcher(skip_probes(handler), policy="round_robin", workers=1, on_done=on_done, clock=clock)
    try:
        real = Message()
        real.topic = TOPIC
        d.submit(real, tracer.start_message(describe(real)))
        assert started.wait(10)
        probe = ProbeSender(object(), TOPIC, Message, clock=clock).message()
        ptrace = probe_stage(tracer, tracer.start_message(describe(probe)))
        assert isinstance(ptrace, ProbeTrace)
        assert d.submit(probe, ptrace, timeout=0)  # into the busy worker's buffer
        clock.advance_s(2.0)
        release.set()
        assert done.wait(10)
    finally:
        d.close()
    assert handled == [real] and outcomes == [Outcome.SUCCESS, Outcome.SUCCESS]
    lab = {"topic": TOPIC, "consumer_group": GROUP}
    assert value(reg, "rmqtrace_probe_last_stage_duration_seconds", stage="dispatch_wait", **lab) == pytest.approx(2.0)
    assert value(reg, "rmqtrace_probe_last_stage_duration_seconds", stage="consumer_wait", **lab) == pytest.approx(2.0)
    assert value(reg, "rmqtrace_messages_total", outcome="success", **lab) == 1  # the probe is not a message


def test_probe_stage_leaves_real_traces_alone() -> None:
    tracer = MessageTracer()
    real = Message()
    t = tracer.start_message(describe(real))
    assert probe_stage(tracer, t) is t and probe_stage(None, t) is t and probe_stage(tracer, None) is None


# -- the CLI -------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--interval", "0"], "--interval"), (["--interval", "x"], "--interval"), (["--count", "0"], "--count"),
    (["--topic", ""], "--topic"), (["--endpoint", "nohost"], "--endpoint"), (["--metrics-port", "70000"], "--metrics-port"),
    (["--bogus"], "--bogus"),
])
def test_probe_cli_bad_arguments_are_one_line_and_status_2(argv: list[str], needle: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        rc = main(["probe", *argv])
        raise SystemExit(rc)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and err.startswith("rmqtrace probe: error:"), err


def test_probe_cli_embedded_demo_sends_settles_and_never_calls_the_handler(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--embedded", "--count", "3", "--interval", "0.01"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"probe \d+: consumer_wait ", out)) == 3, out
    assert "handler called 0 times" in out and "3 probes acked" in out, out


# -- alert rules and dashboard ---------------------------------------------------------------------
def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ensure_promtool(), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def _exported() -> dict[str, set[str]]:
    reg = CollectorRegistry()
    m = ProbeMetrics(reg)
    m.record("T", "G", [1_800_000_000_000_000_000 + i for i in range(len(Stage))], 1_800_000_000_000_000_000)
    m.sent_one("T", True, 1)
    m.sent_one("T", False, 1)
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


_SELECTOR = re.compile(r"\b(rmqtrace_[A-Za-z0-9_]+)\s*(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"')


def _check_expr(where: str, expr: str, names: dict[str, set[str]]) -> None:
    used = _SELECTOR.findall(expr)
    assert used, where
    for metric, body in used:
        assert metric in names, f"{where}: {metric} is not exported"
        for label in _MATCHER.findall(body or ""):
            assert label[0] in names[metric] | {"job", "instance"}, f"{where}: {metric} has no {label[0]}"


def test_probe_rules_pass_promtool_check_and_their_unit_tests() -> None:
    proc = promtool("check", "rules", str(PROBE_RULES))
    assert proc.returncode == 0 and f"SUCCESS: {len(load_rules(PROBE_RULES))} rules found" in proc.stdout, proc.stdout
    proc = promtool("test", "rules", PROBE_RULE_TESTS.name, cwd=PROBE_RULE_TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_probe_alert_has_firing_pending_and_quiet_cases_and_the_house_shape() -> None:
    doc = yaml.safe_load(PROBE_RULE_TESTS.read_text())
    assert doc["rule_files"] == ["../rmqtrace-probe.yml"]
    firing, quiet, pending = set(), set(), set()
    for case in doc["tests"]:
        for t in case.get("alert_rule_test", []):
            (firing if t["exp_alerts"] else quiet).add(t["alertname"])
        for t in case.get("promql_expr_test", []):
            for sample in t.get("exp_samples") or []:
                m = re.search(r'alertname="(\w+)",alertstate="pending"', sample["labels"])
                if m:
                    pending.add(m[1])
    alerts = [r for r in load_rules(PROBE_RULES) if "alert" in r]
    names = {r["alert"] for r in alerts}
    assert names == {"RmqtraceProbeConsumerWaitHigh", "RmqtraceProbeNotSeen"}
    assert names <= firing and names <= quiet and names <= pending
    exported = _exported()
    for r in alerts:
        split_alert_expr(r["expr"])
        _check_expr(r["alert"], r["expr"], exported)
        assert r["labels"]["severity"] in ("warning", "info", "critical")
        assert {"summary", "description", "runbook"} <= set(r["annotations"])


def test_probe_dashboard_reads_only_exported_series() -> None:
    d = json.loads(PROBE_DASHBOARD.read_text())
    exported = _exported()
    targets = [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]
    assert len(targets) >= 3
    for where, expr in targets:
        _check_expr(where, expr, exported)
    for p in d["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    # the dashboard's expressions are the ones the promtool tests evaluate on synthetic series
    tested = {" ".join(t["expr"].split()) for case in yaml.safe_load(PROBE_RULE_TESTS.read_text())["tests"]
              for t in case.get("promql_expr_test", [])}
    for where, expr in targets:
        flat = " ".join(expr.replace("$topic", ".*").replace("$consumer_group", ".*").split())
        flat = flat.replace("$__rate_interval", "5m")
        assert flat in tested, f"{where}: not evaluated by {PROBE_RULE_TESTS.name}: {flat}"


def test_sender_check_first_raises_the_first_failure_and_counts_it() -> None:
    sched = _Schedule()
    reg = CollectorRegistry()
    sender = ProbeSender(_SlowProducer(sched, 0.0, fail={1}), "probes", Message, metrics=ProbeMetrics(reg),
                         monotonic=sched.monotonic, sleep=sched.sleep)
    with pytest.raises(ConnectionError):
        sender.run(count=2, check_first=True)
    assert sender.failed == 1 and value(reg, "rmqtrace_probe_sent_total", topic="probes", outcome="failure") == 1


# -- the seams -----------------------------------------------------------------------------------
def _send_probes_and_one_real(producer: Producer, n: int) -> None:
    sender = ProbeSender(producer, TOPIC, Message)
    for _ in range(n):
        assert sender.send_one()
    real = Message()
    real.topic, real.body = TOPIC, b"order-1"
    producer.send(real)


def test_consume_loop_settles_probes_acks_them_and_hands_only_real_messages_to_the_handler() -> None:
    from tracer.clients.consume import ConsumeLoop

    broker, producer, consumer = _pipeline()
    reg = CollectorRegistry()
    handled: list[bytes] = []
    loop = ConsumeLoop(consumer, lambda m: handled.append(m.body),
                       tracer=MessageTracer(consumer_group=GROUP, metrics=TracerMetrics(reg)), workers=2)
    _send_probes_and_one_real(producer, 3)
    runner = threading.Thread(target=loop.run, kwargs={"until": lambda s: s.acked >= 4}, daemon=True)
    runner.start()
    runner.join(30)
    assert not runner.is_alive()
    lab = {"topic": TOPIC, "consumer_group": GROUP}
    assert handled == [b"order-1"]
    assert loop.statistics().acked == 4 and loop.statistics().failed == 0
    assert value(reg, "rmqtrace_probe_received_total", **lab) == 3
    assert value(reg, "rmqtrace_probe_stage_duration_seconds_count", stage="dispatch_wait", **lab) == 3
    assert value(reg, "rmqtrace_messages_total", outcome="success", **lab) == 1
    assert broker.backlog(GROUP, TOPIC) == 0


def test_traced_listener_returns_success_for_a_probe_without_calling_the_listener() -> None:
    from rocketmq import ConsumeResult

    from tracer.clients.official import TracedListener

    reg = CollectorRegistry()
    calls: list[Any] = []

    class Listener:
        def consume(self, msg: Any) -> Any:
            calls.append(msg)
            return ConsumeResult.SUCCESS

    traced = TracedListener(Listener(), MessageTracer(consumer_group=GROUP, metrics=TracerMetrics(reg)))
    probe = ProbeSender(object(), TOPIC, Message).message()
    assert traced.consume(probe) is ConsumeResult.SUCCESS and calls == []
    real = Message()
    real.topic = TOPIC
    assert traced.consume(real) is ConsumeResult.SUCCESS and calls == [real]
    lab = {"topic": TOPIC, "consumer_group": GROUP}
    assert value(reg, "rmqtrace_probe_received_total", **lab) == 1
    assert value(reg, "rmqtrace_messages_total", outcome="success", **lab) == 1


class _LegacyReceived:
    """A 2.x ReceivedMessage: properties only through get_property (bytes, b'' when absent)."""

    def __init__(self, props: dict[str, str]) -> None:
        self.id, self.topic, self.tags, self.keys, self.body = "M1", TOPIC, b"", b"", b"x"
        self.reconsume_times, self.store_timestamp = 0, 0
        self._props = {k: v.encode() for k, v in props.items()}

    def get_property(self, prop: str) -> bytes:
        return self._props.get(prop, b"")


def test_legacy_callback_returns_consume_success_for_a_probe_without_calling_the_callback() -> None:
    from tracer.clients.legacy import traced_callback

    reg = CollectorRegistry()
    calls: list[Any] = []
    wrapped = traced_callback(lambda m: calls.append(m) or 0, MessageTracer(consumer_group=GROUP,
                                                                            metrics=TracerMetrics(reg)))
    probe = ProbeSender(object(), TOPIC, Message).message()
    assert wrapped(_LegacyReceived(probe.properties)) == 0 and calls == []  # 0 == ConsumeStatus.CONSUME_SUCCESS
    wrapped(_LegacyReceived({}))
    assert len(calls) == 1
    assert value(reg, "rmqtrace_probe_received_total", topic=TOPIC, consumer_group=GROUP) == 1


def test_traced_simple_consumer_acks_probes_on_receive_and_returns_only_real_messages() -> None:
    from tracer.clients.official import TracedSimpleConsumer

    broker, producer, consumer = _pipeline()
    reg = CollectorRegistry()
    traced = TracedSimpleConsumer(consumer, MessageTracer(consumer_group=GROUP, metrics=TracerMetrics(reg)))
    _send_probes_and_one_real(producer, 2)
    got = traced.receive(32, 10)
    assert [m.body for m in got] == [b"order-1"]
    traced.ack(got[0])
    assert value(reg, "rmqtrace_probe_received_total", topic=TOPIC, consumer_group=GROUP) == 2
    assert broker.backlog(GROUP, TOPIC) == 0 and consumer.receive(32, 10) == []
