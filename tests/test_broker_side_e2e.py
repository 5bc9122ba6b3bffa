"""The two silent incidents, on the real broker: the broker's own exporter (127.0.0.1:5557), scraped
with a real consumer's ``/metrics`` by a Prometheus started through prom.sh, its alerts routed by
the real Alertmanager (am.sh, the shipped config with the receiver URL swapped) to a webhook here.

* **Wedged consumer**: a ``ConsumeLoop`` (2 workers) whose handler finishes two messages, then
  hangs on every call. Nothing else finishes, so rmqtrace's histograms stop; the broker's lag
  latency keeps growing and RmqtraceBrokerLagLatencyHigh arrives at the webhook.
* **Wedged push consumer** (the official ``PushConsumer``, 2 threads, its cache watched): both
  threads hang, the rest of the batch waits unstarted in its cache, and RmqtraceConsumerStalled
  (rmqtrace's oldest unstarted age) arrives. The broker sees no lag here: it counts the cached
  (received, unacked) messages as consumed until their invisible time ends.
* **No consumer**: a group consumed (and acked) a few messages, then its consumer went away; new
  messages are ready and nothing pulls them. RmqtraceBrokerNoConsumer arrives; no rmqtrace
  consumer-side series of that group exists to raise anything.

Rules: the shipped rmqtrace-broker.yml, rmqtrace-alerts.yml, rmqtrace-fleet.yml and
rmqtrace-probe.yml with every `for:` at 1 s, the broker lag-latency threshold at 4 s and the stalled
threshold at 3 s (a run of seconds, not minutes); expressions otherwise as shipped. Every broker recording rule and every
query of the main dashboard's broker row must return data from this run.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client import CollectorRegistry, start_http_server
from rmq_real import (
    ENDPOINT,
    client,
    configuration,
    ensure_broker,
    fresh_group,
    fresh_topic,
    message,
    quietly,
    start_producer,
    start_simple,
)
from test_alertmanager_e2e import AM_SH, _Receiver, _start_alertmanager
from waiting import wait_until

from services import REPO, RULES, Prometheus, free_port, load_rules, render_rule_variant, start_prometheus
from tracer.clients.consume import ConsumeLoop
from tracer.clients.official import TracedListener
from tracer.clients.pushcache import watch_push_cache
from tracer.dispatch import DispatchMetrics
from tracer.report.broker_side import fetch_backlog
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.occupancy import OccupancyMetrics
from tracer.telemetry.tracer import MessageTracer
from tracer.tools.cli import main as cli_main

pytestmark = pytest.mark.integration

PROM_DIR = REPO / "dashboards" / "prometheus"
BROKER_RULES = PROM_DIR / "rmqtrace-broker.yml"
CONSUMER_RULES = (RULES, PROM_DIR / "rmqtrace-fleet.yml", PROM_DIR / "rmqtrace-probe.yml")
DASHBOARD = REPO / "dashboards" / "grafana" / "rmqtrace-dashboard.json"
BROKER_EXPORTER = "127.0.0.1:5557"  # metricsPromExporterPort in services/rocketmq/conf/broker.conf
LAG_THRESHOLD_S = 4.0
STALLED = {"RmqtraceConsumerStalled": 3.0}
WORKERS = 2


def _alerts_for(receiver: _Receiver, group: str) -> list[dict[str, Any]]:
    return [a for a in receiver.alerts() if a["labels"].get("consumer_group") == group]


@pytest.fixture(scope="module")
def incidents() -> Iterator[dict[str, Any]]:
    ensure_broker()
    tmp = Path(tempfile.mkdtemp(prefix="rmqtrace-broker-side-"))
    receiver = _Receiver()
    am_env: dict[str, str] | None = None
    prom: Prometheus | None = None
    closers: list[Any] = []
    release = threading.Event()
    try:
        am_port, am_env = _start_alertmanager(tmp / "alertmanager", receiver.url)
        rules = [render_rule_variant(tmp / "broker.test.yml", for_="1s", src=BROKER_RULES,
                                     thresholds={"RmqtraceBrokerLagLatencyHigh": LAG_THRESHOLD_S})]
        rules += [render_rule_variant(tmp / f"{src.stem}.test.yml", for_="1s", src=src,
                                      thresholds=STALLED if src.name == "rmqtrace-fleet.yml" else None)
                  for src in CONSUMER_RULES]
        registry = CollectorRegistry()
        app_port = free_port()
        server, _ = start_http_server(app_port, addr="127.0.0.1", registry=registry)
        closers.append(server.shutdown)
        prom = start_prometheus([f"127.0.0.1:{app_port}"], rules, state_dir=tmp / "prom",
                                broker_targets=[BROKER_EXPORTER], alertmanagers=[f"127.0.0.1:{am_port}"])

        # -- no consumer: consume and ack three, go away, then five more arrive ----------------
        t_none, g_none = fresh_topic("bs-none"), fresh_group("bs-none")
        producer = start_producer(t_none)
        closers.append(lambda: quietly(producer.shutdown))
        gone = start_simple(g_none, t_none)
        for i in range(3):
            producer.send(message(t_none, f"early-{i}"))
        acked = 0
        deadline = time.monotonic() + 20
        while acked < 3 and time.monotonic() < deadline:
            for m in gone.receive(16, 10):
                gone.ack(m)
                acked += 1
        gone.shutdown()
        assert acked == 3
        for i in range(5):
            producer.send(message(t_none, f"late-{i}"))

        # -- wedged: a ConsumeLoop whose handler finishes two messages, then hangs --------------
        t_wedge, g_wedge = fresh_topic("bs-wedge"), fresh_group("bs-wedge")
        metrics, dispatch_metrics = TracerMetrics(registry), DispatchMetrics(registry)
        occupancy_metrics = OccupancyMetrics(registry)
        occupancy = occupancy_metrics.track(g_wedge, WORKERS)
        tracer = MessageTracer(consumer_group=g_wedge, metrics=metrics, occupancy=occupancy)
        calls = [0]
        calls_lock = threading.Lock()

        def handler(_m: Any) -> None:
            with calls_lock:
                calls[0] += 1
                n = calls[0]
            if n == 2:
                time.sleep(2.5)  # real-time: the two successes land in different scrapes: a non-zero rate
            elif n > 2:
                release.wait()  # wedged until teardown

        consumer = start_simple(g_wedge, t_wedge)
        loop = ConsumeLoop(consumer, handler, tracer=tracer, workers=WORKERS, invisible_duration=20,
                           dispatch_metrics=dispatch_metrics)
        runner = threading.Thread(target=loop.run, name="broker-side-wedged", daemon=True)
        runner.start()

        def stop_loop() -> None:
            release.set()
            loop.stop(10)
            runner.join(15)
            quietly(consumer.shutdown)

        closers.append(stop_loop)
        # -- wedged push consumer: both threads hang, the rest waits in its cache ------------------
        t_push, g_push = fresh_topic("bs-push"), fresh_group("bs-push")
        rmq = client()
        push_occupancy = occupancy_metrics.track(g_push, WORKERS)
        push_tracer = MessageTracer(consumer_group=g_push, metrics=metrics, occupancy=push_occupancy)

        class Hang(rmq.MessageListener):  # type: ignore[misc,name-defined]
            def consume(self, _message: Any) -> Any:
                release.wait()
                return rmq.ConsumeResult.SUCCESS

        push = rmq.PushConsumer(configuration(), g_push, TracedListener(Hang(), push_tracer),
                                {t_push: rmq.FilterExpression()}, consumption_thread_count=WORKERS)
        watch_push_cache(push, push_occupancy)
        push.startup()
        closers.append(lambda: quietly(push.shutdown))  # after release (set first in finally)

        wedge_producer = start_producer(t_wedge)
        closers.append(lambda: quietly(wedge_producer.shutdown))
        push_producer = start_producer(t_push)
        closers.append(lambda: quietly(push_producer.shutdown))
        for i in range(12):
            wedge_producer.send(message(t_wedge, f"w-{i}"))
            push_producer.send(message(t_push, f"p-{i}"))
        t0 = time.time()

        def arrived(group: str, alert: str) -> bool:
            return any(a["labels"]["alertname"] == alert for a in _alerts_for(receiver, group))

        def delivered() -> bool:
            return (arrived(g_wedge, "RmqtraceBrokerLagLatencyHigh") and arrived(g_none, "RmqtraceBrokerNoConsumer")
                    and arrived(g_push, "RmqtraceConsumerStalled"))

        wait_until(delivered, timeout=75, interval=0.5, what="both broker-side alerts at the webhook")
        yield {"prom": prom, "receiver": receiver, "wedged": (t_wedge, g_wedge), "none": (t_none, g_none),
               "push": (t_push, g_push),
               "t0": t0, "arrived": time.time(), "calls": calls[0], "loop": loop}
    finally:
        release.set()
        for close in reversed(closers):
            close()
        if prom is not None:
            prom.stop()
        if am_env is not None:
            subprocess.run(["bash", str(AM_SH), "stop"], env=am_env, capture_output=True, timeout=60)
        receiver.server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def _fired(prom: Prometheus, group: str) -> set[str]:
    """Alert names Prometheus had pending or firing for ``group`` at any point of the run."""
    return {s["metric"]["alertname"] for s in prom.query(f'max_over_time(ALERTS{{consumer_group="{group}"}}[5m])')}


def test_a_wedged_consumer_raises_the_broker_lag_alert(incidents: dict[str, Any]) -> None:
    topic, group = incidents["wedged"]
    got = _alerts_for(incidents["receiver"], group)
    lag = [a for a in got if a["labels"]["alertname"] == "RmqtraceBrokerLagLatencyHigh"]
    assert got[0]["labels"]["alertname"] == "RmqtraceBrokerLagLatencyHigh", got  # the first to arrive
    assert lag and lag[0]["labels"]["topic"] == topic and lag[0]["labels"]["severity"] == "warning"
    assert group in lag[0]["annotations"]["summary"]
    # it was wedged: two finished, the rest hang; the consumer side saw exactly two messages
    assert incidents["calls"] >= 2 + WORKERS
    prom: Prometheus = incidents["prom"]
    done = prom.query(f'sum(rmqtrace_messages_total{{consumer_group="{group}"}})')
    assert [float(s["value"][1]) for s in done] == [2.0]
    fired = _fired(prom, group)
    print(f"wedged: webhook got {sorted({a['labels']['alertname'] for a in got})} "
          f"{incidents['arrived'] - incidents['t0']:.1f} s after the sends; Prometheus had {sorted(fired)}")
    # The demand-driven loop takes no more than its workers can start: nothing waits unstarted in
    # it, so the consumer-side wait and occupancy alerts have nothing to measure.
    assert not fired & {"RmqtraceConsumerWaitHigh", "RmqtraceDispatchShareHigh", "RmqtraceHeadOfLineBlocking",
                        "RmqtraceConsumerHeadOfLineBlocking", "RmqtraceFleetHeadOfLineBlocking"}, fired


def test_a_wedged_push_consumer_raises_the_stalled_alert(incidents: dict[str, Any]) -> None:
    topic, group = incidents["push"]
    got = _alerts_for(incidents["receiver"], group)
    stalled = [a for a in got if a["labels"]["alertname"] == "RmqtraceConsumerStalled"]
    assert stalled and stalled[0]["labels"]["instance"] and group in stalled[0]["annotations"]["summary"]
    prom: Prometheus = incidents["prom"]
    unstarted = prom.query(f'max_over_time(rmqtrace_consumer_unstarted_messages{{consumer_group="{group}"}}[5m])')
    assert unstarted and float(unstarted[0]["value"][1]) >= 1  # the cache held what the hung threads could not start
    fired = _fired(prom, group)
    print(f"wedged push consumer: webhook got {sorted({a['labels']['alertname'] for a in got})}; "
          f"Prometheus had {sorted(fired)}")
    # Not asserted either way: the broker counts what a 5.x (pop) consumer received as consumed
    # until its invisible time ends, so a push consumer that cached the whole backlog shows no
    # broker lag at first (measured: ready, lag and in-flight all 0 with 12 cached messages).
    backlog = fetch_backlog(prom.url, [topic], [group])
    print(f"  broker's view of {group}: {[b.describe() for b in backlog]}")
    # every thread is busy: no idle worker, so neither head-of-line alert
    assert not fired & {"RmqtraceConsumerHeadOfLineBlocking", "RmqtraceFleetHeadOfLineBlocking"}, fired


def test_no_consumer_raises_the_broker_no_consumer_alert(incidents: dict[str, Any]) -> None:
    topic, group = incidents["none"]
    got = _alerts_for(incidents["receiver"], group)
    names = {a["labels"]["alertname"] for a in got}
    assert "RmqtraceBrokerNoConsumer" in names
    a = next(a for a in got if a["labels"]["alertname"] == "RmqtraceBrokerNoConsumer")
    assert a["labels"]["topic"] == topic and a["labels"]["severity"] == "critical"
    assert f"consumer group {group} with no consumer connected" in a["annotations"]["summary"]
    prom: Prometheus = incidents["prom"]
    # nothing of rmqtrace's own exists for the group: only broker-side rules can fire
    assert prom.query(f'{{__name__=~"rmqtrace_.+", consumer_group="{group}"}}') == []
    assert {n for n in _fired(prom, group) if not n.startswith("RmqtraceBroker")} == set()


def test_every_broker_rule_is_recorded_from_the_real_broker(incidents: dict[str, Any]) -> None:
    prom: Prometheus = incidents["prom"]
    t_wedge, g_wedge = incidents["wedged"]
    t_none, g_none = incidents["none"]
    for rule in load_rules(BROKER_RULES):
        if "record" in rule:
            assert prom.query(rule["record"]), f"{rule['record']} was never recorded"
    ready = {s["metric"]["consumer_group"]: float(s["value"][1]) for s in prom.query("rmqtrace:broker_ready_messages")}
    assert ready[g_none] in (5, 6)  # 5 late messages (+ the probe test's probe when it ran first)
    consumers = {s["metric"]["consumer_group"]: float(s["value"][1]) for s in prom.query("rmqtrace:broker_consumers")}
    assert consumers[g_none] == 0 and consumers[g_wedge] >= 1
    # what the two alerts average over 5 minutes: the gone group's ready messages without a consumer
    alone = {s["metric"]["consumer_group"]: float(s["value"][1])
             for s in prom.query(f'rmqtrace:broker_ready_without_consumer{{topic=~"{t_none}|{t_wedge}"}}')}
    assert alone == {g_none: 1, g_wedge: 0}
    connected = {s["metric"]["consumer_group"]: float(s["value"][1])
                 for s in prom.query("rmqtrace:broker_consumer_connected")}
    assert connected[g_none] == 0 and connected[g_wedge] == 1
    # the joins: the wedged group finished two, so a drain time; the gone one finished none here
    drain = prom.query(f'rmqtrace:broker_backlog_drain_seconds{{consumer_group="{g_wedge}", topic="{t_wedge}"}}[5m]')
    assert drain, "no backlog drain time for the wedged group while its rate was > 0"
    unobserved = prom.query(f'rmqtrace:broker_lag_latency_seconds:unobserved{{consumer_group="{g_none}", topic="{t_none}"}}')
    assert unobserved and float(unobserved[0]["value"][1]) > 0


_VAR = re.compile(r'=~"\$(topic|consumer_group)"')


def test_every_broker_row_query_returns_data(incidents: dict[str, Any]) -> None:
    prom: Prometheus = incidents["prom"]
    d = json.loads(DASHBOARD.read_text())
    exprs = [(p["title"], t["refId"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])
             if "rmqtrace:broker_" in t["expr"]]
    assert len(exprs) >= 8
    for title, ref, expr in exprs:
        q = _VAR.sub('=~".*"', expr).replace("$__rate_interval", "1m")
        assert "$" not in q, q
        # a range selector over the run: some series (the drain time) exist only while a rate is > 0
        assert prom.query(f"max_over_time(({q})[5m:1s])"), f"{title} [{ref}]: no data for {q}"


def test_fetch_backlog_reads_the_real_broker_through_prometheus(incidents: dict[str, Any]) -> None:
    prom: Prometheus = incidents["prom"]
    t_none, g_none = incidents["none"]
    t_wedge, g_wedge = incidents["wedged"]
    (gone,) = fetch_backlog(prom.url, [t_none])
    assert (gone.topic, gone.consumer_group, gone.consumers) == (t_none, g_none, 0) and gone.ready_messages in (5, 6)
    assert gone.oldest_ready_s and gone.oldest_ready_s > 1 and gone.lag_latency_s
    (wedged,) = fetch_backlog(prom.url, [t_wedge], [g_wedge])
    assert wedged.consumers >= 1 and (wedged.lag_latency_s or 0) > LAG_THRESHOLD_S
    assert fetch_backlog(prom.url, [t_none], ["no-such-group"]) == []


def test_probe_says_a_backlog_waits_on_the_broker(incidents: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    prom: Prometheus = incidents["prom"]
    t_none, g_none = incidents["none"]
    assert cli_main(["probe", "--endpoint", ENDPOINT, "--topic", t_none, "--count", "1", "--interval", "0.2",
                     "--prometheus", prom.url]) == 0
    out = capsys.readouterr().out
    before = out.split("broker side (before the first probe", 1)[1].splitlines()[1]
    # 5 late messages, plus the probe of another test if it ran first
    assert re.match(rf"  {g_none} on {t_none}: [56] ready \(oldest [\d.]+ s\)", before), out
    assert "0 consumers connected — nothing pulls them" in before
    assert "broker side (after the last probe" in out and "1 probes sent, 0 failed" in out


def test_report_adds_the_broker_side_for_its_groups(incidents: dict[str, Any], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from report_helpers import KNOWN, write_scenario_with_tracer

    prom: Prometheus = incidents["prom"]
    t_none, g_none = incidents["none"]
    rows = tuple(dataclasses.replace(r, group=g_none) for r in KNOWN)
    spans = write_scenario_with_tracer(tmp_path / "spans.jsonl", rows, topic=t_none)
    assert cli_main(["report", str(spans), "--prometheus", prom.url]) == 0
    out = capsys.readouterr().out
    assert f"broker side, now ({prom.url}):" in out
    line = rf"  {g_none} on {t_none}: [56] ready \(oldest [\d.]+ s\).*0 consumers connected — nothing pulls them"
    assert re.search(line, out), out  # 5 late messages, plus the probe test's probe if it ran first
    assert cli_main(["report", str(spans), "--json", "--prometheus", prom.url]) == 0
    out, err = capsys.readouterr()
    json.loads(out)  # still one JSON document; the broker lines went to stderr
    assert re.search(line, err), err
