"""``rmqtrace demo --consumers C``: the fleet effect on the embedded broker, C consumers in one process.

The whole job waits in the broker; then C consume loops of one consumer group start together,
each with its own workers and its own :class:`~tracer.telemetry.occupancy.Occupancy`. Two modes:

- ``prefetch``: every loop receives ahead into a cache (``prefetch`` messages, like the 5.x push
  consumer's), so each consumer holds its share of the job from the start and a consumer that
  drew the long groups keeps them while the others run dry;
- ``demand_driven``: every loop receives only what its workers can start, so the broker hands the
  rest to whichever consumer frees a worker first.

Per consumer instance: messages, busy share, the most it held unstarted, and the exact in-process
head-of-line worker-seconds; per mode: the job time against the fleet lower bound and the greedy
list schedule of the measured durations, and the fleet's idle worker-seconds while another
consumer held unstarted work (swept from the stamps).
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
from ..dispatch.simulate import lower_bound
from ..embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from ..path.names import JOB_ORDERS
from ..path.stages import Outcome, Stage
from ..report.blame import Run, fleet_verdict
from ..report.fleet import FleetSection, Handled
from ..report.fleetblame import fleet_avoidable
from ..report.fleetview import fleet_page
from ..report.text import sent_order_words
from ..telemetry.occupancy import OccupancyMetrics, OccupancyStats
from ..telemetry.tracer import MessageTrace, MessageTracer
from .bench.fleet import fleet_greedy, fleet_waits
from .workload import make_job

__all__ = ["FLEET_MODES", "FleetDemoOptions", "FleetModeRun", "cli_fleet_demo", "fleet_table", "run_fleet_demo",
           "write_fleet_html", "write_fleet_json"]

TOPIC = "testcase-groups"
FLEET_MODES = ("prefetch", "demand_driven")


@dataclass(frozen=True)
class FleetDemoOptions:
    """Raises ``ValueError`` on construction for counts that cannot work."""

    consumers: int = 3
    groups: int = 500
    workers: int = 4  # per consumer
    case_ms: float = 10.0
    prefetch: int = 1024
    seed: int = 7
    job_id: str = "job-1"
    order: str = "arrival"  # how the producer sends the job (TracedProducer.send_job): or "longest_first"

    def __post_init__(self) -> None:
        if self.consumers < 1 or self.workers < 1 or self.groups < 1 or self.prefetch < 1:
            raise ValueError("consumers, workers, groups and prefetch must each be at least 1")
        if self.order not in JOB_ORDERS:
            raise ValueError(f"order must be one of {', '.join(JOB_ORDERS)}, got {self.order!r}")


@dataclass
class FleetModeRun:
    mode: str
    consumers: int
    workers: int
    makespan_s: float
    lower_bound_s: float
    greedy_s: float
    messages: list[int]
    busy_share: list[float]
    max_held: list[int]
    hol_s: list[float]  # exact, per consumer
    fleet_idle_while_held_s: float
    records: list[Handled] = field(default_factory=list, repr=False)
    # consumer_wait and its parts avoidable inside a consumer / elsewhere in the fleet (tracer.report.blame)
    avoidable: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "consumers": self.consumers, "workers_per_consumer": self.workers,
            "makespan_s": round(self.makespan_s, 3), "lower_bound_s": round(self.lower_bound_s, 3),
            "greedy_s": round(self.greedy_s, 3),
            "makespan_over_lb": round(self.makespan_s / self.lower_bound_s, 3) if self.lower_bound_s else None,
            "makespan_over_greedy": round(self.makespan_s / self.greedy_s, 3) if self.greedy_s else None,
            "per_consumer": [
                {"consumer": f"consumer-{i}", "messages": self.messages[i], "busy_share": round(self.busy_share[i], 3),
                 "max_held_unstarted": self.max_held[i], "hol_idle_worker_seconds": round(self.hol_s[i], 3)}
                for i in range(self.consumers)],
            "fleet_idle_worker_seconds_while_held": round(self.fleet_idle_while_held_s, 3),
            "avoidable_wait": {k: round(v, 6) for k, v in self.avoidable.items()},
        }


def _run_mode(mode: str, opts: FleetDemoOptions, *, tracer_provider: TracerProvider | None,
              consumer_providers: Sequence[TracerProvider | None], registry: CollectorRegistry | None,
              on_message: Callable[[], None]) -> FleetModeRun:
    job = make_job(opts.groups, seed=opts.seed)
    broker = EmbeddedBroker()
    broker.create_topic(TOPIC)
    group = f"demo-fleet-{mode.replace('_', '-')}"
    producer = TracedProducer(Producer(broker, [TOPIC]), MessageTracer(tracer_provider=tracer_provider))
    producer.startup()
    index: dict[str, int] = {}
    messages = []
    for i, item in enumerate(job):
        msg = Message()
        msg.topic = TOPIC
        msg.body = json.dumps({"group": item.group_id, "cases": item.cases}).encode()
        msg.keys = item.group_id
        index[item.group_id] = i
        messages.append(msg)
    producer.send_job(messages, job_id=f"{opts.job_id}-{mode}", cost=lambda m: float(json.loads(m.body)["cases"]),
                      order=opts.order)
    producer.shutdown()

    # both modes run on one registry: its one OccupancyMetrics, a tracker per instance and mode
    occupancy = OccupancyMetrics.shared(registry) if registry is not None else OccupancyMetrics(CollectorRegistry())
    records: list[Handled] = []
    runs: list[list[Run]] = [[] for _ in range(opts.consumers)]
    lock = threading.Lock()
    done = threading.Event()
    seen: set[int] = set()
    scale = opts.case_ms / 1000.0

    def handler(msg: Any) -> None:
        time.sleep(json.loads(msg.body)["cases"] * scale)  # real-time: the test cases of this group

    def collector(instance: int) -> Callable[[MessageTrace, Outcome], None]:
        def collect(trace: MessageTrace, _outcome: Outcome) -> None:
            t = trace.stamps.times
            keys = trace.info.keys
            if not keys or keys[0] not in index:
                return
            with lock:
                i = index[keys[0]]
                records.append(Handled(i, instance, t[Stage.CLIENT_PULL], t[Stage.HANDLER_START], t[Stage.HANDLER_END]))
                if trace.worker is not None:
                    runs[instance].append(Run(keys[0], keys[0], trace.worker, t[Stage.CLIENT_PULL],
                                              t[Stage.HANDLER_START], t[Stage.HANDLER_END]))
                seen.add(i)
                if len(seen) >= len(job):
                    done.set()
            on_message()
        return collect

    trackers, loops, consumers, tracers = [], [], [], []
    for c in range(opts.consumers):
        occ = occupancy.track(group, opts.workers)
        trackers.append(occ)
        provider = consumer_providers[c] if consumer_providers else tracer_provider
        tracer = MessageTracer(consumer_group=group, tracer_provider=provider, occupancy=occ,
                               listeners=[collector(c)])
        tracers.append(tracer)
        consumer = SimpleConsumer(broker, group, {TOPIC: None}, await_duration=0.05)
        consumer.startup()
        consumers.append(consumer)
        loops.append(ConsumeLoop(consumer, handler, tracer=tracer, policy="aggressive", workers=opts.workers,
                                 invisible_duration=600.0, prefetch=opts.prefetch if mode == "prefetch" else 0))
    go = threading.Barrier(len(loops) + 1)  # the consumers start together, as a fleet deployed at once

    def run_loop(loop: ConsumeLoop) -> None:
        go.wait()
        loop.run()

    threads = [threading.Thread(target=run_loop, args=(loop,), name=f"fleet-demo-{mode}-{c}", daemon=True)
               for c, loop in enumerate(loops)]
    for th in threads:
        th.start()
    t0 = tracers[0].clock.wall_ns()  # the stamps' clock: the makespan is measured against them
    go.wait()
    done.wait()
    for loop in loops:
        loop.stop()
    for th in threads:
        th.join()
    for consumer in consumers:
        consumer.shutdown()
    snaps: list[OccupancyStats] = []
    for occ in trackers:
        occ.close()
        snaps.append(occ.statistics())
    run = _summarise(mode, opts, records, snaps, t0)
    run.avoidable = fleet_avoidable(runs, [opts.workers] * opts.consumers)
    return run


def _summarise(mode: str, opts: FleetDemoOptions, records: list[Handled], snaps: Sequence[OccupancyStats],
               t0: int) -> FleetModeRun:
    first: dict[int, Handled] = {}
    for r in records:
        first.setdefault(r.message, r)
    measured = [0.0] * len(first)
    for r in first.values():
        measured[r.message] = (r.end_ns - r.start_ns) / 1e9
    n = opts.consumers
    total_workers = n * opts.workers
    busy = [0.0] * n
    count = [0] * n
    for r in records:
        busy[r.instance] += (r.end_ns - r.start_ns) / 1e9
        count[r.instance] += 1
    waits = fleet_waits(records, n, opts.workers, t0)
    return FleetModeRun(
        mode, n, opts.workers, (max(r.end_ns for r in records) - t0) / 1e9,
        lower_bound(measured, total_workers), fleet_greedy(measured, total_workers), count,
        [b / sum(busy) if sum(busy) else 0.0 for b in busy], waits["max_held"], [s.hol_s for s in snaps],
        waits["fleet_idle_while_held_s"], records)


def run_fleet_demo(opts: FleetDemoOptions, *, tracer_provider: TracerProvider | None = None,
                   consumer_providers: Sequence[TracerProvider | None] = (),
                   registry: CollectorRegistry | None = None, progress: Any = None) -> list[FleetModeRun]:
    """Both modes in turn on the same job (job id ``<job_id>-<mode>``); ``registry`` gets the
    consumers' occupancy series. ``consumer_providers``: one tracer provider per consumer (each
    with its own ``service.instance.id``, so the report tells them apart); default: all use
    ``tracer_provider``.

    Raises:
        ValueError: ``consumer_providers`` given, but not one per consumer.
    """
    if consumer_providers and len(consumer_providers) != opts.consumers:
        raise ValueError(f"consumer_providers must hold one provider per consumer ({opts.consumers})")
    runs = []
    for mode in FLEET_MODES:
        advance: Callable[[], None] = _no_progress
        if progress is not None:
            advance = functools.partial(progress.advance, progress.add_task(f"{mode:<14}", total=opts.groups))
        runs.append(_run_mode(mode, opts, tracer_provider=tracer_provider, consumer_providers=consumer_providers,
                              registry=registry, on_message=advance))
    return runs


def _no_progress() -> None:
    pass


def fleet_table(runs: Sequence[FleetModeRun]) -> Any:
    """One row per mode and consumer instance, the mode's totals on its first row (fits 80 columns)."""
    from ..report.terminal import titled_table

    table = titled_table(f"One job over {runs[0].consumers} consumers of one group",
                         caption="#: consumer instance; held: most messages received, not started; HOL: idle "
                                 "worker-s while its own messages waited; fleet: idle worker-s while "
                                 "another consumer held work")
    for col in ("mode", "job", "÷ greedy", "#", "msgs", "busy", "held", "HOL", "fleet"):
        table.add_column(col, justify="left" if col in ("mode", "#") else "right", no_wrap=col == "mode")
    for r in runs:
        for i in range(r.consumers):
            head = i == 0
            table.add_row(
                r.mode if head else "", f"{r.makespan_s:.2f} s" if head else "",
                f"{r.makespan_s / r.greedy_s:.2f}" if head and r.greedy_s else "", str(i),
                str(r.messages[i]), f"{r.busy_share[i]:.0%}", str(r.max_held[i]), f"{r.hol_s[i]:.1f}",
                f"{r.fleet_idle_while_held_s:.1f}" if head else "", end_section=i == r.consumers - 1)
    return table


def write_fleet_json(runs: Sequence[FleetModeRun], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.as_dict() for r in runs], indent=2))


def cli_fleet_demo(args: Any, settings: Any, registry: CollectorRegistry, console: Any, progress: Any) -> int:
    """``rmqtrace demo --consumers C`` (C > 1): both modes, the per-consumer table, ``fleet.json``."""
    import dataclasses

    from opentelemetry import trace

    from ..config import configure_tracing, default_instance_id

    opts = FleetDemoOptions(consumers=args.consumers, groups=args.groups, workers=args.workers,
                            case_ms=args.case_ms, seed=args.seed, order=getattr(args, "order", "arrival"))
    provider = configure_tracing(settings, set_global=False)
    providers: list[TracerProvider | None] = []
    if provider is not None and settings.otlp_endpoint and provider is not trace.get_tracer_provider():
        # One resource per consumer, as C processes would have (a span file keeps one writer).
        base = settings.instance_id or default_instance_id()
        providers = [configure_tracing(dataclasses.replace(settings, instance_id=f"{base}/consumer-{c}"),
                                       set_global=False) for c in range(opts.consumers)]
    console.print(f"[bold]rmqtrace demo[/]: {opts.groups} test-case groups over {opts.consumers} consumers x "
                  f"{opts.workers} workers of one group, 1 case = {opts.case_ms:g} ms, embedded broker, "
                  f"job sent {sent_order_words(opts.order)} (TracedProducer.send_job)")
    with progress as bar:
        runs = run_fleet_demo(opts, tracer_provider=provider, consumer_providers=providers, registry=registry,
                              progress=bar)
    for p in (provider, *providers):
        if p is not None:
            p.force_flush()
    console.print(fleet_table(runs))
    from ..report.terminal import hanging

    hanging(console, "  •", [f"{r.mode}: job {r.makespan_s:.2f} s = {r.makespan_s / r.greedy_s:.2f}x the fleet's greedy "
                             f"schedule; {r.fleet_idle_while_held_s:.1f} idle worker-s while another consumer held work; "
                             f"{fleet_verdict(r.avoidable, sum(r.messages))}"
                             for r in runs])
    out = Path(args.out) / "fleet.json"
    write_fleet_json(runs, out)
    page = write_fleet_html(runs, Path(args.out) / "fleet.html")
    console.print(f"report: open {page}")  # as the single-consumer demo says it: the path as given
    console.print(f"summary: {out}")
    if getattr(args, "json", False):
        print(json.dumps([r.as_dict() for r in runs]))
    return 0


def write_fleet_html(runs: Sequence[FleetModeRun], path: Path) -> Path:
    """The fleet page (:func:`tracer.report.fleetview.fleet_page`): per mode, one lane group per consumer."""
    sections = [FleetSection(
        r.mode, f"job {r.makespan_s:.2f} s = {r.makespan_s / r.greedy_s:.2f}× the fleet's greedy schedule; "
        f"{r.fleet_idle_while_held_s:.1f} idle worker-s while another consumer held work; "
        f"{fleet_verdict(r.avoidable, sum(r.messages))}; messages per consumer "
        f"{' / '.join(map(str, r.messages))}", [f"consumer-{i}" for i in range(r.consumers)],
        [r.workers] * r.consumers, r.records, r.max_held) for r in runs]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fleet_page(f"One job over {runs[0].consumers} consumers of one group", sections), encoding="utf-8")
    return path
