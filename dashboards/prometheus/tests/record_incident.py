"""Record a real incident run as a promtool test: the alerts must fire in the incident they name.

    PYTHONPATH=. python dashboards/prometheus/tests/record_incident.py            # ~25 min, rewrites incident_test.yml
    PYTHONPATH=. python dashboards/prometheus/tests/record_incident.py --out /tmp/t.yml --groups 20 --case-ms 5 --interval 0.2

It runs the demo's job (``tracer.tools.demo.run_policy``: the embedded broker, the real
``ConsumeLoop``, the real dispatcher and collectors) under round-robin and then under the
aggressive dispatcher, reads this process's registry every ``--interval`` seconds as a scrape
would (labels ``job="demo", instance="recorded"``), and writes a promtool test file whose
``input_series`` are those samples, beside assertions derived from the phases' times, not from
what the alerts did:

* ``RmqtraceHeadOfLineBlocking`` fires for ``demo-round_robin`` by the end of its run and not
  before its ``for:`` could have passed;
* no alert at all exists for ``demo-aggressive`` at any evaluation of its run.

The series kept are the ones the dispatch alerts read (``rmqtrace_dispatch_*``, the
``consumer_wait``/``end_to_end`` stage histograms, ``rmqtrace_messages_total``). Time is real:
``--case-ms 1000`` makes the round-robin run last about the 11 minutes of issue #32, so the real
``for:`` and windows apply unchanged.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from tracer.dispatch import DispatchMetrics
from tracer.telemetry.metrics import TracerMetrics
from tracer.tools.demo import DemoOptions, run_policy
from tracer.tools.workload import make_job

HERE = Path(__file__).resolve().parent
OUT = HERE / "incident_test.yml"
ALERT_FOR_S = 5 * 60  # RmqtraceHeadOfLineBlocking's `for:` (checked against the rule file below)
KEEP = re.compile(r"^(rmqtrace_dispatch_|rmqtrace_messages_total$|rmqtrace_stage_duration_seconds_)")
STAGES = {"consumer_wait", "end_to_end"}


class Recorder:
    """Samples a registry every ``interval`` seconds on its own thread, like a scrape."""

    def __init__(self, registry: CollectorRegistry, interval: float) -> None:
        self.registry = registry
        self.interval = interval
        self.series: dict[str, dict[int, float]] = {}
        self.n = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def now_index(self) -> int:
        """The sample index a moment falls in (0 = the first sample)."""
        return int((time.monotonic() - self.t0) / self.interval)

    def _run(self) -> None:
        while True:
            self._sample(self.n)
            self.n += 1
            # sample k is taken at t0 + k * interval, whatever the time a sample took
            if self._stop.wait(max(0.0, self.t0 + self.n * self.interval - time.monotonic())):
                self._sample(self.n)
                self.n += 1
                return

    def _sample(self, k: int) -> None:
        for fam in self.registry.collect():
            for s in fam.samples:
                if not KEEP.match(s.name) or s.name.endswith("_created"):
                    continue
                if s.labels.get("stage", "consumer_wait") not in STAGES:
                    continue
                labels = {"job": "demo", "instance": "recorded", **s.labels}
                body = ",".join(f'{k_}="{v}"' for k_, v in sorted(labels.items()))
                self.series.setdefault(f"{s.name}{{{body}}}", {})[k] = float(s.value)


def _values(points: dict[int, float], n: int) -> str:
    """promtool's expanding notation: ``_`` before a series exists, ``vxN`` for N+1 equal values."""
    out: list[str] = []
    run: tuple[float | None, int] | None = None

    def flush() -> Iterator[str]:
        if run is None:
            return
        v, count = run
        if v is None:
            yield from ["_"] * count
        else:
            text = f"{v:.10g}" if v != int(v) or abs(v) >= 1e15 else str(int(v))
            yield text if count == 1 else f"{text}x{count - 1}"

    for k in range(n):
        v = points.get(k)
        if run is not None and run[0] == v:
            run = (v, run[1] + 1)
            continue
        out.extend(flush())
        run = (v, 1)
    out.extend(flush())
    return " ".join(out)


def _check_rule() -> None:
    doc = yaml.safe_load((HERE.parent / "rmqtrace-alerts.yml").read_text())
    rule = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "RmqtraceHeadOfLineBlocking")
    if rule["for"] != f"{ALERT_FOR_S // 60}m":
        raise SystemExit(f"RmqtraceHeadOfLineBlocking has for: {rule['for']}; update ALERT_FOR_S")


def record(opts: DemoOptions, interval: float, linger: float) -> tuple[Recorder, dict[str, tuple[int, int]]]:
    registry = CollectorRegistry()
    metrics, dispatch_metrics = TracerMetrics(registry), DispatchMetrics(registry)
    job = make_job(opts.groups, seed=opts.seed)
    rec = Recorder(registry, interval)
    rec.start()
    phases: dict[str, tuple[int, int]] = {}
    try:
        for policy in ("round_robin", "aggressive"):
            start = rec.now_index() + 1  # the first sample that can see this phase
            run = run_policy(policy, job, opts, tracer_provider=None, registry=registry, metrics=metrics,
                             dispatch_metrics=dispatch_metrics)
            phases[policy] = (start, rec.now_index())
            print(f"{policy}: {run.handled} messages in {run.makespan_s:.0f} s", file=sys.stderr, flush=True)
        time.sleep(linger)
    finally:
        rec.stop()
    return rec, phases


FIRES_WITHIN_S = 10 * 60  # the HOL alert must fire this soon after the round-robin run starts


_PROMISE = (
    f"# RmqtraceHeadOfLineBlocking must fire for demo-round_robin within {FIRES_WITHIN_S // 60} minutes of its start"
    " (not before its for:\n# could pass) and fire each minute to its end; for demo-aggressive no head-of-line alert"
    " and nothing firing.\n# Rerun the script to refresh (--recheck FILE rewrites only the checks); do not edit by hand.\n"
)


def checks(phases: dict[str, tuple[int, int]], interval: float) -> list[dict[str, object]]:
    """What the recorded run must show, from the phases' times and the rule's `for:` only."""

    def at(k: int) -> str:
        return f"{k * interval:g}s"

    rr_start, rr_end = phases["round_robin"]
    ag_start, ag_end = phases["aggressive"]
    hol = 'ALERTS{alertname="RmqtraceHeadOfLineBlocking",alertstate="firing",consumer_group="demo-round_robin"}'
    firing = [{"labels": 'ALERTS{alertname="RmqtraceHeadOfLineBlocking",alertstate="firing",severity="warning",'
                         'job="demo",instance="recorded",policy="round_robin",consumer_group="demo-round_robin"}',
               "value": 1}]
    steps = int(FIRES_WITHIN_S / interval)
    not_before = min(rr_start + int(ALERT_FOR_S / interval), rr_end) - 1
    minute = max(1, int(60 / interval))
    # fires within 10 minutes of the incident's start and keeps firing, each minute, to its end
    # (the instant rule it replaces fired, was reset by one saturated evaluation, fired again)...
    tests: list[dict[str, object]] = [
        {"expr": hol, "eval_time": at(k), "exp_samples": firing}
        for k in [*range(min(rr_start + steps, rr_end), rr_end, minute), rr_end]
    ]
    # ...but not before its `for:` could have run out
    tests.append({"expr": hol, "eval_time": at(not_before), "exp_samples": []})
    # The aggressive run: no head-of-line alert in any state, and nothing firing, each minute and
    # at its end. (WorkersSaturated may be pending: every worker is busy on the backlog.)
    for k in [*range(ag_start, ag_end + 1, minute), ag_end]:
        tests.append({"expr": 'ALERTS{consumer_group="demo-aggressive",alertname="RmqtraceHeadOfLineBlocking"}',
                      "eval_time": at(k), "exp_samples": []})
        tests.append({"expr": 'ALERTS{consumer_group="demo-aggressive",alertstate="firing"}',
                      "eval_time": at(k), "exp_samples": []})
    return tests


def render(rec: Recorder, phases: dict[str, tuple[int, int]], opts: DemoOptions, interval: float) -> str:
    step = f"{interval:g}s"

    def at(k: int) -> str:
        return f"{k * interval:g}s"

    rr_start, rr_end = phases["round_robin"]
    ag_start, ag_end = phases["aggressive"]
    tests = checks(phases, interval)
    doc = {
        "rule_files": ["../rmqtrace-alerts.yml"],
        "group_eval_order": ["rmqtrace.recording", "rmqtrace.alerts"],
        "evaluation_interval": step,
        "tests": [{
            "name": "recorded incident: round-robin then aggressive",
            "interval": step,
            "input_series": [{"series": name, "values": _values(points, rec.n)}
                             for name, points in sorted(rec.series.items())],
            "promql_expr_test": tests,
        }],
    }
    head = (f"# GENERATED by dashboards/prometheus/tests/record_incident.py: a real run of the demo job\n"
            f"# ({opts.groups} groups, {opts.workers} workers, --case-ms {opts.case_ms:g}, seed {opts.seed}), "
            f"sampled every {interval:g} s.\n"
            f"# round_robin: samples {rr_start}-{rr_end} ({at(rr_start)}-{at(rr_end)}); "
            f"aggressive: samples {ag_start}-{ag_end} ({at(ag_start)}-{at(ag_end)}).\n"
            + _PROMISE)
    return head + yaml.safe_dump(doc, sort_keys=False, width=10_000)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--groups", type=int, default=500)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--case-ms", type=float, default=1000.0)
    p.add_argument("--interval", type=float, default=15.0, help="seconds between samples (a scrape interval)")
    p.add_argument("--linger", type=float, default=60.0, help="seconds recorded after the last run")
    p.add_argument("--recheck", type=Path, help="rewrite the checks of a recorded file, keeping its series")
    args = p.parse_args(argv)
    _check_rule()
    if args.recheck is not None:
        text = args.recheck.read_text()
        m = re.search(r"sampled every ([\d.]+) s\.\n# round_robin: samples (\d+)-(\d+) .*aggressive: samples (\d+)-(\d+)",
                      text)
        if m is None:
            raise SystemExit(f"{args.recheck}: no phase line in its header")
        interval = float(m[1])
        phases = {"round_robin": (int(m[2]), int(m[3])), "aggressive": (int(m[4]), int(m[5]))}
        head = "".join(line + "\n" for line in text.splitlines()[:3])
        doc = yaml.safe_load(text)
        doc["tests"][0]["promql_expr_test"] = checks(phases, interval)
        args.recheck.write_text(head + _PROMISE + yaml.safe_dump(doc, sort_keys=False, width=10_000))
        return 0
    opts = DemoOptions(groups=args.groups, workers=args.workers, case_ms=args.case_ms,
                       policies=("round_robin", "aggressive"))
    rec, phases = record(opts, args.interval, args.linger)
    args.out.write_text(render(rec, phases, opts, args.interval))
    print(f"wrote {args.out}: {len(rec.series)} series x {rec.n} samples", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
