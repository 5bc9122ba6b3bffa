"""Record the fleet bench's push mode on the real broker as a promtool test of rmqtrace-fleet.yml.

    PYTHONPATH=. python dashboards/prometheus/tests/record_fleet_incident.py   # ~20 min, rewrites fleet_incident_test.yml

Needs the local RocketMQ (``services/rocketmq/rmq.sh start``) and the 5.x client. A consumer group
of 3 member processes x 2 workers gets one job after another, as the test platform of issue #32
sends them, each job through ``tracer.tools.bench.fleet.run_fleet`` (a fresh topic and group, the
whole job waiting in the broker, then the members told to go; each member serves its
``rmqtrace_consumer_*`` series on a loopback port, the same ports for every job): for
``--push-minutes`` as ``push_consumer`` (the official ``PushConsumer``, its cache watched), then
for ``--replacement-minutes`` as ``push_replacement`` (``DemandPushConsumer``, the fix). It scrapes
every member every ``--interval`` seconds as Prometheus would (labels ``job="fleet"``,
``instance="<mode>-<i>"``; every job's group renamed ``fleet-<mode>``, one consumer group that
takes job after job; a member between two jobs gets a staleness marker, as a failed scrape
writes) and writes a promtool test whose ``input_series`` are those samples, with checks derived
from the phases' times and the rule's ``for:``, not from what the alerts did:

* ``RmqtraceFleetHeadOfLineBlocking`` fires for ``fleet-push_consumer`` during its phase, and not
  before its ``for:`` could have passed;
* for ``fleet-push_replacement`` no head-of-line alert (fleet or in-process) in any state and
  nothing firing, every minute of its phase.

Why a stream of short jobs: a job's messages wait in the caches of whichever push consumers
received them first while the others idle, but only until their invisible time runs out (about a
minute and a half on the local 5.5 proxy); after that the broker hands them out again. One
job of 100 messages of 24-44 s (recorded first) showed no head-of-line time worth an alert: the
copies came back to every member (30 handled twice, up to 647 cached copies per member), every
worker stayed busy. The head-of-line time of the incident is a job's first minute, again and
again. Time is real, so the shipped windows and ``for:`` apply unchanged.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tracer.tools.bench.fleet import FleetRun, run_fleet

HERE = Path(__file__).resolve().parent
OUT = HERE / "fleet_incident_test.yml"
RULES = HERE.parent / "rmqtrace-fleet.yml"
ALERT = "RmqtraceFleetHeadOfLineBlocking"
MODES = ("push_consumer", "push_replacement")
INSTANCES, WORKERS = 3, 2


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alert_for_s() -> int:
    doc = yaml.safe_load(RULES.read_text())
    rule = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == ALERT)
    text = str(rule["for"])
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


class Scraper:
    """Scrapes every member's /metrics every ``interval`` seconds on its own thread."""

    def __init__(self, targets: dict[str, tuple[str, int]], interval: float) -> None:
        self.targets = targets  # instance name -> (mode, port)
        self.interval = interval
        self.groups: dict[str, str] = {}  # real consumer group -> fleet-<mode>
        self.series: dict[str, dict[int, float]] = {}
        self.seen: dict[str, set[int]] = {name: set() for name in targets}
        self.n = 0
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def now_index(self) -> int:
        return int((time.monotonic() - self.t0) / self.interval)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._scrape(self.n)
            self.n += 1
            self._stop.wait(max(0.0, self.t0 + self.n * self.interval - time.monotonic()))

    def _scrape(self, k: int) -> None:
        for name, (mode, port) in self.targets.items():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                continue  # a failed scrape: its series get a staleness marker when written
            self.seen[name].add(k)
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    if not s.name.startswith("rmqtrace_consumer_") or s.name.endswith("_created"):
                        continue
                    labels = {**s.labels, "job": "fleet", "instance": name}
                    if "consumer_group" in labels:
                        labels["consumer_group"] = f"fleet-{mode}"
                    body = ",".join(f'{k_}="{v}"' for k_, v in sorted(labels.items()))
                    self.series.setdefault(f"{s.name}{{{body}}}", {})[k] = float(s.value)


def _with_staleness(points: dict[int, float], n: int) -> str:
    """promtool's notation (``_`` no sample, ``aXn`` n+1 equal values) with Prometheus' staleness
    marker at the first missed scrape after a sample, as a failed scrape writes one."""
    out: list[str] = []
    for k in range(n):
        if k in points:
            v = points[k]
            out.append(f"{v:.10g}" if v != int(v) or abs(v) >= 1e15 else str(int(v)))
        else:
            out.append("stale" if out and out[-1] not in ("_", "stale") else "_")
    packed: list[str] = []
    i = 0
    while i < len(out):
        j = i
        while j + 1 < len(out) and out[j + 1] == out[i] and out[i] not in ("_", "stale"):
            j += 1
        packed.append(out[i] if j == i else f"{out[i]}x{j - i}")
        i = j + 1
    return " ".join(packed)


def checks(phases: dict[str, tuple[int, int]], interval: float, for_s: int) -> list[dict[str, Any]]:
    def at(k: int) -> str:
        return f"{k * interval:g}s"

    push_start, push_end = phases["push_consumer"]
    rep_start, rep_end = phases["push_replacement"]
    push = f'ALERTS{{alertname="{ALERT}",alertstate="firing",consumer_group="fleet-push_consumer"}}'
    minute = max(1, int(60 / interval))
    tests: list[dict[str, Any]] = [
        # firing at some evaluation of the push phase: job after job, one member holds cached
        # messages while the others have nothing to start
        {"expr": f"max(max_over_time({push}[{(push_end - push_start) * interval:g}s]))", "eval_time": at(push_end),
         "exp_samples": [{"labels": "{}", "value": 1}]},
        # and not before its for: could have run out
        {"expr": push, "eval_time": at(min(push_start + int(for_s / interval), push_end) - 1), "exp_samples": []},
    ]
    for k in [*range(rep_start, rep_end + 1, minute), rep_end]:
        for alertname in (ALERT, "RmqtraceConsumerHeadOfLineBlocking"):
            tests.append({"expr": f'ALERTS{{consumer_group="fleet-push_replacement",alertname="{alertname}"}}',
                          "eval_time": at(k), "exp_samples": []})
        tests.append({"expr": 'ALERTS{consumer_group="fleet-push_replacement",alertstate="firing"}',
                      "eval_time": at(k), "exp_samples": []})
    return tests


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--messages", type=int, default=40, help="messages per job")
    p.add_argument("--seconds", type=float, nargs=2, default=(0.5, 1.5), help="a message's handler time range")
    p.add_argument("--push-minutes", type=float, default=12.0)
    p.add_argument("--replacement-minutes", type=float, default=6.0)
    p.add_argument("--interval", type=float, default=15.0, help="seconds between scrapes")
    p.add_argument("--seed", type=int, default=32)
    args = p.parse_args(argv)
    for_s = alert_for_s()
    rng = random.Random(args.seed)
    ports = {mode: [free_port() for _ in range(INSTANCES)] for mode in MODES}
    targets = {f"{mode}-{i}": (mode, port) for mode in MODES for i, port in enumerate(ports[mode])}
    scraper = Scraper(targets, args.interval)
    runs: dict[str, list[FleetRun]] = {mode: [] for mode in MODES}
    scraper.start()
    try:
        for mode, minutes in zip(MODES, (args.push_minutes, args.replacement_minutes), strict=True):
            until = time.monotonic() + 60 * minutes
            while time.monotonic() < until:
                job = [round(rng.uniform(*args.seconds), 3) for _ in range(args.messages)]
                run = run_fleet(mode, job, instances=INSTANCES, workers=WORKERS, metrics_ports=ports[mode],
                                timeout=600, linger=1.0)
                runs[mode].append(run)
                s = run.summary()
                print(f"{mode} job {len(runs[mode])}: {s['makespan_s']:.1f} s, per instance {s['messages_per_instance']}, "
                      f"fleet idle-while-held {s['idle_worker_seconds']:.1f} worker-s", file=sys.stderr, flush=True)
        time.sleep(2 * args.interval)  # real-time: staleness markers after the members left
    finally:
        scraper.stop()
    phases: dict[str, tuple[int, int]] = {}
    for mode in MODES:
        seen = sorted(k for name, (m, _) in targets.items() if m == mode for k in scraper.seen[name])
        if not seen:
            raise SystemExit(f"{mode}: no member was ever scraped")
        phases[mode] = (seen[0], seen[-1])
    step = f"{args.interval:g}s"
    doc = {
        "rule_files": ["../rmqtrace-fleet.yml"],
        "group_eval_order": ["rmqtrace.fleet.recording", "rmqtrace.fleet.alerts"],
        "evaluation_interval": step,
        "tests": [{
            "name": "recorded fleet: push consumers, then their replacement, job after job",
            "interval": step,
            "input_series": [{"series": name, "values": _with_staleness(points, scraper.n)}
                             for name, points in sorted(scraper.series.items())],
            "promql_expr_test": checks(phases, args.interval, for_s),
        }],
    }

    def describe(mode: str) -> str:
        sums = [r.summary() for r in runs[mode]]
        held = sum(x["idle_worker_seconds"] for x in sums)
        lone = sum(1 for x in sums if sorted(x["messages_per_instance"])[-1] == args.messages)
        return (f"{mode}: samples {phases[mode][0]}-{phases[mode][1]}, {len(sums)} jobs ({lone} run by one member alone), "
                f"fleet idle-while-held {held:.0f} worker-s, {sum(x['redelivered'] for x in sums)} redelivered")

    head = ("# GENERATED by dashboards/prometheus/tests/record_fleet_incident.py: the fleet bench's push mode and its\n"
            f"# replacement on the real broker, job after job ({args.messages} messages of {args.seconds[0]:g}-"
            f"{args.seconds[1]:g} s each; {INSTANCES} members x {WORKERS} workers), scraped every {args.interval:g} s.\n"
            f"# {describe('push_consumer')}\n# {describe('push_replacement')}\n"
            f"# {ALERT} must fire for fleet-push_consumer during its phase (not before its for:);\n"
            "# for fleet-push_replacement no head-of-line alert and nothing firing. Rerun the script; do not edit.\n")
    args.out.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=10_000))
    print(f"wrote {args.out}: {len(scraper.series)} series x {scraper.n} samples", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
