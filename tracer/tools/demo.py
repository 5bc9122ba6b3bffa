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

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from ..clients.consume import ConsumeLoop
from ..clients.producer import TracedProducer
from ..dispatch import DispatchMetrics, Random, RoundRobin
from ..dispatch.simulate import lower_bound
from ..embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from ..path.names import JOB_ORDER_PROPERTY
from ..path.propagation import COST
from ..path.stages import GAPS, PATH_GAPS, Outcome, Stage
from ..path.stamps import Stamps, compute_gaps
from ..report.blame import Blame, Run, blame
from ..report.jobs import MIXED_ORDER
from ..report.model import BLAME_TOP
from ..report.stats import percentile
from ..report.text import where_time_went_line
from ..telemetry.hold import HoldingSpanProcessor
from ..telemetry.keep import KeepPolicy
from ..telemetry.metrics import TracerMetrics
from ..telemetry.tracer import MessageTrace, MessageTracer
from .workload import JobItem, make_job

__all__ = ["SLOW_CONSUMER_WAIT_S", "TOPIC", "DemoOptions", "PolicyRun", "blame_line", "keep_line", "run_demo", "run_policy",
           "summary_json", "where_time_went"]

TOPIC = "testcase-groups"
# With --trace-sampling: a message is slow when it waited this long inside the consumer.
SLOW_CONSUMER_WAIT_S = 1.0


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
    # The order the producer sends the job in (TracedProducer.send_job): "arrival" (as the job
    # came, the incident's) or "longest_first"
    order: str = "arrival"
    # Background probability of the keep policy; None: every trace sampled (no policy). With it,
    # producers sample nothing and the consumer keeps failures, slow messages (consumer_wait over
    # SLOW_CONSUMER_WAIT_S), each job's first and last finisher, and this share of the rest.
    trace_sampling: float | None = None


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
    keep: dict[str, Any] | None = None  # what the keep policy kept (with --trace-sampling)
    blame: Blame | None = None  # who blocked whom, from the run's stamps (tracer.report.blame)
    sent_order: str = ""  # read back from the messages (rmqtrace_order): the report's sent_order()

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
            "policy": self.policy, "sent_order": self.sent_order, "makespan_s": self.makespan_s,
            "lower_bound_s": self.lower_bound_s,
            "makespan_over_lb": self.over_lb or None,
            "handled": self.handled, "failed": self.failed, "worker_occupancy": self.occupancy(),
            "gaps": {g.name: {"p50": self.percentile(g.name, .5), "p95": self.percentile(g.name, .95),
                              "p99": self.percentile(g.name, .99), "max": self.percentile(g.name, 1.0),
                              "share": self.share(g.name)} for g in GAPS},
            "avoidable_wait_share": self.blame.avoidable_share if self.blame else None,
            "top_blockers": [b.as_dict() for b in self.blame.top[:BLAME_TOP]] if self.blame else [],
            **(self.keep or {}),  # with --trace-sampling: messages, traces_kept, slow_messages, ...
        }


def run_policy(policy: str, job: Sequence[JobItem], opts: DemoOptions, *,
               tracer_provider: TracerProvider | None, registry: CollectorRegistry,
               metrics: TracerMetrics, dispatch_metrics: DispatchMetrics,
               on_message: Callable[[], None] = lambda: None) -> PolicyRun:
    broker = EmbeddedBroker()
    broker.create_topic(TOPIC)
    group = f"demo-{policy}"
    finished: list[tuple[list[int], float | None]] = []
    ids: list[str] = []
    runs: list[Run] = []
    orders: set[str] = set()
    done = threading.Event()
    lock = threading.Lock()

    def collect(trace: MessageTrace, outcome: Outcome) -> None:
        with lock:
            finished.append((list(trace.stamps.times), trace.carried.cost))
            ids.append(trace.info.message_id or "")
            orders.add(str(trace.info.properties.get(JOB_ORDER_PROPERTY, "")))
            t = trace.stamps.times
            if trace.worker is not None and t[Stage.HANDLER_START] and t[Stage.HANDLER_END]:
                mid = trace.info.message_id or ""
                runs.append(Run(mid, ",".join(trace.info.keys) or mid, trace.worker,
                                min(t[Stage.CLIENT_PULL] or t[Stage.HANDLER_START], t[Stage.HANDLER_START]),
                                t[Stage.HANDLER_START], t[Stage.HANDLER_END], t[Stage.DISPATCH_ENQUEUE] or None))
            if len(finished) >= len(job):
                done.set()
        on_message()

    keeping = _Keeping(tracer_provider, opts.trace_sampling) if opts.trace_sampling is not None else None
    tracer = MessageTracer(consumer_group=group, tracer_provider=keeping.consumer if keeping else tracer_provider,
                           metrics=metrics, listeners=[collect], keep=keeping.policy if keeping else None,
                           hold=keeping.hold if keeping else None)
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

    producer = TracedProducer(Producer(broker, [TOPIC]), MessageTracer(
        tracer_provider=keeping.producer if keeping else tracer_provider))
    producer.startup()
    messages = []
    for item in job:
        msg = Message()
        msg.topic = TOPIC
        msg.body = json.dumps({"group": item.group_id, "cases": item.cases}).encode()
        msg.keys = item.group_id
        messages.append(msg)
    producer.send_job(messages, job_id=opts.job_id, cost=lambda m: float(json.loads(m.body)["cases"]),
                      order=opts.order)
    done.wait()
    loop.stop()
    runner.join()
    consumer.shutdown()
    producer.shutdown()
    run = _summarise(policy, opts, finished, loop.statistics().failed)
    run.sent_order = orders.pop() if len(orders) == 1 else MIXED_ORDER
    if runs:
        run.blame = blame(runs, max(opts.workers, len({r.worker for r in runs})), top=BLAME_TOP)
    if keeping is not None:
        run.keep = keeping.summary(finished, ids)
    return run


class _KeptIds(SpanProcessor):
    """The message ids of the ``process`` spans that reached the exporters: the kept traces."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def on_end(self, span: ReadableSpan) -> None:
        message_id = (span.attributes or {}).get("messaging.message.id")
        if span.kind is SpanKind.CONSUMER and isinstance(message_id, str):
            self.ids.add(message_id)


class _Keeping:
    """The demo's keep set-up: producers sample nothing, the consumer's spans are held and kept
    by the policy, then handed to ``provider``'s own processors (and counted here)."""

    def __init__(self, provider: TracerProvider | None, background: float) -> None:
        resource = provider.resource if provider is not None else None
        self.producer = TracerProvider(sampler=ALWAYS_OFF, resource=resource)
        self.kept = _KeptIds()
        forward: list[SpanProcessor] = [self.kept]
        if provider is not None:
            forward.append(provider.get_tracer("rmqtrace-demo").span_processor)  # type: ignore[attr-defined]
        self.hold = HoldingSpanProcessor(forward)
        self.consumer = TracerProvider(resource=resource)
        self.consumer.add_span_processor(self.hold)
        self.policy = KeepPolicy({"consumer_wait": SLOW_CONSUMER_WAIT_S}, background=background)

    def summary(self, finished: Sequence[tuple[list[int], float | None]], ids: Sequence[str]) -> dict[str, Any]:
        self.policy.flush()  # the job's latest finisher is held until the job is idle: it is now
        wait_ns = SLOW_CONSUMER_WAIT_S * 1e9
        slow = {i for (t, _c), i in zip(finished, ids) if t[Stage.HANDLER_START] - t[Stage.CLIENT_PULL] > wait_ns}
        last = max(zip(finished, ids), key=lambda f: f[0][0][Stage.HANDLER_END])[1] if ids else None
        return {"messages": len(ids), "traces_kept": len(self.kept.ids), "slow_messages": len(slow),
                "slow_kept": len(slow & self.kept.ids), "critical_path_kept": last in self.kept.ids,
                "background": self.policy.background, "slow_consumer_wait_s": SLOW_CONSUMER_WAIT_S,
                "held_spans_dropped": self.hold.statistics().dropped}


def keep_line(run: PolicyRun) -> str | None:
    """One line per policy with --trace-sampling: what was kept of how many."""
    k = run.keep
    if k is None:
        return None
    return (f"{run.policy}: kept {k['traces_kept']} of {k['messages']} traces; slow (consumer_wait > "
            f"{k['slow_consumer_wait_s']:g} s) kept {k['slow_kept']} of {k['slow_messages']}; "
            f"the job's critical path {'kept' if k['critical_path_kept'] else 'NOT kept'}")


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


def blame_line(run: PolicyRun) -> str | None:
    """Who blocked whom in one line, numbers from the run: the avoidable share and the worst blocker."""
    return run.blame.line(run.policy) if run.blame else None


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

