"""The incident, reproduced on the embedded broker: one job of test-case groups, several policies.

A producer sends one message per test-case group (most groups have a few cases, a few have
hundreds); a consume loop runs them on N workers under each dispatch policy in turn. For every
policy the demo prints the job's completion time next to the lower bound
LB = max(total work / workers, longest message), the percentiles of every stage gap, and in
one line where the time went (the same sentence the report prints for a consumer group).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from ..clients.consume import ConsumeLoop
from ..clients.producer import TracedProducer
from ..dispatch import DispatchMetrics, Random, RoundRobin
from ..dispatch.simulate import lower_bound
from ..embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from ..path.propagation import COST
from ..path.stages import GAPS, PATH_GAPS, Outcome, Stage
from ..path.stamps import Stamps, compute_gaps
from ..report.model import percentile, where_time_went_line
from ..telemetry.metrics import TracerMetrics
from ..telemetry.tracer import MessageTrace, MessageTracer
from .workload import JobItem, make_job

__all__ = ["TOPIC", "DemoOptions", "PolicyRun", "run_demo", "run_policy", "summary_json", "where_time_went"]

TOPIC = "testcase-groups"


@dataclass
class DemoOptions:
    groups: int = 500
    workers: int = 8
    case_ms: float = 10.0  # one test case takes this long
    buffer: int = 10  # per-worker buffer of the baseline policies
    prefetch: int = 1024  # the baseline's client cache (the 5.x push consumer keeps up to 1024)
    policies: Sequence[str] = ("round_robin", "aggressive", "cost_aware")
    seed: int = 7
    job_id: str = "job-1"


@dataclass
class PolicyRun:
    policy: str
    workers: int
    makespan_s: float
    lower_bound_s: float
    handled: int
    failed: int
    gaps: dict[str, list[float]] = field(default_factory=dict)
    handler_s: list[float] = field(default_factory=list)

    @property
    def over_lb(self) -> float:
        return self.makespan_s / self.lower_bound_s if self.lower_bound_s else 0.0

    def percentile(self, gap: str, q: float) -> float:
        return percentile(self.gaps.get(gap) or [0.0], q)  # the report's definition

    def share(self, gap: str) -> float:
        total = sum(sum(self.gaps.get(g.name, [])) for g in PATH_GAPS)
        return sum(self.gaps.get(gap, [])) / total if total else 0.0

    def occupancy(self) -> float:
        return sum(self.handler_s) / (self.workers * self.makespan_s) if self.makespan_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "makespan_s": self.makespan_s, "lower_bound_s": self.lower_bound_s,
            "makespan_over_lb": self.over_lb or None,
            "handled": self.handled, "failed": self.failed, "worker_occupancy": self.occupancy(),
            "gaps": {g.name: {"p50": self.percentile(g.name, .5), "p95": self.percentile(g.name, .95),
                              "p99": self.percentile(g.name, .99), "max": self.percentile(g.name, 1.0),
                              "share": self.share(g.name)} for g in GAPS},
        }


def run_policy(policy: str, job: Sequence[JobItem], opts: DemoOptions, *,
               tracer_provider: TracerProvider | None, registry: CollectorRegistry,
               metrics: TracerMetrics, dispatch_metrics: DispatchMetrics,
               on_message: Callable[[], None] = lambda: None) -> PolicyRun:
    broker = EmbeddedBroker()
    broker.create_topic(TOPIC)
    group = f"demo-{policy}"
    finished: list[tuple[list[int], float | None]] = []
    done = threading.Event()
    lock = threading.Lock()

    def collect(trace: MessageTrace, outcome: Outcome) -> None:
        with lock:
            finished.append((list(trace.stamps.times), trace.carried.cost))
            if len(finished) >= len(job):
                done.set()
        on_message()

    tracer = MessageTracer(consumer_group=group, tracer_provider=tracer_provider, metrics=metrics,
                           listeners=[collect])
    scale = opts.case_ms / 1000.0

    def handler(msg: Any) -> None:
        cases = json.loads(msg.body)["cases"]
        time.sleep(cases * scale)  # the test cases of this group

    consumer = SimpleConsumer(broker, group, {TOPIC: None}, await_duration=0.05)
    consumer.startup()
    policy_arg: Any = policy
    baseline = policy in ("round_robin", "random")
    if baseline:
        policy_arg = RoundRobin(buffer=opts.buffer) if policy == "round_robin" else Random(buffer=opts.buffer, seed=opts.seed)
    loop = ConsumeLoop(consumer, handler, tracer=tracer, policy=policy_arg, workers=opts.workers,
                       cost=lambda m: float(m.properties.get(COST, 0) or 0),
                       dispatch_metrics=dispatch_metrics, invisible_duration=60.0,
                       prefetch=opts.prefetch if baseline else 0)
    runner = threading.Thread(target=loop.run, name=f"demo-{policy}", daemon=True)
    runner.start()

    producer = TracedProducer(Producer(broker, [TOPIC]), MessageTracer(tracer_provider=tracer_provider))
    producer.startup()
    for item in job:
        msg = Message()
        msg.topic = TOPIC
        msg.body = json.dumps({"group": item.group_id, "cases": item.cases}).encode()
        msg.keys = item.group_id
        producer.send(msg, job_id=opts.job_id, cost=float(item.cases))
    done.wait()
    loop.stop()
    runner.join()
    consumer.shutdown()
    producer.shutdown()
    return _summarise(policy, opts, finished, loop.stats.failed)


def _summarise(policy: str, opts: DemoOptions, finished: list[tuple[list[int], float | None]],
               failed: int) -> PolicyRun:
    gaps: dict[str, list[float]] = {g.name: [] for g in GAPS}
    handler_s: list[float] = []
    first = min(t[Stage.PRODUCE] for t, _ in finished)
    last = max(t[Stage.HANDLER_END] for t, _ in finished)
    for times, _cost in finished:
        for g in compute_gaps(Stamps(times)):
            gaps[g.gap.name].append(g.seconds)
        handler_s.append((times[Stage.HANDLER_END] - times[Stage.HANDLER_START]) / 1e9)
    return PolicyRun(policy, opts.workers, (last - first) / 1e9, lower_bound(handler_s, opts.workers),
                     len(finished) - failed, failed, gaps, handler_s)


def where_time_went(run: PolicyRun) -> str:
    """One line: the headline share first, then the job against its lower bound (as the report says it)."""
    shares = {g.name: run.share(g.name) for g in GAPS}
    return where_time_went_line(run.policy, shares, run.over_lb or None, run.occupancy())


def run_demo(opts: DemoOptions, *, tracer_provider: TracerProvider | None,
             registry: CollectorRegistry, progress: Any = None,
             metrics: TracerMetrics | None = None) -> list[PolicyRun]:
    job = make_job(opts.groups, seed=opts.seed)
    metrics = metrics or TracerMetrics(registry)
    dispatch_metrics = DispatchMetrics(registry)
    runs = []
    for policy in opts.policies:
        advance: Callable[[], None] = _no_progress
        if progress is not None:
            advance = functools.partial(progress.advance, progress.add_task(f"{policy:<12}", total=len(job)))
        runs.append(run_policy(policy, job, opts, tracer_provider=tracer_provider, registry=registry,
                               metrics=metrics, dispatch_metrics=dispatch_metrics, on_message=advance))
    return runs


def _no_progress() -> None:
    pass


def summary_json(runs: Sequence[PolicyRun], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.as_dict() for r in runs], indent=2))

